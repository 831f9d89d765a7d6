//! Trace replay for `lmperf run --trace`: request arrival times and input / output token
//! lengths read from public LLM inference traces (`../shared/traces/PROVENANCE.md`):
//!
//! - Azure LLM inference trace 2023 (CSV `TIMESTAMP,ContextTokens,GeneratedTokens`, CRLF,
//!   timestamps `YYYY-MM-DD HH:MM:SS.fffffff` with 7 fractional digits and no time zone);
//! - BurstGPT (CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`, v3
//!   adds `Session ID,Elapsed time`; columns are found by name; timestamps in seconds; rows
//!   with `Response tokens` = 0 are failed requests and are skipped, and counted);
//! - Mooncake (JSONL `timestamp` in milliseconds, `input_length`, `output_length`, `hash_ids`;
//!   many requests share a timestamp).
//!
//! Arrival offsets are relative to the earliest request; requests keep the file's order among
//! equal timestamps.
//!
//! The file is read as a stream, one record at a time (a CSV record may span lines inside
//! quotes), and reading stops at the request limit: a 10 GB trace replayed for its first 100
//! requests reads only their rows. [`load_capped`] also bounds the bytes read.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::dataset::{column, parse_csv};

/// A supported trace format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    /// Azure LLM inference trace (2023; the 2024 week-long files have the same columns).
    Azure,
    BurstGpt,
    Mooncake,
}

impl TraceFormat {
    /// `azure`, `burstgpt` or `mooncake` (the `--trace-format` values).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "azure" => Some(Self::Azure),
            "burstgpt" => Some(Self::BurstGpt),
            "mooncake" => Some(Self::Mooncake),
            _ => None,
        }
    }
}

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TraceRequest {
    /// Arrival after the trace's first request (before `--trace-speedup`).
    pub at: Duration,
    /// Prompt length in tokens (at least 1).
    pub input_tokens: u32,
    /// Output length in tokens, sent as `max_tokens` (at least 1).
    pub output_tokens: u32,
}

impl TraceRequest {
    /// Its arrival replayed `speedup` times faster: `at / speedup`, rounded to the nanosecond
    /// (exact at speedup 1). Used by `lmperf run --trace` and by `InjectLoad` replays alike.
    pub fn at_speedup(&self, speedup: f64) -> Duration {
        Duration::from_nanos(
            (self.at.as_nanos() as f64 / speedup)
                .round()
                .min(u64::MAX as f64) as u64,
        )
    }
}

/// A loaded trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// File name (no directory), as the summary and report name it.
    pub name: String,
    pub format: TraceFormat,
    /// In arrival order, at most `--trace-limit`.
    pub requests: Vec<TraceRequest>,
    /// BurstGPT rows skipped as failed (`Response tokens` = 0) among the rows read.
    pub skipped_failed: usize,
    /// Mooncake `hash_ids` of each request (same index as `requests`; empty for the other
    /// formats): request blocks of [`MOONCAKE_BLOCK_TOKENS`] tokens, equal ids = equal blocks.
    pub hash_ids: Vec<Vec<u64>>,
}

/// Tokens per Mooncake `hash_ids` block (the Mooncake traces' block size; a request's last
/// block holds the rest of its input).
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// A trace that cannot be replayed; the message names the file, line, field and value.
#[derive(Debug, thiserror::Error)]
#[error("{path}{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct TraceError {
    pub path: String,
    pub line: Option<usize>,
    pub reason: String,
}

/// The format of a trace from its first line: JSON object → Mooncake; a CSV header with
/// `ContextTokens` → Azure; with `Request tokens` → BurstGPT.
pub fn detect(text: &str) -> Option<TraceFormat> {
    let first = text
        .trim_start_matches('\u{feff}')
        .lines()
        .find(|l| !l.trim().is_empty())?
        .trim();
    if first.starts_with('{') {
        return Some(TraceFormat::Mooncake);
    }
    let lower = first.to_ascii_lowercase();
    if lower.contains("contexttokens") {
        Some(TraceFormat::Azure)
    } else if lower.contains("request tokens") {
        Some(TraceFormat::BurstGpt)
    } else {
        None
    }
}

