//! The offline evaluation of the diagnosis engine over an episode corpus (RCAEval's metrics):
//! AC@k, the share of fault episodes whose injected cause is among the first k causes ranked;
//! the time from the onset to `root_confirmed`; and the control episodes that were diagnosed.
//! Source of the metric: Pham et al., "RCAEval: A Benchmark for Root Cause Analysis of
//! Microservice Systems with Telemetry Data" (WWW 2025), AC@k and Avg@5.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::episode::Outcome;
use super::held_back;
use crate::diagnosis::Cause;
use crate::diagnosis::detector::median;

/// The figures of one cause (or of all, `cause = None`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub cause: Option<Cause>,
    pub episodes: usize,
    /// Share with the true cause first.
    pub ac1: f64,
    /// Share with the true cause in the first three.
    pub ac3: f64,
    /// Avg@5: the mean of AC@1..AC@5.
    pub avg5: f64,
    /// Episodes that reached `root_confirmed` after the onset.
    pub confirmed: usize,
    /// Median seconds from the onset to `root_confirmed`, over the confirmed ones.
    pub median_time_to_confirmed_s: Option<f64>,
    /// Median of the engine's onset − the injected onset, seconds (negative: before the
    /// fault), and the largest |error|, over the episodes with an onset.
    pub median_onset_error_s: Option<f64>,
    pub worst_onset_error_s: Option<f64>,
    /// The causes ranked first in the misses (AC@1), by episode.
    pub misses: Vec<(String, Option<Cause>)>,
}

/// The whole evaluation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub rows: Vec<Row>,
    pub total: Row,
    pub controls: usize,
    /// Controls that reached `root_confirmed` (a false page).
    pub control_diagnoses: usize,
    /// Controls that left idle at all (a symptom, maybe no conclusion).
    pub control_triggered: usize,
    /// Names and first confirmed cause of the diagnosed controls.
    pub control_alarms: Vec<(String, Option<Cause>)>,
}

fn row(cause: Option<Cause>, outs: &[&Outcome]) -> Row {
    let n = outs.len().max(1) as f64;
    let ac = |k: usize| {
        outs.iter()
            .filter(|o| o.rank().is_some_and(|r| r <= k))
            .count() as f64
            / n
    };
    Row {
        cause,
        episodes: outs.len(),
        ac1: ac(1),
        ac3: ac(3),
        avg5: (1..=5).map(ac).sum::<f64>() / 5.0,
        confirmed: outs
            .iter()
            .filter(|o| o.time_to_confirmed_s.is_some())
            .count(),
        median_time_to_confirmed_s: median(
            &mut outs
                .iter()
                .filter_map(|o| o.time_to_confirmed_s)
                .collect::<Vec<_>>(),
        ),
        median_onset_error_s: median(
            &mut outs
                .iter()
                .filter_map(|o| o.onset_error_s)
                .collect::<Vec<_>>(),
        ),
        worst_onset_error_s: outs
            .iter()
            .filter_map(|o| o.onset_error_s)
            .max_by(|a, b| a.abs().total_cmp(&b.abs())),
        misses: outs
            .iter()
            .filter(|o| o.rank() != Some(1))
            .map(|o| (o.name.clone(), o.ranking.first().copied()))
            .collect(),
    }
}

/// Aggregates the outcomes of a corpus: fault episodes per cause, controls apart.
pub fn report(outcomes: &[Outcome]) -> Report {
    let mut by: BTreeMap<Cause, Vec<&Outcome>> = BTreeMap::new();
    let mut controls = Vec::new();
    for o in outcomes {
        match o.cause {
            Some(c) => by.entry(c).or_default().push(o),
            None => controls.push(o),
        }
    }
    let faults: Vec<&Outcome> = by.values().flatten().copied().collect();
    Report {
        rows: by.iter().map(|(c, v)| row(Some(*c), v)).collect(),
        total: row(None, &faults),
        controls: controls.len(),
        control_diagnoses: controls
            .iter()
            .filter(|o| o.confirmed_evaluations > 0)
            .count(),
        control_triggered: controls
            .iter()
            .filter(|o| o.triggered_evaluations > 0)
            .count(),
        control_alarms: controls
            .iter()
            .filter(|o| o.confirmed_evaluations > 0)
            .map(|o| (o.name.clone(), o.first_confirmed.as_ref().map(|f| f.1)))
            .collect(),
    }
}

