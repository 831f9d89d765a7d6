//! Live serving-path episodes (issue 53), `cargo xtask diagnose-live --episode NAME`: the real
//! vllm-router 0.1.17 (`.venv-serving`, round robin) in front of two real llama.cpp servers
//! (Gemma 3 270M, 1 thread each), the agent's router target on it (its page scraped each
//! second, direct canaries to each worker of the router's list every 2 s), calm for `CALM_S`,
//! then one fault:
//!
//! - `router_quota`: the router in its own cgroup v1 `cpu` cgroup, its CFS quota cut from 2
//!   cores to 1 % of a core (2 ms of each 200 ms). Expected: `router_overhead` (scope router).
//! - `worker_quota`: the second worker's CFS quota cut to 20 % of a core; the router keeps
//!   sending it half the requests. Expected: `worker_out_of_rotation` on that worker.
//! - `worker_killed`: the second worker killed. vllm-router retries its requests on the other
//!   worker: the routed canaries see nothing, nothing is paged (a control; the killed worker
//!   fails its direct canaries, `failing_workers` 0 → 1).
//!
//! The serving-path series of a recorded episode are what the agent computes from the same
//! requests (`super::super::serving_path_series`: direct TTFT, routed − direct, the workers
//! apart) and what the router's page said (picks per worker, `Seen::server_sample`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lmperf::node::cgroup;
use lmperf_e2e::agent::workspace_root;
use lmperf_e2e::peers::free_port;
use serde_json::Value;

use super::super::real::model_server;
use super::{
    CPU_V1, Outcome, Spec, V1Cgroup, confirms, evidence_line, report, run_with, server_pid,
};

/// The router process; killed when dropped.
struct Router(Child);

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// vllm-router (round robin) in front of `workers`, its page on its own port; waits until it
/// routes a model list (at most 60 s). Returns it, its port and its page's port.
fn start_router(workers: &[String], log: &Path) -> (Router, u16, u16) {
    start_router_with(workers, "round_robin", log)
}

