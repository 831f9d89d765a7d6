//! A tolerant parser of the Prometheus text format 0.0.4 and OpenMetrics 1.0 text: a bad line is
//! skipped and counted, never the whole page.
//!
//! Why our own: the crates that exist (`prometheus-parse` 0.2, `openmetrics-parser` 0.4) either
//! reject a whole page for one bad line, duplicate series or a NaN counter (`openmetrics-parser`),
//! or merge histogram series across label sets and index label pairs without a bounds check
//! (`prometheus-parse`). A model server's page is scraped every few seconds; one odd line
//! must not blind the agent. Fuzzed by `daemon/fuzz` (target `parse_metrics`).
//!
//! What is read: `# TYPE` lines; samples `name{label="value",...} value [timestamp]` with an
//! OpenMetrics exemplar (` # {...} v [ts]`) ignored; `# EOF` ends the page; `# HELP` and other
//! comments are skipped. Values follow Go's `strconv.ParseFloat` as Prometheus does (`NaN`,
//! `+Inf`, `-Inf`, case-insensitive). Label values unescape `\\`, `\"`, `\n`.
//!
//! Cost (the scraper reads every page every second): a [`Page`] borrows from the text (no
//! allocation per line or label); label values are unescaped only when read
//! ([`Sample::label`]); [`parse_with`] keeps only the samples a caller reads (every line is
//! still checked and counted), and hashes are a seeded folded multiply, not SipHash.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};

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

/// One sample line, borrowed from the page text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    /// The full sample name (`vllm:time_to_first_token_seconds_bucket`).
    pub name: &'a str,
    /// The label set as on the page, after `{` up to and including `}` (checked well-formed;
    /// values still escaped); empty without labels.
    raw_labels: &'a str,
    /// Finite value (NaN and ±Inf samples are dropped and counted in [`ParseStats::non_finite`]).
    pub value: f64,
    /// Its label pairs in its page's `pairs` (start, count), for [`Page::label`].
    pairs: (u32, u32),
}

impl<'a> Sample<'a> {
    /// The value of label `key`, unescaped (borrowed unless it had an escape).
    pub fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The label pairs in page order, values unescaped.
    pub fn labels(&self) -> impl Iterator<Item = (&'a str, Cow<'a, str>)> + 'a {
        let (raw, mut i) = (self.raw_labels, 0);
        std::iter::from_fn(move || {
            let p = next_pair(raw.as_bytes(), &mut i).ok()??;
            let value = &raw[p.value.0..p.value.1];
            let value = if p.escaped {
                Cow::Owned(unescape(value))
            } else {
                Cow::Borrowed(value)
            };
            Some((&raw[p.key.0..p.key.1], value))
        })
    }
}

/// What the parser skipped, for the status and the `lmperf.server.scrapes` counter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParseStats {
    /// Lines that are not a comment, a blank or a well-formed sample.
    pub bad_lines: u64,
    /// The first bad line: its 1-based number and why (at most 120 bytes of it quoted).
    pub first_bad: Option<String>,
    /// Kept samples whose name and label set were seen before on the page (the first one is
    /// kept); with [`parse_with`], only among the samples kept.
    pub duplicates: u64,
    /// Samples whose value is NaN or ±Inf.
    pub non_finite: u64,
    /// Whether an OpenMetrics `# EOF` ended the page.
    pub eof: bool,
}

/// A parsed page, borrowing from its text.
#[derive(Debug, Clone, Default)]
pub struct Page<'a> {
    /// The samples kept, in page order.
    pub samples: Vec<Sample<'a>>,
    /// Family name → type, from `# TYPE` lines ([`Page::metric_type`]).
    types: HashMap<&'a str, MetricType, Seeded>,
    pub stats: ParseStats,
    /// Well-formed sample lines with a finite value, kept or not (duplicates included).
    pub sample_lines: u64,
    /// Well-formed finite sample lines per server prefix: `vllm:`, `sglang:`, `tgi_`,
    /// `llamacpp:` (kept or not), for the kind detection.
    pub prefix_lines: [u64; 5],
    /// Sample name → its slot in `slots`.
    index: HashMap<&'a str, usize, Seeded>,
    /// Indices into `samples`, per name.
    slots: Vec<Vec<u32>>,
    /// The kept samples' label pairs (byte ranges in their lines), read once by the parse.
    pairs: Vec<Pair>,
}

