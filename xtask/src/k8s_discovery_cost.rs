//! `cargo xtask k8s-discovery-cost [--seconds N] [--rounds R]`: the discovery cost benchmark of
//! issue 24. Builds the release `lmperf`, then runs `tests/benches/k8s_discovery_cost.rs`
//! (a 50,000-pod scripted cluster, 110 pods on the node, 8 targets; the same agent with
//! discovery on and off, alternating), which prints CPU (% of a core) and RSS per run and what
//! discovery adds (budget: <= 0.2 % of a core, <= 10 MiB). Not part of `cargo xtask ci`.

use anyhow::{Context, Result, bail};

pub fn run(args: &[String]) -> Result<()> {
    let (mut seconds, mut rounds) = (30u64, 2u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<u64> {
            let v = it.next().with_context(|| format!("{name} needs a value"))?;
            v.parse()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("{name} {v:?}: a positive whole number"))
        };
        match a.as_str() {
            "--seconds" => seconds = value("--seconds")?,
            "--rounds" => rounds = value("--rounds")?,
            other => bail!(
                "unexpected argument {other:?}; usage: cargo xtask k8s-discovery-cost [--seconds N] [--rounds R]"
            ),
        }
    }
    crate::build_release_lmperf("[1/2] ")?;
    let mut bench = crate::cargo();
    bench
        .args(["bench", "-p", "lmperf-e2e", "--bench", "k8s_discovery_cost"])
        .env("LMPERF_BENCH_SECS", seconds.to_string())
        .env("LMPERF_BENCH_ROUNDS", rounds.to_string());
    crate::step(
        &format!(
            "[2/2] discovery cost, {rounds} rounds of {seconds} s per agent (tests/benches/k8s_discovery_cost.rs)"
        ),
        bench,
    )
}
