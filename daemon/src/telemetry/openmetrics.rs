//! The OpenMetrics 1.0 text exposition of `/metrics`, with exemplars.
//!
//! The `prometheus` crate's text encoder writes only the classic format (0.0.4), which has no
//! exemplars; this writes the same families as OpenMetrics text (OpenMetrics 1.0, "Text
//! format"): counters as `# TYPE x counter` with `x_total` samples, `_info` gauges of value 1
//! as `info`, untyped as `unknown`, `# UNIT` where the name ends with its unit, and `# EOF`.
//! The bucket lines of the GenAI histograms and the `lmperf_diagnosis_confirmed_total` lines
//! carry the exemplars of [`ExemplarStore`] (`… # {trace_id="…",span_id="…"} value
//! timestamp`). Series and `le` values are written exactly as the classic encoder writes them,
//! so a scrape in either format makes the same series (the SLO rules select `le="…"` by those
//! strings).
//!
//! Served when the scraper's `Accept` prefers `application/openmetrics-text` (Prometheus does);
//! the classic format stays the default ([`prefers_openmetrics`]).

use std::fmt::Write as _;

use prometheus::proto::{LabelPair, Metric, MetricFamily, MetricType};

use super::exemplars::{Exemplar, ExemplarStore, SeriesKey};

/// `Content-Type` of the OpenMetrics exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Units OpenMetrics names by suffix that the OpenTelemetry → Prometheus translation appends
/// (`s` → `seconds`, `By` → `bytes`, ...).
const UNITS: &[&str] = &[
    "seconds", "bytes", "joules", "watts", "celsius", "hertz", "ratio", "meters", "volts",
    "amperes",
];

/// True when an `Accept` header ranks `application/openmetrics-text` above the classic
/// `text/plain` (RFC 9110 §12.5.1 weights; a missing `q` is 1). No header, `*/*` alone or
/// `text/plain` first keep the classic format.
pub fn prefers_openmetrics(accept: Option<&str>) -> bool {
    let Some(accept) = accept else { return false };
    let (mut om, mut text) = (0.0_f64, 0.0_f64);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f64>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => om = om.max(q),
            "text/plain" => text = text.max(q),
            _ => {}
        }
    }
    om > 0.0 && om > text
}