impl<'a> Page<'a> {
    /// The value of label `key` of `s`, one of this page's samples, as [`Sample::label`] reads
    /// it, from the pairs the parse found (no second scan of the label set).
    pub fn label(&self, s: &Sample<'a>, key: &str) -> Option<Cow<'a, str>> {
        let (from, n) = (s.pairs.0 as usize, s.pairs.1 as usize);
        // The ranges count from the line's start; the label set starts after `name{`.
        let o = s.name.len() + 1;
        let raw = s.raw_labels;
        let at = |r: (usize, usize)| raw.get(r.0.checked_sub(o)?..r.1.checked_sub(o)?);
        for p in self.pairs.get(from..from + n)? {
            if at(p.key) == Some(key) {
                let v = at(p.value)?;
                return Some(if p.escaped {
                    Cow::Owned(unescape(v))
                } else {
                    Cow::Borrowed(v)
                });
            }
        }
        None
    }

    /// The type a `# TYPE` line gave the family `family`.
    pub fn metric_type(&self, family: &str) -> Option<MetricType> {
        self.types.get(family).copied()
    }

    /// Samples named exactly `name`, in page order.
    pub fn named<'p>(&'p self, name: &str) -> impl Iterator<Item = &'p Sample<'a>> + 'p {
        self.index
            .get(name)
            .and_then(|&slot| self.slots.get(slot))
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(move |&i| self.samples.get(i as usize))
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

/// Parses a page, keeping every sample. Bad lines are skipped and counted in [`Page::stats`].
///
/// # Errors
/// [`PageError::Html`] when the body looks like HTML, [`PageError::Empty`] for a blank page,
/// [`PageError::NoSamples`] when not one line is a sample.
pub fn parse(text: &str) -> Result<Page<'_>, PageError> {
    parse_with(text, |_| true)
}

