//! An outage ranks as its own root: a target whose canaries failed [`DOWN_AFTER`] times in a
//! row ([`crate::reachability`]) is an incident whenever that happens, baseline or not, and
//! the failed canaries are its evidence (`error_burst`: unreachable or failing, with the
//! first error). A restart seen during or after the outage (the server coming back) is its
//! child, never its root; a change well before the outage is not its cause either.
//!
//! Pure: the caller fills [`TargetDiagnosis::down`] and calls [`rank`] with the evaluation's
//! time.
//!
//! [`DOWN_AFTER`]: crate::reachability::DOWN_AFTER

use crate::reachability::Down;
use crate::report::{Cause, CauseScore, Evidence, State, TargetDiagnosis, clock, fmt_value};
use crate::signal::Signal;

/// The outage's own score: failed canaries in a row are direct evidence.
pub const OUTAGE_SCORE: f64 = 1.0;
/// A change this close before the outage's first failure, or any time after it, belongs to
/// the outage (the restart that ended it, seen once the server answered).
pub const CHILD_TOLERANCE_S: f64 = 5.0;
/// A change earlier than that is not the outage's cause: its score is capped here.
pub const EARLIER_CHANGE_CAP: f64 = 0.3;
/// An outage stays the open incident this long after the target answers again (as the
/// engine's `clear_after`): the restart read on the server's page once it answers is its
/// child, and the incident closes as any other does, not at the first answer.
pub const HOLD_AFTER_RECOVERY_S: f64 = 60.0;
/// The score of a server change seen during or right after an outage when the engine scored
/// none (without a baseline it scores no cause): an observed event, the outage's child.
pub const OBSERVED_CHANGE_SCORE: f64 = 0.9;

/// Causes that may cause an outage and stay above it when they moved (as the cause graph's
/// parents of `error_burst`): a GPU fault, an OOM kill.
const PARENTS: [Cause; 2] = [Cause::GpuFault, Cause::MemoryPressure];

/// Ranks `td`'s outage ([`TargetDiagnosis::down`]) at `now_unix_s`: `error_burst` first
/// with the failed canaries as its first evidence (below a GPU fault or an OOM kill that
/// moved with it, its parents), a `server_change` during or after the outage its child
/// (below it, its evidence carried by the outage), an earlier `server_change` capped at
/// [`EARLIER_CHANGE_CAP`] and marked contradicted. A target down now is an incident
/// (`root_confirmed`) whatever the engine's state. Nothing changes without `down`.
pub fn rank(td: &mut TargetDiagnosis, now_unix_s: f64) {
    let Some(down) = td.down.clone() else {
        return;
    };
    let lead = td.onset_unix_s.map(|o| o - down.since_unix_s);
    let evidence = outage_evidence(&down, lead);
    let burst = match td.causes.iter().position(|c| c.cause == Cause::ErrorBurst) {
        Some(i) => i,
        None => {
            td.causes.push(CauseScore {
                cause: Cause::ErrorBurst,
                score: 0.0,
                evidence: Vec::new(),
            });
            td.causes.len() - 1
        }
    };
    td.causes[burst].evidence.insert(0, evidence);
    let parent = td
        .causes
        .iter()
        .any(|c| PARENTS.contains(&c.cause) && c.score >= 0.5);
    let own = if parent {
        OUTAGE_SCORE - 0.05
    } else {
        OUTAGE_SCORE
    };
    td.causes[burst].score = td.causes[burst].score.max(own);
    for c in &mut td.causes {
        if PARENTS.contains(&c.cause) && c.score >= 0.5 {
            c.score = OUTAGE_SCORE;
        } else if c.cause != Cause::ErrorBurst {
            // While a target does not answer, nothing else is measured of it: any other
            // cause (a prompt mix that moved minutes before, a restart's empty cache) ranks
            // below the outage, listed with its evidence.
            c.score = c.score.min(own - 0.05).max(0.0);
        }
    }
    demote_changes(td, &down, own);
    let kept = |r: &Cause| *r == Cause::ErrorBurst || PARENTS.contains(r);
    if !td.roots.iter().all(kept) {
        let (roots, onsets): (Vec<Cause>, Vec<Option<f64>>) = td
            .roots
            .iter()
            .zip(td.root_onsets_unix_s.iter().chain(std::iter::repeat(&None)))
            .filter(|(r, _)| kept(r))
            .map(|(r, o)| (*r, *o))
            .unzip();
        td.roots = roots;
        td.root_onsets_unix_s = onsets;
    }
    if td.roots.len() < 2 {
        td.roots.clear();
        td.root_onsets_unix_s.clear();
    }
    if td.roots.is_empty() {
        td.causes
            .sort_by(|a, b| b.score.total_cmp(&a.score).then(a.cause.cmp(&b.cause)));
    }
    let open = down
        .recovered_unix_s
        .is_none_or(|up| now_unix_s - up < HOLD_AFTER_RECOVERY_S);
    if open && td.state != State::RootConfirmed {
        // Since the outage began: the same at every evaluation while it lasts.
        td.state = State::RootConfirmed;
        td.since_unix_s = Some(down.since_unix_s.min(now_unix_s));
    }
    td.onset_unix_s = Some(
        td.onset_unix_s
            .map_or(down.since_unix_s, |o| o.min(down.since_unix_s)),
    );
}

