//! `report.html`'s latency-over-time plots: the benchmarks end to end on one time axis, each a
//! shaded phase (a concurrency ramp's steps and a rate ramp's stretches as phases of their
//! own), rolling p50 and p99 lines over the raw requests drawn faint.

use std::collections::BTreeSet;

use super::chart::{Axis, Band, Chart, Mark, Series, spread};
use crate::bench::stats::percentile;
use crate::bench::workload::{RampKind, RampOver};
use crate::bench::{RequestRow, Summary};

/// Raw points drawn per plot, at most (evenly spread over the run).
const RAW_POINTS: usize = 1500;
/// Requests per rolling window: a tenth of a phase's, within these bounds; the window moves
/// by a fifth of itself.
const WINDOW_MIN: usize = 5;
const WINDOW_MAX: usize = 500;

/// One benchmark run (a benchmark, or one of its `--repeat` runs) on the run's time axis.
struct Segment<'a> {
    label: String,
    /// Seconds on the plot's axis where it starts.
    offset_s: f64,
    rows: Vec<&'a RequestRow>,
}

/// The benchmarks' runs in order, placed end to end (each as long as its last request).
fn segments<'a>(summary: &Summary, rows: &'a [RequestRow]) -> Vec<Segment<'a>> {
    let mut out = Vec::new();
    let mut offset_s = 0.0;
    for b in &summary.benchmarks {
        let mine: Vec<&RequestRow> = rows.iter().filter(|r| r.benchmark == b.benchmark).collect();
        let repeats: BTreeSet<usize> = mine.iter().map(|r| r.repeat).collect();
        for &k in &repeats {
            let mut rows: Vec<&RequestRow> =
                mine.iter().copied().filter(|r| r.repeat == k).collect();
            rows.sort_by(|a, b| a.send_ms.total_cmp(&b.send_ms));
            let len_s = rows
                .iter()
                .map(|r| (r.send_ms + r.e2el_ms) / 1000.0)
                .fold(0.0, f64::max)
                .max(1e-6);
            let label = if repeats.len() > 1 {
                format!("{} run {}", b.benchmark, k + 1)
            } else {
                b.benchmark.clone()
            };
            out.push(Segment {
                label,
                offset_s,
                rows,
            });
            offset_s += len_s;
        }
    }
    out
}

/// Phases of one segment: its own span, split by the concurrency limit of a concurrency ramp
/// (`c=3`) or by the stretches of a rate ramp.
fn phases(summary: &Summary, seg: &Segment<'_>, end_s: f64) -> Vec<Band> {
    let at = |ms: f64| seg.offset_s + ms / 1000.0;
    match summary.workload.ramp {
        Some(r) if r.over == RampOver::Concurrency && !seg.rows.is_empty() => {
            let mut bands: Vec<Band> = Vec::new();
            for row in &seg.rows {
                let label = format!("c={}", row.concurrency_limit);
                if bands.last().is_none_or(|b| b.label != label) {
                    if let Some(last) = bands.last_mut() {
                        last.to = at(row.send_ms);
                    }
                    bands.push(Band {
                        from: if bands.is_empty() {
                            seg.offset_s
                        } else {
                            at(row.send_ms)
                        },
                        to: end_s,
                        label,
                    });
                }
            }
            bands
        }
        Some(r) => {
            let d = r.duration.as_secs_f64();
            let stretch = |i: usize| match r.kind {
                RampKind::Sawtooth => format!("ramp {}", i + 1),
                _ if i == 0 => format!("ramp {}→{} req/s", r.from, r.to),
                _ => format!("hold {} req/s", r.to),
            };
            let mut bands = Vec::new();
            let mut t = seg.offset_s;
            while t < end_s && bands.len() < 50 {
                let to = if r.kind == RampKind::Sawtooth || bands.is_empty() {
                    (t + d).min(end_s)
                } else {
                    end_s
                };
                bands.push(Band {
                    from: t,
                    to,
                    label: format!("{} · {}", seg.label, stretch(bands.len())),
                });
                t = to.max(t + 1e-9);
            }
            bands
        }
        None => vec![Band {
            from: seg.offset_s,
            to: end_s,
            label: seg.label.clone(),
        }],
    }
}

