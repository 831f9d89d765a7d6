//! How much a node pressure (PSI) can explain: a magnitude check of `node_cpu_pressure` and the
//! PSI evidence of `memory_pressure`.
//!
//! PSI `some` avg10 is the share of time at least one task waited for the resource. A task
//! runnable but waiting a share `p` of the time takes `1 ÷ (1 − p)` times as long as with the
//! resource to itself, and no single task waits more than the node's `some` share. So a rise of
//! the share from `p₀` to `p₁` stretches a step that is wholly bound by that resource by at most
//! `(1 − p₀) ÷ (1 − p₁)` ([`max_stretch`]); steps that also wait for the GPU or the network
//! stretch less. A latency that grew far more than that (30 × under a PSI that went 59 % → 85 %,
//! at most 2.7 ×) has another cause, unless a queue amplifies the stretch: a server whose own
//! queue (requests waiting, or running with no more arrivals) rose with the pressure turns a
//! slower step into a longer wait for every request behind it.
//!
//! Such a pressure keeps a score below 0.5 ([`INSUFFICIENT_CAP`]): it neither wins, nor ranks
//! above a child in the cause graph, nor argues against a load the canaries show (the canary-only
//! `load_surge` inference discounts only the causes that can explain the latency). Pure: the
//! caller passes the values.

use super::contradict;
use super::store::EvidenceStore;

/// How far the observed inflation may exceed [`max_stretch`] before the pressure is judged
/// unable to explain it: a step is rarely wholly CPU-bound, but threads that wait for each other
/// (a batch step waits for its slowest thread), and an avg10 that lags the seconds it averages,
/// make the bound approximate.
pub const SLACK: f64 = 2.0;

/// The highest score of a pressure that cannot explain the latency: below every confirmation
/// rule (0.5 for the graph, 0.6 and 0.75 to confirm).
pub const INSUFFICIENT_CAP: f64 = 0.45;

/// The largest stretch of a resource-bound step when the pressure share rose from `before` to
/// `after` (each 0..1): `(1 − before) ÷ (1 − after)`, at least 1; infinite at a share of 1
/// (every moment someone waited: no bound).
pub fn max_stretch(before: f64, after: f64) -> f64 {
    let (b, a) = (before.clamp(0.0, 1.0), after.clamp(0.0, 1.0));
    if a >= 1.0 {
        return f64::INFINITY;
    }
    ((1.0 - b) / (1.0 - a)).max(1.0)
}

/// The verdict of the magnitude check when the pressure cannot explain the latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Insufficient {
    /// [`max_stretch`] of the pressure.
    pub bound: f64,
    /// The latency's inflation (after ÷ before of the most inflated latency that moved).
    pub observed: f64,
    /// The share of the inflation (on a log scale) the pressure can explain, 0..1.
    pub explained: f64,
}

impl Insufficient {
    /// Words for the evidence's rule.
    pub fn words(&self, what: &str) -> String {
        format!(
            "{what} stretches a step at most {:.1} × (1 ÷ (1 − share)); the latency rose {:.1} × with no queue at the server to amplify it: the pressure explains at most {:.0} % of it",
            self.bound,
            self.observed,
            self.explained * 100.0
        )
    }
}

/// Whether a pressure share that went `before` → `after` cannot explain a latency that rose
/// `observed` times (after ÷ before): `observed` beyond [`SLACK`] × [`max_stretch`], and the
/// server's own queue did not rise since `onset` without more arrivals ([`queue_amplifies`]).
/// `None` when it can (or the latency did not inflate).
pub fn insufficient(
    before: f64,
    after: f64,
    observed: f64,
    store: &EvidenceStore,
    onset: u32,
    now: u32,
) -> Option<Insufficient> {
    beyond(max_stretch(before, after), observed, store, onset, now)
}

/// Whether a latency that rose `observed` times is beyond what a contention that stretches a
/// step at most `bound` times can explain: `observed` beyond [`SLACK`] × `bound`, and the
/// server's own queue did not rise since `onset` without more arrivals ([`queue_amplifies`]).
/// `None` when it can. Shared by the node's PSI and the server's own CPU wait
/// ([`crate::cpu_wait`]).
pub fn beyond(
    bound: f64,
    observed: f64,
    store: &EvidenceStore,
    onset: u32,
    now: u32,
) -> Option<Insufficient> {
    if !observed.is_finite() || observed <= SLACK * bound || queue_amplifies(store, onset, now) {
        return None;
    }
    let explained = if observed > 1.0 {
        (bound.ln() / observed.ln()).clamp(0.0, 1.0)
    } else {
        1.0
    };
    Some(Insufficient {
        bound,
        observed,
        explained,
    })
}