/// Adds the server changes `changes` (Unix seconds, kind; oldest first) from
/// [`CHILD_TOLERANCE_S`] before `down` on as evidence of the `server_change` cause: the count
/// of changes (0 → n) from the first, its rule their kinds (`restart`). Where the engine
/// scored no such cause (without a baseline it scores none) the cause is added at
/// [`OBSERVED_CHANGE_SCORE`]; where its evidence dates the changes from an earlier one (its
/// window holds an earlier outage's restart too), this evidence goes first. [`rank`] then
/// makes it the outage's child. Nothing when no change came in that window or the cause
/// already dates one there.
pub fn add_changes(td: &mut TargetDiagnosis, down: &Down, changes: &[(f64, &str)]) {
    let from = down.since_unix_s - CHILD_TOLERANCE_S;
    let within: Vec<&(f64, &str)> = changes.iter().filter(|(at, _)| *at >= from).collect();
    let Some(first) = within.first() else {
        return;
    };
    let mut kinds: Vec<&str> = within.iter().map(|(_, k)| *k).collect();
    kinds.dedup();
    let n = within.len() as f64;
    let evidence = Evidence {
        signal: Signal::ServerChange,
        before: 0.0,
        after: n,
        peak: n,
        z: 0.0,
        changed_at_unix_s: Some(first.0),
        lead_s: None,
        rule: Some(kinds.join(", ")),
        hw_ids: Vec::new(),
        source: None,
    };
    match td
        .causes
        .iter_mut()
        .find(|c| c.cause == Cause::ServerChange)
    {
        Some(c) => {
            let dated = c.evidence.iter().any(|e| {
                e.signal == Signal::ServerChange && e.changed_at_unix_s.is_some_and(|t| t >= from)
            });
            if !dated {
                c.evidence.insert(0, evidence);
            }
        }
        None => td.causes.push(CauseScore {
            cause: Cause::ServerChange,
            score: OBSERVED_CHANGE_SCORE,
            evidence: vec![evidence],
        }),
    }
}

/// The failed canaries as evidence of the outage: the error ratio 0 → 1 from its first
/// failure, the rule in words (`5 canaries failed in a row from 01:23:44 UTC: unreachable`;
/// the errors themselves are in [`TargetDiagnosis::down`] and the sentence).
fn outage_evidence(down: &Down, lead_s: Option<f64>) -> Evidence {
    Evidence {
        signal: Signal::Error,
        before: 0.0,
        after: 1.0,
        peak: 1.0,
        z: 0.0,
        changed_at_unix_s: Some(down.since_unix_s),
        lead_s,
        rule: Some(format!(
            "{} canaries failed in a row from {} UTC: {}",
            down.failed,
            clock(down.since_unix_s),
            down.kind.as_str()
        )),
        hw_ids: Vec::new(),
        source: None,
    }
}

