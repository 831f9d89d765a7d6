//! Live serving-path episodes on the real NVIDIA Dynamo 1.6.1 (issue 53), `cargo xtask
//! diagnose-live --episode NAME`: the frontend's KV router in front of mocker workers on CPU
//! (`lmperf_e2e::dynamo`), the agent's router target on it (its page scraped each second,
//! pinned probes to each worker every 2 s), calm for `CALM_S`, then one fault, as a rolling
//! restart does it (the new worker started, then the old one stopped with SIGTERM: no moment
//! without one):
//!
//! - `pd_kv_transfer`: one prefill and one decode mocker at `--kv-transfer-bandwidth` 0.05
//!   GB/s; both replaced by ones at 0.005 GB/s (10 × lower). Replacing the decode worker alone
//!   changed nothing (seen: the transfer 9.2 → 9.5 ms, the TTFT 14.7 ms before and after):
//!   1.6.1's mocker paces the transfer on the prefill side. Expected: `kv_transfer`. Seen on
//!   2026-12-07: the transfer 10 → 66 ms, `kv_transfer` confirmed 10 s after the injection.
//!   Earlier it was named `worker_out_of_rotation` (the new prefill worker's probes 6 × the
//!   old one's while they overlapped, nearly all of it transfer: the probes now leave the
//!   router's transfer estimate out), then `error_burst` (the old worker SIGKILLed while the
//!   frontend still routed to it: it is now stopped with SIGTERM, as Kubernetes does).
//! - `agg_slow_worker`: two aggregated mockers at `--speedup-ratio` 10; one replaced by one at
//!   0.3 (33 × slower). Expected: `worker_out_of_rotation` on the slow worker (its pinned
//!   probes against the other's), when the router keeps sending it requests.
//! - `frontend_quota`: two aggregated mockers; the frontend's CFS quota cut from 2 cores to
//!   5 % of a core. Expected: `router_overhead` (scope router) from the routed canaries' time
//!   in the frontend before dispatch. At 1 % of a core the frontend was down, not slow (seen
//!   twice: "Model … is not ready" 503s, E2E p99 88 s, 62 % of the canaries skipped at
//!   `max_in_flight`: an outage, named `error_burst` and `cpu_throttling`). Pinned probes pass
//!   through the frontend: they are compared by the workers' own time (Dynamo's
//!   `prefill_time_ms`), not the client's TTFT (one worker's probes read 112 × the other's).

use std::path::Path;
use std::time::Duration;

use lmperf::node::cgroup;
use lmperf_e2e::dynamo::{Dynamo, start, wait_serving};
use serde_json::Value;

use super::{CPU_V1, Spec, V1Cgroup, confirms, evidence_line, report, run_with};

/// The router target on `d`: its model, its page each second, pinned probes every 2 s.
fn dynamo_target(d: &Dynamo) -> String {
    format!(
        "model = \"{}\"\nkind = \"router\"\nmetrics_interval = \"1s\"\nworker_probe_interval = \"2s\"\nworker_probe_max_rate = 4.0\n",
        d.model
    )
}

const NOTES: &str = "tests/diagnose_live/dynamo.rs: the agent's canaries (1/s, 4 tokens) through the real Dynamo 1.6.1 frontend (KV router) in front of mocker workers on CPU, its page scraped each second, pinned probes to each worker every 2 s";

/// Replaces mocker `i` of `d` by one of `mode` with `extra` arguments: the new one started
/// and serving, then the old one stopped as Kubernetes stops a pod (SIGTERM, SIGKILL after
/// 30 s). Killed at once (SIGKILL), the old worker stayed in the frontend's view for a few
/// seconds and every canary routed to it failed (seen: an error burst 6 s after).
fn replace(d: &mut Dynamo, i: usize, mode: &str, extra: &[&str]) {
    d.add_mocker_with(mode, 1, extra);
    std::thread::sleep(Duration::from_secs(8));
    wait_serving(d);
    d.stop_gracefully(i, Duration::from_secs(30));
}

