//! Longest first: the e2e tests that run for minutes without the serial lock start at once,
//! in a second process of the e2e binary beside the `cargo test` one.
//!
//! libtest starts a binary's tests in name order as its threads free up, so a long test late
//! in the alphabet starts late: on a fresh 2-core CI machine (4ef719c)
//! `spike::scripted_overload_…` (221 s) started ~320 s into the 545 s e2e step and ran
//! alone for its last ~150 s. Started at once they end inside the serial chain's time.
//!
//! The serial lock (`tests/support/serial.rs`) is one per process: a test listed in
//! [`EARLY`] must not take it. The early process runs with `LMPERF_E2E_EARLY=1`, under which
//! `serial::lock` panics naming this file, and CI fails when the early process ran another
//! number of tests than [`EARLY`] lists (a test renamed away from its entry).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The long e2e tests that take no serial lock, by their full libtest names.
pub const EARLY: &[&str] = &[
    // 130 s calm + 30 s overload + the spike hold, against a scripted 2-slot server.
    "spike::scripted_overload_enters_spike_mode_on_a_latency_jump_without_slo",
    // The real llama.cpp killed twice and restarted, ~155 s; its checks hold on a loaded
    // machine (tests/outage.rs says why it is not serial).
    "outage::a_killed_server_is_an_outage_and_its_restart_the_outages_child",
    // The real vllm-router, ~110 s calm then up to 60 s slowed, scripted workers.
    "vllm_router::vllm_router_a_slower_router_is_diagnosed_router_overhead",
];

/// The e2e test binary as cargo built it.
pub struct E2eBinary {
    /// Its executable (`target/debug/deps/e2e-<hash>`).
    exe: PathBuf,
    /// Its package's directory, where `cargo test` runs it.
    dir: PathBuf,
}

/// Finds the e2e binary: `cargo test --workspace --locked --test '*' --no-run
/// --message-format=json` (the build step's selection, so nothing is rebuilt), its
/// `compiler-artifact` of test target `e2e`.
///
/// # Errors
/// cargo fails, or prints no artifact for the test target `e2e`.
pub fn find(cargo: &dyn Fn() -> Command) -> Result<E2eBinary> {
    let out = cargo()
        .args([
            "test",
            "--workspace",
            "--locked",
            "--test",
            "*",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run: {}", out.status);
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_e2e = msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == "e2e"
            && msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"));
        if !is_e2e {
            continue;
        }
        let (Some(exe), Some(manifest)) =
            (msg["executable"].as_str(), msg["manifest_path"].as_str())
        else {
            continue;
        };
        let dir = PathBuf::from(manifest)
            .parent()
            .map(PathBuf::from)
            .context("the e2e package's manifest path has no directory")?;
        return Ok(E2eBinary {
            exe: PathBuf::from(exe),
            dir,
        });
    }
    bail!("cargo test --no-run printed no executable for the test target `e2e`")
}

/// The early process: the binary run with `--exact` [`EARLY`], as many threads as tests,
/// `--report-time` (through `RUSTC_BOOTSTRAP=1`, as the `cargo test` run's runner sets it)
/// and `LMPERF_E2E_EARLY=1`; the caller adds the run's environment.
pub fn command(bin: &E2eBinary) -> Command {
    let mut cmd = Command::new(&bin.exe);
    cmd.arg("--exact")
        .args(EARLY)
        .args(["-Z", "unstable-options", "--report-time"])
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUST_TEST_THREADS", EARLY.len().to_string())
        .env("LMPERF_E2E_EARLY", "1")
        .current_dir(&bin.dir);
    cmd
}

/// `--skip <name>` for each of [`EARLY`], for the `cargo test` run's harness arguments.
pub fn skip_args() -> Vec<String> {
    EARLY
        .iter()
        .flat_map(|t| ["--skip".to_owned(), (*t).to_owned()])
        .collect()
}

/// Checks that the early process ran each of [`EARLY`] (`ran`: its passed plus failed).
///
/// # Errors
/// It ran another number of tests: an entry names no test.
pub fn check_ran(ran: u64) -> Result<()> {
    if ran != EARLY.len() as u64 {
        bail!(
            "the early e2e process ran {ran} tests, xtask/src/e2e_early.rs EARLY lists {}: an entry names no test ({EARLY:?})",
            EARLY.len()
        );
    }
    Ok(())
}