/// Nanoseconds since 1970-01-01 of `YYYY-MM-DD HH:MM:SS[.f…]` (or with `T`; a trailing `Z` is
/// ignored; no other time zone). Up to 9 fractional digits are kept.
pub fn parse_datetime_ns(s: &str) -> Option<i128> {
    let s = s.trim().trim_end_matches('Z');
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m)
        || !(1..=31).contains(&day)
        || hh > 23
        || mm > 59
        || ss > 60
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = &frac[..frac.len().min(9)];
    let frac_ns = if digits.is_empty() {
        0
    } else {
        digits.parse::<i128>().ok()? * 10i128.pow(9 - digits.len() as u32)
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = i128::from(days) * 86_400 + i128::from(hh * 3600 + mm * 60 + ss);
    Some(secs * 1_000_000_000 + frac_ns)
}

/// Reads a trace: `format` or detected; the first `limit` replayable requests.
///
/// # Errors
/// Unreadable file, unknown format, a missing column, a value that is not a number or
/// timestamp, or no request at all.
pub fn load(
    path: &Path,
    format: Option<TraceFormat>,
    limit: Option<usize>,
) -> Result<Trace, TraceError> {
    load_capped(path, format, limit, None)
}

/// One record of a trace file at a time: a line, or for CSV the lines of a record whose quotes
/// span lines. Counts the bytes read and refuses to read past `max_bytes`.
struct Records<R> {
    reader: R,
    line: usize,
    bytes: u64,
    max_bytes: u64,
}

impl<R: BufRead> Records<R> {
    /// The next non-blank record and its first line number; `csv` joins lines while a quote is
    /// open. `Err` is the reason (I/O, byte cap).
    fn next(&mut self, csv: bool) -> Result<Option<(usize, String)>, String> {
        let mut record = String::new();
        let mut start = 0;
        loop {
            let mut buf = Vec::new();
            // At most one byte past the cap, so a giant line is never held whole.
            let room = self.max_bytes.saturating_sub(self.bytes).saturating_add(1);
            let n = (&mut self.reader)
                .take(room)
                .read_until(b'\n', &mut buf)
                .map_err(|e| e.to_string())?;
            self.bytes += n as u64;
            if self.bytes > self.max_bytes {
                return Err(format!(
                    "more than {} bytes read before the request limit",
                    self.max_bytes
                ));
            }
            if n == 0 {
                return Ok((!record.trim().is_empty()).then_some((start, record)));
            }
            self.line += 1;
            let text =
                String::from_utf8(buf).map_err(|_| format!("line {}: not UTF-8", self.line))?;
            let text = if self.line == 1 {
                text.trim_start_matches('\u{feff}').to_owned()
            } else {
                text
            };
            if record.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                start = self.line;
            }
            record.push_str(&text);
            if !csv || record.bytes().filter(|b| *b == b'"').count() % 2 == 0 {
                return Ok(Some((start, record)));
            }
        }
    }
}

