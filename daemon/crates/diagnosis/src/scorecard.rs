//! The scorecard in the terminal (`lmperf ctl diagnose`): per target its state, onset and
//! symptom, then the causes ranked by score with their evidence, one line each. Node-level
//! diagnoses (one fault over several targets of a node) come first.

use std::fmt::Write;

use super::report::{Diagnosis, State, clock, fmt_value};

/// The scorecard of `d` as text.
pub fn text(d: &Diagnosis) -> String {
    let mut o = String::new();
    // Node-level diagnoses first: one fault over several targets.
    for n in &d.nodes {
        let _ = writeln!(
            o,
            "node {}  {}  {} {:.2} on {} of {} targets ({})",
            n.node,
            n.state.as_str(),
            n.cause.as_str(),
            n.score,
            n.targets.len(),
            n.node_targets,
            n.targets.join(", ")
        );
        let _ = writeln!(o, "  {}", n.summary);
    }
    for t in &d.targets {
        // Idle is no verdict on traffic: a target that ran requests is "not judged" (no
        // baseline yet) or "no spike".
        let state = match (t.state, &t.baseline_wait) {
            (State::Idle, Some(_)) => "not judged",
            (State::Idle, None) => "no spike",
            (s, _) => s.as_str(),
        };
        let _ = write!(o, "{}  {state}", t.target);
        if let Some(on) = t.onset_unix_s {
            let _ = write!(o, "  onset {} UTC", clock(on));
        }
        if let Some(s) = &t.symptom {
            let _ = write!(
                o,
                "  symptom {} p99 {} → {} ({:.1} ×)",
                s.signal.as_str(),
                fmt_value(s.signal, s.baseline),
                fmt_value(s.signal, s.peak),
                s.ratio
            );
        }
        o.push('\n');
        // The outage in words, unless the sentence below already says it.
        if let Some(d) = &t.down {
            let words = d.words();
            if !t.summary.as_deref().is_some_and(|s| s.contains(&words)) {
                let _ = writeln!(o, "  {words}");
            }
        }
        if t.state == State::Idle {
            if t.down.is_some() {
                continue;
            }
            match &t.baseline_wait {
                Some(w) => {
                    let _ = writeln!(o, "  {}: a spike cannot be judged before", w.words());
                }
                None => o.push_str("  nothing to diagnose\n"),
            }
            continue;
        }
        if let Some(line) = &t.summary {
            let _ = writeln!(o, "  {line}");
        }
        for c in &t.causes {
            let bar = "█".repeat((c.score * 20.0).round() as usize);
            let _ = writeln!(o, "  {:<20} {:>4.2} {bar}", c.cause.as_str(), c.score);
            for e in c.evidence.iter().take(4) {
                let lead = e
                    .lead_s
                    .map_or(String::new(), |l| format!(", {l:+.0} s vs onset"));
                let rule = e
                    .rule
                    .as_deref()
                    .map_or(String::new(), |r| format!(" [{r}]"));
                let _ = writeln!(
                    o,
                    "      {} {} → {} (z {:.1}{lead}){rule}",
                    e.signal.words(),
                    fmt_value(e.signal, e.before),
                    fmt_value(e.signal, e.after),
                    e.z
                );
            }
        }
        if let Some(share) = t.canaries_skipped_share.filter(|s| *s > 0.0) {
            let _ = writeln!(
                o,
                "  {:.0} % of scheduled canaries skipped since the onset (max_in_flight still running): the spike is sampled less",
                share * 100.0
            );
        }
        if let Some(dec) = &t.ttft_decomposition {
            let part =
                |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.0} ms", v * 1000.0));
            let _ = writeln!(
                o,
                "  extra TTFT {:.0} ms = queue {} + prefill {} + network {} + unexplained {:.0} ms",
                dec.extra_s * 1000.0,
                part(dec.server_queue_s),
                part(dec.server_prefill_s),
                part(dec.network_s),
                dec.unexplained_s * 1000.0
            );
            if let Some(note) = &dec.note {
                let _ = writeln!(o, "    ({note})");
            }
        }
    }
    o
}
