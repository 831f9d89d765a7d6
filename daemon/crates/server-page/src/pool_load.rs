//! A disaggregated deployment's two pools as its router sees them (issue 53): NVIDIA Dynamo's
//! frontend exports, for each worker its KV router holds, the work it has given it and not
//! yet seen finish: `dynamo_frontend_worker_active_prefill_tokens{worker_id, dp_rank,
//! worker_type}` ("Active prefill tokens queued per worker") and
//! `dynamo_frontend_worker_active_decode_blocks{worker_id, dp_rank, worker_type}` ("Active KV
//! cache decode blocks per worker"), `worker_type` `prefill` or `decode` (ai-dynamo/dynamo
//! `lib/llm/src/kv_router/metrics.rs`, 1.6.1; an aggregated worker is a `decode` worker to the
//! router: `tests/fixtures/server/dynamo-frontend.a.prom`). Where the work waits tells the
//! pools apart: a prefill pool short of capacity holds more prompt tokens queued on its
//! workers, a decode pool short of it more sequences (blocks) in flight.

use serde::{Deserialize, Serialize};

use super::parse::Page;

/// Prompt tokens queued on a worker (Dynamo 1.6.1's router).
pub const PREFILL_TOKENS: &str = "dynamo_frontend_worker_active_prefill_tokens";
/// KV blocks a worker's active sequences hold (Dynamo 1.6.1's router).
pub const DECODE_BLOCKS: &str = "dynamo_frontend_worker_active_decode_blocks";

/// What the router's page says of its prefill and decode pools; read only under
/// prefill/decode disaggregation (a worker of type `prefill` on the page).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PoolLoad {
    /// Prompt tokens queued on the prefill workers, summed over them (`{token}`).
    pub prefill_tokens: f64,
    /// KV blocks held by the decode workers' active sequences, summed over them; `None` when
    /// the page has no decode worker's series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_blocks: Option<f64>,
    /// Prefill workers on the page.
    pub prefill_workers: u32,
    /// Decode workers on the page.
    pub decode_workers: u32,
}

/// The sum of `family` over the series of workers of type `worker_type`, and their count;
/// `None` without one.
fn pool_sum(page: &Page, family: &str, worker_type: &str) -> Option<(f64, u32)> {
    page.named(family)
        .filter(|s| page.label(s, "worker_type").as_deref() == Some(worker_type))
        .filter(|s| s.value.is_finite())
        .fold(None, |acc, s| {
            let (sum, n) = acc.unwrap_or((0.0, 0));
            Some((sum + s.value, n + 1))
        })
}

/// The two pools' load on `page`; `None` unless a prefill worker's series is there (an
/// aggregated deployment has one pool: its load is the server's own queue and batch).
pub fn pool_load(page: &Page) -> Option<PoolLoad> {
    let (prefill_tokens, prefill_workers) = pool_sum(page, PREFILL_TOKENS, "prefill")?;
    let decode = pool_sum(page, DECODE_BLOCKS, "decode");
    Some(PoolLoad {
        prefill_tokens,
        decode_blocks: decode.map(|d| d.0),
        prefill_workers,
        decode_workers: decode.map_or(0, |d| d.1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    /// Two prefill workers' queued tokens summed, the decode worker's blocks; the prefill
    /// workers' decode blocks and the decode worker's prefill tokens are not the pools'.
    #[test]
    fn a_disaggregated_frontends_pools() {
        let text = "dynamo_frontend_worker_active_prefill_tokens{dp_rank=\"0\",worker_id=\"1\",worker_type=\"prefill\"} 300\n\
                    dynamo_frontend_worker_active_prefill_tokens{dp_rank=\"0\",worker_id=\"2\",worker_type=\"prefill\"} 212\n\
                    dynamo_frontend_worker_active_prefill_tokens{dp_rank=\"0\",worker_id=\"3\",worker_type=\"decode\"} 40\n\
                    dynamo_frontend_worker_active_decode_blocks{dp_rank=\"0\",worker_id=\"1\",worker_type=\"prefill\"} 9\n\
                    dynamo_frontend_worker_active_decode_blocks{dp_rank=\"0\",worker_id=\"3\",worker_type=\"decode\"} 57\n";
        let p = pool_load(&parse(text).expect("page")).expect("disaggregated");
        assert_eq!(
            p,
            PoolLoad {
                prefill_tokens: 512.0,
                decode_blocks: Some(57.0),
                prefill_workers: 2,
                decode_workers: 1,
            }
        );
    }

    /// A live aggregated 1.6.1 frontend (two decode workers, no prefill worker) has no pools
    /// to tell apart.
    #[test]
    fn an_aggregated_frontend_has_no_pools() {
        let text = include_str!("../../../../tests/fixtures/server/dynamo-frontend.a.prom");
        assert_eq!(pool_load(&parse(text).expect("page")), None);
    }
}
