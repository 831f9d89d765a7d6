//! What the engine is fed, from the measurements: a canary's record and a model server
//! scrape mapped to [`Signal`] values (in the signal's unit). Pure: the agent
//! (`lmperf::diagnosis_live`) and the offline analysis (`lmperf analyze`) both call them.

use lmperf_measure::{Measured, Outcome};
use lmperf_server_page::ServerSample;

use crate::Signal;

/// The canary signals of one measured request (none for a request the agent cancelled).
pub fn request_signals(m: &Measured) -> Vec<(Signal, f64)> {
    let r = &m.record;
    if r.outcome == Outcome::Cancelled {
        return Vec::new();
    }
    let failed = r.outcome != Outcome::Ok;
    let mut v = vec![
        (Signal::Error, f64::from(u8::from(failed))),
        (
            Signal::Error5xx,
            f64::from(u8::from(r.http_status.is_some_and(|s| s >= 500))),
        ),
        (
            Signal::Error429,
            f64::from(u8::from(r.http_status == Some(429))),
        ),
        (
            Signal::ErrorTimeout,
            f64::from(u8::from(r.outcome == Outcome::Timeout)),
        ),
    ];
    if !failed {
        if let Some(t) = r.ttft {
            v.push((Signal::Ttft, t.as_secs_f64()));
        }
        if let Some(t) = r.tpot {
            v.push((Signal::Tpot, t.as_secs_f64()));
        }
        v.push((Signal::E2e, r.e2e.as_secs_f64()));
    }
    if let Some(tokens) = r.input_tokens {
        v.push((Signal::InputTokens, tokens as f64));
    }
    if !failed {
        v.extend(server_timing_signals(r));
    }
    v
}

/// The server's own figures of one successful request, where its response carried them
/// (`lmperf_measure::server_timing`): its TTFT, queue and prefill at canary resolution, its
/// decode time per output token (vLLM's `mean_itl_ms`, else the decode time over the tokens
/// after the first), and the client − server TTFT gap. A field the server did not send is
/// absent, never 0.
pub fn server_timing_signals(r: &lmperf_measure::RequestRecord) -> Vec<(Signal, f64)> {
    let Some(t) = &r.server_timing else {
        return Vec::new();
    };
    let per_token = t.mean_itl.or_else(|| {
        let n = t.decoded_tokens.filter(|n| *n > 1)?;
        Some(t.decode? / u32::try_from(n - 1).ok()?)
    });
    // Behind Dynamo, whose `ttft_ms` ends before the KV transfer, what lies outside the
    // server is the split's `frontend` segment: the transfer is `kv_transfer`'s (seen on 1.6.1:
    // a 10 × slower link read as the network).
    let split = r
        .ttft
        .and_then(|c| lmperf_measure::server_timing::TtftSplit::of(c, t));
    let gap = match split {
        Some(s) => Some(s.frontend_ms),
        None => r.ttft.and_then(|c| t.client_minus_server_ttft_ms(c)),
    }
    .map(|ms| ms / 1e3);
    [
        (Signal::ServerTtft, t.ttft.map(|d| d.as_secs_f64())),
        (Signal::ServerQueueTime, t.queue.map(|d| d.as_secs_f64())),
        (
            Signal::ServerPrefillTime,
            t.prefill.map(|d| d.as_secs_f64()),
        ),
        (Signal::ServerDecodeTime, per_token.map(|d| d.as_secs_f64())),
        (Signal::ClientServerTtftGap, gap),
        (Signal::KvTransfer, kv_transfer_s(r, t)),
        (Signal::PathOverhead, before_dispatch_s(r, t)),
    ]
    .into_iter()
    .filter_map(|(s, v)| v.map(|v| (s, v)))
    .collect()
}

