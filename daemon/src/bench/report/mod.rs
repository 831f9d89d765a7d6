//! `report.html`: one self-contained file (inline CSS and SVG, no script, no fetch) drawn from
//! `summary.json` (every number in a table or sentence) and the run's rows (the plots, which
//! may be a sample): a paragraph in words, latency CDFs and latency over time, throughput vs
//! concurrency, the input × output length-bucket heatmaps of p99 TTFT and E2EL and the SLO
//! compliance matrix (both from `summary.json`'s `length_buckets`, see [`super::buckets`]),
//! and the error table.

pub mod capacity;
pub mod chart;
/// The number formatter, now the leaf module [`crate::fmt`] (its old path kept).
pub use crate::fmt;
pub mod groups;
pub mod overview;
pub mod path;
pub mod profile;
pub mod ramp;
pub mod server;
pub mod server_timing;
pub mod timeline;
pub mod workload;

use std::fmt::Write as _;

use crate::fmt::TimeUnit;
pub use chart::line_chart;
use chart::{Axis, Chart, Mark, Series};

use super::stats::Distribution;
use super::{BenchSummary, RequestRow, Summary};

/// One statistic of a distribution (`|d| d.p99`).
type Stat = fn(&Distribution) -> f64;
/// One distribution of a benchmark (`|b| &b.ttft_ms`).
pub(crate) type Pick = fn(&BenchSummary) -> &Option<Distribution>;