/// `server_change` against the outage: changed during or after it (or within
/// [`CHILD_TOLERANCE_S`] before) → its child, below `outage` and its evidence carried by the
/// outage; earlier → capped at [`EARLIER_CHANGE_CAP`], its evidence marked contradicted.
fn demote_changes(td: &mut TargetDiagnosis, down: &Down, outage: f64) {
    let Some(i) = td
        .causes
        .iter()
        .position(|c| c.cause == Cause::ServerChange)
    else {
        return;
    };
    // When the server changed: its own evidence's dates (the engine also files the error
    // ratio under it, dated at the outage, which says nothing of when the server changed).
    let dates = |only_changes: bool| {
        td.causes[i]
            .evidence
            .iter()
            .filter(|e| !only_changes || e.signal == Signal::ServerChange)
            .filter_map(|e| e.changed_at_unix_s)
            .fold(None, |a: Option<f64>, t| Some(a.map_or(t, |a| a.max(t))))
    };
    let changed = dates(true).or_else(|| dates(false));
    let child = changed.is_none_or(|t| t >= down.since_unix_s - CHILD_TOLERANCE_S);
    if child {
        let c = &mut td.causes[i];
        c.score = c.score.min(outage - 0.05).max(0.0);
        let carried: Vec<Evidence> = c.evidence.clone();
        if let Some(b) = td.causes.iter_mut().find(|c| c.cause == Cause::ErrorBurst) {
            for e in carried {
                if !b.evidence.iter().any(|x| x.signal == e.signal) {
                    b.evidence.push(e);
                }
            }
        }
    } else {
        let c = &mut td.causes[i];
        c.score = c.score.min(EARLIER_CHANGE_CAP);
        let at = changed.map_or_else(String::new, |t| {
            format!(" at {} UTC, {:.0} s", clock(t), down.since_unix_s - t)
        });
        for e in &mut c.evidence {
            e.rule = Some(format!(
                "contradicted: changed{at} before the outage began; the outage has its own evidence"
            ));
        }
    }
}

/// The restart that ended (or came during) the outage, when [`rank`] made it its child: the
/// `server_change` cause whose change came from [`CHILD_TOLERANCE_S`] before the outage on.
pub fn restart_child<'a>(td: &'a TargetDiagnosis, down: &Down) -> Option<&'a Evidence> {
    td.causes
        .iter()
        .find(|c| c.cause == Cause::ServerChange && c.score >= 0.3)?
        .evidence
        .iter()
        .find(|e| {
            e.signal == Signal::ServerChange
                && e.changed_at_unix_s
                    .is_some_and(|t| t >= down.since_unix_s - CHILD_TOLERANCE_S)
        })
}