/// A disaggregated request's transfer segment, s: what followed its prefill up to its first
/// token (`TtftSplit::transfer_and_first_decode_ms`); `None` unless its timing carried a KV
/// transfer (an aggregated request has none to slow).
fn kv_transfer_s(
    r: &lmperf_measure::RequestRecord,
    t: &lmperf_measure::server_timing::ServerTiming,
) -> Option<f64> {
    t.kv_transfer_estimate?;
    let split = lmperf_measure::server_timing::TtftSplit::of(r.ttft?, t)?;
    Some(split.transfer_and_first_decode_ms / 1e3)
}

/// A request's time in Dynamo's frontend before a worker got it, s: the `frontend` and
/// `router_queue` segments of its TTFT split (HTTP, tokenizer, the router's decision and
/// queue: Dynamo's `prefill_wait_time_ms`, and what its clock did not see). Its workers speak
/// Dynamo's request plane, never HTTP, so no direct canary can be subtracted: this is the
/// router's own time there. Measured on 1.6.1 with the frontend's CFS quota cut to 1 % of a
/// core: `prefill_wait_time_ms` 0.8 → 0.7–196 ms (the rest of the wait lands in
/// `prefill_time_ms`, which the worker's time shares). `None` without a split (not Dynamo's).
fn before_dispatch_s(
    r: &lmperf_measure::RequestRecord,
    t: &lmperf_measure::server_timing::ServerTiming,
) -> Option<f64> {
    let split = lmperf_measure::server_timing::TtftSplit::of(r.ttft?, t)?;
    Some((split.frontend_ms + split.router_queue_ms) / 1e3)
}

/// The scrape's figures that a target's per-request server timing replaces: where its
/// canaries carry their own, the `/metrics` histogram means of the same quantities are not
/// fed (they interpolate buckets that start at 0.3 s and cover every user's requests).
pub const PER_REQUEST_SIGNALS: [Signal; 5] = [
    Signal::ServerTtft,
    Signal::ServerQueueTime,
    Signal::ServerPrefillTime,
    Signal::ServerDecodeTime,
    Signal::KvTransfer,
];

/// The diagnosis signals of one model server scrape (fields the server lacks are absent). A
/// counter reset (restart) is not among them: the scraper logs a `restart` change event for
/// each, fed as the server change (counting both read one restart as two changes).
pub fn server_signals(s: &ServerSample) -> Vec<(Signal, f64)> {
    let pairs = [
        (Signal::ServerRequestsWaiting, s.requests_waiting),
        (Signal::ServerRequestsRunning, s.requests_running),
        (Signal::ServerKvUsage, s.kv_cache_usage),
        (Signal::ServerPreemptions, s.preemptions_per_s),
        (Signal::ServerPromptTokensRate, s.prompt_tokens_per_s),
        (
            Signal::ServerGenerationTokensRate,
            s.generation_tokens_per_s,
        ),
        (Signal::ServerRequestRate, s.requests_per_s),
        (Signal::ServerTtft, s.ttft.mean),
        (Signal::ServerQueueTime, s.queue.mean),
        (Signal::ServerPrefillTime, s.prefill.mean),
        (Signal::ServerDecodeTime, s.decode.mean),
        (Signal::KvTransfer, s.router_kv_transfer.mean),
        (
            Signal::PrefillPoolLoad,
            s.pool_load.map(|p| p.prefill_tokens),
        ),
        (
            Signal::DecodePoolLoad,
            s.pool_load.and_then(|p| p.decode_blocks),
        ),
    ];
    pairs
        .into_iter()
        .chain([
            (Signal::PickImbalance, pick_imbalance(&s.router_picks)),
            (
                Signal::StarvedWorkers,
                starved(&s.router_picks).map(|w| w.len() as f64),
            ),
        ])
        .filter_map(|(sig, x)| x.map(|x| (sig, x)))
        .collect()
}

