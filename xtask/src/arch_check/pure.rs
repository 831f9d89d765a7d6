//! Pure crates stay pure: every crate under `daemon/crates/` is listed in [`PURE_CRATES`] with
//! the dependencies it may have; its `Cargo.toml` names no other (`[dev-dependencies]` may add
//! test-only crates, never an IO one), and its code names none of [`FORBIDDEN_IN_PURE`].

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::modules::ModuleTree;
use super::tokens::{Tok, tokenize, without_tests};

/// The pure crates (directory under `daemon/crates/`) and the dependencies each may have.
/// `lmperf-*` path dependencies must themselves be pure crates listed here.
pub(super) const PURE_CRATES: &[(&str, &[&str])] = &[
    ("fmt", &[]),
    ("measure", &["serde", "serde_json", "thiserror", "httpdate"]),
    ("server-page", &["serde", "serde_json", "thiserror"]),
    (
        "diagnosis",
        &[
            "serde",
            "serde_json",
            "thiserror",
            "lmperf-fmt",
            "lmperf-measure",
            "lmperf-server-page",
        ],
    ),
];

/// Crates that no pure crate may depend on, not even for its tests.
pub(super) const FORBIDDEN_DEPS: &[&str] = &[
    "tokio",
    "tokio-util",
    "tokio-stream",
    "reqwest",
    "hyper",
    "hyper-util",
    "axum",
    "tonic",
    "tower",
    "aya",
    "nvml-wrapper",
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry-otlp",
    "clap",
    "notify",
];

/// Paths a pure crate's code may not name: IO, sockets, clocks and async runtimes. Matched
/// against the token stream, so a mention in a comment or a string does not count.
pub(super) const FORBIDDEN_IN_PURE: &[&[&str]] = &[
    &["std", "::", "fs"],
    &["std", "::", "net"],
    &["std", "::", "process"],
    &["SystemTime", "::", "now"],
    &["Instant", "::", "now"],
    &["tokio"],
    &["reqwest"],
    &["hyper"],
];

pub(super) fn check_pure_crates(root: &Path, report: &mut String) -> Result<usize> {
    let dir = root.join("daemon/crates");
    let mut failures = 0;
    let mut found = BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            if e.path().join("Cargo.toml").exists() {
                found.insert(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    let declared: BTreeSet<String> = PURE_CRATES.iter().map(|(d, _)| (*d).to_owned()).collect();
    for missing in declared.difference(&found) {
        failures += 1;
        let _ = writeln!(
            report,
            "pure crate daemon/crates/{missing} is missing (declared in xtask/src/arch_check/pure.rs)"
        );
    }
    for extra in found.difference(&declared) {
        failures += 1;
        let _ = writeln!(
            report,
            "daemon/crates/{extra} is not declared in PURE_CRATES (xtask/src/arch_check/pure.rs): list its allowed dependencies"
        );
    }
    let pure_names: BTreeSet<String> = found.iter().map(|d| format!("lmperf-{d}")).collect();
    for (name, allowed) in PURE_CRATES {
        let crate_dir = dir.join(name);
        let Ok(manifest) = std::fs::read_to_string(crate_dir.join("Cargo.toml")) else {
            continue;
        };
        for (section, dep) in manifest_deps(&manifest) {
            let bad = if FORBIDDEN_DEPS.contains(&dep.as_str()) {
                true
            } else if section == "dependencies" {
                !(allowed.contains(&dep.as_str()) || pure_names.contains(&dep))
                    || (dep.starts_with("lmperf") && !allowed.contains(&dep.as_str()))
            } else {
                false
            };
            if bad {
                failures += 1;
                let _ = writeln!(
                    report,
                    "daemon/crates/{name}/Cargo.toml: [{section}] {dep} is not allowed (allowed: {})",
                    if allowed.is_empty() {
                        "none".to_owned()
                    } else {
                        allowed.join(", ")
                    }
                );
            }
        }
        // The crate's compiled code: its module tree from lib.rs, `#[cfg(test)]` modules and
        // items left out (a test may read its fixture files).
        let tree = ModuleTree::load(&crate_dir.join("src"))?;
        for file in &tree.files {
            let f = &file.path;
            let text = std::fs::read_to_string(f)?;
            let toks = without_tests(tokenize(&text));
            for (k, t) in toks.iter().enumerate() {
                for pat in FORBIDDEN_IN_PURE {
                    let hit = pat.iter().enumerate().all(|(o, p)| {
                        toks.get(k + o).is_some_and(|x| match &x.tok {
                            Tok::Ident(w) => w == p,
                            Tok::PathSep => *p == "::",
                            _ => false,
                        })
                    });
                    if hit {
                        failures += 1;
                        let _ = writeln!(
                            report,
                            "{}:{}: `{}` in a pure crate",
                            f.strip_prefix(root).unwrap_or(f).display(),
                            t.line,
                            pat.concat()
                        );
                    }
                }
            }
        }
    }
    Ok(failures)
}

/// `(section, dependency name)` of every dependency in a Cargo.toml (the `[dependencies]`,
/// `[dev-dependencies]`, `[build-dependencies]` tables and their `[x.dependencies.name]` forms).
pub(super) fn manifest_deps(manifest: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in manifest.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(h) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = h.trim().to_owned();
            if let Some((s, dep)) = section.clone().rsplit_once('.')
                && s.ends_with("dependencies")
            {
                out.push((s.rsplit('.').next().unwrap_or(s).to_owned(), dep.to_owned()));
            }
            continue;
        }
        if section.ends_with("dependencies")
            && !section.contains('.')
            && let Some((dep, _)) = line.split_once('=')
        {
            let dep = dep.trim().split('.').next().unwrap_or("").trim();
            if !dep.is_empty() {
                out.push((section.clone(), dep.to_owned()));
            }
        }
    }
    out
}
