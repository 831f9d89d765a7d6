//! Live serving-path episodes on the real NVIDIA Dynamo 1.6.1 (issue 53), `cargo xtask
//! diagnose-live --episode NAME`: the frontend's KV router in front of mocker workers on CPU
//! (`lmperf_e2e::dynamo`), the agent's router target on it (its page scraped each second,
//! pinned probes to each worker every 2 s), calm for `CALM_S`, then one fault, as a rolling
//! restart does it (the new worker started, then the old one killed: no moment without one):
//!
//! - `pd_kv_transfer`: one prefill and one decode mocker at `--kv-transfer-bandwidth` 0.05
//!   GB/s; both replaced by ones at 0.005 GB/s (10 × lower). Replacing the decode worker alone
//!   changed nothing (seen: the transfer 9.2 → 9.5 ms, the TTFT 14.7 ms before and after):
//!   1.6.1's mocker paces the transfer on the prefill side. Expected: `kv_transfer`. Seen
//!   on 2026-12-07 (twice): the transfer 9.5 → 65 ms and the TTFT 15 → 73 ms, but the first
//!   confirmation named `worker_out_of_rotation` (the pinned probes' slowest worker 6 × the
//!   others' while the restart's old and new workers overlapped): a known miss, not recorded.
//! - `agg_slow_worker`: two aggregated mockers at `--speedup-ratio` 10; one replaced by one at
//!   0.3 (33 × slower). Expected: `worker_out_of_rotation` on the slow worker (its pinned
//!   probes against the other's), when the router keeps sending it requests.

use std::time::Duration;

use lmperf::node::cgroup;
use lmperf_e2e::dynamo::{Dynamo, start, wait_serving};
use serde_json::Value;

use super::{Spec, confirms, evidence_line, report, run_with};

/// The router target on `d`: its model, its page each second, pinned probes every 2 s.
fn dynamo_target(d: &Dynamo) -> String {
    format!(
        "model = \"{}\"\nkind = \"router\"\nmetrics_interval = \"1s\"\nworker_probe_interval = \"2s\"\nworker_probe_max_rate = 4.0\n",
        d.model
    )
}

const NOTES: &str = "tests/diagnose_live/dynamo.rs: the agent's canaries (1/s, 4 tokens) through the real Dynamo 1.6.1 frontend (KV router) in front of mocker workers on CPU, its page scraped each second, pinned probes to each worker every 2 s";

/// Replaces mocker `i` of `d` by one of `mode` with `extra` arguments: the new one started
/// and serving, then the old one killed.
fn replace(d: &mut Dynamo, i: usize, mode: &str, extra: &[&str]) {
    d.add_mocker_with(mode, 1, extra);
    std::thread::sleep(Duration::from_secs(8));
    wait_serving(d);
    let _ = d.children[i].kill();
    let _ = d.children[i].wait();
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