/// The table as text, one line per cause, the total, the controls and the misses.
pub fn table(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<22} {:>8} {:>6} {:>6} {:>6} {:>10} {:>14} {:>16}",
        "cause",
        "episodes",
        "AC@1",
        "AC@3",
        "Avg@5",
        "confirmed",
        "median TTD s",
        "onset err s med/worst"
    );
    let line = |o: &mut String, name: &str, r: &Row| {
        let ttd = r
            .median_time_to_confirmed_s
            .map_or("-".to_owned(), |t| format!("{t:.0}"));
        let onset = match (r.median_onset_error_s, r.worst_onset_error_s) {
            (Some(m), Some(w)) => format!("{m:+.0}/{w:+.0}"),
            _ => "-".to_owned(),
        };
        let _ = writeln!(
            o,
            "{:<22} {:>8} {:>6.2} {:>6.2} {:>6.2} {:>10} {:>14} {:>16}",
            name,
            r.episodes,
            r.ac1,
            r.ac3,
            r.avg5,
            format!("{}/{}", r.confirmed, r.episodes),
            ttd,
            onset
        );
    };
    for x in &r.rows {
        line(&mut o, x.cause.map_or("all", Cause::as_str), x);
    }
    line(&mut o, "all faults", &r.total);
    let _ = writeln!(
        o,
        "controls: {} episodes, {} diagnosed (root_confirmed), {} triggered",
        r.controls, r.control_diagnoses, r.control_triggered
    );
    for (name, c) in &r.control_alarms {
        let _ = writeln!(
            o,
            "  false alarm: {name} → {}",
            c.map_or("-", Cause::as_str)
        );
    }
    if !r.total.misses.is_empty() {
        let _ = writeln!(o, "misses at AC@1 (episode → ranked first):");
        for (name, c) in &r.total.misses {
            let _ = writeln!(o, "  {name} → {}", c.map_or("nothing", Cause::as_str));
        }
    }
    o
}

/// The half of the corpus an episode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Half {
    /// Rules and thresholds may be tuned on these.
    Development,
    /// Never looked at while tuning: the figures that count.
    Holdout,
}

/// FNV-1a (64 bit) of `s`: a hash that is the same on every machine and in every release.
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Splits the corpus in two halves, deterministically and balanced per cause (controls are a
/// group of their own): within a group, episodes ordered by the FNV-1a hash of their name go
/// alternately to the development half (first) and the holdout half. The assignment of an
/// episode depends only on the names in its group, never on how the engine scored it.
/// Returns the half of each item, in the order given.
pub fn split<T>(items: &[T], key: impl Fn(&T) -> (&str, Option<Cause>)) -> Vec<Half> {
    let mut groups: BTreeMap<Option<Cause>, Vec<(u64, &str, usize)>> = BTreeMap::new();
    for (i, it) in items.iter().enumerate() {
        let (name, cause) = key(it);
        groups
            .entry(cause)
            .or_default()
            .push((fnv1a(name), name, i));
    }
    let mut out = vec![Half::Development; items.len()];
    for g in groups.values_mut() {
        g.sort();
        for (k, &(_, _, i)) in g.iter().enumerate() {
            if k % 2 == 1 {
                out[i] = Half::Holdout;
            }
        }
    }
    out
}

/// The onset lines of one half: the share of fault episodes with an onset within the
/// tolerance, and every episode outside it (or without an onset) with its error.
pub fn onset_lines(outs: &[Outcome]) -> String {
    let faults: Vec<&Outcome> = outs.iter().filter(|o| o.cause.is_some()).collect();
    let within = faults
        .iter()
        .filter(|o| {
            o.onset_error_s
                .is_some_and(|e| e.abs() <= held_back::ONSET_TOLERANCE_S)
        })
        .count();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "onset within {:.0} s of the injected fault: {within} of {} fault episodes ({:.2})",
        held_back::ONSET_TOLERANCE_S,
        faults.len(),
        within as f64 / faults.len().max(1) as f64
    );
    for o in &faults {
        match o.onset_error_s {
            Some(e) if e.abs() <= held_back::ONSET_TOLERANCE_S => {}
            Some(e) => {
                let _ = writeln!(
                    s,
                    "  outside: {} onset error {e:+.0} s{}",
                    o.name,
                    why_outside(o, e)
                );
            }
            None => {
                let _ = writeln!(s, "  outside: {} no onset (never left idle)", o.name);
            }
        }
    }
    for o in faults.iter().filter(|o| o.root_onset_errors_s.len() >= 2) {
        let roots: Vec<String> = o
            .root_onset_errors_s
            .iter()
            .map(|(c, e)| match e {
                Some(e) => format!("{} {e:+.0} s", c.as_str()),
                None => format!("{} (no change time)", c.as_str()),
            })
            .collect();
        let _ = writeln!(
            s,
            "  roots: {} onsets from the injection: {}{}",
            o.name,
            roots.join(", "),
            o.canary_gap_s
                .map(|(a, b)| format!(
                    " (no canary ended between {a:+.1} s and {b:+.1} s: a later fault in it shows when they end)"
                ))
                .unwrap_or_default()
        );
    }
    for o in &faults {
        if let Some(l) = o.top_lead_s.filter(|l| *l < -held_back::ONSET_TOLERANCE_S) {
            let _ = writeln!(
                s,
                "  cause after the spike: {} the sentence's evidence changed {:.0} s after the onset",
                o.name, -l
            );
        }
    }
    s
}

