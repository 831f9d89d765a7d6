//! Layers: the top-level modules of `daemon/src` in [`LAYERS`], bottom first; an import may go
//! down or stay within a layer, never up (ARCHITECTURE.md draws the same table). Beside it,
//! [`FORBIDDEN_EDGES`]: imports that the layers allow but the design does not.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// The top-level modules of `daemon/src`, by layer, lowest first: `(layer, modules)` (L0 and L1 are the pure crates, `daemon/crates/`, which
/// the compiler keeps below: they cannot name the agent). A new
/// top-level module must be placed here (the check fails on a module it cannot place).
pub(super) const LAYERS: &[(&str, &[&str])] = &[
    (
        "L2 foundation",
        &[
            "caps",
            "config",
            "cost",
            "grid",
            "heap",
            "live_list",
            "logging",
            "reload",
            "sampler",
            "telemetry",
            "unix_grpc",
        ],
    ),
    (
        "L3 sources",
        &["discovery", "gpu", "net", "node", "profiler", "server"],
    ),
    (
        "L4 live engines and their views",
        &["contention", "diagnosis_live", "status"],
    ),
    ("L5 request path", &["canary", "load", "targets"]),
    ("L6 services", &["admin", "bench", "control"]),
    ("L7 front ends", &["agent", "analyze", "cli"]),
];

/// The layer index of a top-level module, `None` when [`LAYERS`] does not place it.
fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

/// Counts (and reports) upward imports, top-level modules [`LAYERS`] does not place (or
/// places twice, or that do not exist), and the edges in [`FORBIDDEN_EDGES`]. `modules`: the
/// top-level modules of `daemon/src`; `top`: their import edges, `(from, to) -> file:line`.
pub(super) fn check_layers(
    modules: &BTreeSet<String>,
    top: &BTreeMap<(String, String), String>,
    report: &mut String,
) -> usize {
    let mut failures = 0;
    let mut placed = BTreeSet::new();
    for (layer, ms) in LAYERS {
        for m in *ms {
            if !placed.insert(*m) {
                failures += 1;
                let _ = writeln!(report, "LAYERS places `{m}` twice (again in {layer})");
            }
            if !modules.contains(*m) {
                failures += 1;
                let _ = writeln!(
                    report,
                    "LAYERS ({layer}) names `{m}`, which is not a top-level module of daemon/src"
                );
            }
        }
    }
    for m in modules {
        if layer_of(m).is_none() {
            failures += 1;
            let _ = writeln!(
                report,
                "daemon/src/{m}: a top-level module that LAYERS (xtask/src/arch_check/layers.rs) does not place: put it in its layer"
            );
        }
    }
    for ((from, to), at) in top {
        if let (Some(a), Some(b)) = (layer_of(from), layer_of(to))
            && b > a
        {
            failures += 1;
            let _ = writeln!(
                report,
                "upward import {from} ({}) -> {to} ({}) at {at}: a layer never imports the one above it",
                LAYERS[a].0, LAYERS[b].0
            );
        }
    }
    for (from, to, why) in FORBIDDEN_EDGES {
        if let Some(at) = top.get(&((*from).to_owned(), (*to).to_owned())) {
            failures += 1;
            let _ = writeln!(report, "forbidden import {from} -> {to} ({at}): {why}");
        }
    }
    failures
}

/// Top-level imports forbidden beyond the acyclic rule, `(from, to, why)`: the load layer
/// (`load`) is shared by `lmperf run` (`bench`) and `lmperf ctl inject` (`control`), which
/// must not reach into each other, and it imports neither.
pub(super) const FORBIDDEN_EDGES: &[(&str, &str, &str)] = &[
    (
        "control",
        "bench",
        "the agent must not depend on the benchmark (shared: `load`)",
    ),
    (
        "bench",
        "control",
        "the benchmark must not depend on the agent (shared: `load`)",
    ),
    ("load", "bench", "`load` sits below `bench`"),
    ("load", "control", "`load` sits below `control`"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn edges(pairs: &[(&str, &str)]) -> BTreeMap<(String, String), String> {
        pairs
            .iter()
            .map(|(a, b)| (((*a).to_owned(), (*b).to_owned()), "x.rs:1".to_owned()))
            .collect()
    }

    fn all_modules() -> BTreeSet<String> {
        LAYERS
            .iter()
            .flat_map(|(_, ms)| ms.iter().map(|m| (*m).to_owned()))
            .collect()
    }

    #[test]
    fn an_upward_import_fails_and_a_downward_one_passes() {
        let mut report = String::new();
        assert_eq!(
            check_layers(&all_modules(), &edges(&[("canary", "status")]), &mut report),
            0,
            "{report}"
        );
        let n = check_layers(&all_modules(), &edges(&[("status", "canary")]), &mut report);
        assert_eq!(n, 1);
        assert!(report.contains("upward import status (L4 live engines and their views) -> canary (L5 request path) at x.rs:1"), "{report}");
    }

    #[test]
    fn an_unplaced_module_fails() {
        let mut modules = all_modules();
        modules.insert("router".to_owned());
        let mut report = String::new();
        assert_eq!(check_layers(&modules, &BTreeMap::new(), &mut report), 1);
        assert!(report.contains("daemon/src/router"), "{report}");
    }
}
