//! `report.html`'s section of a `--profile` run: TTFT and sends over time with each profile
//! revision marked where it took effect.

use std::fmt::Write as _;

use super::{esc, line_chart};
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
    let ok = rows.iter().filter(|r| r.outcome == "ok");
    let ttft: Vec<(f64, f64)> = ok
        .filter_map(|r| r.ttft_ms.map(|t| (r.send_ms / 1000.0, t)))
        .collect();
    let top = ttft.iter().map(|p| p.1).fold(1.0, f64::max);
    let mut series = vec![("TTFT ms".to_owned(), ttft)];
    for (at, rev) in p.revisions.iter().skip(1) {
        series.push((format!("revision {rev}"), vec![(*at, 0.0), (*at, top)]));
    }
    h.push_str(&line_chart(
        "TTFT over time, profile revisions marked",
        "seconds from the start",
        "TTFT ms",
        &series,
    ));
    h
}
