//! `cargo xtask bench-client`: the client benchmark of issue 3 (acceptance 5). Installs the
//! Python peers (GuideLLM, AIPerf) into `.venv-bench/` with a Gemma tokenizer built from the
//! test model's GGUF (`tests/peers/install-bench.sh`), builds the release `lmperf`, then runs
//! `tests/benches/client_peers.rs`, which prints the figures (wrk, the closed-loop reference,
//! installed from Debian when missing and root). Not part of `cargo xtask ci`.
//! Settings pass through as `LMPERF_BENCH_*` environment variables (see that file).

use anyhow::Result;

/// `cargo xtask bench-client --help`: what it runs and every `LMPERF_BENCH_*` setting it reads
/// (tests/benches/client_peers.rs and client_peers/closed_loop.rs), with its default.
const HELP: &str = "\
cargo xtask bench-client: lmperf run beside GuideLLM, AIPerf and wrk against one local stream
server; prints sustained rates, CPU per request, TTFT error against the server's own send
times (p50, p99) at fixed rates, and the closed-loop ratio lmperf / wrk (target >= 0.25), each
with the load average. Installs wrk (Debian, as root), the peers (.venv-bench/) and a release
lmperf first.

Settings (environment variables, default in brackets):
  LMPERF_BENCH_TOOLS          tools to run [lmperf,guidellm,aiperf]
  LMPERF_BENCH_RATES          sweep rates, req/s, comma separated [100 doubling to 51200]
  LMPERF_BENCH_STEP_S         seconds per sweep step [3]
  LMPERF_BENCH_FIXED_RATES    rates for the TTFT error figures [500,5000]
  LMPERF_BENCH_TOL_MS         a request sent later than this past its due time (or not
                              completed) makes the rate not sustained, ms [10]
  LMPERF_BENCH_VENV           peers' virtual environments [.venv-bench]
  LMPERF_BENCH_TOKENIZER      directory with tokenizer.json [<venv>/tokenizer]
  LMPERF_BENCH_FIRST_DELAY_MS server delay before the first token, ms [0]
  LMPERF_BENCH_GAP_MS         server delay between tokens, ms [0]
  LMPERF_BENCH_STARTUP_S      time allowed for a tool to start, s [120]
  LMPERF_BENCH_SERVE_S        only serve for N seconds (runs by hand) [unset]
  LMPERF_BENCH_CLOSED         0 skips the closed loop beside wrk [1]
  LMPERF_BENCH_CLOSED_CONC    closed-loop concurrency [64]
  LMPERF_BENCH_CLOSED_N       lmperf's closed-loop requests [20000]
  LMPERF_BENCH_CLOSED_S       wrk's seconds [5]
  LMPERF_BENCH_WRK            the wrk binary [wrk]
";

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        if a == "--help" || a == "-h" {
            print!("{HELP}");
            return Ok(());
        }
        anyhow::bail!(
            "bench-client takes no arguments (got {a:?}); settings are LMPERF_BENCH_* variables \
             (cargo xtask bench-client --help lists them)"
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