/// Why an onset lies outside the tolerance, when the episode says: the fault showed in no
/// sample before its first evidence ([`Outcome::first_evidence`]: the onset's error from it),
/// or no canary ended for a while after the injection.
fn why_outside(o: &Outcome, err: f64) -> String {
    let mut why = Vec::new();
    if let Some((signal, at)) = &o.first_evidence
        && err > 0.0
        && *at > held_back::ONSET_TOLERANCE_S
    {
        why.push(format!(
            "the first sample outside its calm range: {signal} at {at:+.1} s (onset {:+.0} s from it)",
            (err - at).round() + 0.0
        ));
    }
    if let Some((a, b)) = o.canary_gap_s
        && err > 0.0
    {
        why.push(format!("no canary ended between {a:+.1} s and {b:+.1} s"));
    }
    if why.is_empty() {
        String::new()
    } else {
        format!(" ({})", why.join("; "))
    }
}

/// The contradiction and decomposition lines over the whole corpus.
pub fn held_back_summary(outs: &[Outcome]) -> String {
    let mut s = String::new();
    let worst = outs
        .iter()
        .filter_map(|o| o.held_back.contradicted_max.map(|c| (o.name.as_str(), c)))
        .max_by(|a, b| a.1.0.total_cmp(&b.1.0));
    match worst {
        Some((name, (score, cause, off))) => {
            let _ = writeln!(
                s,
                "contradicted causes: max score {score:.2} ({} in {name} at +{off:.0} s) {}",
                cause.as_str(),
                if score < 0.5 {
                    "< 0.5 met"
                } else {
                    "≥ 0.5 MISSED"
                }
            );
        }
        None => {
            let _ = writeln!(s, "contradicted causes: none scored");
        }
    }
    let n: usize = outs.iter().map(|o| o.held_back.decompositions).sum();
    let over: usize = outs.iter().map(|o| o.held_back.over_explained).sum();
    let unsaid: usize = outs.iter().map(|o| o.held_back.over_explained_unsaid).sum();
    let min = outs
        .iter()
        .filter_map(|o| o.held_back.unexplained_min_s)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))));
    let _ = writeln!(
        s,
        "TTFT decompositions: {n}, min unexplained_s {}, parts > extra TTFT in {over} (clamped to 0, {unsaid} without a note) {}",
        min.map_or("-".to_owned(), |m| format!("{:.0} ms", m * 1e3)),
        if min.is_none_or(|m| m >= 0.0) && unsaid == 0 {
            "met"
        } else {
            "MISSED"
        }
    );
    s
}
