//! `lmperf run --find-max-rate`: against a server of known capacity (k requests at a time,
//! fixed service time: max rate = k / service time) the search lands within the asked
//! precision; against the real llama.cpp server it finishes with a consistent capacity block.

use std::process::Command;
use std::time::Duration;

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::peers::shared_model_server;
use lmperf_e2e::serial;
use lmperf_e2e::slot_server::k_slot_server;
use lmperf_e2e::temp;
use serde_json::Value;

fn run(args: &[&str]) -> (Value, String) {
    let dir = temp::dir("capacity");
    let out = Command::new(lmperf_bin())
        .args(["run", "--output-dir", dir.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        html.contains("<h2>Capacity search</h2>") && html.contains("vs offered rate"),
        "report plot"
    );
    (s, err)
}

/// Known capacity: 8 at a time × 100 ms = 80 req/s nominal; the capacity as served is
/// k / (mean slot hold time), the timer adding ~1 ms to each. The search (p99 rule: 473
/// requests a step, constant arrivals) lands at most 5 % above it and at most 15 % below
/// (within 5 % on an idle machine; on a loaded one the client's timer wakes late, the
/// arrivals bunch, and a step a few % under capacity queues past the 40 ms bound: seen in CI,
/// 73.4 req/s failing for 78.9 served, found 70.25, −11 %), the knee is near it, and every
/// passing step is below every failing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_the_known_capacity_within_the_precision() {
    let _serial = serial::lock().await;
    let (url, held) = k_slot_server(8, Duration::from_millis(100)).await;
    let (s, err) = tokio::task::spawn_blocking(move || {
        run(&[
            "--target",
            &url,
            "--model",
            "m",
            "--seq-lengths",
            "8",
            "--output-len",
            "4",
            "--arrival",
            "constant",
            "--request-rate",
            "40",
            "--find-max-rate",
            "--slo",
            "ttft_p99:40ms",
            "--precision",
            "5%",
        ])
    })
    .await
    .unwrap();
    let c = &s["capacity"];
    let max = c["max_rate"].as_f64().unwrap();
    let held = held.lock().unwrap().clone();
    let service_s = held.iter().map(Duration::as_secs_f64).sum::<f64>() / held.len() as f64;
    let cap = 8.0 / service_s;
    println!(
        "capacity search: found {max:.2} req/s for a known {cap:.2} req/s (8 / {:.2} ms) ({:+.2} %), {} steps; knee {}; {err}",
        service_s * 1000.0,
        (max / cap - 1.0) * 100.0,
        c["steps"].as_array().unwrap().len(),
        c["knee_rate"]
    );
    assert!(
        (0.85 * cap..=1.05 * cap).contains(&max),
        "found {max} req/s, capacity {cap}: {c}"
    );
    assert_eq!(c["stopped"], "precision");
    assert_eq!(c["step_requests"], 473);
    let steps = c["steps"].as_array().unwrap();
    let passing: Vec<f64> = steps
        .iter()
        .filter(|s| s["passed"] == true)
        .map(|s| s["offered_rate"].as_f64().unwrap())
        .collect();
    let failing: Vec<f64> = steps
        .iter()
        .filter(|s| s["passed"] == false)
        .map(|s| s["offered_rate"].as_f64().unwrap())
        .collect();
    assert!(
        passing.iter().all(|p| failing.iter().all(|f| p < f)),
        "monotone: {passing:?} {failing:?}"
    );
    let knee = c["knee_rate"].as_f64().unwrap();
    assert!(
        knee > cap * 0.9 && knee <= c["failing_rate"].as_f64().unwrap() * 2.0,
        "knee {knee}"
    );
    assert_eq!(
        s["benchmarks"].as_array().unwrap().len(),
        steps.len(),
        "one benchmark per step"
    );
    assert!(steps.iter().all(|s| s["requests"] == 473));
}

/// The real llama.cpp server (a smoke test: its speed depends on the machine's load, so the
/// answer is not known in advance): 8 requests a step (`--step-requests`), a 10 s p90 TTFT
/// SLO. Every verdict matches its step's figures, passes lie below failures, and the search
/// ends at the precision or with no passing rate.
#[test]
fn finds_a_max_rate_on_the_real_server() {
    let _serial = serial::lock_blocking();
    let server = shared_model_server();
    let url = server.url();
    let (s, err) = run(&[
        "--target",
        &url,
        "--model",
        "gemma-3-270m",
        "--seq-lengths",
        "16",
        "--output-len",
        "4",
        "--request-rate",
        "4",
        "--find-max-rate",
        "--slo",
        "ttft_p90:10s",
        "--precision",
        "50%",
        "--step-requests",
        "8",
    ]);
    let c = &s["capacity"];
    println!("real server: {err}");
    assert_eq!(c["step_requests"], 8);
    let steps = c["steps"].as_array().unwrap();
    for st in steps {
        let bound = st["slos"][0]["upper_bound_ms"].as_f64().unwrap();
        let kept_up =
            st["achieved_rate"].as_f64().unwrap() >= 0.9 * st["offered_rate"].as_f64().unwrap();
        assert_eq!(
            st["passed"],
            bound <= 10_000.0 && kept_up && st["failed"] == 0,
            "{st}"
        );
    }
    let rate = |p: bool| {
        steps
            .iter()
            .filter(|s| s["passed"] == p)
            .map(|s| s["offered_rate"].as_f64().unwrap())
            .collect::<Vec<f64>>()
    };
    let (pass, fail) = (rate(true), rate(false));
    assert!(
        pass.iter().all(|p| fail.iter().all(|f| p < f)),
        "{pass:?} {fail:?}"
    );
    match c["stopped"].as_str().unwrap() {
        "precision" => {
            let (max, first_fail) = (
                c["max_rate"].as_f64().unwrap(),
                c["failing_rate"].as_f64().unwrap(),
            );
            assert!(
                max < first_fail && (first_fail - max) / max <= 0.5 + 1e-9,
                "{c}"
            );
        }
        "no_rate_passes" => assert!(c["max_rate"].is_null()),
        other => panic!("stopped: {other}: {c}"),
    }
}
