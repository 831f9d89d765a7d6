//! The hard rules of the serving path's signals (issue 53): a router's own time, the KV
//! transfer, a router's picks, a disaggregated deployment's pools, one worker apart from the
//! others. Each says in words when its signal moved far enough to name its cause on its own
//! (the engine's score of such evidence is at least 0.85).

use super::signal::Signal;
use super::store::EvidenceStore;

/// The worker the signal's newest note since `onset` names, after `sep` ("; last: http://w1");
/// empty without one.
fn named(store: &EvidenceStore, s: Signal, (onset, now): (u32, u32), sep: &str) -> String {
    store
        .note_in(s, onset, now.saturating_add(1))
        .map(|w| format!("{sep}{w}"))
        .unwrap_or_default()
}

/// The rule of serving-path signal `s` that moved from `before` to `after` (its medians
/// before and since `onset`), in words when it holds.
pub fn rule(
    s: Signal,
    (before, after): (f64, f64),
    store: &EvidenceStore,
    onset: u32,
    now: u32,
) -> Option<String> {
    match s {
        // The router adds at least the TTFT floor more than before: the direct canaries to its
        // workers, in the same minute, did not see it.
        Signal::PathOverhead if after - before >= Signal::Ttft.floor() => Some(format!(
            "routed − direct TTFT {:+.0} → {:+.0} ms (≥ +{:.0} ms): the router adds it, its workers answer direct canaries as before",
            before * 1e3,
            after * 1e3,
            Signal::Ttft.floor() * 1e3
        )),
        // The transfer doubled and took the TTFT floor's worth more (a link or bandwidth 10 ×
        // slower multiplies it; a busier decode worker's first step adds milliseconds).
        Signal::KvTransfer
            if after >= 2.0 * before && after - before >= Signal::PathOverhead.floor() =>
        {
            Some(format!(
                "KV transfer and first decode {:.0} → {:.0} ms (≥ 2 × and +{:.0} ms): the prefill-to-decode transfer got slower",
                before * 1e3,
                after * 1e3,
                Signal::PathOverhead.floor() * 1e3
            ))
        }
        // One worker gets at least half again its fair share of the picks (with two workers:
        // three quarters of them; twice the fair share is all of them, which the requests a
        // hash still spreads never reach), from a spread within a quarter of it.
        Signal::PickImbalance if after >= 1.5 && before <= 1.25 => Some(format!(
            "the most-picked worker got {:.1} × its fair share of the router's picks (from {:.1} ×): the router sends it the others' requests{}",
            after,
            before,
            named(store, s, (onset, now), "; last: ")
        )),
        // The prefill pool holds twice the prompt tokens, a canary's prompt more: work waits
        // for a prefill worker.
        Signal::PrefillPoolLoad if after >= 2.0 * before && after - before >= s.floor() => {
            Some(format!(
                "prompt tokens queued on the prefill workers {:.0} → {:.0} (≥ 2 ×): the prefill pool has more work than it serves",
                before, after
            ))
        }
        // The decode pool's sequences hold half again the blocks: each stays longer (or more
        // came), Little's law.
        Signal::DecodePoolLoad if after >= 1.5 * before && after - before >= s.floor() => {
            Some(format!(
                "KV blocks held on the decode workers {:.0} → {:.0} (≥ 1.5 ×): the decode pool's sequences stay longer than it serves them",
                before, after
            ))
        }
        // One worker answers its direct canaries at twice the others' time or more, from
        // within half of it: the router's requests to it come as late.
        Signal::WorkerSlowdown if after >= 2.0 && before <= 1.5 => Some(format!(
            "one worker answers direct canaries at {:.1} × the others' TTFT (from {:.1} ×): the router still sends it its share{}",
            after,
            before,
            named(store, s, (onset, now), "; last: ")
        )),
        Signal::FailingWorkers if before == 0.0 && after >= 1.0 => Some(format!(
            "{:.0} worker(s) failed every direct canary of the last minute while the others answered: the router's requests to them fail as well{}",
            after,
            named(store, s, (onset, now), ": ")
        )),
        Signal::StarvedWorkers if before == 0.0 && after >= 1.0 => Some(format!(
            "{:.0} worker(s) the router calls fine got none of its picks{}",
            after,
            named(store, s, (onset, now), ": ")
        )),
        _ => None,
    }
}
