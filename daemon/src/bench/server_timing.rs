//! `benchmarks[].server_timing`: the server's own per-request timing (vLLM's per-request
//! `metrics`, llama.cpp's `timings`; [`crate::measure::server_timing`]) over a benchmark's
//! successful requests, beside the client's TTFT: where the time went on the server (queue,
//! prefill, decode) and what it did not see (`client_minus_server_ttft_ms`: network, client,
//! HTTP front end, and where the server's clock starts at its slot, the wait for one). Fed row by row beside [`super::aggregate::Summarizer`]; bounded memory.
//! Pure: no clock, no IO.

use std::collections::BTreeMap;

use serde::Serialize;

use super::RequestRow;
use super::accumulator::Accumulator;
use super::stats::Distribution;

/// The block of `summary.json`; absent when no successful request carried server timing.
#[derive(Debug, Clone, Serialize)]
pub struct ServerTimingSummary {
    /// Successful requests whose response carried server timing, by where it came from
    /// (`vllm_metrics`, `llama_cpp_timings`).
    pub requests_by_source: BTreeMap<String, usize>,
    /// Of the benchmark's successful requests, the share that carried it.
    pub coverage: f64,
    /// The server's TTFT (arrival in the engine → first token), ms.
    pub ttft_ms: Option<Distribution>,
    pub queue_ms: Option<Distribution>,
    pub prefill_ms: Option<Distribution>,
    pub decode_ms: Option<Distribution>,
    /// The client's TTFT minus the server's, per request, ms. A negative gap counts as 0 in the
    /// percentiles (mean and min are exact).
    pub client_minus_server_ttft_ms: Option<Distribution>,
    /// What the gap holds: `network_client_front_end` where every request's server timing
    /// counts from its arrival in the engine (a queue figure beside it: vLLM's `metrics`), or
    /// `network_client_front_end_and_slot_wait` where some counted from when a slot took it
    /// (no queue figure: llama.cpp's `timings.prompt_ms`), so the wait for a free slot is in
    /// the gap, not on the server's clock; read it beside the server's waiting requests.
    pub gap_holds: &'static str,
}

/// [`ServerTimingSummary::gap_holds`] when every server clock started at arrival.
pub const GAP_FRONT_END: &str = "network_client_front_end";
/// [`ServerTimingSummary::gap_holds`] when some server clock started at the slot.
pub const GAP_WITH_SLOT_WAIT: &str = "network_client_front_end_and_slot_wait";

/// Running figures of one benchmark.
#[derive(Debug, Clone, Default)]
pub struct ServerTimingStats {
    ok: usize,
    by_source: BTreeMap<String, usize>,
    ttft: Accumulator,
    queue: Accumulator,
    prefill: Accumulator,
    decode: Accumulator,
    gap: Accumulator,
    /// Requests with server timing but no queue figure (their server clock started at the
    /// slot).
    from_slot: usize,
}

impl ServerTimingStats {
    /// Adds a successful request's row (the caller skips failed ones and probes).
    pub fn push(&mut self, r: &RequestRow) {
        self.ok += 1;
        let Some(source) = r.server_timing_source else {
            return;
        };
        *self.by_source.entry(source.to_owned()).or_insert(0) += 1;
        if r.server_queue_ms.is_none() {
            self.from_slot += 1;
        }
        let pairs = [
            (&mut self.ttft, r.server_ttft_ms),
            (&mut self.queue, r.server_queue_ms),
            (&mut self.prefill, r.server_prefill_ms),
            (&mut self.decode, r.server_decode_ms),
            (&mut self.gap, r.client_minus_server_ttft_ms),
        ];
        for (acc, v) in pairs {
            if let Some(v) = v {
                acc.record(v);
            }
        }
    }

    /// The block; `None` when no request carried server timing.
    pub fn finish(&self) -> Option<ServerTimingSummary> {
        if self.by_source.is_empty() {
            return None;
        }
        let with: usize = self.by_source.values().sum();
        Some(ServerTimingSummary {
            requests_by_source: self.by_source.clone(),
            coverage: with as f64 / self.ok.max(1) as f64,
            ttft_ms: self.ttft.distribution(),
            queue_ms: self.queue.distribution(),
            prefill_ms: self.prefill.distribution(),
            decode_ms: self.decode.distribution(),
            client_minus_server_ttft_ms: self.gap.distribution(),
            gap_holds: if self.from_slot > 0 {
                GAP_WITH_SLOT_WAIT
            } else {
                GAP_FRONT_END
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(source: Option<&'static str>, ttft: f64, server_ttft: Option<f64>) -> RequestRow {
        RequestRow {
            outcome: "ok",
            ttft_ms: Some(ttft),
            server_timing_source: source,
            server_ttft_ms: server_ttft,
            server_prefill_ms: server_ttft,
            client_minus_server_ttft_ms: server_ttft.map(|s| ttft - s),
            ..RequestRow::default()
        }
    }

    #[test]
    fn percentiles_of_the_server_split_and_the_share_that_carried_it() {
        let mut s = ServerTimingStats::default();
        assert!(s.finish().is_none());
        for i in 0..9 {
            let server = 10.0 + f64::from(i);
            s.push(&row(Some("llama_cpp_timings"), server + 1.5, Some(server)));
        }
        s.push(&row(None, 30.0, None));
        let b = s.finish().unwrap();
        assert_eq!(b.requests_by_source["llama_cpp_timings"], 9);
        assert!((b.coverage - 0.9).abs() < 1e-12);
        let ttft = b.ttft_ms.unwrap();
        assert_eq!((ttft.count, ttft.min, ttft.max), (9, 10.0, 18.0));
        let gap = b.client_minus_server_ttft_ms.unwrap();
        assert!((gap.mean - 1.5).abs() < 1e-9 && (gap.p99 - 1.5).abs() < 1e-3);
        assert!(b.queue_ms.is_none() && b.decode_ms.is_none());
        // llama.cpp's timings have no queue: the gap holds the wait for a slot.
        assert_eq!(b.gap_holds, GAP_WITH_SLOT_WAIT);
        let mut v = ServerTimingStats::default();
        v.push(&RequestRow {
            server_queue_ms: Some(40.0),
            ..row(Some("vllm_metrics"), 60.0, Some(55.0))
        });
        assert_eq!(v.finish().unwrap().gap_holds, GAP_FRONT_END);
    }
}
