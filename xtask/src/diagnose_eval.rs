//! `cargo xtask diagnose-eval [--live] [--release] [ARGS]`: the diagnosis engine over the
//! episode corpus (the synthetic episodes of `lmperf::analyze::synth` and the recorded ones of
//! `tests/fixtures/episodes/`), printing AC@1, AC@3, Avg@5, the median time from onset to
//! `root_confirmed` and the onset error per cause, and the control episodes diagnosed (issue 12),
//! on the development half, the holdout half and the whole corpus (issue 28: the split is
//! `lmperf::analyze::eval::split`, documented in `tests/fixtures/episodes/README.md`). Runs
//! `daemon/examples/diagnose_eval.rs`; ARGS go to it (`-v` lists every episode's ranking,
//! `--per-magnitude N`, `--controls N`, `--json FILE`, `--write-synthetic DIR`). `--live` first
//! runs the live harness (`tests/diagnose_live.rs`: the real agent against injected faults,
//! about 3 min per episode), which records its episodes into `tests/fixtures/episodes/`.
//! `--calm DURATION` (`30m`, `90s`, seconds) runs only the calm run instead: the agent's
//! Poisson canaries on the real llama.cpp server, kept about half busy by a second client, and
//! at the same time on 5 scripted vLLM-style servers kept 40–60 % busy by background traffic
//! (`tests/diagnose_live/calm_busy.rs`), for DURATION, printing the servers' busy shares, the
//! evaluations and the diagnoses (must be 0); then the agent's canaries through vllm-router
//! before two real llama.cpp servers and through Dynamo's frontend before two mockers (issue
//! 53), DURATION each.

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
            "--calm" => return calm(args),
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
            "e2e",
            "diagnose_live::",
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

/// `--calm DURATION`: the calm runs of `tests/diagnose_live/real.rs`,
/// `tests/diagnose_live/calm_busy.rs` and, through each router, of
/// `tests/diagnose_live/serving_path.rs` and `tests/diagnose_live/dynamo.rs`, for DURATION.
fn calm(args: &[String]) -> Result<()> {
    let value = args
        .iter()
        .skip_while(|a| *a != "--calm")
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("--calm needs a duration (30m, 90s, 1800)"))?;
    let secs = parse_duration_s(value)?;
    crate::peers_and_agent()?;
    let mut test = crate::e2e_test(
        "diagnose_live",
        "real::live_calm_real_server_is_never_diagnosed",
    );
    // The scripted busy servers' calm run beside it (another filter; both at once).
    test.arg("diagnose_live::calm_busy::live_calm_busy_scripted_servers_are_never_diagnosed");
    test.env("LMPERF_DIAGNOSE_CALM_S", secs.to_string());
    crate::step(
        &format!(
            "[3/4] {secs} s calm runs: the real llama.cpp server with a second client, 5 scripted busy servers"
        ),
        test,
    )?;
    // Through each router (issue 53), after those: vllm-router before two real servers,
    // Dynamo's frontend before two mockers (one after the other: they share the serial lock).
    // Beside the runs above, on 2 cores, the machine itself was busy (seen: vllm-router's
    // workers' TTFT p99 74 -> 194 ms for a while, an `unknown` root confirmed; alone, 0).
    let mut routers = crate::cargo();
    routers
        .args([
            "test",
            "-p",
            "lmperf-e2e",
            "--test",
            "e2e",
            "--",
            "--nocapture",
        ])
        .arg("contention::serving_path::live_calm_through_vllm_router_is_never_diagnosed")
        .arg("contention::dynamo::live_calm_through_dynamo_is_never_diagnosed")
        .env("LMPERF_DIAGNOSE_CALM_S", secs.to_string());
    crate::step(
        &format!(
            "[4/4] {secs} s calm runs through vllm-router and through Dynamo, one after the other"
        ),
        routers,
    )
}

/// `30m` | `90s` | `1800` → seconds.
fn parse_duration_s(v: &str) -> Result<u64> {
    let (num, mult) = match v.strip_suffix('m') {
        Some(n) => (n, 60),
        None => (v.strip_suffix('s').unwrap_or(v), 1),
    };
    num.parse::<u64>()
        .ok()
        .filter(|&n| n > 0)
        .map(|n| n * mult)
        .ok_or_else(|| {
            anyhow::anyhow!("--calm {v:?}: expected a duration such as 30m, 90s or 1800")
        })
}
