//! The model server's own CPU wait as evidence of `node_cpu_pressure` (issue 28): a neighbour
//! that takes the node's CPUs makes the server's threads wait, runnable, for a CPU.
//!
//! The node's PSI cpu `some` is the share of time *some* task waited: on a node busy with
//! other work it already sits near 100 % and cannot rise when a neighbour starts (seen live:
//! 0.98 before two busy loops began, the server 10 × slower, the PSI flat).
//! [`Signal::ServerCpuWait`] is the server's view: the seconds per second its own threads
//! waited. With its CPU use `c` (cores, [`Signal::ServerCpu`]) and its wait `w` (s/s), its CPU
//! work takes `(c + w) ÷ c` times as long as on a free CPU ([`stretch`]); a step that is wholly
//! CPU work stretches from `s₀` before to `s₁` after by at most `s₁ ÷ s₀`, which bounds what the
//! rule may take credit for ([`insufficient`], as [`crate::pressure`] does for the PSI).
//!
//! - **Check** (`rule`): the wait rose by at least its floor (0.05 s/s) and 1.5 × since the
//!   onset ([`MIN_RISE_RATIO`]) and, where the server's CPU use is known, its CPU work stretches
//!   at least [`MIN_STRETCH`] × and [`MIN_STRETCH_GROWTH`] × more than before.
//! - **Not the node's** ([`quota_explains`]): CFS-throttled time counts as run delay too (a
//!   throttled cgroup's threads stay runnable); when the server cgroup's throttled share rose
//!   with the wait, the wait is its quota's (`cpu_throttling`), not a neighbour's.
//! - The agent's own CPU is kept out by the `node_cpu_pressure` contradiction
//!   ([`crate::contradict`]: the agent's CPU use up half a core).
//!
//! Pure: the caller passes the seconds.

use super::detector::median;
use super::pressure::{self, Insufficient};
use super::signal::Signal;
use super::store::EvidenceStore;

/// How much the wait must have risen against before (after ≥ this × before).
pub const MIN_RISE_RATIO: f64 = 1.5;
/// The stretch of the server's CPU work the rule needs after the onset.
pub const MIN_STRETCH: f64 = 1.5;
/// How much more the CPU work must stretch after the onset than before.
pub const MIN_STRETCH_GROWTH: f64 = 1.25;

/// `(c + w) ÷ c`: how many times as long the server's CPU work takes as on a free CPU, for a
/// CPU use of `cpu_cores` and a wait of `wait` s/s; `None` without CPU use.
pub fn stretch(cpu_cores: f64, wait: f64) -> Option<f64> {
    (cpu_cores > 0.0 && wait >= 0.0).then(|| (cpu_cores + wait) / cpu_cores)
}

fn median_in(store: &EvidenceStore, s: Signal, from: u32, to: u32) -> Option<f64> {
    let mut v: Vec<f64> = store.series(s)?.range(from, to).map(|(_, x)| x).collect();
    median(&mut v)
}

/// The server's CPU use before (the 5 min before `onset`, less the guard) and after (since
/// `onset`), medians of [`Signal::ServerCpu`].
fn cpu_use(store: &EvidenceStore, onset: u32, now: u32) -> Option<(f64, f64)> {
    let before = median_in(
        store,
        Signal::ServerCpu,
        onset.saturating_sub(300),
        onset.saturating_sub(5),
    )?;
    let after = median_in(store, Signal::ServerCpu, onset, now.saturating_add(1))?;
    Some((before, after))
}

/// The stretches before and after (`s₀`, `s₁`), for a wait that went `before` → `after`.
fn stretches(
    before: f64,
    after: f64,
    store: &EvidenceStore,
    onset: u32,
    now: u32,
) -> Option<(f64, f64, f64)> {
    let (c0, c1) = cpu_use(store, onset, now)?;
    Some((stretch(c0, before)?, stretch(c1, after)?, c1))
}

/// Why the server's wait is its CFS quota's, in words: its cgroup's throttled share (mean since
/// `onset`) rose by [`super::contradict::THROTTLE_RISE`] against the 5 min before, a model server's
/// (`cpu_throttling`) or, on a router target, the router's (`router_overhead`). `None` when it
/// did not, or without the signal (no quota, no cgroup).
pub fn quota_explains(store: &EvidenceStore, onset: u32, now: u32) -> Option<String> {
    [
        (Signal::CgroupCpuThrottled, "cpu_throttling"),
        (Signal::RouterCpuThrottled, "router_overhead"),
    ]
    .into_iter()
    .find_map(|(s, cause)| {
        let (before, after) = super::contradict::throttle_rose(store, s, onset, now)?;
        Some(format!(
            "its cgroup's throttled CFS periods rose {:.0} % → {:.0} % with it: the wait is its CPU quota's ({cause})",
            before * 100.0,
            after * 100.0
        ))
    })
}

/// The check, in words, when the server's CPU wait that went `before` → `after` (s/s, medians)
/// says a neighbour takes the CPU; `None` when it does not. The caller has already left out a
/// wait the quota explains ([`quota_explains`]).
pub fn rule(
    before: f64,
    after: f64,
    store: &EvidenceStore,
    onset: u32,
    now: u32,
) -> Option<String> {
    if after - before < Signal::ServerCpuWait.floor() || after < MIN_RISE_RATIO * before {
        return None;
    }
    match stretches(before, after, store, onset, now) {
        Some((s0, s1, c1)) => (s1 >= MIN_STRETCH && s1 >= MIN_STRETCH_GROWTH * s0).then(|| {
            format!(
                "the model server's threads waited for a CPU {before:.2} → {after:.2} s per second while running on {c1:.2} cores: its CPU work takes {s1:.1} × as long as on a free CPU (was {s0:.1} ×): something else on the node takes its CPUs"
            )
        }),
        None => Some(format!(
            "the model server's threads waited for a CPU {before:.2} → {after:.2} s per second (its CPU use unknown): something else on the node takes its CPUs"
        )),
    }
}

