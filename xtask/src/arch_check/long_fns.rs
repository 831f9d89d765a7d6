//! Functions over [`MAX_LINES`] lines outside tests (a `const` table is not a function, so
//! declarative tables never count). The functions that were longer when this check was written
//! are in [`KNOWN_LONG`] with their length then: each may shrink, none may grow, and a new
//! function may not pass the limit. Every long function is printed with its length.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::tokens::{Tok, is_punct, matching_brace, tokenize, without_tests};

/// The longest a function may be, in lines (the `fn` line to its closing brace).
pub(super) const MAX_LINES: usize = 150;

/// `(file from the repository root, function, its lines when this check was written)`.
pub(super) const KNOWN_LONG: &[(&str, &str, usize)] = &[
    ("daemon/crates/diagnosis/src/engine.rs", "evaluate", 170),
    ("daemon/crates/diagnosis/src/engine.rs", "score", 215),
    ("daemon/src/agent.rs", "run", 233),
    ("daemon/src/analyze/html.rs", "render", 152),
    ("daemon/src/analyze/synth.rs", "generate", 176),
    ("daemon/src/bench/benchmark.rs", "one_benchmark", 169),
    ("daemon/src/bench/profile/run.rs", "run", 211),
    ("daemon/src/bench/report/chart.rs", "html", 244),
    ("daemon/src/bench/report/mod.rs", "render", 319),
    ("daemon/src/bench/runner.rs", "run_on", 361),
    ("daemon/src/cli.rs", "into_spec", 232),
    ("daemon/src/config/mod.rs", "validate_target", 173),
    ("daemon/src/control/client.rs", "run", 161),
    ("daemon/src/control/load.rs", "validate_trace", 160),
    ("daemon/src/gpu/metrics.rs", "register", 285),
    ("daemon/src/load/trace.rs", "load_capped", 195),
    ("daemon/src/server/metrics.rs", "register", 188),
    ("daemon/src/telemetry/spans.rs", "build_span", 170),
    ("xtask/src/ci.rs", "run", 164),
    ("xtask/src/demo.rs", "run", 158),
];

/// One function: its file (relative to the repository root), name, first line and length.
#[derive(Debug, PartialEq)]
pub(super) struct FnSpan {
    pub(super) file: String,
    pub(super) name: String,
    pub(super) line: usize,
    pub(super) lines: usize,
}

/// The functions over [`MAX_LINES`] in `files` (paths relative to `root`).
pub(super) fn find(root: &Path, files: &[&Path]) -> Result<Vec<FnSpan>> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f)?;
        let rel = f.strip_prefix(root).unwrap_or(f).display().to_string();
        for (name, line, lines) in spans(&text) {
            if lines > MAX_LINES {
                out.push(FnSpan {
                    file: rel.clone(),
                    name,
                    line,
                    lines,
                });
            }
        }
    }
    out.sort_by(|a, b| b.lines.cmp(&a.lines).then(a.file.cmp(&b.file)));
    Ok(out)
}

/// Every function with a body in `text`, outside `#[cfg(test)]` items: `(name, line, lines)`.
pub(super) fn spans(text: &str) -> Vec<(String, usize, usize)> {
    let toks = without_tests(tokenize(text));
    let mut out = Vec::new();
    for i in 0..toks.len() {
        let (Some(Tok::Ident(kw)), Some(Tok::Ident(name))) =
            (toks.get(i).map(|t| &t.tok), toks.get(i + 1).map(|t| &t.tok))
        else {
            continue;
        };
        if kw != "fn" {
            continue;
        }
        // The body's `{`: the first `{` or `;` outside parentheses and brackets.
        let mut depth = 0i32;
        let mut j = i + 2;
        let open = loop {
            match toks.get(j).map(|t| &t.tok) {
                None => break None,
                Some(Tok::Punct('(' | '[')) => depth += 1,
                Some(Tok::Punct(')' | ']')) => depth -= 1,
                Some(Tok::Punct(';')) if depth == 0 => break None,
                Some(Tok::Punct('{')) if depth == 0 => break Some(j),
                _ => {}
            }
            j += 1;
        };
        let Some(open) = open else { continue };
        let close = matching_brace(&toks, open);
        if let Some(end) = toks.get(close).filter(|_| is_punct(toks.get(close), '}')) {
            out.push((name.clone(), toks[i].line, end.line + 1 - toks[i].line));
        }
    }
    out
}

/// Counts (and reports) new long functions, known ones that grew, and stale rows of
/// [`KNOWN_LONG`]; prints every long function.
pub(super) fn check(found: &[FnSpan], report: &mut String) -> usize {
    check_against(found, KNOWN_LONG, report)
}

/// [`check`] against the known long functions `known`.
fn check_against(found: &[FnSpan], known: &[(&str, &str, usize)], report: &mut String) -> usize {
    let mut failures = 0;
    println!(
        "arch-check: {} function(s) over {MAX_LINES} lines outside tests, for the record, not failures: \
         {} were known when the check began (KNOWN_LONG, a ratchet: each may only shrink); \
         a new or grown one is marked FAIL",
        found.len(),
        known.len()
    );
    for f in found {
        let row = known
            .iter()
            .find(|(file, name, _)| *file == f.file && *name == f.name);
        let mark = match row {
            Some((_, _, was)) if f.lines <= *was => "known",
            _ => "FAIL ",
        };
        println!(
            "    {mark} {:>4} lines  {}:{} {}",
            f.lines, f.file, f.line, f.name
        );
        match row {
            None => {
                failures += 1;
                let _ = writeln!(
                    report,
                    "{}:{}: fn {} is {} lines (at most {MAX_LINES}): split it by phase",
                    f.file, f.line, f.name, f.lines
                );
            }
            Some((_, _, was)) if f.lines > *was => {
                failures += 1;
                let _ = writeln!(
                    report,
                    "{}:{}: fn {} grew from {was} to {} lines (at most {MAX_LINES}; a known long function may only shrink)",
                    f.file, f.line, f.name, f.lines
                );
            }
            Some(_) => {}
        }
    }
    for (file, name, _) in known {
        if !found.iter().any(|f| f.file == *file && f.name == *name) {
            failures += 1;
            let _ = writeln!(
                report,
                "KNOWN_LONG lists {file} fn {name}, now at most {MAX_LINES} lines or gone: remove the row (xtask/src/arch_check/long_fns.rs)"
            );
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_spans_skip_declarations_types_and_tests() {
        let src = "trait T { fn decl(&self) -> [u8; 4]; }\n\
                   fn short(x: [u8; 2]) -> u8 {\n    let f: fn(u8) -> u8 = |v| v;\n    f(x[0])\n}\n\
                   #[cfg(test)]\nfn in_test() {\n}\n";
        assert_eq!(spans(src), vec![("short".to_owned(), 2, 4)]);
    }

    #[test]
    fn a_new_long_function_fails_and_is_named() {
        let f = vec![FnSpan {
            file: "daemon/src/x.rs".into(),
            name: "huge".into(),
            line: 10,
            lines: 151,
        }];
        let mut report = String::new();
        assert_eq!(check_against(&f, &[], &mut report), 1);
        assert!(
            report.contains("daemon/src/x.rs:10: fn huge is 151 lines"),
            "{report}"
        );
    }
}
