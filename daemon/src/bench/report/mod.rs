//! `report.html`: one self-contained file (inline CSS and SVG, no script, no fetch) drawn from
//! the same rows and summary as the JSON outputs: latency CDFs, latency over time, throughput
//! vs concurrency, the input × output length-bucket heatmaps of p99 TTFT and E2EL and the SLO
//! compliance matrix (both drawn from `summary.json`'s `length_buckets`, see [`super::buckets`]),
//! and the error table.

pub mod capacity;
pub mod profile;
pub mod ramp;

use std::fmt::Write as _;

use super::{BenchSummary, RequestRow, Summary};

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

const W: f64 = 560.0;
const H: f64 = 260.0;
const PAD: f64 = 44.0;
/// Series with at most this many points get a marker on each.
const MARKED_POINTS: usize = 32;
const COLORS: &[&str] = &["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

/// An SVG chart of several named polylines; `x` and `y` in data units.
pub(crate) fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if !x0.is_finite() || !x1.is_finite() {
        return format!("<figure><figcaption>{}</figcaption><p>no data</p></figure>", esc(title));
    }
    if (x1 - x0).abs() < f64::EPSILON {
        // One x (a single concurrency): the point in the middle.
        x0 -= 0.5;
        x1 = x0 + 1.0;
    }
    if y1 <= 0.0 {
        y1 = 1.0;
    }
    let sx = |x: f64| PAD + (x - x0) / (x1 - x0) * (W - 2.0 * PAD);
    let sy = |y: f64| H - PAD - y / y1 * (H - 2.0 * PAD);
    let mut s = String::new();
    let _ = write!(s, r#"<figure><figcaption>{}</figcaption><svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">"#, esc(title));
    let _ = write!(s, r##"<line x1="{PAD}" y1="{}" x2="{}" y2="{}" stroke="#444"/><line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{}" stroke="#444"/>"##, H - PAD, W - PAD, H - PAD, H - PAD);
    for i in 0..=4 {
        let (xv, yv) = (x0 + (x1 - x0) * f64::from(i) / 4.0, y1 * f64::from(i) / 4.0);
        let _ = write!(s, r#"<text x="{:.1}" y="{}" font-size="10" text-anchor="middle">{}</text>"#, sx(xv), H - PAD + 14.0, fmt_num(xv));
        let _ = write!(s, r#"<text x="{}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"#, PAD - 4.0, sy(yv) + 3.0, fmt_num(yv));
    }
    let _ = write!(s, r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>"#, W / 2.0, H - 6.0, esc(x_label));
    let _ = write!(s, r#"<text x="12" y="{}" font-size="11" transform="rotate(-90 12 {})" text-anchor="middle">{}</text>"#, H / 2.0, H / 2.0, esc(y_label));
    for (i, (name, p)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = p.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
        let _ = write!(s, r#"<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{}"/>"#, path.join(" "));
        // Few points (one concurrency draws no line): a marker on each, with its values.
        if p.len() <= MARKED_POINTS {
            for &(x, y) in p {
                let _ = write!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}" data-x="{x}" data-y="{y}"/>"#, sx(x), sy(y));
            }
        }
        let _ = write!(s, r#"<text x="{}" y="{}" font-size="10" fill="{c}">{}</text>"#, W - PAD + 4.0 - 90.0, PAD + 12.0 * i as f64, esc(name));
    }
    s.push_str("</svg></figure>");
    s
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 { format!("{v:.0}") } else if v.abs() >= 1.0 { format!("{v:.1}") } else { format!("{v:.3}") }
}

fn cdf(values: &mut [f64]) -> Vec<(f64, f64)> {
    values.sort_by(f64::total_cmp);
    let n = values.len() as f64;
    values.iter().enumerate().map(|(i, &v)| (v, (i + 1) as f64 / n)).collect()
}

/// A table cell holding `value` (`data-value`: the exact number of `summary.json`, shortest
/// round-trip form), red or green against `limit` when there is one; `attrs` name the cell.
fn cell(value: Option<f64>, limit: Option<f64>, attrs: &str) -> String {
    match (value, limit) {
        (None, _) => format!("<td {attrs}>–</td>"),
        (Some(v), Some(l)) => {
            let (bg, tag) = if v <= l { ("#c8eccb", "pass") } else { ("#f6c5c5", "fail") };
            format!(r#"<td style="background:{bg}" {attrs} data-value="{v}" data-limit="{l}" data-pass="{}">{v:.1} ({tag})</td>"#, v <= l)
        }
        (Some(v), None) => format!(r#"<td {attrs} data-value="{v}">{v:.1}</td>"#),
    }
}

/// `--repeat`: the coefficient of variation of each metric across the runs, one column per
/// benchmark; cells above the limit are red and marked "unstable".
fn repeatability(h: &mut String, summary: &Summary) {
    let with: Vec<&BenchSummary> = summary.benchmarks.iter().filter(|b| b.repeat.is_some()).collect();
    let Some(first) = with.first().and_then(|b| b.repeat.as_ref()) else { return };
    let _ = write!(h, "<h2>Repeatability ({} runs per benchmark)</h2><p>Coefficient of variation across runs (sample std / mean); above {} % is flagged.</p><table class=\"repeat\"><tr><th>metric</th>", first.k, first.cv_limit_pct);
    for b in &with {
        let _ = write!(h, "<th>{}</th>", esc(&b.benchmark));
    }
    h.push_str("</tr>");
    for metric in first.metrics.keys() {
        let _ = write!(h, "<tr><td>{}</td>", esc(metric));
        for b in &with {
            match b.repeat.as_ref().and_then(|r| r.metrics.get(metric)) {
                Some(m) => {
                    let cv = m.cv_pct.map_or_else(|| "–".to_owned(), |c| format!("{c:.2} %"));
                    let (style, tag) = if m.unstable { (r#" style="background:#f6c5c5""#, " unstable") } else { ("", "") };
                    let _ = write!(
                        h,
                        r#"<td{style} data-benchmark="{}" data-repeat-metric="{}" data-cv="{}" data-unstable="{}">{cv}{tag}</td>"#,
                        esc(&b.benchmark),
                        esc(metric),
                        m.cv_pct.map_or_else(String::new, |c| c.to_string()),
                        m.unstable
                    );
                }
                None => h.push_str("<td>–</td>"),
            }
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
}

/// Renders the report.
pub fn render(summary: &Summary, rows: &[RequestRow]) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>lmperf run: {model}</title><style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse;margin:8px 0 20px}}
td,th{{border:1px solid #bbb;padding:4px 8px;text-align:right;font-size:13px}} th{{background:#eee}}
figure{{display:inline-block;margin:8px}} figcaption{{font-weight:600;font-size:13px}} h2{{margin-top:28px}}
</style></head><body><h1>lmperf run</h1><p>target <code>{target}</code> · model <code>{model}</code> · api {api} · tokenizer {tok} · seed {seed} · lmperf {ver}</p>"#,
        model = esc(&summary.model),
        target = esc(&summary.target),
        api = summary.api,
        // The summary.json name (`server_llama_cpp`), not the Rust variant's.
        tok = serde_json::to_value(summary.tokenizer).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
        seed = summary.seed,
        ver = summary.lmperf_version,
    );
    if let Some(t) = &summary.trace {
        let _ = write!(h, "<p>trace <code>{}</code> ({:?}, {} requests, speedup {}×)</p>", esc(&t.name), t.format, t.requests, t.speedup);
    }
    if !summary.failed_gates.is_empty() {
        let _ = write!(h, r#"<p style="color:#b00"><b>Gates tripped:</b> {}</p>"#, esc(&summary.failed_gates.join(", ")));
    }

    // Summary table.
    h.push_str("<h2>Benchmarks</h2><table><tr><th>benchmark</th><th>requests</th><th>ok</th><th>req/s</th><th>out tok/s</th><th>goodput</th><th>TTFT p50</th><th>TTFT p99</th><th>ITL p50</th><th>TPOT p50</th><th>E2EL p50</th><th>E2EL p99</th></tr>");
    let d = |x: &Option<super::stats::Distribution>, f: fn(&super::stats::Distribution) -> f64| x.as_ref().map_or("–".to_owned(), |d| format!("{:.1}", f(d)));
    for b in &summary.benchmarks {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&b.benchmark),
            b.num_requests,
            b.completed,
            b.request_throughput,
            b.output_token_throughput,
            b.goodput.map_or("–".to_owned(), |g| format!("{g:.2}")),
            d(&b.ttft_ms, |d| d.p50),
            d(&b.ttft_ms, |d| d.p99),
            d(&b.itl_ms, |d| d.p50),
            d(&b.tpot_ms, |d| d.p50),
            d(&b.e2el_ms, |d| d.p50),
            d(&b.e2el_ms, |d| d.p99),
        );
    }
    h.push_str("</table><p>Times in milliseconds.</p>");
    repeatability(&mut h, summary);

    // CDFs and latency over time.
    h.push_str("<h2>Latency distributions</h2>");
    for (title, get) in [("TTFT CDF", 0usize), ("E2EL CDF", 1), ("TPOT CDF", 2)] {
        let series: Vec<(String, Vec<(f64, f64)>)> = summary
            .benchmarks
            .iter()
            .map(|b| {
                let mut v: Vec<f64> = rows
                    .iter()
                    .filter(|r| r.benchmark == b.benchmark && r.outcome == "ok")
                    .filter_map(|r| match get {
                        0 => r.ttft_ms,
                        1 => Some(r.e2el_ms),
                        _ => r.tpot_ms,
                    })
                    .collect();
                (b.benchmark.clone(), cdf(&mut v))
            })
            .collect();
        h.push_str(&line_chart(title, "ms", "share of requests", &series));
    }
    let over_time: Vec<(String, Vec<(f64, f64)>)> = summary
        .benchmarks
        .iter()
        .map(|b| {
            let p = rows.iter().filter(|r| r.benchmark == b.benchmark && r.outcome == "ok").filter_map(|r| r.ttft_ms.map(|t| (r.send_ms / 1000.0, t))).collect();
            (b.benchmark.clone(), p)
        })
        .collect();
    h.push_str(&line_chart("TTFT over time", "seconds from the benchmark's start", "TTFT ms", &over_time));
    h.push_str(&super::server::report_section(summary));

    // Throughput vs concurrency, one line per input length.
    let mut lens: Vec<u32> = summary.benchmarks.iter().map(|b| b.input_len).collect();
    lens.sort_unstable();
    lens.dedup();
    let thr: Vec<(String, Vec<(f64, f64)>)> = lens
        .iter()
        .map(|&l| (format!("in {l}"), summary.benchmarks.iter().filter(|b| b.input_len == l).map(|b| (b.concurrency as f64, b.output_token_throughput)).collect()))
        .collect();
    h.push_str(&line_chart("Output tokens/s vs concurrency", "concurrency", "output tokens/s", &thr));
    h.push_str(&ramp::section(summary, rows));
    h.push_str(&capacity::section(summary));
    h.push_str(&profile::section(summary, rows));

    // Heatmaps: input bucket × output bucket of p99 TTFT and E2EL (colored against the SLO
    // when given) and the request count, one table per concurrency, every value one of
    // summary.json's `length_buckets` (requests bucketed by their own lengths).
    let slo = summary.goodput_slo;
    let _ = write!(h, "<h2>Input × output length heatmaps</h2><p>Requests bucketed by their own lengths: {}. Times in ms.</p>", esc(super::buckets::SCHEME));
    for (name, key, limit) in [("p99 TTFT (ms)", "ttft_p99", slo.ttft_ms), ("p99 E2EL (ms)", "e2el_p99", slo.e2el_ms), ("requests", "count", None)] {
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
            let _ = write!(h, r#"<table class="heatmap" data-metric="{key}" data-concurrency="{c}"><caption>concurrency {c} ({})</caption><tr><th>input \ output</th>"#, esc(&g.benchmarks.join(", ")));
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
                        (None, Some(v)) if top > 0.0 => format!(r#"style="background:rgba(31,119,180,{:.2})" "#, 0.1 + 0.5 * v / top),
                        _ => String::new(),
                    };
                    let attrs = format!(r#"{shade}data-metric="{key}" data-concurrency="{c}" data-input="{}" data-output="{}" data-count="{}""#, i.label(), o.label(), b.count);
                    if key == "count" {
                        let _ = write!(h, "<td {attrs}>{}</td>", b.count);
                    } else {
                        h.push_str(&cell(value(b), limit, &attrs));
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
    let slos: Vec<(&str, &str, f64)> = [("ttft", "TTFT", slo.ttft_ms), ("tpot", "TPOT", slo.tpot_ms), ("e2el", "E2EL", slo.e2el_ms)].into_iter().filter_map(|(k, n, l)| l.map(|l| (k, n, l))).collect();
    if slos.is_empty() {
        h.push_str("<p>No SLO given (<code>--goodput ttft:MS tpot:MS e2el:MS</code>).</p>");
    } else {
        h.push_str(r#"<table class="slo"><tr><th>concurrency</th><th>input tokens</th><th>output tokens</th><th>requests</th>"#);
        for (_, n, l) in &slos {
            let _ = write!(h, "<th>{n} p99 ≤ {l} ms</th>");
        }
        h.push_str("</tr>");
        for g in &summary.length_buckets {
            for b in &g.cells {
                let (i, o) = (b.input.label(), b.output.label());
                let _ = write!(h, "<tr><td>{}</td><td>{i}</td><td>{o}</td><td>{}</td>", g.concurrency, b.count);
                for (k, _, _) in &slos {
                    match b.slo.iter().find(|s| s.slo == *k) {
                        Some(s) => {
                            let attrs = format!(r#"data-slo="{k}_p99" data-concurrency="{}" data-input="{i}" data-output="{o}""#, g.concurrency);
                            h.push_str(&cell(s.p99_ms, Some(s.threshold_ms), &attrs));
                        }
                        None => h.push_str("<td>–</td>"),
                    }
                }
                h.push_str("</tr>");
            }
        }
        h.push_str("</table><h3>Per benchmark (all lengths pooled)</h3>");
        h.push_str(r#"<table class="slo-benchmark"><tr><th>benchmark</th><th>concurrency</th><th>input</th><th>output</th>"#);
        for (_, n, _) in &slos {
            let _ = write!(h, "<th>{n}</th>");
        }
        h.push_str("</tr>");
        for b in &summary.benchmarks {
            let _ = write!(h, "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>", esc(&b.benchmark), b.concurrency, b.input_len, b.output_len);
            for (k, _, l) in &slos {
                let d = match *k {
                    "ttft" => &b.ttft_ms,
                    "tpot" => &b.tpot_ms,
                    _ => &b.e2el_ms,
                };
                let attrs = format!(r#"data-benchmark="{}" data-bench-slo="{k}_p99""#, esc(&b.benchmark));
                h.push_str(&cell(d.as_ref().map(|d| d.p99), Some(*l), &attrs));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }
    // Errors.
    h.push_str("<h2>Errors</h2>");
    let errs: Vec<(&str, &String, &usize)> = summary.benchmarks.iter().flat_map(|b| b.errors.iter().map(move |(t, n)| (b.benchmark.as_str(), t, n))).collect();
    if errs.is_empty() {
        h.push_str("<p>None.</p>");
    } else {
        h.push_str("<table><tr><th>benchmark</th><th>error.type</th><th>requests</th></tr>");
        for (b, t, n) in errs {
            let _ = write!(h, "<tr><td>{}</td><td>{}</td><td>{n}</td></tr>", esc(b), esc(t));
        }
        h.push_str("</table>");
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    /// One concurrency: "Output tokens/s vs concurrency" shows its point (a polyline of one
    /// point draws nothing), in the middle of the x axis.
    #[test]
    fn a_single_point_is_drawn_in_the_middle() {
        let svg = super::line_chart("Output tokens/s vs concurrency", "concurrency", "output tokens/s", &[("in 128".into(), vec![(4.0, 321.5)])]);
        assert!(svg.contains(r##"<circle cx="280.0" cy="44.0" r="3" fill="#1f77b4" data-x="4" data-y="321.5"/>"##), "{svg}");
    }

    /// Axis labels are whole numbers however wide: a TTFT CDF up to 12,082 ms ends at "12082",
    /// not at a label cut to four characters ("1208", ten times too small).
    #[test]
    fn wide_axis_labels_are_not_cut() {
        let svg = super::line_chart("TTFT CDF", "ms", "share", &[("c1".into(), vec![(0.0, 0.0), (12082.0, 1.0)])]);
        assert!(svg.contains(">12082</text>"), "{svg}");
        assert!(svg.contains(">9062</text>") && !svg.contains(">1208</text>"), "{svg}");
    }
}