/// Parses a page, keeping the samples whose name `keep` accepts. Every line is still checked:
/// bad lines, NaN/±Inf values and the per-prefix counts cover the whole page; duplicates are
/// counted among the kept samples. `keep` is asked once per run of lines with the same name.
///
/// # Errors
/// As [`parse`].
pub fn parse_with(text: &str, keep: impl Fn(&str) -> bool) -> Result<Page<'_>, PageError> {
    let head = text.trim_start();
    if head.is_empty() {
        return Err(PageError::Empty);
    }
    if head.starts_with('<') {
        return Err(PageError::Html);
    }
    let seed = Seeded::new();
    let mut page = Page {
        index: HashMap::with_hasher(seed),
        types: HashMap::with_hasher(seed),
        samples: Vec::with_capacity(text.len() / 128),
        ..Page::default()
    };
    let mut seen: HashSet<u64, Seeded> = HashSet::with_capacity_and_hasher(text.len() / 128, seed);
    // The previous line's name: its prefix, whether it is kept, and its slot.
    let mut last: (&str, Option<usize>, Option<usize>) = ("", None, None);
    // The label pairs of the line being read (byte ranges in it), reused line to line.
    let mut pairs: Vec<Pair> = Vec::new();
    for (i, raw) in lines(text).enumerate() {
        let line = raw.trim_ascii();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim_ascii_start();
            if comment == "EOF" {
                page.stats.eof = true;
                break;
            }
            if let Some(rest) = comment.strip_prefix("TYPE") {
                let mut it = rest.split_ascii_whitespace();
                if let (Some(name), Some(ty)) = (it.next(), it.next()) {
                    page.types.insert(name, metric_type(ty));
                }
            }
            continue;
        }
        let s = match sample_line(line, last.0, &mut pairs) {
            Ok(s) => s,
            Err(why) => {
                page.stats.bad_lines += 1;
                if page.stats.first_bad.is_none() {
                    page.stats.first_bad =
                        Some(format!("line {}: {why}: {:?}", i + 1, clip(line, 120)));
                }
                continue;
            }
        };
        if !s.value.is_finite() {
            page.stats.non_finite += 1;
            continue;
        }
        page.sample_lines += 1;
        if s.name != last.0 {
            let slot = if keep(s.name) {
                let next = page.slots.len();
                let slot = *page.index.entry(s.name).or_insert(next);
                if slot == next {
                    page.slots.push(Vec::new());
                }
                Some(slot)
            } else {
                None
            };
            last = (s.name, prefix_of(s.name), slot);
        }
        if let Some(p) = last.1
            && let Some(n) = page.prefix_lines.get_mut(p)
        {
            *n += 1;
        }
        let Some(slot) = last.2 else { continue };
        if !seen.insert(series_hash(seed.0, s.name, line.as_bytes(), &pairs)) {
            page.stats.duplicates += 1;
            continue;
        }
        let at = u32::try_from(page.samples.len()).unwrap_or(u32::MAX);
        if let Some(v) = page.slots.get_mut(slot) {
            v.push(at);
        }
        let mut s = s;
        s.pairs = (
            u32::try_from(page.pairs.len()).unwrap_or(u32::MAX),
            u32::try_from(pairs.len()).unwrap_or(0),
        );
        page.pairs.extend_from_slice(&pairs);
        page.samples.push(s);
    }
    if page.sample_lines == 0 && page.stats.non_finite == 0 && page.stats.bad_lines > 0 {
        return Err(PageError::NoSamples {
            bad_lines: page.stats.bad_lines,
            first: page.stats.first_bad.clone().unwrap_or_default(),
        });
    }
    Ok(page)
}

/// The lines of `text` as `str::lines` splits them (on `\n`; the caller trims a `\r`), the
/// newline found eight bytes at a time.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = find_any(rest.as_bytes(), 0, [b'\n']);
        let line = rest.get(..end).unwrap_or_default();
        rest = rest.get(end + 1..).unwrap_or_default();
        Some(line)
    })
}

/// The server prefixes [`Page::prefix_lines`] counts, in its order.
pub const PREFIXES: [&str; 5] = ["vllm:", "sglang:", "tgi_", "llamacpp:", "dynamo_frontend_"];

fn prefix_of(name: &str) -> Option<usize> {
    PREFIXES.iter().position(|p| name.starts_with(p))
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

/// A per-page random seed for the page's hash tables and series hashes (a page cannot be
/// written to collide them), hashing with a folded multiply: far cheaper than SipHash on the
/// short keys of a metrics page.
#[derive(Debug, Clone, Copy, Default)]
struct Seeded(u64);

impl Seeded {
    fn new() -> Self {
        Self(std::collections::hash_map::RandomState::new().hash_one(0x6c6d_7065_7266_u64) | 1)
    }
}

impl BuildHasher for Seeded {
    type Hasher = Folded;
    fn build_hasher(&self) -> Folded {
        Folded(self.0)
    }
}

/// The hasher of [`Seeded`].
struct Folded(u64);

const K0: u64 = 0x9E37_79B9_7F4A_7C15;
const K1: u64 = 0xD6E8_FEB8_6659_FD93;

fn fold(a: u64, b: u64) -> u64 {
    let m = u128::from(a).wrapping_mul(u128::from(b));
    (m as u64) ^ ((m >> 64) as u64)
}

/// A seeded hash of `bytes` (its length included).
fn hash_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = fold(seed ^ K0, (bytes.len() as u64) ^ K1);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = fold(h ^ u64::from_le_bytes(w), K1);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = fold(h ^ u64::from_le_bytes(w), K0);
    }
    h
}

