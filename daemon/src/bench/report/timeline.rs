//! `report.html`'s latency-over-time plots: the benchmarks end to end on one time axis, each a
//! shaded phase (a concurrency ramp's steps and a rate ramp's stretches as phases of their
//! own), rolling p50 and p99 lines over the raw requests drawn faint.

use std::collections::BTreeSet;

use super::chart::{Axis, Band, Chart, Mark, Series, spread};
use crate::bench::stats::percentile;
use crate::bench::workload::{Ramp, RampKind, RampOver};
use crate::bench::{RequestRow, Summary};
use crate::fmt::count;

/// Raw points drawn per plot, at most (evenly spread over the run).
const RAW_POINTS: usize = 1500;
/// Requests per rolling window: a tenth of a phase's, within these bounds; the window moves
/// by a fifth of itself.
const WINDOW_MIN: usize = 5;
const WINDOW_MAX: usize = 500;
/// Phases of a sawtooth rate ramp drawn per benchmark, at most.
const MAX_PHASES: usize = 50;

/// One benchmark run (a benchmark, or one of its `--repeat` runs) on the run's time axis.
#[derive(Debug)]
struct Segment<'a> {
    label: String,
    /// Where its lead-in (warm-up, prompts made before the first send) starts on the plot's
    /// axis (it ends at `offset_s`); `None` without one.
    warmup_from: Option<f64>,
    /// What that lead-in was, in words (`warm-up`, `making prompts`, or both).
    lead_in: &'static str,
    /// Seconds on the plot's axis where it starts and ends (its last request's end).
    offset_s: f64,
    end_s: f64,
    /// Its rows by send time.
    rows: Vec<&'a RequestRow>,
}

/// A prompt-making pause shorter than this (per run) is no band of its own.
const PREPARE_SHOWN_S: f64 = 1.0;

/// Seconds per run of a benchmark-wide figure shared by `runs` runs (0 when not finite).
fn per_run(s: f64, runs: usize) -> f64 {
    if s.is_finite() {
        s.max(0.0) / runs.max(1) as f64
    } else {
        0.0
    }
}

/// The runs of `benchmarks` (names, warm-up and prompt-making seconds of all their runs, in
/// order), placed end to end, each after its lead-in (the benchmark's warm-up and prompt-making
/// time shared by its runs; prompt making from [`PREPARE_SHOWN_S`] a run).
fn segments<'a>(benchmarks: &[(&str, f64, f64)], rows: &'a [RequestRow]) -> Vec<Segment<'a>> {
    let mut out = Vec::new();
    let mut offset_s = 0.0;
    for &(name, warmup_s, prepare_s) in benchmarks {
        let mine: Vec<&RequestRow> = rows.iter().filter(|r| r.benchmark == name).collect();
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
                format!("{name} run {}", k + 1)
            } else {
                name.to_owned()
            };
            let warm_s = per_run(warmup_s, repeats.len());
            let prep_s = Some(per_run(prepare_s, repeats.len()))
                .filter(|p| *p >= PREPARE_SHOWN_S)
                .unwrap_or(0.0);
            let lead_in = match (warm_s > 0.0, prep_s > 0.0) {
                (true, true) => "warm-up and making prompts",
                (false, true) => "making prompts",
                _ => "warm-up",
            };
            let warmup_from = (warm_s + prep_s > 0.0).then_some(offset_s);
            offset_s += warm_s + prep_s;
            out.push(Segment {
                label,
                warmup_from,
                lead_in,
                offset_s,
                end_s: offset_s + len_s,
                rows,
            });
            offset_s += len_s;
        }
    }
    out
}

/// The band of a segment's warm-up, if it had one.
fn warmup_band(seg: &Segment<'_>) -> Option<Band> {
    seg.warmup_from.map(|from| Band {
        from,
        to: seg.offset_s,
        label: format!("{} {} (not measured)", seg.label, seg.lead_in),
    })
}

