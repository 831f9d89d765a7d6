//! `cargo xtask diagnose-eval [--live] [--release] [ARGS]`: the diagnosis engine over the
//! episode corpus (the synthetic episodes of `lmperf::analyze::synth` and the recorded ones of
//! `tests/fixtures/episodes/`), printing AC@1, AC@3, Avg@5, the median time from onset to
//! `root_confirmed` per cause, and the control episodes diagnosed (issue 12). Runs
//! `daemon/examples/diagnose_eval.rs`; ARGS go to it (`-v` lists every episode's ranking,
//! `--per-magnitude N`, `--controls N`, `--json FILE`, `--write-synthetic DIR`). `--live` first
//! runs the live harness (`tests/diagnose_live.rs`: the real agent against injected faults,
//! about 3 min per episode), which records its episodes into `tests/fixtures/episodes/`.

use anyhow::Result;

pub fn run(args: &[String]) -> Result<()> {
    let episodes = crate::root().join("tests/fixtures/episodes");
    let mut cmd = crate::cargo();
    cmd.args(["run", "-p", "lmperf", "--example", "diagnose_eval"]);
    let mut rest = Vec::new();
    let mut live = false;
    for a in args {
        match a.as_str() {
            "--release" => {
                cmd.arg("--release");
            }
            "--live" => live = true,
            _ => rest.push(a.clone()),
        }
    }
    if live {
        let mut build = crate::cargo();
        build.args(["build", "-p", "lmperf"]);
        crate::step("diagnose-eval --live: cargo build -p lmperf", build)?;
        let mut test = crate::cargo();
        test.args([
            "test",
            "-p",
            "lmperf-e2e",
            "--test",
            "diagnose_live",
            "--",
            "--nocapture",
        ]);
        test.env("LMPERF_DIAGNOSE_LIVE", "1");
        test.env("LMPERF_EPISODE_DIR", &episodes);
        crate::step(
            "diagnose-eval --live: live episodes (tests/diagnose_live.rs)",
            test,
        )?;
    }
    cmd.arg("--");
    cmd.args(&rest);
    cmd.arg(&episodes);
    crate::step("diagnose-eval: the engine over the episode corpus", cmd)
}