impl Hasher for Folded {
    fn finish(&self) -> u64 {
        fold(self.0, K0)
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_bytes(self.0, bytes);
    }
    fn write_u8(&mut self, i: u8) {
        self.0 = fold(self.0 ^ u64::from(i), K1);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = fold(self.0 ^ i, K1);
    }
}

/// A hash of the name and the label set (`pairs`: byte ranges in `line`), independent of the
/// labels' order (a sum of per-pair hashes). Escaped values hash as written: an escape has one
/// spelling.
fn series_hash(seed: u64, name: &str, line: &[u8], pairs: &[Pair]) -> u64 {
    let mut h = hash_bytes(seed, name.as_bytes());
    for p in pairs {
        let (Some(k), Some(v)) = (line.get(p.key.0..p.key.1), line.get(p.value.0..p.value.1))
        else {
            continue;
        };
        h = h.wrapping_add(hash_bytes(hash_bytes(seed, k), v));
    }
    h
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

/// Bytes of a metric or label name: `[a-zA-Z0-9_:]` (a table: names are most of a page).
const NAME_CHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric() || b == b'_' || b == b':';
        c += 1;
    }
    t
};

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_char(b: u8) -> bool {
    NAME_CHAR[usize::from(b)]
}

/// The end of the name whose bytes from `i` on are being read (the first one checked by the
/// caller): the first byte that is not a name byte.
fn name_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_name_char(b[i]) {
        i += 1;
    }
    i
}

/// The index of the first byte of `b` from `i` that is one of `set` (`b.len()` if none),
/// eight bytes at a time.
fn find_any<const N: usize>(b: &[u8], mut i: usize, set: [u8; N]) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let pats = set.map(|c| LO * u64::from(c));
    while let Some(chunk) = b.get(i..i + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let w = u64::from_le_bytes(w);
        // A zero byte of `w ^ pat` is a match; the lowest flagged byte is always a true one.
        let m = pats.iter().fold(0, |m, p| {
            let x = w ^ p;
            m | (x.wrapping_sub(LO) & !x)
        }) & HI;
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < b.len() && !set.contains(&b[i]) {
        i += 1;
    }
    i
}

/// The index of the first `"` or `\` in `b` from `i` (`b.len()` if none).
fn quote_or_escape(b: &[u8], i: usize) -> usize {
    find_any(b, i, [b'"', b'\\'])
}

/// Parses one sample line (already trimmed, not a comment); its label pairs' byte ranges go
/// to `pairs` (cleared first). `prev_name`: the previous sample's name (or empty), a well-formed
/// name.
fn sample_line<'a>(
    line: &'a str,
    prev_name: &str,
    pairs: &mut Vec<Pair>,
) -> Result<Sample<'a>, &'static str> {
    let b = line.as_bytes();
    pairs.clear();
    if !b.first().copied().is_some_and(is_name_start) {
        return Err("not a metric name");
    }
    // Lines of one name come in runs (a histogram's buckets): the previous line's name, when
    // this line starts with it and it ends there, is this one's without a byte-by-byte walk.
    let mut i = if !prev_name.is_empty()
        && b.starts_with(prev_name.as_bytes())
        && !b.get(prev_name.len()).copied().is_some_and(is_name_char)
    {
        prev_name.len()
    } else {
        name_end(b, 1)
    };
    let name = line.get(..i).ok_or("not a metric name")?;
    let mut raw_labels = "";
    if b.get(i) == Some(&b'{') {
        let start = i + 1;
        i = start;
        while let Some(p) = next_pair(b, &mut i)? {
            pairs.push(p);
        }
        raw_labels = &line[start..i];
    }
    let rest = &line[i..];
    if !rest.starts_with([' ', '\t']) {
        return Err("no space before the value");
    }
    let mut fields = rest.split_ascii_whitespace();
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
        name,
        raw_labels,
        value,
        pairs: (0, 0),
    })
}

