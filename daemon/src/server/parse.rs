//! A tolerant parser of the Prometheus text format 0.0.4 and OpenMetrics 1.0 text: a bad line is
//! skipped and counted, never the whole page.
//!
//! Why our own: the crates that exist (`prometheus-parse` 0.2, `openmetrics-parser` 0.4) either
//! reject a whole page for one bad line, duplicate series or a NaN counter (`openmetrics-parser`),
//! or merge histogram series across label sets and index label pairs without a bounds check
//! (`prometheus-parse`). A model server's page is scraped every few seconds; one odd line
//! must not blind the agent. Fuzzed by `daemon/fuzz` (`cargo xtask fuzz-metrics`).
//!
//! What is read: `# TYPE` lines; samples `name{label="value",...} value [timestamp]` with an
//! OpenMetrics exemplar (` # {...} v [ts]`) ignored; `# EOF` ends the page; `# HELP` and other
//! comments are skipped. Values follow Go's `strconv.ParseFloat` as Prometheus does (`NaN`,
//! `+Inf`, `-Inf`, case-insensitive). Label values unescape `\\`, `\"`, `\n`.

use std::collections::{HashMap, HashSet};

/// The type a `# TYPE` line gave a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    /// `untyped` / `unknown`, or any type this parser does not use (`gaugehistogram`, `info`, …).
    Other,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The full sample name (`vllm:time_to_first_token_seconds_bucket`).
    pub name: String,
    /// Label pairs in page order.
    pub labels: Vec<(String, String)>,
    /// Finite value (NaN and ±Inf samples are dropped and counted in [`ParseStats::non_finite`]).
    pub value: f64,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// What the parser skipped, for the status and the `lmperf.server.scrapes` counter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParseStats {
    /// Lines that are not a comment, a blank or a well-formed sample.
    pub bad_lines: u64,
    /// The first bad line: its 1-based number and why (at most 120 bytes of it quoted).
    pub first_bad: Option<String>,
    /// Samples whose name and label set were seen before on the page (the first one is kept).
    pub duplicates: u64,
    /// Samples whose value is NaN or ±Inf.
    pub non_finite: u64,
    /// Whether an OpenMetrics `# EOF` ended the page.
    pub eof: bool,
}

/// A parsed page.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub samples: Vec<Sample>,
    /// Family name → type, from `# TYPE` lines.
    pub types: HashMap<String, MetricType>,
    pub stats: ParseStats,
}

impl Page {
    /// Samples named exactly `name`.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
}

/// Why a page is not a metrics page at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("the page is HTML, not the Prometheus text format (is the metrics endpoint enabled?)")]
    Html,
    #[error("no metric sample on the page ({bad_lines} unreadable lines; first: {first})")]
    NoSamples { bad_lines: u64, first: String },
    #[error("the page is empty")]
    Empty,
}

/// Parses a page. Bad lines are skipped and counted in [`Page::stats`].
///
/// # Errors
/// [`PageError::Html`] when the body looks like HTML, [`PageError::Empty`] for a blank page,
/// [`PageError::NoSamples`] when not one line is a sample.
pub fn parse(text: &str) -> Result<Page, PageError> {
    let head = text.trim_start();
    if head.is_empty() {
        return Err(PageError::Empty);
    }
    if head.starts_with('<') {
        return Err(PageError::Html);
    }
    let mut page = Page {
        samples: Vec::with_capacity(text.len() / 96),
        ..Page::default()
    };
    let mut seen: HashSet<u64> = HashSet::with_capacity(text.len() / 96);
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim_start();
            if comment == "EOF" {
                page.stats.eof = true;
                break;
            }
            if let Some(rest) = comment.strip_prefix("TYPE") {
                let mut it = rest.split_whitespace();
                if let (Some(name), Some(ty)) = (it.next(), it.next()) {
                    page.types.insert(name.to_owned(), metric_type(ty));
                }
            }
            continue;
        }
        match sample_line(line) {
            Ok(s) if !s.value.is_finite() => page.stats.non_finite += 1,
            Ok(s) => {
                if seen.insert(series_hash(&s)) {
                    page.samples.push(s);
                } else {
                    page.stats.duplicates += 1;
                }
            }
            Err(why) => {
                page.stats.bad_lines += 1;
                if page.stats.first_bad.is_none() {
                    page.stats.first_bad =
                        Some(format!("line {}: {why}: {:?}", i + 1, clip(line, 120)));
                }
            }
        }
    }
    if page.samples.is_empty() && page.stats.non_finite == 0 && page.stats.bad_lines > 0 {
        return Err(PageError::NoSamples {
            bad_lines: page.stats.bad_lines,
            first: page.stats.first_bad.clone().unwrap_or_default(),
        });
    }
    Ok(page)
}

fn metric_type(s: &str) -> MetricType {
    match s {
        "counter" => MetricType::Counter,
        "gauge" => MetricType::Gauge,
        "histogram" => MetricType::Histogram,
        "summary" => MetricType::Summary,
        _ => MetricType::Other,
    }
}

fn series_hash(s: &Sample) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut labels: Vec<&(String, String)> = s.labels.iter().collect();
    labels.sort_unstable();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.name.hash(&mut h);
    labels.hash(&mut h);
    h.finish()
}

fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// Parses one sample line (already trimmed, not a comment).
fn sample_line(line: &str) -> Result<Sample, &'static str> {
    let b = line.as_bytes();
    if !b.first().copied().is_some_and(is_name_start) {
        return Err("not a metric name");
    }
    let mut i = 1;
    while i < b.len() && is_name_char(b[i]) {
        i += 1;
    }
    let name = &line[..i];
    let mut labels = Vec::new();
    if b.get(i) == Some(&b'{') {
        i = label_set(line, i + 1, &mut labels)?;
    }
    let rest = &line[i..];
    if !rest.starts_with([' ', '\t']) {
        return Err("no space before the value");
    }
    let mut fields = rest.split_whitespace();
    let value = parse_value(fields.next().ok_or("no value")?).ok_or("value is not a number")?;
    match fields.next() {
        None | Some("#") => {}
        Some(ts) => {
            if ts.parse::<f64>().is_err() {
                return Err("timestamp is not a number");
            }
            if let Some(x) = fields.next()
                && x != "#"
            {
                return Err("text after the timestamp");
            }
        }
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses `k="v",...}` from `start` (after `{`); returns the index after `}`.
fn label_set(
    line: &str,
    start: usize,
    out: &mut Vec<(String, String)>,
) -> Result<usize, &'static str> {
    let b = line.as_bytes();
    let mut i = start;
    loop {
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
            i += 1;
        }
        match b.get(i) {
            None => return Err("unterminated label set"),
            Some(b'}') => return Ok(i + 1),
            Some(&c) if is_name_start(c) => {}
            Some(_) => return Err("bad label name"),
        }
        let k0 = i;
        while i < b.len() && is_name_char(b[i]) {
            i += 1;
        }
        let key = &line[k0..i];
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        if b.get(i) != Some(&b'=') {
            return Err("label without '='");
        }
        i += 1;
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        if b.get(i) != Some(&b'"') {
            return Err("label value not quoted");
        }
        i += 1;
        let mut value = String::new();
        let mut v0 = i;
        loop {
            match b.get(i) {
                None => return Err("unterminated label value"),
                Some(b'"') => break,
                Some(b'\\') => {
                    value.push_str(&line[v0..i]);
                    match b.get(i + 1) {
                        Some(b'n') => value.push('\n'),
                        Some(b'\\') => value.push('\\'),
                        Some(b'"') => value.push('"'),
                        _ => return Err("bad escape in label value"),
                    }
                    i += 2;
                    v0 = i;
                }
                Some(_) => i += 1,
            }
        }
        value.push_str(&line[v0..i]);
        i += 1;
        out.push((key.to_owned(), value));
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Ok(i + 1),
            _ => return Err("expected ',' or '}' after a label"),
        }
    }
}

/// A value as Go's `strconv.ParseFloat` reads it (Prometheus' `textparse`).
pub fn parse_value(s: &str) -> Option<f64> {
    match s.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "+inf" | "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        v => {
            // Rust accepts "infinity" and "nan" spellings Go's ParseFloat also accepts; reject
            // anything with letters other than an exponent.
            if v.bytes().any(|c| c.is_ascii_alphabetic() && c != b'e') {
                return None;
            }
            v.parse::<f64>().ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_types_labels_escapes_and_values() {
        let page = parse(
            "# HELP a_total Things.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\\\\\\n\"} 3.5e2 1700000000000\nb 7\n",
        )
        .unwrap();
        assert_eq!(page.types.get("a_total"), Some(&MetricType::Counter));
        assert_eq!(page.samples.len(), 2);
        assert_eq!(page.samples[0].value, 350.0);
        assert_eq!(page.samples[0].label("y"), Some("q\"\\\n"));
        assert_eq!(
            page.samples[1],
            Sample {
                name: "b".into(),
                labels: vec![],
                value: 7.0
            }
        );
        assert_eq!(page.stats, ParseStats::default());
    }

    #[test]
    fn openmetrics_exemplars_eof_and_created() {
        let page = parse(
            "# TYPE h histogram\nh_bucket{le=\"1.0\"} 2 # {trace_id=\"abc\"} 0.5 1.7e9\nh_bucket{le=\"+Inf\"} 3\nh_count 3\nh_sum 2.5\nh_created 1.7e9\n# EOF\nafter 1\n",
        )
        .unwrap();
        assert!(page.stats.eof);
        assert_eq!(page.samples.len(), 5, "{:?}", page.samples);
        assert_eq!(page.samples[0].value, 2.0);
        assert!(page.named("after").next().is_none());
    }

    #[test]
    fn bad_lines_nan_and_duplicates_are_counted_not_fatal() {
        let page = parse(
            "ok 1\n{broken 2\nx{a=b} 3\nnan_gauge NaN\ninf +Inf\nok 5\ny{a=\"1\"} abc\nz 1 2 3\n",
        )
        .unwrap();
        assert_eq!(page.samples.len(), 1);
        assert_eq!(page.samples[0].value, 1.0);
        assert_eq!(page.stats.duplicates, 1);
        assert_eq!(page.stats.non_finite, 2);
        assert_eq!(page.stats.bad_lines, 4);
        assert!(
            page.stats
                .first_bad
                .as_deref()
                .unwrap()
                .starts_with("line 2: not a metric name"),
            "{:?}",
            page.stats.first_bad
        );
    }

    #[test]
    fn html_empty_and_garbage_pages_are_errors() {
        assert_eq!(
            parse("  <!DOCTYPE html><html>nope</html>").unwrap_err(),
            PageError::Html
        );
        assert_eq!(parse("\n \n").unwrap_err(), PageError::Empty);
        assert!(matches!(
            parse("hello world\n???\n").unwrap_err(),
            PageError::NoSamples { bad_lines: 2, .. }
        ));
    }

    #[test]
    fn go_float_spellings() {
        assert_eq!(parse_value("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_value("-inf"), Some(f64::NEG_INFINITY));
        assert!(parse_value("NaN").unwrap().is_nan());
        assert_eq!(parse_value("1e3"), Some(1000.0));
        assert_eq!(parse_value("infinity"), None);
        assert_eq!(parse_value("0x10"), None);
    }
}
