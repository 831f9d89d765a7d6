//! Early warnings: a cause whose hard rule holds while the latency moved less than the
//! symptom threshold (the KV cache full with preemptions, the GPU throttled, a GPU fault)
//! is the `warning` state of its target: said in the diagnosis, the scorecard and the state
//! gauge, never a page and never `root_confirmed`. The on-call sees the KV cache filling
//! before the P99 pages them (issue 28, item 5).
//!
//! A rule holds over the last [`WINDOW_S`] seconds, most of them ([`HOLD_SHARE`] of the
//! scrapes), so one scrape at 0.96 is no warning. A node-wide pressure (PSI cpu or memory)
//! warns a target only when its latency moved ([`latency_moved`]) or the PSI rose well above
//! its own baseline ([`psi_rose`]): on a machine that is always busy the PSI alone says nothing
//! about this target. Pure: the caller passes the seconds.

use super::report::{Cause, CauseScore, Evidence};
use super::signal::Signal;
use super::store::EvidenceStore;

/// The seconds a warning rule is judged over.
pub const WINDOW_S: u32 = 30;
/// The share of the window's samples the level must hold in.
pub const HOLD_SHARE: f64 = 0.5;
/// A warning's score: the hard rule's (a warning is a rule, not a change).
pub const WARNING_SCORE: f64 = 0.85;
/// Baseline seconds before the window, for the evidence's `before`.
const BEFORE_S: u32 = 300;

/// The seconds of `s` in `[from, to)`.
fn values(store: &EvidenceStore, s: Signal, from: u32, to: u32) -> Vec<(u32, f64)> {
    store
        .series(s)
        .map(|x| x.range(from, to).collect())
        .unwrap_or_default()
}

fn median(mut v: Vec<f64>) -> f64 {
    super::detector::median(&mut v).unwrap_or(0.0)
}

/// Evidence of `s` over the window: median before, median (or mean for ratios) in it, peak.
fn evidence(store: &EvidenceStore, s: Signal, from: u32, to: u32, rule: String) -> Evidence {
    let now: Vec<f64> = values(store, s, from, to).iter().map(|p| p.1).collect();
    let before = median(
        values(store, s, from.saturating_sub(BEFORE_S), from)
            .iter()
            .map(|p| p.1)
            .collect(),
    );
    let after = if s.mean_over_window() {
        now.iter().sum::<f64>() / now.len().max(1) as f64
    } else {
        median(now.clone())
    };
    Evidence {
        signal: s,
        before,
        after,
        peak: now.iter().copied().fold(0.0, f64::max),
        z: 0.0,
        changed_at_unix_s: values(store, s, from, to).first().map(|p| f64::from(p.0)),
        lead_s: None,
        rule: Some(rule),
        hw_ids: Vec::new(),
        source: None,
    }
}

/// Whether at least [`HOLD_SHARE`] of the window's samples of `s` satisfy `ok` (false without
/// a sample).
fn holds(store: &EvidenceStore, s: Signal, from: u32, to: u32, ok: impl Fn(f64) -> bool) -> bool {
    let v = values(store, s, from, to);
    !v.is_empty() && v.iter().filter(|p| ok(p.1)).count() as f64 >= HOLD_SHARE * v.len() as f64
}

/// How much a target's latency must have moved for a node-wide pressure (PSI) to warn about it:
/// the window's median TTFT or TPOT (1 s p99s) at least this many times its median over the
/// [`BEFORE_S`] before (and by half the signal's floor). Below the symptom's 1.5 ×.
pub const LATENCY_MOVED_RATIO: f64 = 1.2;
/// How far a node PSI must rise above its own baseline (its median over the [`BASELINE_S`]
/// before the window) to warn without the latency moving: + this much (absolute share of
/// time) and at least [`PSI_RISE_RATIO`] × the baseline.
pub const PSI_RISE: f64 = 0.15;
/// See [`PSI_RISE`].
pub const PSI_RISE_RATIO: f64 = 2.0;
/// The PSI baseline's seconds before the window (the store's 30 min, less the window).
const BASELINE_S: u32 = 1800 - WINDOW_S;
/// Baseline seconds a PSI needs before its rise counts (a fresh agent has no baseline: then
/// only a latency move makes a PSI warning).
const MIN_BASELINE_SAMPLES: usize = 60;