/// Phases of one segment: its own span, split by the concurrency limit of a concurrency ramp
/// (`c=3`, from each new limit's first send) or into the stretches of a rate ramp (`ramp`,
/// then `hold`; a sawtooth's every period).
fn phases(ramp: Option<Ramp>, seg: &Segment<'_>) -> Vec<Band> {
    let at = |ms: f64| seg.offset_s + ms / 1000.0;
    match ramp {
        Some(r) if r.over == RampOver::Concurrency && !seg.rows.is_empty() => {
            let mut bands: Vec<Band> = Vec::new();
            for row in &seg.rows {
                let label = format!("c={}", row.concurrency_limit);
                if bands.last().is_some_and(|b| b.label == label) {
                    continue;
                }
                let from = if bands.is_empty() {
                    seg.offset_s
                } else {
                    at(row.send_ms)
                };
                if let Some(last) = bands.last_mut() {
                    last.to = from;
                }
                bands.push(Band {
                    from,
                    to: seg.end_s,
                    label,
                });
            }
            bands
        }
        Some(r) if r.over == RampOver::Rate => {
            let d = r.duration.as_secs_f64().max(1e-6);
            let mut bands: Vec<Band> = Vec::new();
            let mut t = seg.offset_s;
            while t < seg.end_s && bands.len() < MAX_PHASES {
                let (to, label) = match (r.kind, bands.len()) {
                    (RampKind::Sawtooth, i) => ((t + d).min(seg.end_s), format!("ramp {}", i + 1)),
                    (_, 0) => (
                        (t + d).min(seg.end_s),
                        format!("ramp {}→{} req/s", r.from, r.to),
                    ),
                    _ => (seg.end_s, format!("hold {} req/s", r.to)),
                };
                bands.push(Band {
                    from: t,
                    to,
                    label: format!("{} · {label}", seg.label),
                });
                t = to;
            }
            bands
        }
        _ => vec![Band {
            from: seg.offset_s,
            to: seg.end_s,
            label: seg.label.clone(),
        }],
    }
}

/// A rolling window's result: the send time of its middle request, its p50 and p99, and the
/// 0-based range of the phase's requests it covers.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Window {
    pub x: f64,
    pub p50: f64,
    pub p99: f64,
    pub from: usize,
    pub to: usize,
}

/// Rolling p50 and p99 of `points` (send time, value; by send time): windows of a tenth of
/// the points (5 to 500), moving by a fifth of a window, the last ending at the last point.
/// None for fewer than two windows' worth.
pub(super) fn rolling(points: &[(f64, f64)]) -> Vec<Window> {
    let n = points.len();
    let k = (n / 10).clamp(WINDOW_MIN, WINDOW_MAX);
    if n < 2 * k {
        return Vec::new();
    }
    let mut starts: Vec<usize> = (0..=n - k).step_by((k / 5).max(1)).collect();
    if starts.last() != Some(&(n - k)) {
        starts.push(n - k);
    }
    starts
        .into_iter()
        .map(|from| {
            let chunk = &points[from..from + k];
            let mut v: Vec<f64> = chunk.iter().map(|c| c.1).collect();
            v.sort_by(f64::total_cmp);
            Window {
                x: chunk[k / 2].0,
                p50: percentile(&v, 0.5),
                p99: percentile(&v, 0.99),
                from,
                to: from + k,
            }
        })
        .collect()
}