/// A router target's workers apart from the others, from the direct canaries
/// ([`lmperf_measure::workers_apart`]): the slowest worker's TTFT p50 ÷ the others'
/// ([`Signal::WorkerSlowdown`]) and the workers failing every direct canary
/// ([`Signal::FailingWorkers`]), each with the words naming the worker ("http://w1:8000 (3.1 ×
/// the others' TTFT p50)"; the failing ones by URL, comma-separated), `None` for none.
/// Without two workers to compare (one of its role left, or too few answers yet) no worker
/// is apart: the slowdown is 1, not absent. Left absent, the last ratio stood for the
/// incident (seen live on Dynamo 1.6.1: a rolling restart's overlap read 3.3 × for two
/// probes, then the old worker left and the ratio stood, confirmed for 90 s; before the new
/// worker, with none to compare, the baseline read 0).
pub fn apart_signals(
    a: &lmperf_measure::workers_apart::WorkersApart,
) -> Vec<(Signal, f64, Option<String>)> {
    let mut v = Vec::new();
    match &a.slowest {
        Some((w, ratio)) => v.push((
            Signal::WorkerSlowdown,
            *ratio,
            Some(format!("{w} ({ratio:.1} × the others' TTFT p50)")),
        )),
        None => v.push((Signal::WorkerSlowdown, 1.0, None)),
    }
    let failing = (!a.failing.is_empty()).then(|| a.failing.join(", "));
    v.push((Signal::FailingWorkers, a.failing.len() as f64, failing));
    v
}

/// The most-picked pickable worker of an interval with an imbalance ([`pick_imbalance`]) in
/// words: "http://w1:8000 (75 % of 40 picks, fair share 25 %)".
pub fn most_picked(picks: &[lmperf_server_page::router_picks::RouterPick]) -> Option<String> {
    pick_imbalance(picks)?;
    let total: f64 = picks.iter().filter_map(|p| p.picks).sum();
    let top = picks
        .iter()
        .filter(|p| p.fair_share > 0.0)
        .filter_map(|p| Some((p, p.share? / p.fair_share)))
        .max_by(|a, b| a.1.total_cmp(&b.1))?
        .0;
    Some(format!(
        "{} ({:.0} % of {total:.0} picks, fair share {:.0} %)",
        top.worker,
        top.share.unwrap_or(0.0) * 100.0,
        top.fair_share * 100.0
    ))
}

/// The workers the router may pick that got no pick in an interval of at least
/// [`MIN_PICKS`] picks ([`Signal::StarvedWorkers`]); `None` as for [`pick_imbalance`].
pub fn starved(picks: &[lmperf_server_page::router_picks::RouterPick]) -> Option<Vec<&str>> {
    pick_imbalance(picks)?;
    Some(
        picks
            .iter()
            .filter(|p| p.fair_share > 0.0 && p.picks == Some(0.0))
            .map(|p| p.worker.as_str())
            .collect(),
    )
}

/// Picks a scrape interval must hold for its imbalance to count: with fewer, one pick more
/// or less moves a share by a tenth or more.
pub const MIN_PICKS: f64 = 10.0;

/// Picks per pickable worker an interval must hold besides [`MIN_PICKS`]: with fewer, the
/// most-picked of many workers is far above its fair share by chance alone (16 picks over
/// 10 workers: one with 3 is 1.9 ×).
pub const MIN_PICKS_PER_WORKER: f64 = 5.0;

