//! Project automation (the cargo-xtask pattern): `cargo xtask <task>`, see `.cargo/config.toml`.
//!
//!   cargo xtask ci [-- <cargo test args>]   style, peers, build, every test, a short fuzz run
//!   cargo xtask arch-check                  import cycles of daemon/src, pure crates (no build)
//!   cargo xtask demo [--seconds N]          model server + collector + agent, live spans
//!   cargo xtask gpu-check [--seconds N]     GPU metrics against nvidia-smi on a real GPU
//!   cargo xtask bench-client                lmperf run vs GuideLLM and AIPerf (figures)
//!   cargo xtask fuzz [--seconds N]          cargo fuzz over the stream measurement (figures)
//!   cargo xtask fake-nvml DIR               the scripted libnvidia-ml.so.1 (tests, no GPU)
//!   cargo xtask spike-calm [--seconds N]    calm run: spike mode never entered (issue 17)
//!   cargo xtask diagnose-eval [--live] [-v] diagnosis AC@1/AC@3 over the episode corpus (issue 12)
//!   cargo xtask diagnose-live [--episode NAME] [--record]  contention episodes, real server (issue 28)
//!   cargo xtask k8s-discovery-cost [--seconds N] [--rounds R]  discovery's CPU/RSS (issue 24)

mod arch_check;
mod bench_client;
mod ci;
mod demo;
mod diagnose_eval;
mod diagnose_live;
mod e2e_early;
mod fake_nvml;
mod fuzz;
mod gpu_check;
mod hog;
mod k8s_discovery_cost;
mod spike_calm;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  ci [--stress[=N]] [-- <cargo test args>]
                              fmt and clippy, install the peers, build, run every test
                              (the e2e binary several tests at a time), fuzz 30 s;
                              --stress: the e2e binary N times (1) beside a CPU hog on
                              every core, the fuzz lane after it (or LMPERF_CI_STRESS=N)
  arch-check                  the architecture from the source text, no build: no import
                              cycle among daemon/src's modules, pure crates (daemon/crates/)
                              with only their allowed dependencies and no IO or clock
  demo [--seconds N]          run a local model server, an OTLP collector and the agent;
                              stop after N seconds or on Ctrl-C
  gpu-check [--seconds N]     on a machine with an NVIDIA GPU: run the agent under a
                              torch load and check its GPU metrics against nvidia-smi
  bench-client                install GuideLLM and AIPerf (.venv-bench/), then print lmperf's
                              and their sustained rate, CPU per request and TTFT error
                              against one local stream server (LMPERF_BENCH_* settings)
  fuzz [--seconds N]          cargo fuzz over StreamMeasurer (daemon/fuzz/) for N seconds
                              (default 600; installs cargo-fuzz into $CARGO_HOME/bin, needs
                              nightly), then executions, coverage and time
  fake-nvml DIR [--omit SYM]  build the scripted NVML into DIR/libnvidia-ml.so.1 with cc
                              (tests/support/fake_nvml/README.md)
  spike-calm [--seconds N]    the real model server under Poisson canaries for N s (600):
                              spike mode must never be entered; prints TTFT figures
  diagnose-eval [--live] [-v]  the diagnosis engine over the episode corpus (synthetic +
                              tests/fixtures/episodes/): AC@1, AC@3, time to diagnosis per
                              cause, control diagnoses; --live first runs the live harness
                              (real agent, injected faults) and records its episodes;
                              --calm 10m: only the calm run on the real server, half busy
                              with a second client (0 diagnoses)
  diagnose-live [--episode NAME]... [--record]
                              the agent against the real llama.cpp server under contention
                              (about 4 min each): cpu_quota (CFS quota cut to 20 % of a
                              core), cpu_hog (a neighbour spinning every core), memory_limit
                              (the server's memory cgroup below its working set),
                              surge_then_503 (a load surge, 503s 20 s later); prints the
                              confirmed cause, its time from the injection, evidence and top
                              three; --record writes the episodes to tests/fixtures/episodes/
                              (needs root and cgroup v1 for the cgroup episodes)
  k8s-discovery-cost [--seconds N] [--rounds R]
                              release build, then Kubernetes discovery's CPU (% of a core)
                              and RSS vs the same agent with discovery off: 50,000 pods in
                              a scripted cluster, 110 on the node, 8 targets (figures)";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let task = args.next();
    let rest: Vec<String> = args.collect();
    let result = match task.as_deref() {
        Some("ci") => ci::run(&rest),
        Some("ci-lane") => ci::lane(&rest),
        Some("hog-spin") => hog::spin(&rest),
        Some("arch-check") => arch_check::run(&rest),
        Some("demo") => demo::run(&rest),
        Some("gpu-check") => gpu_check::run(&rest),
        Some("bench-client") => bench_client::run(&rest),
        Some("fuzz") => fuzz::run(&rest),
        Some("fake-nvml") => fake_nvml::run(&rest),
        Some("spike-calm") => spike_calm::run(&rest),
        Some("diagnose-eval") => diagnose_eval::run(&rest),
        Some("diagnose-live") => diagnose_live::run(&rest),
        Some("k8s-discovery-cost") => k8s_discovery_cost::run(&rest),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(anyhow::anyhow!("unknown task {other:?}\n\n{USAGE}")),
        None => Err(anyhow::anyhow!("no task given\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: the parent of this crate's directory.
pub fn root() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    dir.parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The cargo that launched us (`$CARGO`), else `cargo` from PATH.
pub fn cargo() -> Command {
    let bin = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(bin);
    cmd.current_dir(root());
    cmd
}

/// Builds the agent as it ships (release, without the tests' hooks: `--no-default-features`),
/// as step `header_prefix` (e.g. `[1/2] `) of a command that measures it.
pub fn build_release_lmperf(header_prefix: &str) -> Result<()> {
    let mut build = cargo();
    build.args([
        "build",
        "--release",
        "-p",
        "lmperf",
        "--no-default-features",
    ]);
    step(
        &format!("{header_prefix}cargo build --release -p lmperf --no-default-features"),
        build,
    )
}

/// Prints a step header, runs `cmd` with inherited stdio and fails unless it exits 0.
pub fn step(header: &str, mut cmd: Command) -> Result<()> {
    println!("\n==> {header}");
    let started = std::time::Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{header}`"))?;
    if !status.success() {
        bail!("`{header}` failed ({status})");
    }
    println!(
        "==> {header}: ok ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Steps 1 and 2 of the commands that run the agent against the real peers: install the
/// peers, build `lmperf`.
pub fn peers_and_agent() -> Result<()> {
    step("[1/3] tests/peers/install.sh", install_peers_cmd())?;
    let mut build = cargo();
    build.args(["build", "-p", "lmperf"]);
    step("[2/3] cargo build -p lmperf", build)
}

/// `cargo test -p lmperf-e2e --test e2e MODULE::NAME -- --nocapture`: one end-to-end test
/// (module `MODULE` of `tests/tests.rs`), its output shown.
pub fn e2e_test(module: &str, name: &str) -> Command {
    let mut test = cargo();
    test.args(["test", "-p", "lmperf-e2e", "--test", "e2e"])
        .arg(format!("{module}::{name}"))
        .args(["--", "--nocapture"]);
    test
}

/// `tests/peers/install.sh` (idempotent): llama.cpp server, Gemma 3 270M, rotel.
pub fn install_peers_cmd() -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("tests/peers/install.sh"))
        .current_dir(root());
    cmd
}
