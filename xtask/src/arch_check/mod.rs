//! `cargo xtask arch-check`: the architecture's invariants, checked from the source text alone
//! (no compilation, well under a second, so CI runs it first). One file per check:
//!
//! 1. **No import cycles** ([`cycles`]), in every crate of the workspace. A crate's module tree
//!    is walked from its root file along its `mod` declarations ([`modules`]; `#[cfg(test)]`
//!    modules and everything under them left out). Every `crate::a::…` and `super::…` path in
//!    code (comments and string literals left out, [`tokens`]) is an edge from the module that
//!    writes it to the module it names; an edge counts at the level where the two paths part
//!    (`crate::bench::report` → `crate::bench::server` is the edge `report → server` among the
//!    children of `bench`). Any strongly connected component of more than one module, at any
//!    level, fails the check: each is listed with one file:line per edge, so it says what to
//!    move.
//! 2. **Layers** ([`layers`]): every top-level module of `daemon/src` placed in `LAYERS`, no
//!    import up a layer, and the `FORBIDDEN_EDGES` (bench and control share `load`).
//! 3. **clap only in the CLI layer** ([`cli_layer`]).
//! 4. **Pure crates stay pure** ([`pure`]): listed dependencies only, no IO, clock or runtime.
//! 5. **No new old-path alias** ([`aliases`]): a `pub use` of a path from elsewhere.
//! 6. **No function over 150 lines** ([`long_fns`]) outside tests, beyond the known ones, which
//!    may only shrink; every long function is printed.

mod aliases;
mod cli_layer;
mod cycles;
mod layers;
mod long_fns;
mod modules;
mod pure;
#[cfg(test)]
mod tests;
mod tokens;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use modules::ModuleTree;

pub fn run(args: &[String]) -> Result<()> {
    // `--root DIR`: check another checkout (e.g. `git archive main | tar -x -C DIR`).
    let root = match args {
        [] => crate::root(),
        [flag, dir] if flag == "--root" => PathBuf::from(dir),
        [a, ..] if a == "-h" || a == "--help" => {
            println!(
                "usage: cargo xtask arch-check [--root DIR]   (import cycles in every crate, layers, clap in the CLI layer, pure crates, old-path aliases, long functions)"
            );
            return Ok(());
        }
        [a, ..] => bail!("unexpected argument {a:?}"),
    };
    let started = std::time::Instant::now();
    let mut report = String::new();
    let mut failures = 0usize;

    let src = root.join("daemon/src");
    let tree = ModuleTree::load(&src)?;
    let graphs = tree.edges();
    let edge_count: usize = graphs.values().map(BTreeMap::len).sum();
    failures += report_cycles("daemon/src", &graphs, &mut report);
    println!(
        "arch-check: {} modules in {} files, {} import edges between siblings",
        tree.modules.len(),
        tree.files.len(),
        edge_count
    );
    let empty = BTreeMap::new();
    let top = graphs.get(&Vec::new()).unwrap_or(&empty);
    print_top_graph(top);

    // Every other crate of the workspace: its own cycles; its files for the length check.
    let mut fn_files: Vec<PathBuf> = tree.files.iter().map(|f| f.path.clone()).collect();
    for (name, root_file) in crate_roots(&root) {
        let other = ModuleTree::load_from(&root_file, &root)?;
        failures += report_cycles(&name, &other.edges(), &mut report);
        if !name.starts_with("tests") {
            fn_files.extend(other.files.iter().map(|f| f.path.clone()));
        }
    }

    let top_modules: BTreeSet<String> = tree
        .modules
        .iter()
        .filter(|m| m.len() == 1)
        .map(|m| m[0].clone())
        .collect();
    failures += layers::check_layers(&top_modules, top, &mut report);
    failures += cli_layer::check_cli_layer(&src, &tree, &mut report)?;
    failures += pure::check_pure_crates(&root, &mut report)?;
    failures += aliases::check(&aliases::find(&src, &tree)?, &mut report);
    fn_files.sort();
    fn_files.dedup();
    let files: Vec<&Path> = fn_files.iter().map(PathBuf::as_path).collect();
    failures += long_fns::check(&long_fns::find(&root, &files)?, &mut report);

    if failures > 0 {
        eprint!("{report}");
        bail!("arch-check: {failures} violation(s) (see above)");
    }
    println!(
        "arch-check: ok, no import cycle in any crate, no upward import, load shared by bench and control (neither imports the other), clap only in the CLI layer, pure crates pure, no new alias or long function ({:.0} ms)",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// The workspace's crates other than the `lmperf` library: `(name, root file)`: the binary,
/// the pure crates, xtask and the e2e tests' support library and binary.
fn crate_roots(root: &Path) -> Vec<(String, PathBuf)> {
    let mut out = vec![
        (
            "daemon/src/main.rs".to_owned(),
            root.join("daemon/src/main.rs"),
        ),
        ("xtask".to_owned(), root.join("xtask/src/main.rs")),
        (
            "tests/support".to_owned(),
            root.join("tests/support/lib.rs"),
        ),
        ("tests/tests.rs".to_owned(), root.join("tests/tests.rs")),
    ];
    if let Ok(entries) = std::fs::read_dir(root.join("daemon/crates")) {
        let mut crates: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path().join("src/lib.rs"))
            .filter(|p| p.exists())
            .collect();
        crates.sort();
        for lib in crates {
            let name = lib.strip_prefix(root).unwrap_or(&lib).display().to_string();
            out.push((name, lib));
        }
    }
    out.retain(|(_, p)| p.exists());
    out
}

/// Counts (and reports) the cycles of every level of one crate's graphs.
fn report_cycles(
    krate: &str,
    graphs: &BTreeMap<Vec<String>, BTreeMap<(String, String), String>>,
    report: &mut String,
) -> usize {
    let mut failures = 0;
    for (parent, edges) in graphs {
        for scc in cycles::cycles(edges) {
            failures += 1;
            let level = if parent.is_empty() {
                format!("top-level modules of {krate}")
            } else {
                format!("children of `{}` in {krate}", parent.join("::"))
            };
            let _ = writeln!(
                report,
                "cycle among {level} ({} modules): {}",
                scc.len(),
                scc.iter().cloned().collect::<Vec<_>>().join(" ")
            );
            for ((from, to), at) in edges {
                if scc.contains(from) && scc.contains(to) {
                    let _ = writeln!(report, "    {from} -> {to}   ({at})");
                }
            }
        }
    }
    failures
}

/// Prints the top-level import graph of `daemon/src`, a module per line.
fn print_top_graph(top: &BTreeMap<(String, String), String>) {
    let mut out: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in top.keys() {
        out.entry(from).or_default().insert(to);
    }
    println!("top-level import graph (module -> modules it imports):");
    for (from, tos) in out {
        println!(
            "    {from} -> {}",
            tos.into_iter().collect::<Vec<_>>().join(" ")
        );
    }
}