/// Whether the target's TTFT or TPOT moved in `[from, to)` ([`LATENCY_MOVED_RATIO`]).
pub fn latency_moved(store: &EvidenceStore, from: u32, to: u32) -> bool {
    [Signal::Ttft, Signal::Tpot].into_iter().any(|s| {
        let now: Vec<f64> = values(store, s, from, to).iter().map(|p| p.1).collect();
        let before: Vec<f64> = values(store, s, from.saturating_sub(BEFORE_S), from)
            .iter()
            .map(|p| p.1)
            .collect();
        if now.is_empty() || before.is_empty() {
            return false;
        }
        let (after, before) = (median(now), median(before));
        before > 0.0 && after >= LATENCY_MOVED_RATIO * before && after - before >= s.floor() / 2.0
    })
}

/// Whether the node PSI `s` in `[from, to)` rose well above its own baseline ([`PSI_RISE`]).
pub fn psi_rose(store: &EvidenceStore, s: Signal, from: u32, to: u32) -> bool {
    let now: Vec<f64> = values(store, s, from, to).iter().map(|p| p.1).collect();
    let before: Vec<f64> = values(store, s, from.saturating_sub(BASELINE_S), from)
        .iter()
        .map(|p| p.1)
        .collect();
    if now.is_empty() || before.len() < MIN_BASELINE_SAMPLES {
        return false;
    }
    let (after, before) = (median(now), median(before));
    after >= before + PSI_RISE && after >= PSI_RISE_RATIO * before
}

/// The causes whose hard rule holds over the [`WINDOW_S`] seconds before `now`, each with its
/// evidence; empty when none does.
pub fn early_warnings(store: &EvidenceStore, now: u32) -> Vec<CauseScore> {
    let (from, to) = (now.saturating_sub(WINDOW_S), now.saturating_add(1));
    let mut out = Vec::new();
    let events = |s: Signal| {
        values(store, s, from, to)
            .iter()
            .map(|p| p.1)
            .filter(|v| *v > 0.0)
            .sum::<f64>()
    };
    // KV ≥ 0.95 with preemptions.
    let preempted = events(Signal::ServerPreemptions);
    if preempted > 0.0 && holds(store, Signal::ServerKvUsage, from, to, |v| v >= 0.95) {
        out.push(CauseScore {
            cause: Cause::KvCachePressure,
            score: WARNING_SCORE,
            evidence: vec![
                evidence(
                    store,
                    Signal::ServerKvUsage,
                    from,
                    to,
                    format!("KV usage ≥ 0.95 for most of the last {WINDOW_S} s"),
                ),
                evidence(
                    store,
                    Signal::ServerPreemptions,
                    from,
                    to,
                    format!("preemptions in the last {WINDOW_S} s"),
                ),
            ],
        });
    }
    // Throttle reasons set.
    if holds(store, Signal::GpuThrottle, from, to, |v| v >= 0.5) {
        out.push(CauseScore {
            cause: Cause::GpuThrottling,
            score: WARNING_SCORE,
            evidence: vec![evidence(
                store,
                Signal::GpuThrottle,
                from,
                to,
                "throttle reasons set (thermal / power / HW slowdown)".to_owned(),
            )],
        });
    }
    // The model server's cgroup at its CPU quota.
    if holds(store, Signal::CgroupCpuThrottled, from, to, |v| v >= 0.25) {
        out.push(CauseScore {
            cause: Cause::CpuThrottling,
            score: WARNING_SCORE,
            evidence: vec![evidence(
                store,
                Signal::CgroupCpuThrottled,
                from,
                to,
                "CPU periods throttled ≥ 25 %".to_owned(),
            )],
        });
    }
    // The node's CPUs contended (PSI), unless the agent itself is the load, and only when it
    // concerns this target: its latency moved, or the PSI rose well above its own baseline (a
    // machine that is always busy has a high PSI and no warning).
    let agent_busy = values(store, Signal::AgentCpu, from, to)
        .iter()
        .any(|p| p.1 >= 0.5);
    let latency = latency_moved(store, from, to);
    if !agent_busy
        && holds(store, Signal::NodeCpuPressure, from, to, |v| v >= 0.25)
        && (latency || psi_rose(store, Signal::NodeCpuPressure, from, to))
    {
        out.push(CauseScore {
            cause: Cause::NodeCpuPressure,
            score: WARNING_SCORE,
            evidence: vec![evidence(
                store,
                Signal::NodeCpuPressure,
                from,
                to,
                "node PSI cpu some avg10 ≥ 25 %".to_owned(),
            )],
        });
    }
    // Memory: an OOM kill, PSI memory, or the cgroup at its limit.
    let oom = events(Signal::CgroupOomKill) > 0.0;
    let psi_mem = holds(store, Signal::NodeMemoryPressure, from, to, |v| v >= 0.1)
        && (latency || psi_rose(store, Signal::NodeMemoryPressure, from, to));
    let near_limit = holds(store, Signal::CgroupMemoryUsage, from, to, |v| v >= 0.95);
    if oom || psi_mem || near_limit {
        let mut ev = Vec::new();
        if oom {
            ev.push(evidence(
                store,
                Signal::CgroupOomKill,
                from,
                to,
                "OOM kill in the model server's cgroup".to_owned(),
            ));
        }
        if psi_mem {
            ev.push(evidence(
                store,
                Signal::NodeMemoryPressure,
                from,
                to,
                "node PSI memory some avg10 ≥ 10 %".to_owned(),
            ));
        }
        if near_limit {
            ev.push(evidence(
                store,
                Signal::CgroupMemoryUsage,
                from,
                to,
                "cgroup memory ≥ 95 % of its limit".to_owned(),
            ));
        }
        out.push(CauseScore {
            cause: Cause::MemoryPressure,
            score: WARNING_SCORE,
            evidence: ev,
        });
    }
    // An XID / ECC / lost event.
    if events(Signal::GpuFault) > 0.0 {
        out.push(CauseScore {
            cause: Cause::GpuFault,
            score: WARNING_SCORE,
            evidence: vec![evidence(
                store,
                Signal::GpuFault,
                from,
                to,
                "XID / ECC / GPU lost event".to_owned(),
            )],
        });
    }
    out
}

