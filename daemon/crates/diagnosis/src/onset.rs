//! The incident's onset from its cause's own signal (issue 28).
//!
//! The symptom's onset is a CUSUM change point of the canary latency (or error ratio),
//! searched over the seconds just before the detection ([`crate::engine`]). It is late when a
//! mild fault took longer than that to show in the p99 (a GPU fault's XID 57 s before the
//! error ratio paged; node memory pressure 34 s before the TPOT did), and early when the
//! latency had an ordinary blip just before the fault (a load surge's requests running rose
//! 15 s after the canary's TTFT search found its change). Either way the sentence the on-call
//! reads ("server changes … 25 s after TTFT p99 …") put a cause after the spike it caused.
//!
//! When the ranked first cause is well supported, the incident began when its own signal
//! changed: the XID, the restart, the OOM kill, or the CUSUM change point of the earliest of its
//! signals that moved materially ([`Evidence::changed_at_unix_s`]). That second is taken as
//! the onset when it lies within [`MAX_EARLIER_S`] before the symptom's onset and not after
//! the symptom was detected (a change after the detection did not cause it). The caller scores
//! again from that onset and keeps it only when the same cause still ranks first.
//!
//! Pure: the caller passes the seconds.

use super::detector::median;
use super::report::{Cause, CauseScore, Evidence};
use super::signal::{Harm, Signal};
use super::store::SecondSeries;

/// How long before the symptom's onset a cause's own change may place the incident's onset
/// (s): a GPU fault's XID is searched up to 60 s before, and a mild fault's latency may take
/// a minute more to page.
pub const MAX_EARLIER_S: u32 = 120;

/// The score from which the first cause's own change places the onset (the engine's
/// `confirm_min`: its own signals moved materially).
pub const MIN_SCORE: f64 = 0.6;

/// The second (Unix s) at which the first cause of `causes` (highest first) changed, when it
/// may stand for the incident's onset: the cause scores ≥ [`MIN_SCORE`] and is not `unknown`,
/// and the first of its own signals to change (within [`MAX_EARLIER_S`] before the symptom's
/// onset) changed in `[symptom_onset − MAX_EARLIER_S, triggered]`: a KV cache that filled
/// before it preempted began the incident when it began to fill. `None` otherwise, or when it is the symptom's
/// onset already.
pub fn cause_onset(causes: &[CauseScore], symptom_onset: u32, triggered: u32) -> Option<u32> {
    let top = causes.first()?;
    if top.score < MIN_SCORE || top.cause == Cause::Unknown {
        return None;
    }
    let at = top
        .evidence
        .iter()
        .filter_map(Evidence::own_change)
        .filter(|&at| at.is_finite() && f64::from(symptom_onset) - at <= f64::from(MAX_EARLIER_S))
        .fold(None, |m: Option<f64>, at| Some(m.map_or(at, |m| m.min(at))))?;
    if !at.is_finite() || at < 0.0 {
        return None;
    }
    let at = at.floor().min(f64::from(u32::MAX)) as u32;
    (at.saturating_add(MAX_EARLIER_S) >= symptom_onset && at <= triggered && at != symptom_onset)
        .then_some(at)
}

/// The share of the symptom's move that an earlier onset must already show: the level of the
/// symptom's series over `[at, symptom_onset)` at least half way from its level before `at`
/// to its level since `symptom_onset`.
pub const EARLY_SHARE: f64 = 0.5;

/// The seconds before `at` whose level is the symptom's baseline here (5 min).
const BEFORE_S: u32 = 300;

/// Whether the symptom's own `series` (of `signal`) had already moved between a cause's
/// change `at` and the symptom's onset: its level (the median of its seconds; the mean for
/// ratios, flags and counts) over `[at, symptom_onset)` is at least [`EARLY_SHARE`] of the way
/// from its level over the 5 min before `at` to its level over `[symptom_onset, now]`, in
/// the harmful direction. A restart a minute before a later slowdown is its precursor, not its
/// onset; a mild fault's error ratio that paged a minute after its XID moved at the XID.
pub fn moved_early(
    signal: Signal,
    series: &SecondSeries,
    at: u32,
    symptom_onset: u32,
    now: u32,
) -> bool {
    if at >= symptom_onset {
        return false;
    }
    let ratio = signal.mean_over_window();
    let level = |from: u32, to: u32| -> Option<f64> {
        let mut v: Vec<f64> = series.range(from, to).map(|(_, v)| v).collect();
        if ratio {
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        } else {
            median(&mut v)
        }
    };
    let sign = if signal.harm() == Harm::Down {
        -1.0
    } else {
        1.0
    };
    let (Some(before), Some(between), Some(since)) = (
        level(at.saturating_sub(BEFORE_S), at),
        level(at, symptom_onset),
        level(symptom_onset, now.saturating_add(1)),
    ) else {
        return false;
    };
    let total = sign * (since - before);
    total > 0.0 && sign * (between - before) >= EARLY_SHARE * total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(signal: Signal, at: Option<f64>, rule: Option<&str>) -> Evidence {
        Evidence {
            signal,
            before: 0.0,
            after: 1.0,
            peak: 1.0,
            z: 5.0,
            changed_at_unix_s: at,
            lead_s: None,
            rule: rule.map(str::to_owned),
            hw_ids: Vec::new(),
            source: None,
        }
    }

    fn cause(c: Cause, score: f64, evidence: Vec<Evidence>) -> Vec<CauseScore> {
        vec![CauseScore {
            cause: c,
            score,
            evidence,
        }]
    }

    #[test]
    fn a_fault_event_before_a_late_symptom_is_the_onset() {
        // An XID at 1000; the error ratio's onset was placed at 1057, detected at 1071.
        let c = cause(
            Cause::GpuFault,
            0.9,
            vec![ev(Signal::GpuFault, Some(1000.0), Some("XID"))],
        );
        assert_eq!(cause_onset(&c, 1057, 1071), Some(1000));
    }

    #[test]
    fn a_cause_that_changed_after_an_early_latency_onset_moves_it_later() {
        let c = cause(
            Cause::LoadSurge,
            0.75,
            vec![ev(Signal::ServerRequestsRunning, Some(1015.0), None)],
        );
        assert_eq!(cause_onset(&c, 1000, 1041), Some(1015));
    }

    #[test]
    fn weak_late_distant_or_contradicted_changes_keep_the_symptom_onset() {
        let own = |at: f64| vec![ev(Signal::NodeMemoryPressure, Some(at), None)];
        // Too weak.
        assert_eq!(
            cause_onset(&cause(Cause::MemoryPressure, 0.5, own(990.0)), 1000, 1040),
            None
        );
        // After the detection: it did not cause the symptom.
        assert_eq!(
            cause_onset(&cause(Cause::MemoryPressure, 0.9, own(1045.0)), 1000, 1040),
            None
        );
        // Too long before (a restart 10 min earlier).
        assert_eq!(
            cause_onset(&cause(Cause::MemoryPressure, 0.9, own(400.0)), 1000, 1040),
            None
        );
        // Unknown, latency evidence and contradictions are not a cause's own change.
        assert_eq!(
            cause_onset(&cause(Cause::Unknown, 1.0, own(990.0)), 1000, 1040),
            None
        );
        let lat = vec![
            ev(Signal::Ttft, Some(990.0), None),
            ev(
                Signal::ServerRequestsWaiting,
                Some(985.0),
                Some("contradicted: no queue"),
            ),
        ];
        assert_eq!(
            cause_onset(&cause(Cause::LoadSurge, 0.8, lat), 1000, 1040),
            None
        );
    }
}
