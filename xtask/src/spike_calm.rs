//! `cargo xtask spike-calm [--seconds N]`: the 10-minute calm run of issue 17. The real
//! llama.cpp server under Poisson canaries (1/s, no SLO) for N seconds (default 600): spike
//! mode must never be entered. Runs `tests/spike.rs`'s calm test with `LMPERF_SPIKE_CALM_S`
//! (ignored in CI, where the overload test's 150 s calm phase checks the same) and prints its
//! figures (canaries, TTFT p50/p99/max).

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
    )
}