/// [`load`], reading at most `max_bytes` bytes of the file (`None`: no cap) before the limit is
/// reached: `InjectLoad` bounds what an API call makes the agent read.
///
/// # Errors
/// As [`load`], and a file that needs more than `max_bytes` bytes for its `limit` requests.
pub fn load_capped(
    path: &Path,
    format: Option<TraceFormat>,
    limit: Option<usize>,
    max_bytes: Option<u64>,
) -> Result<Trace, TraceError> {
    let err = |line: Option<usize>, reason: String| TraceError {
        path: path.display().to_string(),
        line,
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| err(None, e.to_string()))?;
    let mut records = Records {
        reader: BufReader::new(file),
        line: 0,
        bytes: 0,
        max_bytes: max_bytes.unwrap_or(u64::MAX),
    };
    // The first record decides the format (a JSON object or a CSV header).
    let first = records
        .next(format != Some(TraceFormat::Mooncake))
        .map_err(|e| err(None, e))?;
    let format = match format.or_else(|| first.as_ref().and_then(|(_, t)| detect(t))) {
        Some(f) => f,
        None => {
            return Err(err(
                Some(1),
                "unknown trace format: give --trace-format azure|burstgpt|mooncake".into(),
            ));
        }
    };
    let limit = limit.unwrap_or(usize::MAX);
    // (timestamp in ns, input, output, hash ids)
    let mut rows: Vec<(i128, u32, u32, Vec<u64>)> = Vec::new();
    let mut skipped_failed = 0;
    let tokens = |line: usize, field: &str, v: &str| -> Result<u32, TraceError> {
        let t = v.trim();
        t.parse::<u64>()
            .ok()
            .or_else(|| {
                t.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0)
                    .map(|f| f as u64)
            })
            .map(|n| n.min(u64::from(u32::MAX)) as u32)
            .ok_or_else(|| err(Some(line), format!("{field} = {v:?}: not a token count")))
    };
    match format {
        TraceFormat::Mooncake => {
            let mut next = first;
            while let Some((line, l)) = next {
                if rows.len() >= limit {
                    break;
                }
                let v: serde_json::Value = serde_json::from_str(l.trim())
                    .map_err(|e| err(Some(line), format!("not JSON: {e}")))?;
                let field = |k: &str| {
                    v.get(k)
                        .ok_or_else(|| err(Some(line), format!("no field `{k}`")))
                };
                let ts = field("timestamp")?;
                let ms = ts
                    .as_f64()
                    .filter(|t| t.is_finite() && *t >= 0.0)
                    .ok_or_else(|| {
                        err(
                            Some(line),
                            format!("timestamp = {ts}: not a number of milliseconds"),
                        )
                    })?;
                let num = |k: &str| -> Result<u32, TraceError> {
                    let f = field(k)?;
                    tokens(line, k, &f.to_string())
                };
                let hash_ids = match v.get("hash_ids") {
                    None | Some(serde_json::Value::Null) => Vec::new(),
                    Some(h) => h
                        .as_array()
                        .and_then(|a| {
                            a.iter()
                                .map(serde_json::Value::as_u64)
                                .collect::<Option<Vec<u64>>>()
                        })
                        .ok_or_else(|| {
                            err(
                                Some(line),
                                format!("hash_ids = {h}: not a list of non-negative integers"),
                            )
                        })?,
                };
                rows.push((
                    (ms * 1e6).round() as i128,
                    num("input_length")?,
                    num("output_length")?,
                    hash_ids,
                ));
                next = if rows.len() >= limit {
                    None
                } else {
                    records.next(false).map_err(|e| err(None, e))?
                };
            }
        }
        TraceFormat::Azure | TraceFormat::BurstGpt => {
            // One CSV record at a time, numbered by its first line.
            let csv_record =
                |(line, text): (usize, String)| -> Result<Option<Vec<String>>, TraceError> {
                    let mut parsed =
                        parse_csv(&text).map_err(|(l, reason)| err(Some(line + l - 1), reason))?;
                    Ok(parsed.pop().map(|(_, r)| r))
                };
            let Some(header) = first.map(&csv_record).transpose()?.flatten() else {
                return Err(err(None, "empty file".into()));
            };
            let names: (&[&str], &[&str], &[&str]) = match format {
                TraceFormat::Azure => (&["TIMESTAMP"], &["ContextTokens"], &["GeneratedTokens"]),
                _ => (&["Timestamp"], &["Request tokens"], &["Response tokens"]),
            };
            let col = |names: &[&str]| {
                column(&header, names).ok_or_else(|| {
                    err(
                        Some(1),
                        format!("header {header:?} has no column {:?}", names[0]),
                    )
                })
            };
            let (ct, ci, co) = (col(names.0)?, col(names.1)?, col(names.2)?);
            while rows.len() < limit {
                let Some((line, text)) = records.next(true).map_err(|e| err(None, e))? else {
                    break;
                };
                let Some(r) = csv_record((line, text))? else {
                    continue;
                };
                let line = &line;
                let get = |c: usize, name: &str| {
                    r.get(c)
                        .map(String::as_str)
                        .ok_or_else(|| err(Some(*line), format!("{} fields, no {name}", r.len())))
                };
                let ts_text = get(ct, names.0[0])?;
                let ts = match format {
                    TraceFormat::Azure => parse_datetime_ns(ts_text),
                    _ => ts_text
                        .trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|t| t.is_finite() && *t >= 0.0)
                        .map(|s| (s * 1e9).round() as i128),
                }
                .ok_or_else(|| {
                    err(
                        Some(*line),
                        format!("{} = {ts_text:?}: not a timestamp", names.0[0]),
                    )
                })?;
                let input = tokens(*line, names.1[0], get(ci, names.1[0])?)?;
                let output = tokens(*line, names.2[0], get(co, names.2[0])?)?;
                if format == TraceFormat::BurstGpt && output == 0 {
                    skipped_failed += 1;
                    continue;
                }
                rows.push((ts, input, output, Vec::new()));
            }
        }
    }
    let Some(first) = rows.iter().map(|r| r.0).min() else {
        return Err(err(None, "no request in the trace".into()));
    };
    // Stable: requests that share a timestamp keep the file's order.
    rows.sort_by_key(|r| r.0);
    let (requests, hash_ids) = rows
        .into_iter()
        .map(|(ts, input, output, hash_ids)| {
            let r = TraceRequest {
                at: Duration::from_nanos(u64::try_from(ts - first).unwrap_or(u64::MAX)),
                input_tokens: input.max(1),
                output_tokens: output.max(1),
            };
            (r, hash_ids)
        })
        .unzip();
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(Trace {
        name,
        format,
        requests,
        skipped_failed,
        hash_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/traces")
            .join(name)
    }

    #[test]
    fn datetimes_with_seven_fractional_digits() {
        let a = parse_datetime_ns("2023-11-16 18:17:03.9799600").unwrap();
        let b = parse_datetime_ns("2023-11-16 18:17:04.0319600").unwrap();
        assert_eq!(b - a, 52_000_000);
        // 2023-11-16T00:00:00Z is 1700092800 s after the epoch.
        assert_eq!(
            parse_datetime_ns("2023-11-16 00:00:00").unwrap(),
            1_700_092_800 * 1_000_000_000
        );
        assert_eq!(
            parse_datetime_ns("2024-03-01T00:00:00.5Z").unwrap()
                - parse_datetime_ns("2024-02-29 23:59:59").unwrap(),
            1_500_000_000
        );
        for bad in [
            "2023-13-01 00:00:00",
            "2023-11-16",
            "yesterday",
            "2023-11-16 18:17:0x",
        ] {
            assert_eq!(parse_datetime_ns(bad), None, "{bad}");
        }
    }

    #[test]
    fn azure_code_sample() {
        let t = load(&fixture("azure_llm_2023_code.head2000.csv"), None, None).unwrap();
        assert_eq!(t.format, TraceFormat::Azure);
        assert_eq!(t.requests.len(), 2000, "a header and 2000 rows");
        assert_eq!(
            t.requests[0],
            TraceRequest {
                at: Duration::ZERO,
                input_tokens: 4808,
                output_tokens: 10
            }
        );
        assert_eq!(
            t.requests[1],
            TraceRequest {
                at: Duration::from_millis(52),
                input_tokens: 3180,
                output_tokens: 8
            }
        );
        let span = t.requests.last().unwrap().at.as_secs_f64();
        assert!(
            (span - 853.0).abs() < 1.0,
            "PROVENANCE: code spans 853 s, got {span}"
        );
        let conv = load(&fixture("azure_llm_2023_conv.head2000.csv"), None, Some(10)).unwrap();
        assert_eq!(conv.requests.len(), 10);
        assert_eq!(
            conv.requests[1].at,
            Duration::from_nanos(4_314_579_000),
            "18:15:50.9951690 − 18:15:46.6805900"
        );
    }

    #[test]
    fn burstgpt_v1_v3_and_failed_rows() {
        let t = load(&fixture("burstgpt_1.head3.csv"), None, None).unwrap();
        assert_eq!(t.format, TraceFormat::BurstGpt);
        assert_eq!(
            t.requests[0],
            TraceRequest {
                at: Duration::ZERO,
                input_tokens: 472,
                output_tokens: 18
            }
        );
        assert_eq!(
            t.requests[1],
            TraceRequest {
                at: Duration::from_secs(40),
                input_tokens: 1087,
                output_tokens: 230
            }
        );
        let dir = std::env::temp_dir().join(format!("lmperf-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let v3 = dir.join("burstgpt_v3.csv");
        std::fs::write(&v3, "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n10,s1,1.5,GPT-4,100,0,100,Conversation log\r\n12.5,s1,2.0,GPT-4,200,30,230,Conversation log").unwrap();
        let t = load(&v3, None, None).unwrap();
        assert_eq!(
            t.skipped_failed, 1,
            "the zero-response row is a failed request"
        );
        assert_eq!(
            t.requests,
            vec![TraceRequest {
                at: Duration::ZERO,
                input_tokens: 200,
                output_tokens: 30
            }]
        );
        std::fs::write(
            &v3,
            "Timestamp,Model,Request tokens,Response tokens\n5,x,many,3\n",
        )
        .unwrap();
        let e = load(&v3, None, None).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("Request tokens") && e.contains("many"),
            "{e}"
        );
    }

    #[test]
    fn mooncake_shared_timestamps_keep_file_order() {
        let t = load(
            &fixture("mooncake_conversation_trace.head2000.jsonl"),
            None,
            Some(5),
        )
        .unwrap();
        assert_eq!(t.format, TraceFormat::Mooncake);
        assert_eq!(
            t.requests
                .iter()
                .map(|r| (r.at, r.input_tokens))
                .collect::<Vec<_>>(),
            [6758, 7322, 7236, 2290, 6760].map(|n| (Duration::ZERO, n))
        );
        let s = load(
            &fixture("mooncake_synthetic_trace.head2000.jsonl"),
            None,
            None,
        )
        .unwrap();
        assert_eq!(s.requests[2].at, Duration::from_millis(40));
        assert_eq!(
            s.requests.iter().map(|r| r.input_tokens).max(),
            Some(134_773)
        );
        assert!(s.requests.windows(2).all(|w| w[0].at <= w[1].at));
        // hash_ids: one block per 512 input tokens; the conversation trace's first rows
        // share their leading blocks.
        assert_eq!(t.hash_ids.len(), 5);
        assert_eq!(
            t.hash_ids[0].len() as u32,
            6758u32.div_ceil(MOONCAKE_BLOCK_TOKENS)
        );
        assert!(
            s.hash_ids
                .iter()
                .zip(&s.requests)
                .all(|(h, r)| h.len() as u32 == r.input_tokens.div_ceil(MOONCAKE_BLOCK_TOKENS))
        );
    }

    #[test]
    fn streams_to_the_limit_within_a_byte_cap() {
        let dir = std::env::temp_dir().join(format!("lmperf-trace-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // 100k rows (~3 MB); a broken row after the first 10 is never read with limit 10.
        let p = dir.join("big.jsonl");
        let mut text = String::new();
        for i in 0..10 {
            text.push_str(&format!(
                "{{\"timestamp\": {i}, \"input_length\": 5, \"output_length\": 7}}\n"
            ));
        }
        text.push_str("not json\n");
        for i in 0..100_000 {
            text.push_str(&format!(
                "{{\"timestamp\": {i}, \"input_length\": 5, \"output_length\": 7}}\n"
            ));
        }
        std::fs::write(&p, &text).unwrap();
        let t = load_capped(&p, None, Some(10), Some(4096)).unwrap();
        assert_eq!(t.requests.len(), 10, "stops at the limit, within 4 KiB");
        assert!(
            load_capped(&p, None, Some(11), None)
                .unwrap_err()
                .to_string()
                .contains("line 11")
        );
        let clean = dir.join("clean.jsonl");
        std::fs::write(&clean, text.replace("not json\n", "")).unwrap();
        assert_eq!(
            load_capped(&clean, None, Some(50_000), None)
                .unwrap()
                .requests
                .len(),
            50_000
        );
        let e = load_capped(
            &clean,
            Some(TraceFormat::Mooncake),
            Some(50_000),
            Some(1 << 20),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("more than 1048576 bytes"), "{e}");
        // CSV: a quoted field over two lines is one record; line numbers stay the file's.
        let c = dir.join("quoted.csv");
        std::fs::write(
            &c,
            "Timestamp,Model,Request tokens,Response tokens\n1,\"gpt\nfour\",10,2\n2,x,oops,3\n",
        )
        .unwrap();
        assert_eq!(
            load_capped(&c, None, Some(1), Some(1 << 10))
                .unwrap()
                .requests
                .len(),
            1
        );
        let e = load(&c, None, None).unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("oops"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unknown_format_is_an_error() {
        let e = load(&fixture("mt_bench_questions.jsonl"), None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no field `timestamp`"), "{e}");
        let e = load(&fixture("awesome_chatgpt_prompts.csv"), None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--trace-format"), "{e}");
    }
}