/// One `k="v"` of a label set: byte ranges of the key and of the (escaped) value.
#[derive(Debug, Clone, Copy)]
struct Pair {
    key: (usize, usize),
    value: (usize, usize),
    escaped: bool,
}

/// The next pair of a label set at `*i` (after `{` or a pair); `None` at the closing `}`,
/// with `*i` just after it.
fn next_pair(b: &[u8], i: &mut usize) -> Result<Option<Pair>, &'static str> {
    let mut j = *i;
    while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
        j += 1;
    }
    match b.get(j) {
        None => return Err("unterminated label set"),
        Some(b'}') => {
            *i = j + 1;
            return Ok(None);
        }
        Some(&c) if is_name_start(c) => {}
        Some(_) => return Err("bad label name"),
    }
    let k0 = j;
    j = name_end(b, j + 1);
    let key = (k0, j);
    while j < b.len() && b[j] == b' ' {
        j += 1;
    }
    if b.get(j) != Some(&b'=') {
        return Err("label without '='");
    }
    j += 1;
    while j < b.len() && b[j] == b' ' {
        j += 1;
    }
    if b.get(j) != Some(&b'"') {
        return Err("label value not quoted");
    }
    j += 1;
    let v0 = j;
    let mut escaped = false;
    loop {
        j = quote_or_escape(b, j);
        match b.get(j) {
            None => return Err("unterminated label value"),
            Some(b'"') => break,
            _ => {
                if !matches!(b.get(j + 1), Some(b'n' | b'\\' | b'"')) {
                    return Err("bad escape in label value");
                }
                escaped = true;
                j += 2;
            }
        }
    }
    let value = (v0, j);
    j += 1;
    while j < b.len() && b[j] == b' ' {
        j += 1;
    }
    match b.get(j) {
        Some(b',') => j += 1,
        Some(b'}') => {}
        _ => return Err("expected ',' or '}' after a label"),
    }
    *i = j;
    Ok(Some(Pair {
        key,
        value,
        escaped,
    }))
}

