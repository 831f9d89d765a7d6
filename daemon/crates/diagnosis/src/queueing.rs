//! Ordinary queueing: whether the server's own queue explains a latency jump at its scrape
//! resolution. A half-busy server queues a canary behind its traffic now and then (10 ms →
//! 0.5 s); when its `/metrics` show requests waiting (or a measurable queue time) within the
//! symptom's seconds, the jump is queueing, not `unknown`, whether or not the queue moved
//! against its own baseline (a 1 s scrape sees a 0.5 s queue only sometimes).
//!
//! Pure: the caller passes the seconds.

use super::report::Evidence;
use super::signal::Signal;
use super::store::EvidenceStore;

/// The score given to `server_queueing` when the queue explains the jump but did not move
/// materially: ranked, below every confirmation rule (0.5, 0.6) and above nothing that moved.
pub const ORDINARY_QUEUEING_SCORE: f64 = 0.45;

/// The server's queue over the seconds `[from, now]`: `Some` evidence when a scrape saw a
/// request waiting, or a request's queue time reached the signal's floor (20 ms). `None`
/// without server queue signals or when neither happened.
pub fn queue_explains(store: &EvidenceStore, from: u32, now: u32) -> Option<Evidence> {
    let to = now.saturating_add(1);
    let peak = |s: Signal| {
        store.series(s).and_then(|x| {
            x.range(from, to)
                .map(|(_, v)| v)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        })
    };
    let before = |s: Signal| {
        store.series(s).map(|x| {
            let mut v: Vec<f64> = x
                .range(from.saturating_sub(300), from)
                .map(|(_, v)| v)
                .collect();
            super::detector::median(&mut v).unwrap_or(0.0)
        })
    };
    let first_at = |s: Signal, min: f64| {
        store
            .series(s)?
            .range(from, to)
            .find(|&(_, v)| v >= min)
            .map(|(t, _)| f64::from(t))
    };
    if let Some(w) = peak(Signal::ServerRequestsWaiting).filter(|&w| w >= 1.0) {
        return Some(Evidence {
            signal: Signal::ServerRequestsWaiting,
            before: before(Signal::ServerRequestsWaiting).unwrap_or(0.0),
            after: w,
            peak: w,
            z: 0.0,
            changed_at_unix_s: first_at(Signal::ServerRequestsWaiting, 1.0),
            lead_s: None,
            rule: Some(format!(
                "{w:.0} request(s) waiting at the server's scrapes during the symptom: the canaries queued behind its traffic (ordinary queueing, no change of the queue itself)"
            )),
            hw_ids: Vec::new(),
            source: None,
        });
    }
    let floor = Signal::ServerQueueTime.floor();
    let q = peak(Signal::ServerQueueTime).filter(|&q| q >= floor)?;
    Some(Evidence {
        signal: Signal::ServerQueueTime,
        before: before(Signal::ServerQueueTime).unwrap_or(0.0),
        after: q,
        peak: q,
        z: 0.0,
        changed_at_unix_s: first_at(Signal::ServerQueueTime, floor),
        lead_s: None,
        rule: Some(format!(
            "server queue time {:.0} ms during the symptom: the canaries queued behind its traffic (ordinary queueing)",
            q * 1e3
        )),
        hw_ids: Vec::new(),
        source: None,
    })
}
