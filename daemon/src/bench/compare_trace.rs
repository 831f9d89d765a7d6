//! `lmperf compare BASE_TRACE NEW_TRACE`: two profiling traces (Chrome trace JSON as
//! torch.profiler's `export_chrome_trace` writes it, gzip'd or not; what vLLM's and SGLang's
//! profilers leave in their trace directory) compared per module, kernel and op, per step,
//! top regressions first ([`crate::profiler::trace_diff`]). Writes `compare.json` and
//! `compare.html`, and returns the rows for the terminal.
//!
//! `compare.json` of a trace pair ([`TRACE_COMPARE_SCHEMA_VERSION`] = 1):
//! ```text
//! { schema_version, kind: "trace", lmperf_version, base, new (paths),
//!   top_regression: null | DiffRow,
//!   diff: { base_steps, new_steps, base_step_us, new_step_us, module_time ("device" | "host"),
//!           modules, kernels, ops: [DiffRow] } }
//! DiffRow: { name, base_us, new_us, delta_us, share_of_step, base_total_us, new_total_us,
//!            base_calls, new_calls }   (µs and calls per step; sorted by delta_us, largest first)
//! ```

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::compare::CompareError;
use super::report::esc;
use crate::profiler::trace::{self, TraceProfile};
use crate::profiler::trace_diff::{self, DiffRow, TraceDiff};

/// Version of a trace pair's `compare.json`.
pub const TRACE_COMPARE_SCHEMA_VERSION: u32 = 1;

/// Rows per table shown in `compare.html` and the terminal (all are in `compare.json`).
const SHOWN_ROWS: usize = 25;
const TERMINAL_ROWS: usize = 10;

/// A trace pair's `compare.json`.
#[derive(Debug, Clone, Serialize)]
pub struct TraceComparison {
    pub schema_version: u32,
    pub kind: &'static str,
    pub lmperf_version: &'static str,
    pub base: String,
    pub new: String,
    /// The largest regression: the first module with time added, else kernel, else op.
    pub top_regression: Option<DiffRow>,
    pub diff: TraceDiff,
}

/// Whether `base` and `new` name files (a trace pair) rather than run directories.
pub fn is_trace_pair(base: &Path, new: &Path) -> bool {
    base.is_file() && new.is_file()
}

