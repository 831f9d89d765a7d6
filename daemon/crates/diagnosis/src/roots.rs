//! Concurrent faults: more than one root confirmed at once (issue 28, item 3). A load surge
//! that fills the KV cache is one root and its child; a network delay on a node whose GPU also
//! throttles is two roots. Roots are the causes at or above the confirmation score, none a
//! child of another in the cause graph, ranked by when their own signals changed (causal
//! order); they lead the target's ranking in that order ([`rank_first`]). Pure.

use super::report::{Cause, CauseScore};

/// The roots among `causes` (ranked, highest first): each ≥ `confirm`, not `unknown`, not a
/// child of another root (`is_child(parent, child)`), each with its onset: when the earliest of
/// its own signals changed ([`crate::onset::own_change`]: not the canary latency a cause reads
/// as evidence, which moved at the symptom's onset, the first root's), in that order (those
/// without a change time last, by score). Empty or one: a single root.
pub fn concurrent_roots(
    causes: &[CauseScore],
    confirm: f64,
    is_child: impl Fn(Cause, Cause) -> bool,
) -> Vec<(Cause, Option<f64>)> {
    let strong: Vec<&CauseScore> = causes
        .iter()
        .filter(|c| c.score >= confirm && c.cause != Cause::Unknown)
        .collect();
    let mut roots: Vec<(Cause, Option<f64>)> = strong
        .iter()
        .filter(|c| !strong.iter().any(|p| is_child(p.cause, c.cause)))
        .map(|c| {
            let first = c
                .evidence
                .iter()
                .filter_map(super::report::Evidence::own_change)
                .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t))));
            (c.cause, first)
        })
        .collect();
    roots.sort_by(|a, b| match (a.1, b.1) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    roots
}

/// The incident's onset with several roots (Unix s): the first root's onset (whole seconds),
/// when it lies within [`crate::onset::MAX_EARLIER_S`] before the symptom's `onset` and not
/// after `now`; `None` otherwise (the symptom's onset stands).
pub fn first_onset(roots: &[(Cause, Option<f64>)], onset: u32, now: u32) -> Option<f64> {
    let first = roots
        .iter()
        .filter_map(|r| r.1)
        .filter(|t| t.is_finite())
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t))))?
        .floor();
    (first >= f64::from(onset) - f64::from(super::onset::MAX_EARLIER_S) && first <= f64::from(now))
        .then_some(first)
}

/// Puts the confirmed `roots` first in `causes`, in their causal order (the order of
/// `roots`), the other causes after them as ranked: with two faults the on-call reads the one
/// that began first first, whichever scores higher now.
pub fn rank_first(causes: &mut [CauseScore], roots: &[Cause]) {
    causes.sort_by_key(|c| {
        roots
            .iter()
            .position(|r| *r == c.cause)
            .unwrap_or(roots.len())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Evidence;
    use crate::signal::Signal;

    fn cause(c: Cause, score: f64, at: Option<f64>) -> CauseScore {
        with(c, score, Signal::GpuSmClock, at)
    }

    fn with(c: Cause, score: f64, signal: Signal, at: Option<f64>) -> CauseScore {
        CauseScore {
            cause: c,
            score,
            evidence: vec![Evidence {
                signal,
                before: 0.0,
                after: 0.0,
                peak: 0.0,
                z: 0.0,
                changed_at_unix_s: at,
                lead_s: None,
                rule: None,
                hw_ids: Vec::new(),
                source: None,
            }],
        }
    }

    #[test]
    fn two_independent_roots_in_causal_order_and_a_child_is_not_one() {
        let causes = vec![
            cause(Cause::GpuThrottling, 0.9, Some(130.0)),
            cause(Cause::Network, 0.85, Some(100.0)),
            cause(Cause::ServerQueueing, 0.8, Some(101.0)),
            cause(Cause::LoadSurge, 0.6, Some(90.0)),
        ];
        let graph = |p: Cause, c: Cause| (p, c) == (Cause::Network, Cause::ServerQueueing);
        let roots = concurrent_roots(&causes, 0.75, graph);
        assert_eq!(
            roots,
            vec![
                (Cause::Network, Some(100.0)),
                (Cause::GpuThrottling, Some(130.0))
            ]
        );
        // One strong cause: a single root.
        assert_eq!(concurrent_roots(&causes[..1], 0.75, graph).len(), 1);
        // The roots lead the ranking in causal order; the rest keep theirs (a stable sort).
        let mut ranked = causes.clone();
        rank_first(&mut ranked, &[Cause::Network, Cause::GpuThrottling]);
        let order: Vec<Cause> = ranked.iter().map(|c| c.cause).collect();
        assert_eq!(
            order,
            vec![
                Cause::Network,
                Cause::GpuThrottling,
                Cause::ServerQueueing,
                Cause::LoadSurge
            ]
        );
    }

    /// A load surge whose queue rose at 1000 and a 503 burst the canaries saw at 1038 (the
    /// error ratio paged; its canary TTFT evidence moved at the symptom's onset, 1038): each
    /// root's onset is its own signal's change, and the incident's the first root's.
    #[test]
    fn each_root_begins_at_its_own_signal_and_the_incident_at_the_first() {
        let mut surge = with(
            Cause::LoadSurge,
            0.89,
            Signal::ServerRequestsWaiting,
            Some(1000.4),
        );
        surge
            .evidence
            .push(with(Cause::LoadSurge, 0.0, Signal::Ttft, Some(1038.0)).evidence[0].clone());
        let mut burst = with(Cause::ErrorBurst, 1.0, Signal::Error, Some(1038.0));
        // Latency evidence that moved earlier is not the burst's own change.
        burst
            .evidence
            .push(with(Cause::ErrorBurst, 0.0, Signal::E2e, Some(990.0)).evidence[0].clone());
        let roots = concurrent_roots(&[burst, surge], 0.75, |_, _| false);
        assert_eq!(
            roots,
            vec![
                (Cause::LoadSurge, Some(1000.4)),
                (Cause::ErrorBurst, Some(1038.0))
            ]
        );
        assert_eq!(first_onset(&roots, 1038, 1060), Some(1000.0));
        // Not more than MAX_EARLIER_S before the symptom's onset, nor after now.
        assert_eq!(first_onset(&roots, 1200, 1220), None);
        assert_eq!(
            first_onset(&[(Cause::LoadSurge, Some(1070.0))], 1038, 1060),
            None
        );
        assert_eq!(first_onset(&[(Cause::LoadSurge, None)], 1038, 1060), None);
    }
}
