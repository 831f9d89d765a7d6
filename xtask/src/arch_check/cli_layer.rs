//! clap only in the CLI layer: domain modules take plain structs that the CLI converts its
//! flags into.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::modules::ModuleTree;
use super::tokens::{Tok, tokenize, without_tests};

/// The files of `daemon/src` that may use clap: the binary and its command line.
pub(super) const CLI_LAYER: &[&str] = &["main.rs", "cli.rs", "cli/"];

/// Counts (and reports) the files of `tree` outside [`CLI_LAYER`] that name `clap`.
pub(super) fn check_cli_layer(src: &Path, tree: &ModuleTree, report: &mut String) -> Result<usize> {
    let mut failures = 0;
    for file in &tree.files {
        let rel = file.path.strip_prefix(src).unwrap_or(&file.path);
        let rel_s = rel.to_string_lossy();
        if CLI_LAYER
            .iter()
            .any(|c| rel_s == *c || (c.ends_with('/') && rel_s.starts_with(c)))
        {
            continue;
        }
        let text = std::fs::read_to_string(&file.path)?;
        for t in without_tests(tokenize(&text)) {
            if t.tok == Tok::Ident("clap".to_owned()) {
                failures += 1;
                let _ = writeln!(
                    report,
                    "daemon/src/{rel_s}:{}: clap outside the CLI layer ({}): take a plain struct, let the CLI convert",
                    t.line,
                    CLI_LAYER.join(", ")
                );
                break;
            }
        }
    }
    Ok(failures)
}