/// Escapes `s` for HTML text and attribute values.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A shown number of `summary.json`: `<tag>` holding `shown`, marked with where it comes from
/// (`data-benchmark` when per benchmark, `data-field`: its path in the benchmark or the summary,
/// `/`-separated, e.g. `ttft_ms/p50`) and the unit of the shown text (`data-unit`); `title`
/// holds the exact value for hover. `–` when `value` is `None`.
pub(crate) fn field(
    tag: &str,
    benchmark: Option<&str>,
    path: &str,
    value: Option<f64>,
    unit: &str,
    shown: &str,
) -> String {
    let b = benchmark.map_or_else(String::new, |b| format!(r#" data-benchmark="{}""#, esc(b)));
    match value {
        Some(v) => format!(
            r#"<{tag}{b} data-field="{path}" data-unit="{unit}" title="{v}">{shown}</{tag}>"#
        ),
        None => format!(r#"<{tag}{b} data-field="{path}" data-unit="{unit}">–</{tag}>"#),
    }
}

/// One time column of benchmarks: its header (`TTFT p50 (ms)`) and a cell per benchmark, all
/// in the column's unit (that of its largest value), three significant digits.
fn time_column<'a>(
    header: &str,
    path: &str,
    benchmarks: &'a [BenchSummary],
    get: impl Fn(&'a BenchSummary) -> Option<f64>,
) -> (String, Vec<String>) {
    let values: Vec<Option<f64>> = benchmarks.iter().map(&get).collect();
    let u = TimeUnit::for_values(values.iter().flatten().copied());
    let cells = benchmarks
        .iter()
        .zip(&values)
        .map(|(b, v)| {
            field(
                "td",
                Some(&b.benchmark),
                path,
                *v,
                u.symbol(),
                &v.map_or_else(String::new, |v| u.show(v)),
            )
        })
        .collect();
    (format!("<th>{} ({})</th>", esc(header), u.symbol()), cells)
}

/// A table of one row per benchmark: its name, then the `cols` (header, a cell per benchmark).
fn columns_table(class: &str, bs: &[BenchSummary], cols: &[(String, Vec<String>)]) -> String {
    let mut h = format!(r#"<table class="{class}"><tr><th>benchmark</th>"#);
    for (th, _) in cols {
        h.push_str(th);
    }
    h.push_str("</tr>");
    for (i, b) in bs.iter().enumerate() {
        let _ = write!(h, "<tr><td>{}</td>", esc(&b.benchmark));
        for (_, cells) in cols {
            h.push_str(&cells[i]);
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    h
}

/// The CDF's table: `summary.json`'s distribution of `key` per benchmark (count, mean and
/// percentiles), times in one unit.
fn distribution_table(summary: &Summary, key: &str, get: Pick) -> String {
    let stats: [(&str, Stat); 9] = [
        ("mean", |d| d.mean),
        ("min", |d| d.min),
        ("p50", |d| d.p50),
        ("p90", |d| d.p90),
        ("p95", |d| d.p95),
        ("p99", |d| d.p99),
        ("p99.9", |d| d.p99_9),
        ("max", |d| d.max),
        ("std", |d| d.std),
    ];
    let bs = &summary.benchmarks;
    let mut cols: Vec<(String, Vec<String>)> = vec![(
        "<th>requests</th>".to_owned(),
        bs.iter()
            .map(|b| {
                field(
                    "td",
                    Some(&b.benchmark),
                    &format!("{key}/count"),
                    get(b).as_ref().map(|d| d.count as f64),
                    "",
                    &get(b)
                        .as_ref()
                        .map_or_else(String::new, |d| fmt::count(d.count as u64)),
                )
            })
            .collect(),
    )];
    for (stat, f) in stats {
        cols.push(time_column(stat, &format!("{key}/{stat}"), bs, |b| {
            get(b).as_ref().map(f)
        }));
    }
    columns_table("distribution", bs, &cols)
        + "<p>From summary.json (every request of the benchmark).</p>"
}

/// A CDF of `metric` (ms) per benchmark from `rows` (at most 200 quantiles drawn each), with
/// `summary.json`'s distribution of `key` as its table.
fn cdf_chart(
    summary: &Summary,
    rows: &[RequestRow],
    name: &str,
    key: &str,
    metric: fn(&RequestRow) -> Option<f64>,
    get: Pick,
) -> String {
    let mut series = Vec::new();
    for b in &summary.benchmarks {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|r| r.benchmark == b.benchmark && r.outcome == "ok")
            .filter_map(metric)
            .filter(|v| v.is_finite())
            .collect();
        if v.is_empty() {
            continue;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let ranks = chart::spread(&(0..n).collect::<Vec<_>>(), 200);
        let points: Vec<(f64, f64)> = ranks
            .iter()
            .map(|&i| (v[i], (i + 1) as f64 / n as f64))
            .collect();
        let mut s = Series::new(b.benchmark.clone(), points, Mark::Line);
        s.titles = ranks
            .iter()
            .map(|&i| {
                format!(
                    "{}: {} of {n} requests ({} %) at or below {} ms",
                    b.benchmark,
                    i + 1,
                    fmt::exact((i + 1) as f64 / n as f64 * 100.0, 4),
                    fmt::exact(v[i], 6)
                )
            })
            .collect();
        series.push(s);
    }
    // The x axis spans the values only (a TPOT of 118–122 ms is not squeezed at the right).
    let x = Axis {
        from_zero: false,
        ..Axis::time(name)
    };
    let mut c = Chart::new(
        &format!("{name} CDF"),
        x,
        Axis::linear("share of requests", "", true),
        series,
    );
    c.table = chart::Table::Html(distribution_table(summary, key, get));
    c.html()
}

/// A table cell holding `value` ms shown in `unit` (`data-value`: the exact number of
/// `summary.json`, shortest round-trip form; `title`: the same for hover), red or green
/// against `limit` when there is one; `attrs` name the cell.
fn cell(value: Option<f64>, limit: Option<f64>, unit: TimeUnit, attrs: &str) -> String {
    match (value, limit) {
        (None, _) => format!("<td {attrs}>–</td>"),
        (Some(v), Some(l)) => {
            let (bg, tag) = if v <= l {
                ("#c8eccb", "pass")
            } else {
                ("#f6c5c5", "fail")
            };
            format!(
                r#"<td style="background:{bg}" {attrs} data-value="{v}" data-limit="{l}" data-pass="{}" data-unit="{}" title="{v} ms">{} ({tag})</td>"#,
                v <= l,
                unit.symbol(),
                unit.show(v)
            )
        }
        (Some(v), None) => format!(
            r#"<td {attrs} data-value="{v}" data-unit="{}" title="{v} ms">{}</td>"#,
            unit.symbol(),
            unit.show(v)
        ),
    }
}

/// `--repeat`: the coefficient of variation of each metric across the runs, one column per
/// benchmark; cells above the limit are red and marked "unstable".
fn repeatability(h: &mut String, summary: &Summary) {
    let with: Vec<&BenchSummary> = summary
        .benchmarks
        .iter()
        .filter(|b| b.repeat.is_some())
        .collect();
    let Some(first) = with.first().and_then(|b| b.repeat.as_ref()) else {
        return;
    };
    let _ = write!(
        h,
        "<h2>Repeatability ({} runs per benchmark)</h2><p>Coefficient of variation across runs (sample std / mean); above {} % is flagged.</p><table class=\"repeat\"><tr><th>metric</th>",
        first.k,
        fmt::number(first.cv_limit_pct)
    );
    for b in &with {
        let _ = write!(h, "<th>{} (CV %)</th>", esc(&b.benchmark));
    }
    h.push_str("</tr>");
    for metric in first.metrics.keys() {
        let _ = write!(h, "<tr><td>{}</td>", esc(metric));
        for b in &with {
            match b.repeat.as_ref().and_then(|r| r.metrics.get(metric)) {
                Some(m) => {
                    let cv = m.cv_pct.map_or_else(|| "–".to_owned(), fmt::number);
                    let (style, tag) = if m.unstable {
                        (r#" style="background:#f6c5c5""#, " unstable")
                    } else {
                        ("", "")
                    };
                    let _ = write!(
                        h,
                        r#"<td{style} data-benchmark="{}" data-repeat-metric="{}" data-cv="{}" data-unstable="{}" title="{}">{cv}{tag}</td>"#,
                        esc(&b.benchmark),
                        esc(metric),
                        m.cv_pct.map_or_else(String::new, |c| c.to_string()),
                        m.unstable,
                        m.cv_pct.map_or_else(String::new, |c| c.to_string()),
                    );
                }
                None => h.push_str("<td>–</td>"),
            }
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
}

/// The benchmarks table: every number a `summary.json` field (see [`field`]), times in one
/// unit per column.
fn benchmarks_table(summary: &Summary) -> String {
    let bs = &summary.benchmarks;
    let plain = |header: &str,
                 path: &str,
                 unit: &str,
                 get: fn(&BenchSummary) -> Option<f64>|
     -> (String, Vec<String>) {
        let th = if unit.is_empty() {
            format!("<th>{header}</th>")
        } else {
            format!("<th>{header} ({unit})</th>")
        };
        // Counts whole, rates to three significant digits.
        let show = |v: f64| {
            if unit.is_empty() {
                fmt::count(v as u64)
            } else {
                fmt::number(v)
            }
        };
        (
            th,
            bs.iter()
                .map(|b| {
                    field(
                        "td",
                        Some(&b.benchmark),
                        path,
                        get(b),
                        unit,
                        &get(b).map_or_else(String::new, show),
                    )
                })
                .collect(),
        )
    };
    let cols = [
        plain("requests", "num_requests", "", |b| {
            Some(b.num_requests as f64)
        }),
        plain("ok", "completed", "", |b| Some(b.completed as f64)),
        plain("error rate", "error_rate", "ratio", |b| Some(b.error_rate)),
        plain("OOM rate", "oom_rate", "ratio", |b| Some(b.oom_rate)),
        plain("request rate", "request_throughput", "req/s", |b| {
            Some(b.request_throughput)
        }),
        plain("output", "output_token_throughput", "tok/s", |b| {
            Some(b.output_token_throughput)
        }),
        plain("goodput", "goodput", "req/s", |b| b.goodput),
        time_column("TTFT p50", "ttft_ms/p50", bs, |b| {
            b.ttft_ms.as_ref().map(|d| d.p50)
        }),
        time_column("TTFT p90", "ttft_ms/p90", bs, |b| {
            b.ttft_ms.as_ref().map(|d| d.p90)
        }),
        time_column("TTFT p99", "ttft_ms/p99", bs, |b| {
            b.ttft_ms.as_ref().map(|d| d.p99)
        }),
        time_column("TTFO p50", "ttfo_ms/p50", bs, |b| {
            b.ttfo_ms.as_ref().map(|d| d.p50)
        }),
        time_column("TTFO p99", "ttfo_ms/p99", bs, |b| {
            b.ttfo_ms.as_ref().map(|d| d.p99)
        }),
        time_column("ITL p50", "itl_ms/p50", bs, |b| {
            b.itl_ms.as_ref().map(|d| d.p50)
        }),
        time_column("TPOT p50", "tpot_ms/p50", bs, |b| {
            b.tpot_ms.as_ref().map(|d| d.p50)
        }),
        time_column("TPOT p90", "tpot_ms/p90", bs, |b| {
            b.tpot_ms.as_ref().map(|d| d.p90)
        }),
        time_column("TPOT p99", "tpot_ms/p99", bs, |b| {
            b.tpot_ms.as_ref().map(|d| d.p99)
        }),
        time_column("E2EL p50", "e2el_ms/p50", bs, |b| {
            b.e2el_ms.as_ref().map(|d| d.p50)
        }),
        time_column("E2EL p99", "e2el_ms/p99", bs, |b| {
            b.e2el_ms.as_ref().map(|d| d.p99)
        }),
    ];
    format!(
        "<h2>Benchmarks</h2>{}<p>Three significant digits; hover a cell for its exact value (summary.json).</p>",
        columns_table("benchmarks", bs, &cols)
    )
}

/// Output tokens/s against the concurrency, one line per input length, from `summary.json`.
fn throughput_chart(summary: &Summary) -> String {
    let mut lens: Vec<u32> = summary.benchmarks.iter().map(|b| b.input_len).collect();
    lens.sort_unstable();
    lens.dedup();
    let series = lens
        .iter()
        .map(|&l| {
            let bs: Vec<&BenchSummary> = summary
                .benchmarks
                .iter()
                .filter(|b| b.input_len == l)
                .collect();
            let mut s = Series::new(
                format!("input {l} tokens"),
                bs.iter()
                    .map(|b| (b.concurrency as f64, b.output_token_throughput))
                    .collect(),
                Mark::Line,
            );
            s.titles = bs
                .iter()
                .map(|b| {
                    format!(
                        "{}: concurrency {}, {} output tok/s",
                        b.benchmark, b.concurrency, b.output_token_throughput
                    )
                })
                .collect();
            s
        })
        .collect();
    Chart::new(
        "Output tokens/s vs concurrency",
        Axis::linear("concurrency", "", false),
        Axis::linear("output throughput", "tok/s", true),
        series,
    )
    .html()
}

/// Renders the report.
pub fn render(summary: &Summary, rows: &[RequestRow]) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>lmperf run: {model}</title><style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}} table{{border-collapse:collapse;margin:8px 0 20px}}
td,th{{border:1px solid #bbb;padding:4px 8px;text-align:right;font-size:13px;font-variant-numeric:tabular-nums}} th{{background:#eee}}
figure{{display:inline-block;margin:8px;vertical-align:top}} figcaption{{font-weight:600;font-size:13px}} h2{{margin-top:28px}}
#overview{{font-size:15px;line-height:1.5;max-width:900px;background:#f6f8fa;padding:10px 14px;border-left:4px solid #1f77b4}}
caption{{white-space:nowrap;text-align:left;font-size:13px}} details{{font-size:12px}} details table td,details table th{{font-size:11px;padding:2px 6px}}
</style></head><body><h1>lmperf run</h1><p>target <code>{target}</code> · model <code>{model}</code> · api {api} · tokenizer {tok} · seed {seed} · lmperf {ver}</p>"#,
        model = esc(&summary.model),
        target = esc(&summary.target),
        api = summary.api,
        // The summary.json name (`server_llama_cpp`), not the Rust variant's.
        tok = serde_json::to_value(summary.tokenizer)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        seed = summary.seed,
        ver = summary.lmperf_version,
    );
    h.push_str(&overview::paragraph(summary));
    if let Some(t) = &summary.trace {
        let _ = write!(
            h,
            "<p>trace <code>{}</code> ({:?}, {} requests, speedup {}×)</p>",
            esc(&t.name),
            t.format,
            fmt::count(t.requests as u64),
            fmt::number(t.speedup)
        );
    }
    if !summary.failed_gates.is_empty() {
        let _ = write!(
            h,
            r#"<p style="color:#b00"><b>Gates tripped:</b> {}</p>"#,
            esc(&summary.failed_gates.join(", "))
        );
    }
    h.push_str(&benchmarks_table(summary));
    repeatability(&mut h, summary);

    // CDFs (tables: summary.json) and latency over time.
    h.push_str("<h2>Latency distributions</h2>");
    h.push_str(&cdf_chart(
        summary,
        rows,
        "TTFT",
        "ttft_ms",
        |r| r.ttft_ms,
        |b| &b.ttft_ms,
    ));
    h.push_str(&cdf_chart(
        summary,
        rows,
        "E2EL",
        "e2el_ms",
        |r| Some(r.e2el_ms),
        |b| &b.e2el_ms,
    ));
    h.push_str(&cdf_chart(
        summary,
        rows,
        "TPOT",
        "tpot_ms",
        |r| r.tpot_ms,
        |b| &b.tpot_ms,
    ));
    h.push_str("<h2>Latency over time</h2>");
    if summary.benchmarks.iter().all(|b| b.completed == 0) {
        h.push_str("<p>No successful request.</p>");
    }
    for (name, metric) in [
        (
            "TTFT",
            (|r: &RequestRow| r.ttft_ms) as fn(&RequestRow) -> Option<f64>,
        ),
        ("E2EL", |r| Some(r.e2el_ms)),
    ] {
        h.push_str(&timeline::plot(summary, rows, name, metric).unwrap_or_default());
    }
    h.push_str(&(server::section(summary) + &server_timing::section(summary)));
    h.push_str(&groups::sections(summary));
    h.push_str("<h2>Throughput</h2>");
    h.push_str(&throughput_chart(summary));
    h.push_str(&ramp::section(summary, rows));
    h.push_str(&capacity::section(summary));
    h.push_str(&profile::section(summary, rows));
    h.push_str(&workload::section(summary));

    // Heatmaps: input bucket × output bucket of p99 TTFT and E2EL (colored against the SLO
    // when given) and the request count, one table per concurrency, every value one of
    // summary.json's `length_buckets` (requests bucketed by their own lengths).
    let slo = summary.goodput_slo;
    let _ = write!(
        h,
        "<h2>Input × output length heatmaps</h2><p>Requests bucketed by their own lengths: {}.</p>",
        esc(super::buckets::SCHEME)
    );
    for (name, key, limit) in [
        ("p99 TTFT", "ttft_p99", slo.ttft_ms),
        ("p99 E2EL", "e2el_p99", slo.e2el_ms),
        ("requests", "count", None),
    ] {
        let _ = write!(h, "<h3>{} by input × output tokens</h3>", esc(name));
        for g in &summary.length_buckets {
            let c = g.concurrency;
            let value = |b: &super::buckets::BucketCell| match key {
                "ttft_p99" => b.ttft_p99_ms,
                "e2el_p99" => b.e2el_p99_ms,
                _ => Some(b.count as f64),
            };
            // Without an SLO to color against, shade by the value (darkest: the largest).
            let top = g.cells.iter().filter_map(value).fold(0.0f64, f64::max);
            let unit = TimeUnit::for_values(g.cells.iter().filter_map(value));
            let what = if key == "count" {
                String::new()
            } else {
                format!(", {name} in {}", unit.symbol())
            };
            let _ = write!(
                h,
                r#"<table class="heatmap" data-metric="{key}" data-concurrency="{c}"{}><caption>concurrency {c}{} ({}){what}</caption><tr><th>input \ output</th>"#,
                g.image_size.as_ref().map_or(String::new(), |s| format!(
                    r#" data-image-size="{}""#,
                    esc(s)
                )),
                g.image_size
                    .as_ref()
                    .map_or(String::new(), |s| format!(", images {}", esc(s))),
                esc(&g.benchmarks.join(", "))
            );
            for o in &g.output_buckets {
                let _ = write!(h, "<th>{}</th>", o.label());
            }
            h.push_str("</tr>");
            for i in &g.input_buckets {
                let _ = write!(h, "<tr><th>{}</th>", i.label());
                for o in &g.output_buckets {
                    let Some(b) = g.cells.iter().find(|b| b.input == *i && b.output == *o) else {
                        h.push_str("<td>–</td>");
                        continue;
                    };
                    let shade = match (limit, value(b)) {
                        (None, Some(v)) if top > 0.0 => format!(
                            r#"style="background:rgba(31,119,180,{:.2})" "#,
                            0.1 + 0.5 * v / top
                        ),
                        _ => String::new(),
                    };
                    let attrs = format!(
                        r#"{shade}data-metric="{key}" data-concurrency="{c}" data-input="{}" data-output="{}" data-count="{}""#,
                        i.label(),
                        o.label(),
                        b.count
                    );
                    if key == "count" {
                        let _ = write!(
                            h,
                            r#"<td {attrs} title="{} requests">{}</td>"#,
                            b.count,
                            fmt::count(b.count as u64)
                        );
                    } else {
                        h.push_str(&cell(value(b), limit, unit, &attrs));
                    }
                }
                h.push_str("</tr>");
            }
            h.push_str("</table>");
        }
    }

    // SLO compliance matrix: (concurrency, input bucket, output bucket) × SLO, p99 vs
    // threshold, from summary.json's cells; then the same per benchmark, all lengths pooled.
    h.push_str("<h2>SLO compliance (p99 vs threshold)</h2>");
    let picks: [(&str, &str, Option<f64>, Pick); 3] = [
        ("ttft", "TTFT", slo.ttft_ms, |b| &b.ttft_ms),
        ("tpot", "TPOT", slo.tpot_ms, |b| &b.tpot_ms),
        ("e2el", "E2EL", slo.e2el_ms, |b| &b.e2el_ms),
    ];
    // Each SLO's column unit: that of the largest of its limit and values (1.20 s, not 1,203 ms).
    let slos: Vec<(&str, &str, f64, TimeUnit)> = picks
        .into_iter()
        .filter_map(|(k, n, l, pick)| {
            let l = l?;
            let cells = summary.length_buckets.iter().flat_map(|g| {
                g.cells
                    .iter()
                    .flat_map(|c| c.slo.iter().filter(|s| s.slo == k).filter_map(|s| s.p99_ms))
            });
            let pooled = summary
                .benchmarks
                .iter()
                .filter_map(|b| pick(b).as_ref().map(|d| d.p99));
            Some((
                k,
                n,
                l,
                TimeUnit::for_values(cells.chain(pooled).chain([l])),
            ))
        })
        .collect();
    if slos.is_empty() {
        h.push_str("<p>No SLO given (<code>--goodput ttft:MS tpot:MS e2el:MS</code>).</p>");
    } else {
        h.push_str(r#"<table class="slo"><tr><th>concurrency</th><th>input tokens</th><th>output tokens</th><th>requests</th>"#);
        for (_, n, l, u) in &slos {
            let _ = write!(
                h,
                "<th>{n} p99 ≤ {} ({})</th>",
                fmt::limit_ms(*l),
                u.symbol()
            );
        }
        h.push_str("</tr>");
        for g in &summary.length_buckets {
            for b in &g.cells {
                let (i, o) = (b.input.label(), b.output.label());
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{i}</td><td>{o}</td><td>{}</td>",
                    g.concurrency,
                    fmt::count(b.count as u64)
                );
                for (k, _, _, u) in &slos {
                    match b.slo.iter().find(|s| s.slo == *k) {
                        Some(s) => {
                            let attrs = format!(
                                r#"data-slo="{k}_p99" data-concurrency="{}" data-input="{i}" data-output="{o}""#,
                                g.concurrency
                            );
                            h.push_str(&cell(s.p99_ms, Some(s.threshold_ms), *u, &attrs));
                        }
                        None => h.push_str("<td>–</td>"),
                    }
                }
                h.push_str("</tr>");
            }
        }
        h.push_str("</table><h3>Per benchmark (all lengths pooled)</h3>");
        h.push_str(r#"<table class="slo-benchmark"><tr><th>benchmark</th><th>concurrency</th><th>input</th><th>output</th>"#);
        for (_, n, l, u) in &slos {
            let _ = write!(
                h,
                "<th>{n} p99 ≤ {} ({})</th>",
                fmt::limit_ms(*l),
                u.symbol()
            );
        }
        h.push_str("</tr>");
        for b in &summary.benchmarks {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                esc(&b.benchmark),
                b.concurrency,
                b.input_len,
                b.output_len
            );
            for (k, _, l, u) in &slos {
                let d = match *k {
                    "ttft" => &b.ttft_ms,
                    "tpot" => &b.tpot_ms,
                    _ => &b.e2el_ms,
                };
                let attrs = format!(
                    r#"data-benchmark="{}" data-bench-slo="{k}_p99""#,
                    esc(&b.benchmark)
                );
                h.push_str(&cell(d.as_ref().map(|d| d.p99), Some(*l), *u, &attrs));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }
    // Errors.
    h.push_str("<h2>Errors</h2>");
    let errs: Vec<(&str, &String, &usize)> = summary
        .benchmarks
        .iter()
        .flat_map(|b| {
            b.errors
                .iter()
                .map(move |(t, n)| (b.benchmark.as_str(), t, n))
        })
        .collect();
    if errs.is_empty() {
        h.push_str("<p>None.</p>");
    } else {
        h.push_str("<table><tr><th>benchmark</th><th>error.type</th><th>requests</th></tr>");
        for (b, t, n) in errs {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td>{}</tr>",
                esc(b),
                esc(t),
                field(
                    "td",
                    Some(b),
                    &format!("errors/{t}"),
                    Some(*n as f64),
                    "",
                    &fmt::count(*n as u64)
                )
            );
        }
        h.push_str("</table><ul class=\"error-reasons\">");
        for b in &summary.benchmarks {
            for r in b.error_reasons() {
                let _ = write!(h, "<li>{}: {}</li>", esc(&b.benchmark), esc(&r));
            }
        }
        h.push_str("</ul>");
    }
    h.push_str("</body></html>\n");
    h
}