/// A plot of `metric` (ms) of the successful requests over the run: faint raw points, rolling
/// p50 and p99 per run of a benchmark, the phases shaded. `None` without a value.
pub fn plot(
    summary: &Summary,
    rows: &[RequestRow],
    name: &str,
    metric: fn(&RequestRow) -> Option<f64>,
) -> Option<String> {
    let names: Vec<(&str, f64, f64)> = summary
        .benchmarks
        .iter()
        .map(|b| (b.benchmark.as_str(), b.warmup_s, b.prepare_s))
        .collect();
    let segs = segments(&names, rows);
    let mut raw: Vec<(f64, f64, String)> = Vec::new();
    let (mut p50, mut p99) = (Vec::<(f64, f64)>::new(), Vec::<(f64, f64)>::new());
    let (mut t50, mut t99) = (Vec::new(), Vec::new());
    let mut bands = Vec::new();
    for seg in &segs {
        bands.extend(warmup_band(seg));
        bands.extend(phases(summary.workload.ramp, seg));
        let ok: Vec<(&RequestRow, f64)> = seg
            .rows
            .iter()
            .filter(|r| r.outcome == "ok")
            .filter_map(|r| metric(r).filter(|v| v.is_finite()).map(|v| (*r, v)))
            .collect();
        let points: Vec<(f64, f64)> = ok
            .iter()
            .map(|(r, v)| (seg.offset_s + r.send_ms / 1000.0, *v))
            .collect();
        for ((r, v), p) in ok.iter().zip(&points) {
            raw.push((
                p.0,
                *v,
                format!(
                    "{} request {}: {name} {} ms, sent at {} s",
                    seg.label,
                    r.index,
                    super::fmt::exact(*v, 6),
                    super::fmt::exact(r.send_ms / 1000.0, 6)
                ),
            ));
        }
        for w in rolling(&points) {
            let span = format!(
                "{}, its requests {}–{} (at {} s)",
                seg.label,
                w.from + 1,
                w.to,
                w.x
            );
            p50.push((w.x, w.p50));
            t50.push(format!(
                "{name} p50 {} ms: {span}",
                super::fmt::exact(w.p50, 6)
            ));
            p99.push((w.x, w.p99));
            t99.push(format!(
                "{name} p99 {} ms: {span}",
                super::fmt::exact(w.p99, 6)
            ));
        }
        // A gap in the lines between runs.
        for (line, titles) in [(&mut p50, &mut t50), (&mut p99, &mut t99)] {
            line.push((seg.end_s, f64::NAN));
            titles.push(String::new());
        }
    }
    if raw.is_empty() {
        return None;
    }
    let ok_total = raw
        .len()
        .max(summary.benchmarks.iter().map(|b| b.completed).sum());
    let raw = spread(&raw, RAW_POINTS);
    let mut points = Series::new(
        sample_label(raw.len(), ok_total),
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

/// The legend of the plotted requests: `requests (1,500)`, or `1,500 of 18,131 requests
/// shown` when they are a sample of the run's successful requests.
fn sample_label(shown: usize, total: usize) -> String {
    if shown < total {
        format!(
            "{} of {} requests shown",
            count(shown as u64),
            count(total as u64)
        )
    } else {
        format!("requests ({})", count(shown as u64))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn row(benchmark: &str, repeat: usize, send_ms: f64, e2el_ms: f64, limit: usize) -> RequestRow {
        RequestRow {
            benchmark: benchmark.into(),
            repeat,
            send_ms,
            e2el_ms,
            concurrency_limit: limit,
            outcome: "ok",
            ..RequestRow::default()
        }
    }

    /// The legend says when the points are a sample of the run.
    #[test]
    fn a_sample_is_labelled_as_one() {
        assert_eq!(sample_label(1500, 18_131), "1,500 of 18,131 requests shown");
        assert_eq!(sample_label(40, 40), "requests (40)");
    }

    /// Benchmarks and their repeats end to end, each as long as its last request.
    #[test]
    fn runs_are_placed_end_to_end() {
        let rows = vec![
            row("a", 0, 500.0, 500.0, 1),
            row("a", 0, 0.0, 100.0, 1),
            row("b", 0, 0.0, 2000.0, 1),
            row("b", 1, 100.0, 400.0, 1),
            row("other", 0, 0.0, 1.0, 1),
        ];
        let segs = segments(&[("a", 0.0, 0.0), ("b", 0.0, 0.0)], &rows);
        let got: Vec<(&str, f64, f64, usize)> = segs
            .iter()
            .map(|s| (s.label.as_str(), s.offset_s, s.end_s, s.rows.len()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", 0.0, 1.0, 2),
                ("b run 1", 1.0, 3.0, 1),
                ("b run 2", 3.0, 3.5, 1)
            ]
        );
        assert_eq!(segs[0].rows[0].send_ms, 0.0, "by send time");
    }

    /// A warm-up comes before its run on the axis, shared by the runs of its benchmark, and
    /// is drawn as its own band.
    #[test]
    fn warm_ups_precede_their_runs() {
        let rows = vec![
            row("a", 0, 0.0, 1000.0, 1),
            row("b", 0, 0.0, 500.0, 1),
            row("b", 1, 0.0, 500.0, 1),
        ];
        let segs = segments(&[("a", 2.0, 0.0), ("b", 1.0, 0.0)], &rows);
        let got: Vec<(Option<f64>, f64, f64)> = segs
            .iter()
            .map(|s| (s.warmup_from, s.offset_s, s.end_s))
            .collect();
        assert_eq!(
            got,
            [
                (Some(0.0), 2.0, 3.0),
                (Some(3.0), 3.5, 4.0),
                (Some(4.0), 4.5, 5.0)
            ]
        );
        let band = warmup_band(&segs[1]).expect("a band");
        assert_eq!(
            (band.from, band.to, band.label.as_str()),
            (3.0, 3.5, "b run 1 warm-up (not measured)")
        );
        assert!(
            segments(&[("a", 0.0, 0.5)], &rows)
                .iter()
                .all(|s| warmup_band(s).is_none())
        );
    }

    /// Prompts made before the first send (5 s, a server tokenizer's calls) come before the
    /// run on the axis, after its warm-up, in the same band named for both.
    #[test]
    fn prompt_making_precedes_its_run() {
        let rows = vec![row("a", 0, 0.0, 1000.0, 1), row("b", 0, 0.0, 500.0, 1)];
        let segs = segments(&[("a", 0.0, 5.0), ("b", 1.0, 2.0)], &rows);
        let got: Vec<(Option<f64>, f64, f64)> = segs
            .iter()
            .map(|s| (s.warmup_from, s.offset_s, s.end_s))
            .collect();
        assert_eq!(got, [(Some(0.0), 5.0, 6.0), (Some(6.0), 9.0, 9.5)]);
        let labels: Vec<String> = segs
            .iter()
            .filter_map(warmup_band)
            .map(|b| b.label)
            .collect();
        assert_eq!(
            labels,
            [
                "a making prompts (not measured)",
                "b warm-up and making prompts (not measured)"
            ]
        );
    }

    /// A concurrency ramp: one phase per limit, from its first send; a rate ramp: the ramp,
    /// then the hold (a sawtooth: each period); no ramp: the benchmark.
    #[test]
    fn phases_follow_the_ramp() {
        let rows = [
            row("c8", 0, 0.0, 10.0, 1),
            row("c8", 0, 400.0, 10.0, 1),
            row("c8", 0, 500.0, 10.0, 2),
            row("c8", 0, 1500.0, 500.0, 3),
        ];
        let seg = Segment {
            label: "c8".into(),
            warmup_from: None,
            lead_in: "warm-up",
            offset_s: 1.0,
            end_s: 3.0,
            rows: rows.iter().collect(),
        };
        let conc = Ramp::new_over(
            "linear",
            1.0,
            3.0,
            Duration::from_secs(2),
            RampOver::Concurrency,
        )
        .ok();
        let got: Vec<(String, f64, f64)> = phases(conc, &seg)
            .into_iter()
            .map(|b| (b.label, b.from, b.to))
            .collect();
        assert_eq!(
            got,
            [
                ("c=1".to_owned(), 1.0, 1.5),
                ("c=2".to_owned(), 1.5, 2.5),
                ("c=3".to_owned(), 2.5, 3.0)
            ]
        );
        let linear = Ramp::new("linear", 10.0, 50.0, Duration::from_millis(1500)).ok();
        let got: Vec<(String, f64, f64)> = phases(linear, &seg)
            .into_iter()
            .map(|b| (b.label, b.from, b.to))
            .collect();
        assert_eq!(
            got,
            [
                ("c8 · ramp 10→50 req/s".to_owned(), 1.0, 2.5),
                ("c8 · hold 50 req/s".to_owned(), 2.5, 3.0)
            ]
        );
        let saw = Ramp::new("sawtooth", 10.0, 50.0, Duration::from_millis(800)).ok();
        let got: Vec<String> = phases(saw, &seg).into_iter().map(|b| b.label).collect();
        assert_eq!(got, ["c8 · ramp 1", "c8 · ramp 2", "c8 · ramp 3"]);
        assert_eq!(phases(None, &seg).len(), 1);
    }

    /// Windows of a tenth of the points moving by a fifth of a window; the p50 and p99 of each.
    #[test]
    fn rolling_percentiles() {
        let points: Vec<(f64, f64)> = (0..100)
            .map(|i| (f64::from(i), f64::from(i % 10)))
            .collect();
        let w = rolling(&points);
        assert_eq!(w.len(), 46, "windows of 10 from 0 to 90 by 2");
        assert_eq!((w[0].x, w[0].p50, w[0].from, w[0].to), (5.0, 4.5, 0, 10));
        assert!((w[0].p99 - 8.91).abs() < 1e-12, "{:?}", w[0]);
        assert_eq!((w[45].from, w[45].to), (90, 100));
        assert!(
            rolling(&points[..9]).is_empty(),
            "fewer than two windows of 5"
        );
        assert_eq!(rolling(&points[..10]).len(), 6);
    }
}