/// Encodes `families` as OpenMetrics text, with the exemplars `store` holds for the
/// histogram series it knows. Ends with `# EOF`.
pub fn encode(families: &[MetricFamily], store: &ExemplarStore) -> String {
    let mut out = String::with_capacity(64 * 1024);
    for mf in families {
        let name = mf.name();
        let ty = mf.get_field_type();
        let metrics = mf.get_metric();
        let is_info = ty == MetricType::GAUGE
            && name.ends_with("_info")
            && metrics.iter().all(|m| m.get_gauge().get_value() == 1.0);
        let (family, om_type) = match ty {
            MetricType::COUNTER => (name.strip_suffix("_total").unwrap_or(name), "counter"),
            MetricType::GAUGE if is_info => (name.strip_suffix("_info").unwrap_or(name), "info"),
            MetricType::GAUGE => (name, "gauge"),
            MetricType::HISTOGRAM => (name, "histogram"),
            MetricType::SUMMARY => (name, "summary"),
            MetricType::UNTYPED => (name, "unknown"),
        };
        let _ = writeln!(out, "# TYPE {family} {om_type}");
        if let Some(unit) = UNITS
            .iter()
            .find(|u| family.ends_with(&format!("_{u}")))
            .filter(|_| om_type != "info")
        {
            let _ = writeln!(out, "# UNIT {family} {unit}");
        }
        if !mf.help().is_empty() {
            let _ = writeln!(out, "# HELP {family} {}", escape(mf.help()));
        }
        for m in metrics {
            match ty {
                MetricType::COUNTER => {
                    sample(
                        &mut out,
                        family,
                        "_total",
                        m,
                        None,
                        m.get_counter().get_value(),
                    );
                    let total = format!("{family}_total");
                    exemplar(&mut out, store.for_counter(&total, &key_of(m.get_label())));
                }
                MetricType::GAUGE if is_info => sample(&mut out, name, "", m, None, 1.0),
                MetricType::GAUGE => sample(&mut out, name, "", m, None, m.get_gauge().get_value()),
                MetricType::UNTYPED => {
                    // The OpenTelemetry exporter never makes untyped families; the accessor is
                    // deprecated upstream, but a family of that type must still be written.
                    #[allow(deprecated)]
                    let v = m.get_untyped().get_value();
                    sample(&mut out, name, "", m, None, v);
                }
                MetricType::HISTOGRAM => histogram(&mut out, name, m, store),
                MetricType::SUMMARY => {
                    let s = m.get_summary();
                    for q in s.get_quantile() {
                        let qs = q.quantile().to_string();
                        sample(
                            &mut out,
                            name,
                            "",
                            m,
                            Some(("quantile", qs.as_str())),
                            q.value(),
                        );
                    }
                    sample(&mut out, name, "_sum", m, None, s.sample_sum());
                    sample(&mut out, name, "_count", m, None, s.sample_count() as f64);
                }
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

/// The series key of a gathered metric: its labels less the `otel_scope_*` ones the
/// exporter adds, sorted by name (as [`super::exemplars::series_key`] makes it).
fn key_of(labels: &[LabelPair]) -> SeriesKey {
    let mut key: SeriesKey = labels
        .iter()
        .filter(|l| !l.name().starts_with("otel_scope_"))
        .map(|l| (l.name().to_owned(), l.value().to_owned()))
        .collect();
    key.sort();
    key
}

fn histogram(out: &mut String, name: &str, m: &Metric, store: &ExemplarStore) {
    let h = m.get_histogram();
    let exemplars = store.for_series(name, &key_of(m.get_label()));
    let ex_at = |i: usize| exemplars.as_ref().and_then(|e| e.get(i).copied().flatten());
    let mut inf_seen = false;
    let mut n = 0;
    for (i, b) in h.get_bucket().iter().enumerate() {
        let ub = b.upper_bound();
        let le = if ub.is_infinite() && ub > 0.0 {
            inf_seen = true;
            "+Inf".to_owned()
        } else {
            ub.to_string()
        };
        sample(
            out,
            name,
            "_bucket",
            m,
            Some(("le", le.as_str())),
            b.cumulative_count() as f64,
        );
        exemplar(out, ex_at(i));
        n = i + 1;
    }
    if !inf_seen {
        sample(
            out,
            name,
            "_bucket",
            m,
            Some(("le", "+Inf")),
            h.get_sample_count() as f64,
        );
        exemplar(out, ex_at(n));
    }
    sample(out, name, "_sum", m, None, h.get_sample_sum());
    sample(out, name, "_count", m, None, h.get_sample_count() as f64);
}

/// Writes ` # {trace_id="…",span_id="…"} value timestamp` before the line's newline.
fn exemplar(out: &mut String, ex: Option<Exemplar>) {
    let Some(e) = ex else { return };
    if out.ends_with('\n') {
        out.pop();
    }
    let _ = writeln!(
        out,
        " # {{trace_id=\"{}\",span_id=\"{}\"}} {} {:.3}",
        e.trace_id,
        e.span_id,
        float(e.value),
        e.unix_s
    );
}

fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    m: &Metric,
    extra: Option<(&str, &str)>,
    value: f64,
) {
    out.push_str(name);
    out.push_str(suffix);
    let labels = m.get_label();
    if !labels.is_empty() || extra.is_some() {
        out.push('{');
        let mut first = true;
        let pairs = labels.iter().map(|l| (l.name(), l.value())).chain(extra);
        for (k, v) in pairs {
            if !first {
                out.push(',');
            }
            first = false;
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        out.push('}');
    }
    let _ = write!(out, " {}", float(value));
    let ts = m.timestamp_ms();
    if ts != 0 {
        let _ = write!(out, " {}", ts as f64 / 1000.0);
    }
    out.push('\n');
}

fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        v.to_string()
    }
}

/// Escapes `\`, `"` and newlines (OpenMetrics escapes all three in label values and help).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
#[path = "openmetrics_case.rs"]
mod openmetrics_case;
