//! `cargo xtask diagnose-eval [--release] [ARGS]`: the diagnosis engine over the episode
//! corpus (the synthetic episodes of `lmperf::analyze::synth` and the recorded ones of
//! `tests/fixtures/episodes/`), printing AC@1, AC@3, Avg@5, the median time from onset to
//! `root_confirmed` per cause, and the control episodes diagnosed (issue 12). Runs
//! `daemon/examples/diagnose_eval.rs`; ARGS go to it (`-v` lists every episode's ranking,
//! `--per-magnitude N`, `--controls N`, `--json FILE`, `--write-synthetic DIR`).

use anyhow::Result;

pub fn run(args: &[String]) -> Result<()> {
    let mut cmd = crate::cargo();
    cmd.args(["run", "-p", "lmperf", "--example", "diagnose_eval"]);
    let mut rest = Vec::new();
    for a in args {
        if a == "--release" {
            cmd.arg("--release");
        } else {
            rest.push(a.clone());
        }
    }
    cmd.arg("--");
    cmd.args(&rest);
    cmd.arg(crate::root().join("tests/fixtures/episodes"));
    crate::step("diagnose-eval: the engine over the episode corpus", cmd)
}
