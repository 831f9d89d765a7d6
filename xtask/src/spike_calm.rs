//! `cargo xtask spike-calm [--seconds N]`: spike mode on the real llama.cpp server (issue 17),
//! both tests ignored in CI (where a scripted 2-slot server's overload runs instead):
//! 1. the calm run: Poisson canaries (1/s, no SLO) for N seconds (default 600): spike mode must
//!    never be entered (`tests/spike.rs`'s calm test with `LMPERF_SPIKE_CALM_S`; it prints
//!    canaries and TTFT p50/p99/max);
//! 2. the overload: 150 s calm, 45 s overloaded by another client: spike mode entered on the
//!    latency jump within 30 s of it, every trace kept until the hold ends (about 6 minutes).

use anyhow::{Result, bail};

pub fn run(args: &[String]) -> Result<()> {
    let seconds = match args {
        [] => 600,
        [flag, n] if flag == "--seconds" => n
            .parse::<u64>()
            .map_err(|e| anyhow::anyhow!("--seconds {n:?}: {e}"))?,
        other => bail!("spike-calm takes [--seconds N] (got {other:?})"),
    };
    crate::peers_and_agent()?;
    let mut test = crate::e2e_test("spike", "calm_poisson_canaries_never_enter_spike_mode");
    test.arg("--ignored")
        .env("LMPERF_SPIKE_CALM_S", seconds.to_string());
    crate::step(
        &format!("[3/3] {seconds} s calm run (tests/spike.rs)"),
        test,
    )?;
    let mut test = crate::e2e_test(
        "spike",
        "overload_enters_spike_mode_on_a_latency_jump_without_slo",
    );
    test.arg("--ignored");
    crate::step(
        "[3/3] then the overload of the real server (tests/spike.rs)",
        test,
    )
}