/// The most-picked pickable worker's share of an interval's picks ÷ its fair share
/// ([`Signal::PickImbalance`]); `None` without pick counts, with fewer than [`MIN_PICKS`]
/// picks or [`MIN_PICKS_PER_WORKER`] per pickable worker, or with fewer than 2 workers to
/// pick from.
pub fn pick_imbalance(picks: &[lmperf_server_page::router_picks::RouterPick]) -> Option<f64> {
    let total: f64 = picks.iter().filter_map(|p| p.picks).sum();
    let pickable = picks.iter().filter(|p| p.fair_share > 0.0).count();
    if total < MIN_PICKS.max(MIN_PICKS_PER_WORKER * pickable as f64) || pickable < 2 {
        return None;
    }
    picks
        .iter()
        .filter(|p| p.fair_share > 0.0)
        .filter_map(|p| Some(p.share? / p.fair_share))
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmperf_server_page::router_picks::RouterPick;

    fn pick(worker: &str, picks: f64, total: f64, fair_share: f64) -> RouterPick {
        RouterPick {
            worker: worker.to_owned(),
            picks: Some(picks),
            share: Some(picks / total),
            fair_share,
            healthy: None,
            breaker: None,
            load: None,
            queue: None,
        }
    }

    /// 30 of 40 picks on one of four workers: 3 × its fair share, named; a worker out of
    /// rotation (fair share 0) is not among those weighed; too few picks say nothing.
    #[test]
    fn the_imbalance_is_the_most_picked_workers_share_over_its_fair_share() {
        let four = [
            pick("http://w1:8000", 30.0, 40.0, 0.25),
            pick("http://w2:8000", 5.0, 40.0, 0.25),
            pick("http://w3:8000", 5.0, 40.0, 0.25),
            pick("http://w4:8000", 0.0, 40.0, 0.25),
        ];
        assert_eq!(pick_imbalance(&four), Some(3.0));
        assert_eq!(
            most_picked(&four).as_deref(),
            Some("http://w1:8000 (75 % of 40 picks, fair share 25 %)")
        );
        let even = [
            pick("http://w1:8000", 10.0, 20.0, 0.5),
            pick("http://w2:8000", 10.0, 20.0, 0.5),
            pick("http://dead:8000", 0.0, 20.0, 0.0),
        ];
        assert_eq!(pick_imbalance(&even), Some(1.0));
        let few = [
            pick("http://w1:8000", 4.0, 5.0, 0.5),
            pick("http://w2:8000", 1.0, 5.0, 0.5),
        ];
        assert_eq!(pick_imbalance(&few), None);
        assert_eq!(most_picked(&few), None);
        // 16 picks over 10 workers: 1.6 each, too few to weigh one against its fair share;
        // 60 are enough.
        let many = |total: f64| -> Vec<RouterPick> {
            (0..10)
                .map(|k| {
                    pick(
                        &format!("http://w{k}:8000"),
                        if k == 0 { 3.0 } else { (total - 3.0) / 9.0 },
                        total,
                        0.1,
                    )
                })
                .collect()
        };
        assert_eq!(pick_imbalance(&many(16.0)), None);
        let x = pick_imbalance(&many(60.0)).unwrap_or_default();
        assert!((x - 57.0 / 9.0 / 60.0 / 0.1).abs() < 1e-9, "{x}");
        // w4 is pickable and got none of the 40; the dead worker is out by the router's word.
        assert_eq!(starved(&four), Some(vec!["http://w4:8000"]));
        assert_eq!(starved(&even), Some(vec![]));
        assert_eq!(starved(&few), None);
    }

    /// Two workers, one at 3 × the other: its ratio and its name; none to compare (the other
    /// left): a slowdown of 1, no worker named; the failing count each time.
    #[test]
    fn the_slowdown_is_one_without_two_workers_to_compare() {
        use lmperf_measure::workers_apart::WorkersApart;
        let two = WorkersApart {
            slowest: Some(("w1".into(), 3.0)),
            failing: vec![],
            ratios: vec![("w0".into(), 1.0 / 3.0), ("w1".into(), 3.0)],
        };
        let sigs = apart_signals(&two);
        assert_eq!(sigs[0].0, Signal::WorkerSlowdown);
        assert_eq!(sigs[0].1, 3.0);
        assert_eq!(
            sigs[0].2.as_deref(),
            Some("w1 (3.0 × the others' TTFT p50)")
        );
        let alone = apart_signals(&WorkersApart::default());
        assert_eq!(
            alone,
            vec![
                (Signal::WorkerSlowdown, 1.0, None),
                (Signal::FailingWorkers, 0.0, None)
            ]
        );
    }
}