/// The warning line: `warning: kv_cache_pressure: KV usage 0.30 → 0.97 [rule]; TPOT p99
/// 1.38 × its baseline (a symptom needs 1.5 ×)`. `moved` are the latency ratios of the newest
/// buckets (signal, ratio to the baseline), when known.
pub fn line(causes: &[CauseScore], moved: &[(Signal, f64)], symptom_ratio: f64) -> Option<String> {
    let top = causes.first()?;
    let mut s = format!("warning: {}", top.cause.as_str());
    if let Some(e) = top.evidence.first() {
        s.push_str(&format!(
            ": {} {} → {}",
            e.signal.words(),
            super::report::fmt_value(e.signal, e.before),
            super::report::fmt_value(e.signal, e.peak.max(e.after))
        ));
        if let Some(r) = &e.rule {
            s.push_str(&format!(" ({r})"));
        }
    }
    for c in &causes[1..] {
        s.push_str(&format!("; also {}", c.cause.as_str()));
    }
    let parts: Vec<String> = moved
        .iter()
        .map(|(sig, r)| format!("{} p99 {r:.2} ×", sig.words()))
        .collect();
    if !parts.is_empty() {
        s.push_str(&format!(
            "; {} its baseline (a symptom needs {symptom_ratio:.1} ×): no page yet",
            parts.join(", ")
        ));
    }
    Some(s)
}

/// The factor a latency symptom's absolute floor is multiplied by while strong cause evidence
/// holds ([`corroborated`]): a +40 ms kernel RTT moves the TTFT by +40 ms, under the 50 ms
/// floor, while the cause is certain at once.
pub const CORROBORATED_FLOOR: f64 = 0.5;

/// Whether strong cause evidence holds over the [`WINDOW_S`] seconds before `now`: an early
/// warning's hard rule, or the kernel RTT's median ≥ 2 × and +5 ms above its median over the
/// 5 min before the window.
pub fn corroborated(store: &EvidenceStore, now: u32) -> bool {
    !early_warnings(store, now).is_empty() || rtt_rose(store, now)
}