/// The magnitude check: whether a wait that went `before` → `after` cannot explain a latency
/// that rose `observed` times (its CPU work stretched `s₁ ÷ s₀` at most, [`pressure::beyond`]),
/// with the words of the evidence. `None` when it can, or without the server's CPU use (no
/// bound).
pub fn insufficient(
    before: f64,
    after: f64,
    observed: f64,
    store: &EvidenceStore,
    onset: u32,
    now: u32,
) -> Option<(Insufficient, String)> {
    let (s0, s1, _) = stretches(before, after, store, onset, now)?;
    let i = pressure::beyond((s1 / s0).max(1.0), observed, store, onset, now)?;
    let words = format!(
        "the model server's CPU wait {before:.2} → {after:.2} s/s stretches its CPU work at most {:.1} × ((c + w) ÷ c, {s0:.1} × → {s1:.1} ×); the latency rose {:.1} × with no queue at the server to amplify it: the wait explains at most {:.0} % of it",
        i.bound,
        i.observed,
        i.explained * 100.0
    );
    Some((i, words))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Cause, State, TargetDiagnosis};

    /// A canary-only target ([`crate::tests::canary_episode`]) on a node whose PSI cpu sits at
    /// 0.97 throughout (other work), its server's CPU use and wait and its cgroup's throttled
    /// share per second, 600 s calm then the fault; the first confirmed diagnosis (its second
    /// from the fault), else the last.
    fn episode(
        calm: (f64, f64, f64, f64, f64),
        fault: (f64, f64, f64, f64, f64),
    ) -> (u32, TargetDiagnosis) {
        let split = |(ttft, tpot, cpu, wait, throttled)| (ttft, tpot, (cpu, wait, throttled));
        crate::tests::canary_episode(split(calm), split(fault), |e, s, at, p| {
            let (cpu, wait, throttled): (f64, f64, f64) = p;
            let x = at(f64::from(s) + 0.5);
            let wobble = 1.0 + 0.1 * (f64::from(s % 5) - 2.0) / 2.0;
            e.observe("t", Signal::NodeCpuPressure, x, 0.97);
            e.observe("t", Signal::AgentCpu, x, 0.01);
            e.observe("t", Signal::ServerCpu, x, cpu * wobble);
            e.observe("t", Signal::ServerCpuWait, x, wait * wobble);
            e.observe("t", Signal::CgroupCpuThrottled, x, throttled);
        })
    }

    #[test]
    fn a_neighbour_on_a_node_already_at_full_psi_is_named_by_the_servers_wait() {
        // The server runs 0.5 cores and waits 0.2 s/s (1.4 ×); a neighbour: 0.3 cores, 0.9 s/s
        // waiting (4 ×); TTFT 40 → 120 ms, TPOT 5 → 15 ms (3 ×). The node's PSI stays 97 %.
        let (after, t) = episode((0.04, 0.005, 0.5, 0.2, 0.0), (0.12, 0.015, 0.3, 0.9, 0.0));
        assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
        assert!(after <= 60, "confirmed {after} s after the fault");
        assert_eq!(t.causes[0].cause, Cause::NodeCpuPressure, "{t:#?}");
        let e = t.causes[0]
            .evidence
            .iter()
            .find(|e| e.signal == Signal::ServerCpuWait)
            .unwrap_or_else(|| panic!("{t:#?}"));
        let rule = e.rule.as_deref().unwrap_or("");
        assert!(
            rule.contains("0.20 → 0.90 s per second") && rule.contains("4.0 × as long"),
            "{rule}"
        );
    }

    #[test]
    fn a_wait_that_rose_with_the_cgroups_throttling_is_the_quotas() {
        // The same wait, but the server's cgroup is throttled 0 → 90 % of its periods.
        let (_, t) = episode((0.04, 0.005, 0.5, 0.2, 0.0), (0.12, 0.015, 0.3, 0.9, 0.9));
        assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
        assert_eq!(t.causes[0].cause, Cause::CpuThrottling, "{t:#?}");
        assert!(
            t.causes
                .iter()
                .filter(|c| c.cause == Cause::NodeCpuPressure)
                .all(|c| c.score < 0.5),
            "{t:#?}"
        );
    }

    #[test]
    fn a_wait_too_small_for_the_slowdown_takes_no_credit_for_it() {
        // 1.4 × → 1.8 × (at most 1.3 ×) while the latency rose 15 ×, no queue: the wait cannot
        // explain it.
        let (_, t) = episode((0.04, 0.005, 0.5, 0.2, 0.0), (0.6, 0.075, 0.5, 0.4, 0.0));
        let c = t
            .causes
            .iter()
            .find(|c| c.cause == Cause::NodeCpuPressure)
            .unwrap_or_else(|| panic!("{t:#?}"));
        assert!(c.score < 0.5, "{c:#?}");
        let rule = c.evidence[0].rule.as_deref().unwrap_or("");
        assert!(rule.contains("at most 1.3 ×"), "{rule}");
    }

    #[test]
    fn the_stretch_of_cpu_work() {
        assert_eq!(stretch(0.5, 0.5), Some(2.0));
        assert_eq!(stretch(1.0, 0.0), Some(1.0));
        assert_eq!(stretch(0.0, 0.3), None);
    }
}
