//! `scorecard.html`: one self-contained file (inline CSS and SVG, no script, no fetch, like
//! `report.html`): per target its state, onset and symptom, the causes ranked with their
//! evidence, evidence plots (each top signal around the onset) and the top-3 bottleneck
//! heatmap (x: signal groups, y: 30 s slices, colour: the group's highest cause score in the
//! slice, the three highest of each slice outlined).

use std::fmt::Write as _;

use super::offline::Analysis;
use crate::bench::report::{esc, line_chart};
use crate::diagnosis::report::{clock, fmt_value};
use crate::diagnosis::{Cause, Signal};

/// The heatmap's columns: each cause's group of signals, in words.
pub const GROUPS: [(Cause, &str); 10] = [
    (Cause::LoadSurge, "load"),
    (Cause::ServerQueueing, "server queue"),
    (Cause::KvCachePressure, "KV cache"),
    (Cause::LongPrompts, "prefill / prompts"),
    (Cause::GpuThrottling, "GPU clocks"),
    (Cause::GpuMemoryPressure, "GPU memory"),
    (Cause::GpuFault, "GPU faults"),
    (Cause::Network, "network"),
    (Cause::ErrorBurst, "errors"),
    (Cause::ServerChange, "server change"),
];

/// White (0) to red (1).
fn colour(v: f64) -> String {
    let v = v.clamp(0.0, 1.0);
    let g = (255.0 * (1.0 - 0.85 * v)) as u8;
    let b = (255.0 * (1.0 - 0.9 * v)) as u8;
    format!("rgb(255,{g},{b})")
}

/// Renders the scorecard.
pub fn render(a: &Analysis) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>lmperf diagnosis: {src}</title><style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse;margin:8px 0 20px}}
td,th{{border:1px solid #bbb;padding:4px 8px;font-size:13px}} th{{background:#eee}} td.hm{{width:64px;text-align:center}}
td.top{{outline:3px solid #222;outline-offset:-3px;font-weight:600}} figure{{display:inline-block;margin:8px}}
figcaption{{font-weight:600;font-size:13px}} h2{{margin-top:28px}} .bar{{display:inline-block;height:10px;background:#d62728}}
</style></head><body><h1>lmperf diagnosis</h1><p>{src} · schema {ver} · evaluated {at} UTC</p>"#,
        src = esc(&a.source),
        ver = a.diagnosis.schema_version,
        at = clock(a.diagnosis.evaluated_at_unix_s),
    );
    for t in &a.diagnosis.targets {
        let _ = write!(
            h,
            r#"<section class="target" data-target="{name}" data-state="{state}"><h2>{name}: {state}</h2>"#,
            name = esc(&t.target),
            state = t.state.as_str()
        );
        if let Some(on) = t.onset_unix_s {
            let _ = write!(h, "<p>onset {} UTC", clock(on));
            if let Some(s) = &t.symptom {
                let _ = write!(
                    h,
                    " · symptom {} {} → {} ({:.1} ×)",
                    s.signal.words(),
                    esc(&fmt_value(s.signal, s.baseline)),
                    esc(&fmt_value(s.signal, s.peak)),
                    s.ratio
                );
            }
            h.push_str("</p>");
        } else {
            match &t.baseline_wait {
                Some(w) => {
                    let _ = write!(
                        h,
                        "<p>{}: a spike cannot be judged before</p>",
                        esc(&w.words())
                    );
                }
                None => h.push_str("<p>no spike: nothing to diagnose</p>"),
            }
        }
        if let Some(line) = &t.summary {
            let _ = write!(h, "<p><b>{}</b></p>", esc(line));
        }
        if !t.causes.is_empty() {
            h.push_str("<table class=\"causes\"><tr><th>#</th><th>cause</th><th>score</th><th>evidence</th></tr>");
            for (i, c) in t.causes.iter().enumerate() {
                let ev: Vec<String> = c
                    .evidence
                    .iter()
                    .take(4)
                    .map(|e| {
                        let rule = e
                            .rule
                            .as_deref()
                            .map_or(String::new(), |r| format!(" [{r}]"));
                        esc(&format!(
                            "{} {} → {} (z {:.1}){rule}",
                            e.signal.words(),
                            fmt_value(e.signal, e.before),
                            fmt_value(e.signal, e.after),
                            e.z
                        ))
                    })
                    .collect();
                let _ = write!(
                    h,
                    r#"<tr data-cause="{c}" data-score="{s}"><td>{r}</td><td>{c}</td><td>{s:.2} <span class="bar" style="width:{w:.0}px"></span></td><td>{ev}</td></tr>"#,
                    c = c.cause.as_str(),
                    s = c.score,
                    r = i + 1,
                    w = c.score * 100.0,
                    ev = ev.join("<br>")
                );
            }
            h.push_str("</table>");
        }
        // Evidence plots: the top causes' signals, seconds from the onset.
        if let (Some(on), Some(series)) = (t.onset_unix_s, a.series.get(&t.target)) {
            let mut shown: Vec<Signal> = Vec::new();
            if let Some(sym) = &t.symptom {
                shown.push(sym.signal);
            }
            for c in t.causes.iter().take(3) {
                for e in c.evidence.iter().take(2) {
                    if !shown.contains(&e.signal) {
                        shown.push(e.signal);
                    }
                }
            }
            for s in shown {
                let Some(pts) = series.get(&s) else { continue };
                let p: Vec<(f64, f64)> = pts
                    .iter()
                    .filter(|p| p[0] >= on - 300.0 && p[0] <= on + 300.0)
                    .map(|p| (p[0] - on, p[1]))
                    .collect();
                h.push_str(&line_chart(
                    &format!("{} ({})", s.words(), s.unit()),
                    "seconds from the onset",
                    s.unit(),
                    &[(s.as_str().to_owned(), p)],
                ));
            }
        }
        // The top-3 bottleneck heatmap.
        if let Some(slices) = a.timeline.get(&t.target) {
            let rows: Vec<_> = slices.iter().filter(|s| !s.scores.is_empty()).collect();
            if !rows.is_empty() {
                h.push_str("<h3>top-3 bottleneck heatmap</h3><table class=\"heatmap\"><tr><th>slice (UTC)</th><th>state</th>");
                for (_, g) in GROUPS {
                    let _ = write!(h, "<th>{}</th>", esc(g));
                }
                h.push_str("</tr>");
                for s in rows {
                    let mut vals: Vec<f64> = GROUPS
                        .iter()
                        .map(|(c, _)| s.scores.get(c).copied().unwrap_or(0.0))
                        .collect();
                    let mut sorted = vals.clone();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    let third = sorted.get(2).copied().unwrap_or(0.0).max(1e-9);
                    let _ = write!(
                        h,
                        "<tr><td>{}</td><td>{}</td>",
                        clock(s.start_unix_s),
                        s.state.as_str()
                    );
                    for (v, (c, _)) in vals.iter_mut().zip(GROUPS) {
                        let top = if *v >= third { " top" } else { "" };
                        let _ = write!(
                            h,
                            r#"<td class="hm{top}" data-cause="{}" data-score="{v}" style="background:{}">{v:.2}</td>"#,
                            c.as_str(),
                            colour(*v)
                        );
                    }
                    h.push_str("</tr>");
                }
                h.push_str("</table>");
            }
        }
        h.push_str("</section>");
    }
    h.push_str("</body></html>\n");
    h
}
