//! `lmperf run --find-max-rate` with default flags (no start rate: a throughput probe sets the
//! bracket) against a server of known capacity: 8 at a time × 100 ms = 80 req/s. The search
//! answers within its own rules' bounds (max rate 70 % to cap / 0.95, knee 75–110 % of the
//! capacity as served) in a few steps, each still as long as the p99 rule asks (473 requests: ~6 s each).

use std::process::Command;
use std::time::{Duration, Instant};

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::serial;
use lmperf_e2e::slot_server::k_slot_server;
use lmperf_e2e::temp;
use serde_json::Value;

/// Requests the scripted server serves at a time (each held 100 ms).
const SLOTS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_search_answers_fast_from_a_throughput_probe() {
    // Its rates are held by this machine's CPUs: one timing test at a time.
    let _serial = serial::lock().await;
    let (url, held) = k_slot_server(SLOTS, Duration::from_millis(100)).await;
    let dir = temp::dir("capacity-fast");
    let d = dir.clone();
    let (wall, err) = tokio::task::spawn_blocking(move || {
        let t0 = Instant::now();
        let out = Command::new(lmperf_bin())
            .args(["run", "--output-dir", d.to_str().unwrap()])
            .args(["--target", &url, "--model", "m"])
            .args(["--find-max-rate", "--slo", "ttft_p99:400ms"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        (t0.elapsed(), err)
    })
    .await
    .unwrap();
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let c = &s["capacity"];
    let held = held.lock().unwrap().clone();
    let cap =
        SLOTS as f64 / (held.iter().map(Duration::as_secs_f64).sum::<f64>() / held.len() as f64);
    let benches = s["benchmarks"].as_array().unwrap();
    // The search's own duration: its benchmarks' measured spans (the scripted server's pace,
    // not this loaded machine's process start-up).
    let measured_s: f64 = benches
        .iter()
        .map(|b| b["duration_s"].as_f64().unwrap())
        .sum();
    let steps = c["steps"].as_array().unwrap();
    let (max, knee) = (
        c["max_rate"].as_f64().unwrap(),
        c["knee_rate"].as_f64().unwrap(),
    );
    let probe = c["probe_rate"].as_f64().unwrap();
    println!(
        "capacity search (defaults): max_rate {max:.2} req/s, knee {knee:.2} req/s, probe {probe:.2} req/s, capacity as served {cap:.2} req/s; {} steps + probe, measured {measured_s:.1} s, wall {:.1} s\n{err}",
        steps.len(),
        wall.as_secs_f64()
    );
    // The search's own rules bound its answer: a step passes only when completions kept up
    // with the rate sent (within 1 − precision, 5 %), and counts at the rate sent when a
    // Poisson draw or a loaded sender came short of the offered one; so no answer lies above
    // cap / 0.95 (1 % beside for the capacity's own estimate from held times).
    assert!(
        (0.70 * cap..=cap / 0.95 * 1.01).contains(&max),
        "max_rate {max} for a capacity of {cap}: {c}"
    );
    for step in steps {
        let tested = step["tested_rate"].as_f64().unwrap();
        assert!(tested <= step["offered_rate"].as_f64().unwrap(), "{step}");
        if let Some(sent) = step["sent_rate"].as_f64() {
            assert!(tested <= sent, "{step}");
        }
    }
    assert!(
        (0.75 * cap..=1.10 * cap).contains(&knee),
        "knee {knee} for a capacity of {cap}: {c}"
    );
    assert!(measured_s <= 180.0, "search took {measured_s} s");
    // The probe measured the capacity as served (closed loop, all due at once).
    assert!((probe - cap).abs() <= 0.1 * cap, "probe {probe} vs {cap}");
    // The probe is one benchmark, then one per step; every step keeps the p99 rule's length.
    assert_eq!(benches.len(), steps.len() + 1);
    assert!(
        benches[0]["benchmark"]
            .as_str()
            .unwrap()
            .starts_with("probe_c")
    );
    assert!(steps.iter().all(|s| s["requests"] == 473), "{c}");
    assert_eq!(c["step_requests"], 473);
    assert_eq!(c["stopped"], "precision");
    // No doubling from 1 req/s: every step is within the probe's bracket.
    assert!(
        steps
            .iter()
            .all(|s| s["offered_rate"].as_f64().unwrap() >= 0.5 * probe),
        "{c}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