/// A checked label value with its escapes (`\\`, `\"`, `\n`) resolved.
fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// A value as Go's `strconv.ParseFloat` reads it (Prometheus' `textparse`).
pub fn parse_value(s: &str) -> Option<f64> {
    // A sign then a digit or '.': only a decimal number can parse (Rust's and Go's spellings
    // of NaN and infinities start with a letter), and Rust rejects Go's hex and '_' forms.
    let b = s.as_bytes();
    let first = match b.first() {
        Some(b'+' | b'-') => b.get(1),
        f => f,
    };
    if first.is_some_and(|c| c.is_ascii_digit() || *c == b'.') {
        return s.parse::<f64>().ok();
    }
    if s.eq_ignore_ascii_case("nan") {
        Some(f64::NAN)
    } else if s.eq_ignore_ascii_case("+inf") || s.eq_ignore_ascii_case("inf") {
        Some(f64::INFINITY)
    } else if s.eq_ignore_ascii_case("-inf") {
        Some(f64::NEG_INFINITY)
    } else if s
        .bytes()
        .any(|c| c.is_ascii_alphabetic() && c != b'e' && c != b'E')
    {
        // Rust accepts "infinity" and other spellings Go's ParseFloat does not; reject
        // anything with letters other than an exponent.
        None
    } else {
        s.parse::<f64>().ok()
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
        assert_eq!(page.metric_type("a_total"), Some(MetricType::Counter));
        assert_eq!(page.samples.len(), 2);
        assert_eq!(page.samples[0].value, 350.0);
        assert_eq!(page.samples[0].label("y").as_deref(), Some("q\"\\\n"));
        assert_eq!(page.samples[0].label("x").as_deref(), Some("1"));
        assert_eq!(page.samples[0].label("z"), None);
        for s in &page.samples {
            for k in ["x", "y", "z"] {
                assert_eq!(page.label(s, k), s.label(k), "{k}");
            }
        }
        let b = page.samples[1];
        assert_eq!((b.name, b.value, b.labels().count()), ("b", 7.0, 0));
        assert_eq!(page.stats, ParseStats::default());
        assert_eq!(page.sample_lines, 2);
    }

    #[test]
    fn labels_with_spaces_trailing_comma_and_order() {
        let page =
            parse("m{ a = \"1\" , b=\"x y\",} 1\nm{b=\"x y\",a=\"1\"} 2\nm{a=\"2\"} 3\n").unwrap();
        assert_eq!(page.samples.len(), 2, "{:?}", page.samples);
        let pairs: Vec<_> = page.samples[0]
            .labels()
            .map(|(k, v)| (k, v.into_owned()))
            .collect();
        assert_eq!(pairs, vec![("a", "1".to_owned()), ("b", "x y".to_owned())]);
        // The same label set in another order is a duplicate series.
        assert_eq!(page.stats.duplicates, 1);
        assert_eq!(
            page.named("m").map(|s| s.value).collect::<Vec<_>>(),
            [1.0, 3.0]
        );
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
    fn parse_with_keeps_the_asked_names_and_checks_every_line() {
        let text = "vllm:a{e=\"0\"} 1\nvllm:b{e=\"0\"} 2\nvllm:b{e=\"0\"} 3\nvllm:a{e=\"1\"} 4\nvllm:c{e=\"0\" 5\ngo_x NaN\nvllm:a{e=\"0\"} 6\n";
        let page = parse_with(text, |n| n == "vllm:a").unwrap();
        assert_eq!(
            page.named("vllm:a").map(|s| s.value).collect::<Vec<_>>(),
            [1.0, 4.0]
        );
        assert_eq!(page.named("vllm:b").count(), 0);
        // The skipped family's duplicate is not counted; the kept one's is.
        assert_eq!(
            (
                page.stats.duplicates,
                page.stats.bad_lines,
                page.stats.non_finite
            ),
            (1, 1, 1)
        );
        assert_eq!((page.sample_lines, page.prefix_lines), (5, [5, 0, 0, 0, 0]));
        // A page of skipped samples only is still a page.
        let page = parse_with("go_x 1\n", |_| false).unwrap();
        assert_eq!((page.samples.len(), page.sample_lines), (0, 1));
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
    fn word_scans_find_what_a_byte_loop_finds() {
        let alphabet = b"a\"\\\x00\x01\x21\x22\x5b\x5c\x5d\x80\xa2\xdc\xff{= \t_:9Z-";
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 41) as usize;
            let b: Vec<u8> = (0..len)
                .map(|k| alphabet[((x >> (k % 60)) as usize + k * 7) % alphabet.len()])
                .collect();
            for i in 0..=len {
                let naive = (i..len)
                    .find(|&k| b[k] == b'"' || b[k] == b'\\')
                    .unwrap_or(len);
                assert_eq!(quote_or_escape(&b, i), naive, "{b:?} from {i}");
                let mut naive = i;
                while naive < len && is_name_char(b[naive]) {
                    naive += 1;
                }
                assert_eq!(name_end(&b, i), naive, "{b:?} from {i}");
            }
        }
    }

    #[test]
    fn lines_split_as_str_lines_does() {
        for text in [
            "",
            "a",
            "a\n",
            "a\nb",
            "a\r\n\nb\n\n",
            "\n",
            "ab\ncdefghijklmnop\nq",
        ] {
            assert_eq!(
                lines(text).collect::<Vec<_>>(),
                text.split_terminator('\n').collect::<Vec<_>>(),
                "{text:?}"
            );
        }
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
