//! The Prometheus text exposition format (`/metrics` of the agent and of the model servers),
//! read the simple way the tests need: one sample per line, `name{labels} value`.

use std::collections::{BTreeMap, BTreeSet};

/// The sample lines of `metric` (exactly that name, with or without labels) whose line holds
/// every `labels` fragment (`k="v"`, or any substring), as values.
fn values<'a>(
    text: &'a str,
    metric: &'a str,
    labels: &'a [&'a str],
) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(move |l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(move |l| labels.iter().all(|lab| l.contains(lab)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
}

/// Sum of `metric`'s samples whose line holds every `labels` fragment (`k="v"`); 0 when none.
pub fn sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    values(text, metric, labels).sum()
}

/// The value of the first sample of `metric` whose line holds every `labels` fragment.
pub fn first(text: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    values(text, metric, labels).next()
}

/// Sample name → the label names seen on it (from the sample lines, so histograms give
/// `_bucket` (with `le`), `_sum` and `_count`).
pub fn label_names(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_owned()).or_default();
        if line[name_end..].starts_with('{') {
            // name="value",... ; values may hold commas and escaped quotes.
            let mut rest = &line[name_end + 1..];
            while let Some(eq) = rest.find("=\"") {
                labels.insert(rest[..eq].trim_start_matches(',').trim().to_owned());
                let mut i = eq + 2;
                let bytes = rest.as_bytes();
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                rest = &rest[(i + 1).min(rest.len())..];
                if rest.starts_with('}') {
                    break;
                }
            }
        }
    }
    out
}