/// A plot of `metric` (ms) of the successful requests over the run: faint raw points, rolling
/// p50 and p99 per phase, the phases shaded. `None` without a value.
pub fn plot(
    summary: &Summary,
    rows: &[RequestRow],
    name: &str,
    metric: fn(&RequestRow) -> Option<f64>,
) -> Option<String> {
    let segs = segments(summary, rows);
    let mut raw: Vec<(f64, f64, String)> = Vec::new();
    let (mut p50, mut p99) = (Vec::<(f64, f64)>::new(), Vec::<(f64, f64)>::new());
    let (mut t50, mut t99) = (Vec::new(), Vec::new());
    let mut bands = Vec::new();
    for (i, seg) in segs.iter().enumerate() {
        let end_s = segs.get(i + 1).map_or_else(
            || {
                seg.offset_s
                    + seg
                        .rows
                        .iter()
                        .map(|r| (r.send_ms + r.e2el_ms) / 1000.0)
                        .fold(1e-6, f64::max)
            },
            |n| n.offset_s,
        );
        bands.extend(phases(summary, seg, end_s));
        let ok: Vec<(f64, f64, &RequestRow)> = seg
            .rows
            .iter()
            .filter(|r| r.outcome == "ok")
            .filter_map(|r| {
                metric(r)
                    .filter(|v| v.is_finite())
                    .map(|v| (seg.offset_s + r.send_ms / 1000.0, v, *r))
            })
            .collect();
        for &(x, v, r) in &ok {
            raw.push((
                x,
                v,
                format!(
                    "{} request {}: {name} {v} ms, sent at {} s",
                    seg.label,
                    r.index,
                    r.send_ms / 1000.0
                ),
            ));
        }
        let k = (ok.len() / 10).clamp(WINDOW_MIN, WINDOW_MAX);
        if ok.len() < 2 * k {
            continue;
        }
        // Windows of k requests by send time, moving by k/5, the last one ending at the last.
        let stride = (k / 5).max(1);
        let mut starts: Vec<usize> = (0..=ok.len() - k).step_by(stride).collect();
        if starts.last() != Some(&(ok.len() - k)) {
            starts.push(ok.len() - k);
        }
        for from in starts {
            let chunk = &ok[from..from + k];
            let mut v: Vec<f64> = chunk.iter().map(|c| c.1).collect();
            v.sort_by(f64::total_cmp);
            let x = chunk[chunk.len() / 2].0;
            let (a, b) = (percentile(&v, 0.5), percentile(&v, 0.99));
            let span = format!(
                "{}, its requests {}–{} ({} s)",
                seg.label,
                from + 1,
                from + k,
                x
            );
            p50.push((x, a));
            t50.push(format!("{name} p50 {a} ms: {span}"));
            p99.push((x, b));
            t99.push(format!("{name} p99 {b} ms: {span}"));
        }
        // A gap in the lines between benchmarks.
        for (line, titles) in [(&mut p50, &mut t50), (&mut p99, &mut t99)] {
            line.push((end_s, f64::NAN));
            titles.push(String::new());
        }
    }
    if raw.is_empty() {
        return None;
    }
    let raw = spread(&raw, RAW_POINTS);
    let mut points = Series::new(
        format!("requests ({})", raw.len()),
        raw.iter().map(|r| (r.0, r.1)).collect(),
        Mark::Points,
    );
    points.color = Some("#555");
    points.titles = raw.into_iter().map(|r| r.2).collect();
    let mut series = vec![points];
    for (label, line, titles, color) in [
        ("rolling p50", p50, t50, "#1f77b4"),
        ("rolling p99", p99, t99, "#d62728"),
    ] {
        if line.iter().any(|p| p.1.is_finite()) {
            let mut s = Series::new(label, line, Mark::Line);
            s.color = Some(color);
            s.titles = titles;
            series.push(s);
        }
    }
    let x_label = if segs.len() > 1 {
        "time under load, benchmarks end to end"
    } else {
        "time from the benchmark's start"
    };
    let mut chart = Chart::new(
        &format!("{name} over time"),
        Axis::linear(x_label, "s", true),
        Axis::time(name),
        series,
    );
    chart.bands = bands;
    chart.width = 900.0;
    Some(chart.html())
}