/// The sentence of a diagnosis whose first cause is the outage, in causal order: `error_burst
/// 1.00: target unreachable from 01:23:44 to 01:24:09 UTC (12 canaries failed): first
/// connection_refused: …; then server_change 0.95 (server changes 0 → 1 from 01:24:11); GPU,
/// network flat`. Never "errors flat": the failed canaries are the evidence. `None` when the
/// first cause is not the outage (a GPU fault or an OOM kill above it says it as usual).
pub fn line(td: &TargetDiagnosis) -> Option<String> {
    let down = td.down.as_ref()?;
    let top = td.causes.first().filter(|c| c.cause == Cause::ErrorBurst)?;
    let mut s = format!("error_burst {:.2}: target {}", top.score, down.words());
    if let Some(e) = restart_child(td, down) {
        let score = td
            .causes
            .iter()
            .find(|c| c.cause == Cause::ServerChange)
            .map_or(0.0, |c| c.score);
        s.push_str(&format!(
            "; then server_change {score:.2} ({} {} → {}",
            e.signal.words(),
            fmt_value(e.signal, e.before),
            fmt_value(e.signal, e.peak.max(e.after))
        ));
        if let Some(at) = e.changed_at_unix_s {
            s.push_str(&format!(" from {}", clock(at)));
        }
        s.push(')');
    }
    let flat = td.flat();
    if !flat.is_empty() {
        s.push_str(&format!("; {} flat", flat.join(", ")));
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reachability::{DownKind, ErrorNote};

    const T1: f64 = 1_700_000_000.0;

    fn note(at: f64) -> ErrorNote {
        ErrorNote {
            at_unix_s: at,
            error_type: "connection_refused".to_owned(),
            message: Some("connection refused".to_owned()),
        }
    }

    fn down(recovered: Option<f64>) -> Down {
        Down {
            kind: DownKind::Unreachable,
            since_unix_s: T1,
            failed: 12,
            since_start: false,
            first_error: note(T1),
            last_error: note(T1 + 24.0),
            recovered_unix_s: recovered,
        }
    }

    fn change(at: f64, score: f64) -> CauseScore {
        CauseScore {
            cause: Cause::ServerChange,
            score,
            evidence: vec![Evidence {
                signal: Signal::ServerChange,
                before: 0.0,
                after: 1.0,
                peak: 1.0,
                z: 0.0,
                changed_at_unix_s: Some(at),
                lead_s: None,
                rule: Some("restart".to_owned()),
                hw_ids: Vec::new(),
                source: None,
            }],
        }
    }

    fn diagnosis(state: State, causes: Vec<CauseScore>, d: Down) -> TargetDiagnosis {
        TargetDiagnosis {
            state,
            causes,
            down: Some(d),
            ..TargetDiagnosis::idle("t")
        }
    }

    /// The outage: killed at T1, back 25 s later; the restart (seen at T1 + 27 s) was
    /// the engine's only cause, confirmed at 0.90. The outage ranks first, the restart is its
    /// child, in causal order, and no "errors flat".
    #[test]
    fn an_outage_then_a_restart_is_the_outage_first_the_restart_its_child() {
        let mut td = diagnosis(
            State::RootConfirmed,
            vec![change(T1 + 27.0, 0.9)],
            down(Some(T1 + 25.0)),
        );
        td.onset_unix_s = Some(T1 + 40.0);
        rank(&mut td, T1 + 60.0);
        let order: Vec<(Cause, f64)> = td.causes.iter().map(|c| (c.cause, c.score)).collect();
        assert_eq!(
            order,
            [(Cause::ErrorBurst, 1.0), (Cause::ServerChange, 0.9)]
        );
        assert_eq!(td.onset_unix_s, Some(T1));
        let burst = &td.causes[0];
        assert_eq!(burst.evidence[0].signal, Signal::Error);
        assert_eq!(burst.evidence[0].changed_at_unix_s, Some(T1));
        assert_eq!(burst.evidence[0].lead_s, Some(40.0));
        assert_eq!(
            burst.evidence[0].rule.as_deref(),
            Some(
                format!(
                    "12 canaries failed in a row from {} UTC: unreachable",
                    clock(T1)
                )
                .as_str()
            )
        );
        assert!(
            burst
                .evidence
                .iter()
                .any(|e| e.signal == Signal::ServerChange)
        );
        let line = line(&td).unwrap();
        assert_eq!(
            line,
            format!(
                "error_burst 1.00: target unreachable from {} to {} UTC (12 canaries failed): first connection_refused: connection refused; then server_change 0.90 (server changes 0 → 1 from {}); GPU, network flat",
                clock(T1),
                clock(T1 + 25.0),
                clock(T1 + 27.0)
            )
        );
        assert!(!line.contains("errors flat"));
    }

    /// A target down now is an incident even while the engine learns its baseline (idle),
    /// and a restart minutes before this outage (the end of an earlier one) is no cause of
    /// it: capped, contradicted, not in the sentence.
    #[test]
    fn down_now_is_confirmed_and_an_earlier_restart_is_not_its_root() {
        let mut td = diagnosis(State::Idle, vec![change(T1 - 185.0, 1.0)], down(None));
        rank(&mut td, T1 + 10.0);
        assert_eq!(td.state, State::RootConfirmed);
        assert_eq!(td.since_unix_s, Some(T1));
        let order: Vec<(Cause, f64)> = td.causes.iter().map(|c| (c.cause, c.score)).collect();
        assert_eq!(
            order,
            [
                (Cause::ErrorBurst, 1.0),
                (Cause::ServerChange, EARLIER_CHANGE_CAP)
            ]
        );
        assert!(
            td.causes[1].evidence[0]
                .rule
                .as_deref()
                .is_some_and(|r| r.starts_with("contradicted: changed at ")
                    && r.contains(", 185 s before the outage began")),
            "{:?}",
            td.causes[1]
        );
        let line = line(&td).unwrap();
        assert!(
            line.starts_with("error_burst 1.00: target unreachable since ")
                && !line.contains("server_change"),
            "{line}"
        );
        // The outage's evidence is its failed canaries alone: the earlier restart is not carried.
        assert_eq!(td.causes[0].evidence.len(), 1);
    }

    /// A GPU fault that moved with the outage is its parent: it stays first.
    #[test]
    fn a_gpu_fault_stays_above_the_outage_it_caused() {
        let gpu = CauseScore {
            cause: Cause::GpuFault,
            score: 0.8,
            evidence: Vec::new(),
        };
        let mut td = diagnosis(State::RootConfirmed, vec![gpu], down(None));
        rank(&mut td, T1 + 10.0);
        let order: Vec<(Cause, f64)> = td.causes.iter().map(|c| (c.cause, c.score)).collect();
        assert_eq!(order, [(Cause::GpuFault, 1.0), (Cause::ErrorBurst, 0.95)]);
        assert_eq!(line(&td), None);
    }

    /// Inside the baseline the engine scores no cause: the restart read on the page after the
    /// outage is still its child (from the change events), and the incident stays open for
    /// the hold after the target answers again, then closes.
    #[test]
    fn without_a_baseline_the_observed_restart_is_the_outages_child_for_the_hold() {
        let up = T1 + 25.0;
        let mut td = diagnosis(State::Idle, Vec::new(), down(Some(up)));
        add_changes(
            &mut td,
            &down(Some(up)),
            &[(T1 - 90.0, "model"), (T1 + 26.0, "restart")],
        );
        rank(&mut td, up + 10.0);
        assert_eq!(td.state, State::RootConfirmed);
        let order: Vec<(Cause, f64)> = td.causes.iter().map(|c| (c.cause, c.score)).collect();
        assert_eq!(
            order,
            [
                (Cause::ErrorBurst, 1.0),
                (Cause::ServerChange, OBSERVED_CHANGE_SCORE)
            ]
        );
        let l = line(&td).unwrap();
        assert!(
            l.contains(&format!(
                "; then server_change 0.90 (server changes 0 → 1 from {})",
                clock(T1 + 26.0)
            )) && !l.contains("errors flat"),
            "{l}"
        );
        // After the hold the outage no longer opens an incident.
        let mut late = diagnosis(State::Idle, Vec::new(), down(Some(up)));
        rank(&mut late, up + HOLD_AFTER_RECOVERY_S + 1.0);
        assert_eq!(late.state, State::Idle);
        // After the baseline the engine's cause may date the changes from an earlier
        // outage's restart: the one in this outage goes first, so it is the child.
        let mut engine = diagnosis(
            State::RootConfirmed,
            vec![change(T1 - 120.0, 0.95)],
            down(Some(up)),
        );
        add_changes(
            &mut engine,
            &down(Some(up)),
            &[(T1 - 120.0, "restart"), (T1 + 26.0, "restart")],
        );
        rank(&mut engine, up + 5.0);
        let l = line(&engine).unwrap();
        assert!(
            l.contains(&format!(
                "then server_change 0.95 (server changes 0 → 1 from {})",
                clock(T1 + 26.0)
            )),
            "{l}"
        );
        // A change only before the outage (beyond the tolerance) adds nothing.
        let mut before = diagnosis(State::Idle, Vec::new(), down(None));
        add_changes(&mut before, &down(None), &[(T1 - 90.0, "restart")]);
        assert!(before.causes.is_empty());
    }

    /// Seen live after the baseline: the engine confirmed `long_prompts` (the restart's empty
    /// prompt cache moved the prompt ratio) beside the outage as two roots at 1.0. The outage
    /// ranks first; the other cause stays listed below it.
    #[test]
    fn another_engine_root_ranks_below_the_outage() {
        let prompts = CauseScore {
            cause: Cause::LongPrompts,
            score: 1.0,
            evidence: Vec::new(),
        };
        let burst = CauseScore {
            cause: Cause::ErrorBurst,
            score: 1.0,
            evidence: Vec::new(),
        };
        let mut td = diagnosis(State::RootConfirmed, vec![prompts, burst], down(None));
        td.roots = vec![Cause::LongPrompts, Cause::ErrorBurst];
        td.root_onsets_unix_s = vec![Some(T1 - 110.0), Some(T1)];
        rank(&mut td, T1 + 30.0);
        let order: Vec<(Cause, f64)> = td.causes.iter().map(|c| (c.cause, c.score)).collect();
        assert_eq!(
            order,
            [(Cause::ErrorBurst, 1.0), (Cause::LongPrompts, 0.95)]
        );
        assert!(td.roots.is_empty(), "{:?}", td.roots);
        assert!(line(&td).is_some_and(|l| l.starts_with("error_burst 1.00: target unreachable")));
    }

    /// Without an outage nothing changes.
    #[test]
    fn no_outage_no_change() {
        let mut td = diagnosis(State::Idle, vec![change(T1, 0.9)], down(None));
        td.down = None;
        let before = td.clone();
        rank(&mut td, T1);
        assert_eq!(td, before);
        assert_eq!(line(&td), None);
    }
}