/// [`start_router`] with load balancing `policy`.
fn start_router_with(workers: &[String], policy: &str, log: &Path) -> (Router, u16, u16) {
    let bin = workspace_root().join(".venv-serving/bin/vllm-router");
    assert!(
        bin.is_file(),
        "{} is missing: run tests/peers/install-serving.sh",
        bin.display()
    );
    let (port, prom) = (free_port(), free_port());
    let log = std::fs::File::create(log).unwrap();
    let router = Router(
        lmperf_e2e::peers::vllm_router_command(&bin, (port, prom), workers, policy, log)
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    loop {
        let ok = Command::new("curl")
            .args(["-sf", "-m", "5"])
            .arg(format!("http://127.0.0.1:{port}/v1/models"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return (router, port, prom);
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "vllm-router did not route within 60 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The router target's settings: its page, scraped each second; direct canaries to each of
/// its workers every 2 s.
fn router_target(prom: u16) -> String {
    router_target_every(prom, 1)
}

/// [`router_target`] with the page scraped every `scrape_s` seconds.
fn router_target_every(prom: u16, scrape_s: u32) -> String {
    format!(
        "kind = \"router\"\nmetrics_url = \"http://127.0.0.1:{prom}/metrics\"\nmetrics_interval = \"{scrape_s}s\"\nworker_probes = false\ndirect_interval = \"2s\"\n"
    )
}

const NOTES: &str = "tests/diagnose_live/serving_path.rs: the agent's canaries (1/s, 4 tokens) through the real vllm-router 0.1.17 (round robin) in front of two real llama.cpp servers (Gemma 3 270M, --parallel 2, --threads 1), its page scraped each second, direct canaries to each worker every 2 s; serving-path series computed from the agent's requests as the agent computes them";

/// The diagnosis of a poll names `worker` (`scope: worker`).
fn names_worker(t: &Value, worker: &str) -> bool {
    t["scope"] == "worker" && t["worker"].as_str().is_some_and(|w| w.contains(worker))
}

/// The router's CFS quota cut to 1 % of a core: every request waits for the router's CPU.
#[test]
fn live_router_quota_before_llamacpp() {
    if !super::super::enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let (w1, w2) = (model_server(), model_server());
    let dir = lmperf_e2e::temp::dir("diag-router-quota");
    let (router, port, prom) = start_router(&[w1.url(), w2.url()], &dir.join("router.log"));
    let pid = router.0.id();
    let mut cg = V1Cgroup::create(CPU_V1, "router");
    cg.set("cpu.cfs_period_us", "200000").unwrap();
    cg.set("cpu.cfs_quota_us", "400000").unwrap();
    cg.enter(pid, "cpu");
    let spec = Spec {
        name: "live-router_overhead-vllm-router-quota1-1".into(),
        cause: "router_overhead",
        second: None,
        magnitude: "the router's CFS quota 2 cores -> 1 % of a core (cgroup v1 cpu.cfs_quota_us 400000 -> 2000 of 200000)".into(),
        notes: format!("{NOTES}; from the onset the router's CFS quota is cut to 1 % of a core"),
    };
    let dirs = cgroup::dirs_of_pid(Path::new("/proc"), pid, Path::new("/sys/fs/cgroup"));
    let url = format!("http://127.0.0.1:{port}");
    let out = run_with(
        &spec,
        (&url, &router_target(prom)),
        dirs,
        Some(pid),
        || cg.set("cpu.cfs_quota_us", "2000").unwrap(),
        |p| p.iter().any(|(_, t)| confirms(t, "router_overhead")),
    );
    drop(cg);
    drop(router);
    print_last(&out);
    let hit = report(&spec, &out, "router_overhead", |t| {
        confirms(t, "router_overhead")
    });
    let (at, t) = hit.expect("router_overhead not confirmed");
    assert!(*at <= 60.0, "router_overhead after {at:.0} s (> 60 s)");
    assert_eq!(t["scope"], "router", "{t:#}");
    let ev = evidence_line(t, "router_overhead");
    assert!(ev.contains("path_overhead"), "{ev}");
}

/// The second worker's CFS quota cut to 20 % of a core; the router still sends it half.
#[test]
fn live_worker_quota_behind_vllm_router() {
    if !super::super::enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let (w1, w2) = (model_server(), model_server());
    let dir = lmperf_e2e::temp::dir("diag-worker-quota");
    let (router, port, prom) = start_router(&[w1.url(), w2.url()], &dir.join("router.log"));
    let pid = server_pid(w2.port);
    let mut cg = V1Cgroup::create(CPU_V1, "worker");
    cg.set("cpu.cfs_period_us", "100000").unwrap();
    cg.set("cpu.cfs_quota_us", "200000").unwrap();
    cg.enter(pid, "cpu");
    let spec = Spec {
        name: "live-worker_out_of_rotation-vllm-router-slow-worker-1".into(),
        cause: "worker_out_of_rotation",
        second: None,
        magnitude:
            "one of two workers' CFS quota 2 cores -> 20 % of a core, still sent half the requests"
                .into(),
        notes: format!(
            "{NOTES}; from the onset the second worker's CFS quota is cut to 20 % of a core (its cgroup is not the router's: the agent reads the router's)"
        ),
    };
    let url = format!("http://127.0.0.1:{port}");
    let slow = format!("127.0.0.1:{}", w2.port);
    let out = run_with(
        &spec,
        (&url, &router_target(prom)),
        cgroup::CgroupDirs::default(),
        None,
        || cg.set("cpu.cfs_quota_us", "20000").unwrap(),
        |p| p.iter().any(|(_, t)| names_worker(t, &slow)),
    );
    drop(cg);
    drop(router);
    print_last(&out);
    let hit = report(&spec, &out, "worker_out_of_rotation", |t| {
        confirms(t, "worker_out_of_rotation") && names_worker(t, &slow)
    });
    let (at, _) = hit.expect("worker_out_of_rotation on the slow worker not confirmed");
    assert!(
        *at <= 60.0,
        "worker_out_of_rotation after {at:.0} s (> 60 s)"
    );
}

/// The second worker killed: vllm-router retries its requests on the other worker and drops
/// it, so the routed canaries never fail or slow down; the killed worker fails its direct
/// canaries (`failing_workers` 0 → 1). Nothing to page for: recorded as a control.
#[test]
fn live_worker_killed_behind_vllm_router() {
    if !super::super::enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let w1 = model_server();
    let w2 = std::sync::Mutex::new(Some(model_server()));
    let w2_port = w2.lock().unwrap().as_ref().map_or(0, |w| w.port);
    let dir = lmperf_e2e::temp::dir("diag-worker-killed");
    let workers = [w1.url(), format!("http://127.0.0.1:{w2_port}")];
    let (router, port, prom) = start_router(&workers, &dir.join("router.log"));
    let spec = Spec {
        name: "live-control-vllm-router-worker-killed-1".into(),
        cause: "",
        second: None,
        magnitude: "one of two workers killed; the router retries on the other".into(),
        notes: format!(
            "{NOTES}; at the onset the second worker is killed: vllm-router retries its requests on the other worker, the routed canaries see nothing"
        ),
    };
    let url = format!("http://127.0.0.1:{port}");
    let out = run_with(
        &spec,
        (&url, &router_target(prom)),
        cgroup::CgroupDirs::default(),
        None,
        || drop(w2.lock().unwrap().take()),
        |_| true,
    );
    drop(router);
    print_last(&out);
    let confirmed = out
        .polls
        .iter()
        .find(|(_, t)| t["state"] == "root_confirmed");
    assert!(
        confirmed.is_none(),
        "a fault the router absorbed was paged: {confirmed:?}"
    );
}

/// vllm-router's `consistent_hash` policy with background traffic (6 clients, short requests
/// with a mean 4 s pause between, each with a new `X-Session-ID`: spread over both workers,
/// about 1.3 requests/s), then every client's requests under one session key: all on the
/// worker it hashes to, the other idle but for the canaries (each with its own request id).
/// Seen with clients that paused in proportion to their service time: both workers already
/// saturated before the onset (1.3 s a request), the canaries' TTFT p99 1.5 → 1.9 s (no
/// symptom) though the picks went 1.16 → 1.63 × the fair share.
#[test]
fn live_session_pinning_behind_vllm_router() {
    if !super::super::enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let (w1, w2) = (model_server(), model_server());
    let dir = lmperf_e2e::temp::dir("diag-session-pinning");
    let (router, port, prom) = start_router_with(
        &[w1.url(), w2.url()],
        "consistent_hash",
        &dir.join("router.log"),
    );
    let hot = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let shape = super::super::background::Shape {
        words: (6, 30),
        tokens: (4, 12),
        hot: Some(hot.clone()),
        think_s: Some(4.0),
    };
    let background = super::super::background::Background::start_shaped(
        port,
        6,
        1.0,
        Duration::from_secs(600),
        shape,
    );
    let spec = Spec {
        name: "live-routing_imbalance-vllm-router-one-session-1".into(),
        cause: "routing_imbalance",
        second: None,
        magnitude: "6 background clients' requests from a new X-Session-ID each to one for all (consistent_hash)".into(),
        notes: format!(
            "{NOTES}; the router's policy consistent_hash, its page scraped every 5 s (10 picks or more an interval); 6 background clients (6-30 words, 4-12 tokens, exponential pauses of mean 4 s), each request with a new X-Session-ID; from the onset all with X-Session-ID tenant-hot"
        ),
    };
    let url = format!("http://127.0.0.1:{port}");
    let out = run_with(
        &spec,
        (&url, &router_target_every(prom, 5)),
        cgroup::CgroupDirs::default(),
        None,
        || hot.store(true, std::sync::atomic::Ordering::Relaxed),
        |p| p.iter().any(|(_, t)| confirms(t, "routing_imbalance")),
    );
    let (answered, mean_s) = background.answered();
    drop(background);
    drop(router);
    println!("  background: {answered} requests answered, {mean_s:.2} s each");
    print_last(&out);
    let hit = report(&spec, &out, "routing_imbalance", |t| {
        confirms(t, "routing_imbalance")
    });
    let (at, t) = hit.expect("routing_imbalance not confirmed");
    assert!(*at <= 60.0, "routing_imbalance after {at:.0} s (> 60 s)");
    let ev = evidence_line(t, "routing_imbalance");
    assert!(ev.contains("pick_imbalance"), "{ev}");
}

/// A calm run through vllm-router in front of two real servers: never diagnosed.
#[test]
fn live_calm_through_vllm_router_is_never_diagnosed() {
    let Some(secs) = super::calm_secs() else {
        return;
    };
    let _serial = lmperf_e2e::serial::lock_blocking();
    let (w1, w2) = (model_server(), model_server());
    let dir = lmperf_e2e::temp::dir("diag-router-calm");
    let (router, port, prom) = start_router(&[w1.url(), w2.url()], &dir.join("router.log"));
    let url = format!("http://127.0.0.1:{port}");
    let (confirmed, not_idle) =
        super::calm_through("calm-vllm-router", (&url, &router_target(prom)), secs);
    drop(router);
    println!(
        "diagnose-calm: {secs} s through vllm-router (two real llama.cpp servers): {not_idle} polls not idle, {confirmed} root_confirmed"
    );
    assert_eq!(confirmed, 0, "a calm run through vllm-router was diagnosed");
}

/// The last diagnosis polled: its line, scope and worker.
fn print_last(out: &Outcome) {
    if let Some((_, t)) = out.polls.last() {
        println!(
            "  last diagnosis: {} (scope {}, worker {})",
            t["summary"], t["scope"], t["worker"]
        );
    }
}