/// Whether the server's own queue rose since `onset` while no more work arrived: requests
/// waiting (or running) up by at least 1 and 1.5 × their median over the 5 min before, with the
/// arrivals not risen (a queue that grew with the arrivals is the load's, not the pressure's).
/// `false` without the server's queue signals.
pub fn queue_amplifies(store: &EvidenceStore, onset: u32, now: u32) -> bool {
    use super::signal::Signal;
    if contradict::arrivals_rose(store, onset, now) == Some(true) {
        return false;
    }
    [Signal::ServerRequestsWaiting, Signal::ServerRequestsRunning]
        .into_iter()
        .any(|s| {
            let Some(series) = store.series(s) else {
                return false;
            };
            let mut before: Vec<f64> = series
                .range(onset.saturating_sub(300), onset.saturating_sub(5))
                .map(|(_, v)| v)
                .collect();
            let mut after: Vec<f64> = series
                .range(onset, now.saturating_add(1))
                .map(|(_, v)| v)
                .collect();
            let b = super::detector::median(&mut before).unwrap_or(0.0);
            let Some(a) = super::detector::median(&mut after) else {
                return false;
            };
            a - b >= 1.0 && a >= 1.5 * b
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Signal;
    use crate::report::{Cause, State, TargetDiagnosis};

    /// A canary-only target ([`crate::tests::canary_episode`]) and the node PSI cpu, 600 s calm
    /// then the fault; the first confirmed diagnosis (with its second from the fault), else the
    /// last.
    fn episode(calm: (f64, f64, f64), fault: (f64, f64, f64)) -> (u32, TargetDiagnosis) {
        crate::tests::canary_episode(calm, fault, |e, s, at, psi| {
            e.observe("t", Signal::NodeCpuPressure, at(f64::from(s) + 0.5), psi);
            e.observe("t", Signal::AgentCpu, at(f64::from(s) + 0.5), 0.01);
        })
    }

    #[test]
    fn a_pressure_too_small_for_the_slowdown_does_not_outscore_the_load() {
        // The e2e slowdown (TTFT 20 → 600 ms, TPOT 5 → 30 ms) while another test's model server
        // moved the node PSI 59 % → 85 % at the same second: at most 2.7 ×, the TTFT rose 30 ×.
        let (after, t) = episode((0.02, 0.005, 0.59), (0.6, 0.03, 0.85));
        assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
        assert!(after <= 60, "confirmed {after} s after the fault");
        assert_eq!(t.causes[0].cause, Cause::LoadSurge, "{t:#?}");
        assert!(t.causes[0].score >= 0.75, "{t:#?}");
        let psi = t
            .causes
            .iter()
            .find(|c| c.cause == Cause::NodeCpuPressure)
            .unwrap_or_else(|| panic!("{t:#?}"));
        assert!(psi.score < 0.5, "{psi:#?}");
        let rule = psi.evidence[0].rule.as_deref().unwrap_or("");
        assert!(
            rule.contains("at most 2.7 ×") && rule.contains("the latency rose 30"),
            "{rule}"
        );
    }

    #[test]
    fn a_pressure_that_can_stretch_the_step_that_much_is_still_the_cause() {
        // PSI 5 % → 80 % (at most 4.75 ×) and the latency 3 × (TTFT 40 → 120 ms, TPOT 5 → 15
        // ms): the node's CPU explains it.
        let (after, t) = episode((0.04, 0.005, 0.05), (0.12, 0.015, 0.8));
        assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
        assert!(after <= 60, "confirmed {after} s after the fault");
        assert_eq!(t.causes[0].cause, Cause::NodeCpuPressure, "{t:#?}");
        assert!(t.causes[0].score >= 0.75, "{t:#?}");
    }

    #[test]
    fn the_stretch_bound_is_the_ratio_of_the_free_shares() {
        assert!((max_stretch(0.0, 0.5) - 2.0).abs() < 1e-9);
        assert!((max_stretch(0.59, 0.85) - 0.41 / 0.15).abs() < 1e-9);
        // A share that fell bounds nothing below 1.
        assert_eq!(max_stretch(0.8, 0.2), 1.0);
        assert_eq!(max_stretch(0.1, 1.0), f64::INFINITY);
    }

    #[test]
    fn a_pressure_cannot_explain_a_far_larger_inflation_without_a_queue() {
        let store = EvidenceStore::new(Default::default(), Default::default());
        let store = &store;
        // 59 % → 85 %: at most 2.7 ×; the latency rose 30 ×.
        let i = insufficient(0.59, 0.85, 30.0, store, 1000, 1060).unwrap();
        assert!((i.bound - 2.733).abs() < 0.01, "{i:?}");
        assert!((i.explained - i.bound.ln() / 30_f64.ln()).abs() < 1e-9 && i.explained < 0.3);
        assert!(i.words("node PSI cpu").contains("at most 2.7 ×"));
        // Within 2 × of the bound it may explain it.
        assert_eq!(insufficient(0.59, 0.85, 5.0, store, 1000, 1060), None);
        // 5 % → 90 %: at most 9.5 ×, 30 × is beyond 2 × that.
        assert!(insufficient(0.05, 0.9, 30.0, store, 1000, 1060).is_some());
        assert_eq!(insufficient(0.05, 0.97, 30.0, store, 1000, 1060), None);
    }
}