/// Reads one trace, gunzipping it when it starts with gzip's magic bytes.
fn read(path: &Path) -> Result<TraceProfile, CompareError> {
    let raw = std::fs::read(path).map_err(|source| CompareError::Io {
        path: path.to_owned(),
        source,
    })?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| CompareError::Format {
                path: path.to_owned(),
                reason: format!("gzip: {e}"),
            })?;
        out
    } else {
        raw
    };
    trace::parse(&bytes).map_err(|e| CompareError::Format {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Compares the traces and writes `compare.json` and `compare.html` into `out`.
///
/// # Errors
/// A file that cannot be read, is not gzip or a Chrome trace, or an output not written.
pub fn compare_traces(
    base: &Path,
    new: &Path,
    out: &Path,
) -> Result<TraceComparison, CompareError> {
    let d = trace_diff::diff(&read(base)?, &read(new)?);
    let c = TraceComparison {
        schema_version: TRACE_COMPARE_SCHEMA_VERSION,
        kind: "trace",
        lmperf_version: env!("CARGO_PKG_VERSION"),
        base: base.display().to_string(),
        new: new.display().to_string(),
        top_regression: d.top_regression().cloned(),
        diff: d,
    };
    let io = |path: PathBuf| move |source| CompareError::Io { path, source };
    std::fs::create_dir_all(out).map_err(io(out.to_owned()))?;
    let json = serde_json::to_string_pretty(&c)
        .map_err(|e| io(out.join("compare.json"))(std::io::Error::other(e)))?;
    std::fs::write(out.join("compare.json"), json + "\n").map_err(io(out.join("compare.json")))?;
    std::fs::write(out.join("compare.html"), render(&c)).map_err(io(out.join("compare.html")))?;
    Ok(c)
}

fn us(v: f64) -> String {
    crate::fmt::number(v)
}

fn share(r: &DiffRow) -> String {
    r.share_of_step
        .map_or_else(|| "–".to_owned(), |s| format!("{:+.1} %", s * 100.0))
}

fn html_table(h: &mut String, title: &str, rows: &[DiffRow]) {
    if rows.is_empty() {
        return;
    }
    let _ = write!(
        h,
        r#"<h2>{title}</h2><table data-table="{title}"><tr><th>name</th><th>base µs/step</th><th>new µs/step</th><th>delta µs/step</th><th>share of base step</th><th>calls/step base → new</th></tr>"#
    );
    for r in rows.iter().take(SHOWN_ROWS) {
        let _ = write!(
            h,
            r#"<tr data-name="{n}"><td style="text-align:left"><code>{n}</code></td><td>{}</td><td>{}</td><td>{:+.1}</td><td>{}</td><td>{} → {}</td></tr>"#,
            us(r.base_us),
            us(r.new_us),
            r.delta_us,
            share(r),
            us(r.base_calls),
            us(r.new_calls),
            n = esc(&r.name),
        );
    }
    if rows.len() > SHOWN_ROWS {
        let _ = write!(
            h,
            "</table><p>{} more in compare.json.</p>",
            rows.len() - SHOWN_ROWS
        );
    } else {
        h.push_str("</table>");
    }
}

/// `compare.html`: the step times, the top regression in words, then modules, kernels, ops.
fn render(c: &TraceComparison) -> String {
    let d = &c.diff;
    let mut h = format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>lmperf compare: traces</title><style>body{{font-family:system-ui,sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse;margin:8px 0 20px}} td,th{{border:1px solid #bbb;padding:4px 8px;text-align:right;font-size:13px;font-variant-numeric:tabular-nums}} th{{background:#eee}}</style></head><body><h1>lmperf compare: two profiling traces</h1><p>base <code>{}</code> ({} steps, {} µs a step) · new <code>{}</code> ({} steps, {} µs a step) · module times: {:?}; self time per step, largest added time first.</p>"#,
        esc(&c.base),
        d.base_steps,
        us(d.base_step_us),
        esc(&c.new),
        d.new_steps,
        us(d.new_step_us),
        d.module_time,
    );
    match &c.top_regression {
        Some(r) => {
            let _ = write!(
                h,
                r#"<p id="top">Largest regression: <code>{}</code> {} → {} µs a step ({:+.1} µs, {} of the base step).</p>"#,
                esc(&r.name),
                us(r.base_us),
                us(r.new_us),
                r.delta_us,
                share(r)
            );
        }
        None => h.push_str(r#"<p id="top">No module, kernel or op takes longer.</p>"#),
    }
    html_table(&mut h, "Modules", &d.modules);
    html_table(&mut h, "Kernels", &d.kernels);
    html_table(&mut h, "Ops", &d.ops);
    h.push_str("</body></html>\n");
    h
}

/// The terminal's view: step times and the top rows of modules (kernels too when the traces
/// have them).
pub fn table(c: &TraceComparison) -> String {
    let d = &c.diff;
    let mut out = format!(
        "step: {} → {} µs ({} → {} steps)\n",
        us(d.base_step_us),
        us(d.new_step_us),
        d.base_steps,
        d.new_steps
    );
    for (title, rows) in [("module", &d.modules), ("kernel", &d.kernels)] {
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "  {title:<48} {:>10} {:>10} {:>10} {:>8}",
            "base µs", "new µs", "delta", "share"
        );
        for r in rows.iter().take(TERMINAL_ROWS) {
            let _ = writeln!(
                out,
                "  {:<48} {:>10} {:>10} {:>+10.1} {:>8}",
                r.name,
                us(r.base_us),
                us(r.new_us),
                r.delta_us,
                share(r)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/torch_traces")
            .join(name)
    }

    /// The real torch.profiler pair (tests/fixtures/torch_traces/README.md): layer 2's
    /// attention was slowed, and it comes first, in the JSON, the page and the terminal.
    #[test]
    fn the_slowed_module_of_a_real_trace_pair_comes_first() {
        let out = std::env::temp_dir().join(format!("lmperf-trace-cmp-{}", std::process::id()));
        let (base, slow) = (fixture("base.json.gz"), fixture("slow.json.gz"));
        assert!(is_trace_pair(&base, &slow) && !is_trace_pair(&out, &slow));
        let c = compare_traces(&base, &slow, &out).unwrap();
        let top = c.top_regression.as_ref().unwrap();
        assert!(top.name.ends_with("DecoderLayer_2/Attention_2"), "{top:?}");
        assert!(top.delta_us > 100.0, "{top:?}");
        assert_eq!(c.diff.modules[0].name, top.name);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("compare.json")).unwrap())
                .unwrap();
        assert_eq!(json["kind"], "trace");
        assert_eq!(json["top_regression"]["name"], top.name.as_str());
        let html = std::fs::read_to_string(out.join("compare.html")).unwrap();
        assert!(html.contains(&format!(
            "Largest regression: <code>{}</code>",
            esc(&top.name)
        )));
        let text = table(&c);
        let first = text.lines().nth(2).unwrap();
        assert!(first.trim_start().starts_with(&top.name), "{text}");
        // Against itself: nothing regresses.
        let same = compare_traces(&base, &base, &out).unwrap();
        assert!(same.top_regression.is_none());
        // Not a trace: a clear error naming the file.
        let bad = out.join("bad.json");
        std::fs::write(&bad, "{\"x\": 1}").unwrap();
        let e = compare_traces(&base, &bad, &out).unwrap_err().to_string();
        assert!(e.contains("bad.json"), "{e}");
        let _ = std::fs::remove_dir_all(&out);
    }
}