/// Whether the kernel RTT's median over the [`WINDOW_S`] seconds before `now` is ≥ 2 × and
/// +5 ms above its median over the 5 min before the window: a delay the canary's TTFT carries
/// whole, so the symptom's ratio relaxes as its floor does (a +40 ms round trip on a 70 ms
/// TTFT is a 1.5 × median and under 1.5 × at the p99).
pub fn rtt_rose(store: &EvidenceStore, now: u32) -> bool {
    let from = now.saturating_sub(WINDOW_S);
    let recent: Vec<f64> = values(store, Signal::NetSrtt, from, now.saturating_add(1))
        .iter()
        .map(|p| p.1)
        .collect();
    let before: Vec<f64> = values(store, Signal::NetSrtt, from.saturating_sub(BEFORE_S), from)
        .iter()
        .map(|p| p.1)
        .collect();
    if recent.is_empty() || before.is_empty() {
        return false;
    }
    let (after, before) = (median(recent), median(before));
    before > 0.0 && after >= 2.0 * before && after - before >= 0.005
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use crate::report::{Cause, State};
    use crate::{Engine, EngineConfig, Signal};

    const T0: u64 = 1_700_000_000;

    fn at(s: f64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs_f64(T0 as f64 + s)
    }

    /// `secs` seconds of a target with 2 canaries a second (TTFT `ttft(s)`, TPOT 20 ms) and the
    /// node PSI cpu `psi(s)`; the states of every evaluation.
    fn run(secs: u32, ttft: impl Fn(u32) -> f64, psi: impl Fn(u32) -> f64) -> Vec<State> {
        let mut e = Engine::new(EngineConfig::default());
        let mut states = Vec::new();
        for s in 0..secs {
            // A deterministic wobble of ±10 %.
            let wobble = 1.0 + 0.1 * (f64::from(s % 7) - 3.0) / 3.0;
            for half in [0.0, 0.5] {
                let t = f64::from(s) + half;
                e.observe("t", Signal::Ttft, at(t), ttft(s) * wobble);
                e.observe("t", Signal::Tpot, at(t), 0.02 * wobble);
                e.observe("t", Signal::E2e, at(t), ttft(s) * wobble + 0.3);
                e.observe("t", Signal::Error, at(t), 0.0);
            }
            e.observe(
                "t",
                Signal::NodeCpuPressure,
                at(f64::from(s) + 0.25),
                psi(s),
            );
            e.observe("t", Signal::AgentCpu, at(f64::from(s) + 0.25), 0.01);
            let d = e.evaluate(at(f64::from(s) + 1.0));
            let t = &d.targets[0];
            if t.state == State::Warning {
                assert_eq!(t.causes[0].cause, Cause::NodeCpuPressure, "{:?}", t.causes);
            }
            states.push(t.state);
        }
        states
    }

    #[test]
    fn node_psi_alone_on_an_always_busy_machine_is_no_warning() {
        // PSI cpu some 40–60 % for 20 min (a machine that is always busy), the latency flat.
        let psi = |s: u32| 0.4 + 0.2 * f64::from(s % 11) / 10.0;
        let states = run(1200, |_| 0.1, psi);
        assert!(
            states.iter().all(|s| *s == State::Idle),
            "{:?}",
            states.iter().filter(|s| **s != State::Idle).count()
        );
    }

    #[test]
    fn node_psi_warns_when_the_latency_moved_or_the_psi_rose_above_its_baseline() {
        let busy = |s: u32| 0.4 + 0.2 * f64::from(s % 11) / 10.0;
        // The same busy machine; from 600 s the TTFT +30 % (under the symptom's 1.5 ×).
        let states = run(700, |s| if s >= 600 { 0.13 } else { 0.1 }, busy);
        let first = states.iter().position(|s| *s == State::Warning);
        assert!(
            first.is_some_and(|i| (600..=660).contains(&i)),
            "first warning at {first:?}"
        );
        assert!(states[..600].iter().all(|s| *s == State::Idle));
        // A calm machine (PSI 5 %) whose PSI rises to 80 % at 600 s, the latency flat.
        let states = run(700, |_| 0.1, |s| if s >= 600 { 0.8 } else { 0.05 });
        let first = states.iter().position(|s| *s == State::Warning);
        assert!(
            first.is_some_and(|i| (600..=660).contains(&i)),
            "first warning at {first:?}"
        );
        // The busy machine's PSI up by 10 points only (below +15 and 2 ×): no warning.
        let states = run(700, |_| 0.1, |s| busy(s) + if s >= 600 { 0.1 } else { 0.0 });
        assert!(states.iter().all(|s| *s == State::Idle));
    }
}
