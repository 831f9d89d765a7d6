//! Old-path aliases: a `pub use` in `daemon/src` that publishes, under the writing module's
//! path, a module or item that lives elsewhere (`pub use crate::load::prompts`, `pub use
//! lmperf_measure as measure`, `pub use super::sibling::X`). Each keeps an old path alive and
//! hides the real edge from the cycle and layer checks (a user of `bench::prompts` is seen
//! importing `bench`, not `load`). Re-exporting the writer's own children (`pub use
//! state::ServerState` in `server/mod.rs`) is its API and fine; `pub(crate) use` is not checked.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::modules::{ModuleTree, after_supers, path_targets};
use super::tokens::{Tok, is_ident, tokenize, without_tests};

/// The aliases each file of `daemon/src` had when this check was written (issue 35 removes
/// them): `(file, how many)`. A file may hold at most its count; a file not listed, none.
/// Lower a count (or drop the row) when an alias goes: the check says when one is stale.
pub(super) const KNOWN_ALIASES: &[(&str, usize)] = &[
    ("analyze/synth.rs", 2),
    ("bench/aggregate.rs", 2),
    ("bench/mod.rs", 7),
    ("bench/profile/mod.rs", 1),
    ("bench/report/mod.rs", 1),
    ("bench/spec.rs", 1),
    ("canary/client.rs", 2),
    ("config/mod.rs", 1),
    ("diagnosis_live.rs", 2),
    ("discovery/mod.rs", 2),
    ("gpu/pod_resources.rs", 1),
    ("load/prompts.rs", 5),
    ("server/mod.rs", 6),
    ("targets/mod.rs", 1),
];

/// One alias: the file (relative to `daemon/src`), its line, the path it publishes.
#[derive(Debug, PartialEq)]
pub(super) struct Alias {
    pub(super) file: String,
    pub(super) line: usize,
    pub(super) target: String,
}

/// Every old-path alias in `tree` (the module tree of `daemon/src`, whose root is `src`).
pub(super) fn find(src: &Path, tree: &ModuleTree) -> Result<Vec<Alias>> {
    let mut out = Vec::new();
    for file in &tree.files {
        let rel = file
            .path
            .strip_prefix(src)
            .unwrap_or(&file.path)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&file.path)?;
        for (line, target) in in_source(&text, &file.module) {
            out.push(Alias {
                file: rel.clone(),
                line,
                target,
            });
        }
    }
    out.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    Ok(out)
}

/// The aliases in one file's source whose module is `module`: `(line, published path)`.
pub(super) fn in_source(text: &str, module: &[String]) -> Vec<(usize, String)> {
    let toks = without_tests(tokenize(text));
    let mut out = Vec::new();
    for i in 0..toks.len() {
        if !(is_ident(toks.get(i), "pub") && is_ident(toks.get(i + 1), "use")) {
            continue;
        }
        let line = toks[i].line;
        let first = i + 2;
        let Some(Tok::Ident(head)) = toks.get(first).map(|t| &t.tok) else {
            continue;
        };
        let after_sep = matches!(toks.get(first + 1).map(|t| &t.tok), Some(Tok::PathSep));
        let targets: Vec<Vec<String>> = match head.as_str() {
            "crate" if after_sep => path_targets(&toks, first + 2, Vec::new()),
            "super" if after_sep => {
                let (base, j) = after_supers(&toks, first, module);
                path_targets(&toks, j, base)
            }
            h if h.starts_with("lmperf_") => {
                let base = vec![format!("{h}(crate)")];
                if after_sep {
                    path_targets(&toks, first + 2, base)
                } else {
                    vec![base]
                }
            }
            _ => continue,
        };
        for t in targets {
            if t.len() >= module.len() && t[..module.len()] == *module && !t.is_empty() {
                continue; // the writer's own subtree
            }
            out.push((line, t.join("::")));
        }
    }
    out
}

/// Counts (and reports) aliases over each file's allowance in [`KNOWN_ALIASES`], and stale
/// allowances; prints the total.
pub(super) fn check(aliases: &[Alias], report: &mut String) -> usize {
    check_against(aliases, KNOWN_ALIASES, report)
}

/// [`check`] against the allowances `known`.
fn check_against(aliases: &[Alias], known: &[(&str, usize)], report: &mut String) -> usize {
    let mut per_file: BTreeMap<&str, Vec<&Alias>> = BTreeMap::new();
    for a in aliases {
        per_file.entry(a.file.as_str()).or_default().push(a);
    }
    let mut failures = 0;
    for (file, found) in &per_file {
        let allowed = known.iter().find(|(f, _)| f == file).map_or(0, |(_, n)| *n);
        if found.len() > allowed {
            failures += 1;
            let list: Vec<String> = found
                .iter()
                .map(|a| format!("{}:{} {}", a.file, a.line, a.target))
                .collect();
            let _ = writeln!(
                report,
                "daemon/src/{file}: {} old-path alias(es), {allowed} allowed: {}: import the module where it lives instead",
                found.len(),
                list.join("; ")
            );
        }
    }
    for (file, allowed) in known {
        let n = per_file.get(file).map_or(0, Vec::len);
        if n < *allowed {
            failures += 1;
            let _ = writeln!(
                report,
                "KNOWN_ALIASES allows {allowed} alias(es) in daemon/src/{file}, which has {n}: lower it (xtask/src/arch_check/aliases.rs)"
            );
        }
    }
    let allowed_total: usize = known.iter().map(|(_, n)| n).sum();
    println!(
        "arch-check: {} old-path aliases in daemon/src ({} allowed while issue 35 removes them)",
        aliases.len(),
        allowed_total
    );
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn aliases_are_paths_from_elsewhere_children_are_not() {
        let src = "pub use crate::load::{prompts, tokens};\n\
                   pub use state::ServerState;\n\
                   pub use lmperf_measure as measure;\n\
                   pub use super::sib::X;\n\
                   pub use crate::bench::own::Y;\n\
                   pub(crate) use crate::other::Z;\n\
                   #[cfg(test)]\npub use crate::test_only::T;\n";
        assert_eq!(
            in_source(src, &m(&["bench"])),
            vec![
                (1, "load::prompts".to_owned()),
                (1, "load::tokens".to_owned()),
                (3, "lmperf_measure(crate)".to_owned()),
                (4, "sib::X".to_owned()),
            ]
        );
    }

    #[test]
    fn a_file_over_its_allowance_fails() {
        let a = vec![Alias {
            file: "new.rs".into(),
            line: 3,
            target: "load::x".into(),
        }];
        let mut report = String::new();
        assert_eq!(check_against(&a, &[], &mut report), 1);
        assert!(
            report.contains("daemon/src/new.rs: 1 old-path alias(es), 0 allowed: new.rs:3 load::x"),
            "{report}"
        );
    }
}
