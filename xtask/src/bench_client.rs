//! `cargo xtask bench-client`: the client benchmark of issue 3 (acceptance 5). Installs the
//! Python peers (GuideLLM, AIPerf) into `.venv-bench/` with a Gemma tokenizer built from the
//! test model's GGUF (`tests/peers/install-bench.sh`), builds the release `lmperf`, then runs
//! `tests/benches/client_peers.rs`, which prints the figures (wrk, the closed-loop reference,
//! installed from Debian when missing and root). Not part of `cargo xtask ci`.
//! Settings pass through as `LMPERF_BENCH_*` environment variables (see that file).

use anyhow::Result;

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        anyhow::bail!(
            "bench-client takes no arguments (got {a:?}); settings are LMPERF_BENCH_* variables"
        );
    }
    let root = crate::root();
    install_wrk()?;
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

/// wrk, the closed-loop reference (Debian's package), installed when missing and root.
fn install_wrk() -> Result<()> {
    let have = std::process::Command::new("wrk")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok();
    if have || !crate::ci::is_root() {
        return Ok(());
    }
    let mut apt = std::process::Command::new("apt-get");
    apt.args(["install", "-y", "--no-install-recommends", "wrk"])
        .env("DEBIAN_FRONTEND", "noninteractive");
    crate::step("[0/4] apt-get install wrk (the closed-loop reference)", apt)
}