/// A rolling restart: each `(mocker, mode, arguments)` of `steps` replaced in turn.
type Steps<'a> = &'a [(usize, &'a str, &'a [&'a str])];

/// The episode `spec` on `d`: calm, then the mockers of `steps` replaced ([`replace`]), polled
/// until `done`.
fn run_replacing(
    spec: &Spec,
    d: Dynamo,
    steps: Steps,
    done: impl Fn(&Value) -> bool,
) -> super::Outcome {
    let (url, target) = (d.url.clone(), dynamo_target(&d));
    let d = std::sync::Mutex::new(d);
    run_with(
        spec,
        (&url, &target),
        cgroup::CgroupDirs::default(),
        None,
        || {
            if let Ok(mut d) = d.lock() {
                for (i, mode, extra) in steps {
                    replace(&mut d, *i, mode, extra);
                }
            }
        },
        |p| p.iter().any(|(_, t)| done(t)),
    )
}

/// The workers of a P/D pair replaced by ones with a 10 × slower KV link.
#[test]
fn live_dynamo_pd_slower_kv_transfer() {
    if !super::super::enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let Some(mut d) = start("live-pd-kv", &[]) else {
        return;
    };
    d.add_mocker_with("prefill", 1, &["--kv-transfer-bandwidth", "0.05"]);
    d.add_mocker_with("decode", 1, &["--kv-transfer-bandwidth", "0.05"]);
    wait_serving(&d);
    let spec = Spec {
        name: "live-kv_transfer-dynamo-pd-bandwidth10x-1".into(),
        cause: "kv_transfer",
        second: None,
        magnitude: "both workers' --kv-transfer-bandwidth 0.05 -> 0.005 GB/s (a rolling restart)"
            .into(),
        notes: format!(
            "{NOTES}; one prefill and one decode mocker; at the onset each is replaced by one with a 10 x lower --kv-transfer-bandwidth"
        ),
    };
    let slow: &[&str] = &["--kv-transfer-bandwidth", "0.005"];
    let steps = [(0, "prefill", slow), (1, "decode", slow)];
    let out = run_replacing(&spec, d, &steps, |t| confirms(t, "kv_transfer"));
    let hit = report(&spec, &out, "kv_transfer", |t| confirms(t, "kv_transfer"));
    let (at, t) = hit.expect("kv_transfer not confirmed");
    assert!(*at <= 60.0, "kv_transfer after {at:.0} s (> 60 s)");
    let ev = evidence_line(t, "kv_transfer");
    assert!(ev.contains("kv_transfer"), "{ev}");
}

/// One of two aggregated workers replaced by one 33 × slower.
#[test]
fn live_dynamo_agg_slow_worker() {
    if !super::super::enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let Some(d) = start("live-agg-slow", &[("agg", 1), ("agg", 1)]) else {
        return;
    };
    let spec = Spec {
        name: "live-worker_out_of_rotation-dynamo-agg-slow-worker-1".into(),
        cause: "worker_out_of_rotation",
        second: None,
        magnitude: "one of two aggregated mockers' --speedup-ratio 10 -> 0.3 (a rolling restart)"
            .into(),
        notes: format!(
            "{NOTES}; two aggregated mockers; at the onset one is replaced by one with --speedup-ratio 0.3"
        ),
    };
    let steps: Steps = &[(1, "agg", &["--speedup-ratio", "0.3"])];
    let out = run_replacing(&spec, d, steps, |t| {
        confirms(t, "worker_out_of_rotation") && t["scope"] == "worker"
    });
    let hit = report(&spec, &out, "worker_out_of_rotation", |t| {
        confirms(t, "worker_out_of_rotation") && t["scope"] == "worker"
    });
    let (at, t) = hit.expect("worker_out_of_rotation not confirmed");
    println!("  the worker named: {}", t["worker"]);
    assert!(
        *at <= 60.0,
        "worker_out_of_rotation after {at:.0} s (> 60 s)"
    );
}

/// The frontend's CFS quota cut to 5 % of a core: every request waits for the frontend's CPU
/// (its HTTP, its tokenizer, its router), its two aggregated mockers as fast as before. (5 %
/// changed nothing at the canaries' rate: measured, 1.6.1's frontend needs less than that.)
#[test]
fn live_dynamo_frontend_quota() {
    if !super::super::enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let Some(d) = start("live-frontend-quota", &[("agg", 1), ("agg", 1)]) else {
        return;
    };
    let pid = d.frontend.pid;
    let mut cg = V1Cgroup::create(CPU_V1, "frontend");
    cg.set("cpu.cfs_period_us", "100000").unwrap();
    cg.set("cpu.cfs_quota_us", "200000").unwrap();
    cg.enter(pid, "cpu");
    let spec = Spec {
        name: "live-router_overhead-dynamo-frontend-quota5-1".into(),
        cause: "router_overhead",
        second: None,
        magnitude: "the frontend's CFS quota 2 cores -> 5 % of a core (cgroup v1 cpu.cfs_quota_us 200000 -> 5000 of 100000)".into(),
        notes: format!(
            "{NOTES}; two aggregated mockers; from the onset the frontend's CFS quota is cut to 5 % of a core"
        ),
    };
    let dirs = cgroup::dirs_of_pid(Path::new("/proc"), pid, Path::new("/sys/fs/cgroup"));
    let (url, target) = (d.url.clone(), dynamo_target(&d));
    let out = run_with(
        &spec,
        (&url, &target),
        dirs,
        Some(pid),
        || cg.set("cpu.cfs_quota_us", "5000").unwrap(),
        |p| p.iter().any(|(_, t)| confirms(t, "router_overhead")),
    );
    drop(cg);
    drop(d);
    let hit = report(&spec, &out, "router_overhead", |t| {
        confirms(t, "router_overhead")
    });
    let (at, t) = hit.expect("router_overhead not confirmed");
    assert!(*at <= 60.0, "router_overhead after {at:.0} s (> 60 s)");
    assert_eq!(t["scope"], "router", "{t:#}");
}

/// A calm run through Dynamo's frontend in front of two aggregated mockers: never diagnosed.
#[test]
fn live_calm_through_dynamo_is_never_diagnosed() {
    let Some(secs) = super::calm_secs() else {
        return;
    };
    let _serial = lmperf_e2e::serial::lock_blocking();
    let Some(d) = start("live-calm", &[("agg", 1), ("agg", 1)]) else {
        return;
    };
    let (confirmed, not_idle) =
        super::calm_through("calm-dynamo", (&d.url, &dynamo_target(&d)), secs);
    drop(d);
    println!(
        "diagnose-calm: {secs} s through Dynamo 1.6.1 (two aggregated mockers): {not_idle} polls not idle, {confirmed} root_confirmed"
    );
    assert_eq!(confirmed, 0, "a calm run through Dynamo was diagnosed");
}
