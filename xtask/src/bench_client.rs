//! `cargo xtask bench-client`: the client benchmark of issue 3 (acceptance 5). Installs the
//! Python peers (GuideLLM, AIPerf) into `.venv-bench/` with a Gemma tokenizer built from the
//! test model's GGUF (`tests/peers/install-bench.sh`), builds the release `lmperf`, then runs
//! `tests/benches/client_peers.rs`, which prints the figures. Not part of `cargo xtask ci`.
//! Settings pass through as `LMPERF_BENCH_*` environment variables (see that file).

use anyhow::Result;

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        anyhow::bail!(
            "bench-client takes no arguments (got {a:?}); settings are LMPERF_BENCH_* variables"
        );
    }
    let root = crate::root();
    crate::step(
        "[1/4] tests/peers/install.sh (the GGUF the tokenizer comes from)",
        crate::install_peers_cmd(),
    )?;
    let mut peers = std::process::Command::new("bash");
    peers
        .arg(root.join("tests/peers/install-bench.sh"))
        .current_dir(&root);
    crate::step(
        "[2/4] tests/peers/install-bench.sh (GuideLLM, AIPerf, tokenizer)",
        peers,
    )?;
    crate::build_release_lmperf("[3/4] ")?;
    let mut bench = crate::cargo();
    bench.args(["bench", "-p", "lmperf-e2e", "--bench", "client_peers"]);
    crate::step(
        "[4/4] client benchmark (tests/benches/client_peers.rs)",
        bench,
    )
}
