//! `report.html`'s section of a `--profile` run: TTFT over time (rolling p50/p99 over the
//! raw requests), each profile revision a shaded phase from where it took effect.

use std::fmt::Write as _;

use super::chart::{Axis, Band, Chart, Mark, Series, spread};
use super::esc;
use super::timeline::{Window, rolling};
use crate::bench::{RequestRow, Summary};

/// The section; empty without a profile.
pub(in crate::bench) fn section(summary: &Summary, rows: &[RequestRow]) -> String {
    let Some(p) = &summary.profile else {
        return String::new();
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<h2>Load profile <code>{}</code></h2><p>File {}; revisions:",
        esc(&p.name),
        esc(&p.file)
    );
    for (at, rev) in &p.revisions {
        let _ = write!(
            h,
            r#" <span data-revision="{rev}" data-at-s="{at}">r{rev} at {at:.2} s</span>"#
        );
    }
    h.push_str("</p>");
    // Faint raw TTFTs, rolling p50/p99, each revision a shaded phase.
    let mut ok: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.outcome == "ok")
        .filter_map(|r| r.ttft_ms.map(|t| (r.send_ms / 1000.0, t)))
        .collect();
    ok.sort_by(|a, b| a.0.total_cmp(&b.0));
    let windows = rolling(&ok);
    let end = rows
        .iter()
        .map(|r| (r.send_ms + r.e2el_ms) / 1000.0)
        .fold(0.0, f64::max);
    let mut raw = Series::new(
        format!("requests ({})", ok.len()),
        spread(&ok, 1500),
        Mark::Points,
    );
    raw.color = Some("#555");
    let mut series = vec![raw];
    for (name, pick, color) in [
        (
            "rolling p50",
            (|w: &Window| w.p50) as fn(&Window) -> f64,
            "#1f77b4",
        ),
        ("rolling p99", |w: &Window| w.p99, "#d62728"),
    ] {
        let mut s = Series::new(
            name,
            windows.iter().map(|w| (w.x, pick(w))).collect(),
            Mark::Line,
        );
        s.titles = windows
            .iter()
            .map(|w| {
                format!(
                    "TTFT {name} {} ms: requests {}–{} (at {} s)",
                    pick(w),
                    w.from + 1,
                    w.to,
                    w.x
                )
            })
            .collect();
        s.color = Some(color);
        series.push(s);
    }
    let mut chart = Chart::new(
        "TTFT over time, profile revisions marked",
        Axis::linear("time from the start", "s", true),
        Axis::time("TTFT"),
        series,
    );
    chart.bands = p
        .revisions
        .iter()
        .enumerate()
        .map(|(i, (at, rev))| Band {
            from: *at,
            to: p.revisions.get(i + 1).map_or(end.max(*at), |n| n.0),
            label: format!("revision {rev}"),
        })
        .collect();
    chart.width = 900.0;
    h.push_str(&chart.html());
    h
}
