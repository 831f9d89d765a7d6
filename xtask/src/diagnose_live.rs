//! `cargo xtask diagnose-live [--episode NAME] [--record]`: the live contention episodes on the
//! real llama.cpp server (issue 28; `tests/diagnose_live/contention.rs`), a long evaluation that
//! prints figures, not part of CI (about 4 minutes an episode): `cpu_quota` (the server's CFS
//! quota cut to 20 % of a core → `cpu_throttling`), `cpu_hog` (a neighbour spinning every core
//! → `node_cpu_pressure`), `memory_limit` (the server's memory cgroup cut below its working set
//! → `memory_pressure`), `surge_then_503` (a load surge and a 503 burst 20 s apart → both in
//! the top three); and the serving path's (`tests/diagnose_live/serving_path.rs`: vllm-router
//! in front of two real servers): `router_quota` (the router's quota cut to 1 % of a core →
//! `router_overhead`), `worker_quota` (one worker's cut to 20 % → `worker_out_of_rotation` on
//! it), `worker_killed` (one worker killed), `session_pinning` (`consistent_hash`, background
//! clients' requests from one session key each to one for all → `routing_imbalance`); and on
//! the real Dynamo (`tests/diagnose_live/dynamo.rs`): `pd_kv_transfer` (the P/D pair replaced
//! by one with a 10 × slower KV link → `kv_transfer`), `agg_slow_worker` (one of two mockers
//! replaced by one 33 × slower → `worker_out_of_rotation` on it), `frontend_quota` (the
//! frontend's quota cut to 5 % of a core → `router_overhead`). Prints per episode the first
//! `root_confirmed`, the expected cause's time from the injection, its evidence and the top
//! three. `--record` writes each episode into
//! `tests/fixtures/episodes/` for `cargo xtask diagnose-eval`. Needs root and cgroup v1 for the
//! cgroup episodes (it restores what it changed).

use anyhow::{Result, bail};

/// Episode name → the test that runs it.
const EPISODES: [(&str, &str); 11] = [
    ("cpu_quota", "live_cpu_quota_on_llamacpp"),
    ("cpu_hog", "live_cpu_hog_on_llamacpp"),
    ("memory_limit", "live_memory_limit_on_llamacpp"),
    ("surge_then_503", "live_surge_then_503_on_llamacpp"),
    (
        "router_quota",
        "serving_path::live_router_quota_before_llamacpp",
    ),
    (
        "worker_quota",
        "serving_path::live_worker_quota_behind_vllm_router",
    ),
    (
        "worker_killed",
        "serving_path::live_worker_killed_behind_vllm_router",
    ),
    (
        "session_pinning",
        "serving_path::live_session_pinning_behind_vllm_router",
    ),
    (
        "pd_kv_transfer",
        "dynamo::live_dynamo_pd_slower_kv_transfer",
    ),
    ("agg_slow_worker", "dynamo::live_dynamo_agg_slow_worker"),
    ("frontend_quota", "dynamo::live_dynamo_frontend_quota"),
];

pub fn run(args: &[String]) -> Result<()> {
    let mut chosen: Vec<&str> = Vec::new();
    let mut record = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--record" => record = true,
            "--episode" => {
                let Some(name) = it.next() else {
                    bail!("--episode needs a name: one of {}", names());
                };
                let Some((_, test)) = EPISODES.iter().find(|(n, _)| n == name) else {
                    bail!("--episode {name:?}: expected one of {}", names());
                };
                chosen.push(test);
            }
            other => bail!(
                "diagnose-live takes [--episode NAME]... [--record] (got {other:?}; episodes: {})",
                names()
            ),
        }
    }
    if chosen.is_empty() {
        chosen = EPISODES.iter().map(|(_, t)| *t).collect();
    }
    crate::peers_and_agent()?;
    let mut failed = Vec::new();
    for test in chosen {
        let mut cmd = crate::e2e_test("diagnose_live", &format!("contention::{test}"));
        cmd.args(["--exact", "--test-threads", "1"]);
        cmd.env("LMPERF_DIAGNOSE_LIVE", "1");
        if record {
            cmd.env(
                "LMPERF_EPISODE_DIR",
                crate::root().join("tests/fixtures/episodes"),
            );
        }
        if let Err(e) = crate::step(&format!("[3/3] live episode {test}"), cmd) {
            eprintln!("{e:#}");
            failed.push(test);
        }
    }
    if !failed.is_empty() {
        bail!("episodes that missed their cause: {failed:?}");
    }
    Ok(())
}

fn names() -> String {
    EPISODES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}
