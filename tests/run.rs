//! `lmperf run`: the seed command on the real model server, and the scheduler case
//! `../shared/cases/sse/07_vllm_54101_client_queueing.json` against a scripted server.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lmperf::bench::{Goodput, RunArrival, RunSpec};
use lmperf::config::{self, Env, Overrides, raw::RawCanary};
use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::peers::ModelServer;
use lmperf_e2e::scripted::{Frame, Reply, ScriptedServer};

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

/// numpy's default (linear) percentile, written independently of the daemon's.
fn np_percentile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let pos = q * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
}

#[tokio::test(flavor = "multi_thread")]
async fn case_07_vllm_54101_client_queueing() {
    let case = lmperf_e2e::case("sse/07_vllm_54101_client_queueing.json");
    let (input, want) = (&case["input"], &case["expected"]);
    let ttft = Duration::from_millis(input["server_ttft_ms"].as_u64().unwrap());
    let service = Duration::from_millis(input["server_service_ms"].as_u64().unwrap());
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        let tok = |t: Duration, text: &str, fin: &str| Frame { at: t, bytes: format!("data: {{\"choices\":[{{\"text\":\"{text}\",\"finish_reason\":{fin}}}]}}\n\n").into_bytes() };
        Reply::sse(vec![
            tok(ttft, "a", "null"),
            tok(ttft + (service - ttft) / 2, "b", "null"),
            tok(service, "c", "\"length\""),
            Frame { at: service, bytes: b"data: [DONE]\n\n".to_vec() },
        ])
    }))
    .await;
    let o = Overrides {
        targets: vec![server.url()],
        canary: RawCanary { model: Some("m".into()), api: Some("completions".into()), max_tokens: Some(3), ..RawCanary::default() },
        ..Overrides::default()
    };
    let target = config::load(o, &NoEnv).unwrap().targets.remove(0);
    let dir = std::env::temp_dir().join(format!("lmperf-case07-{}", std::process::id()));
    let n = input["num_requests"].as_u64().unwrap() as usize;
    let spec = RunSpec {
        target,
        concurrencies: vec![input["max_concurrency"].as_u64().unwrap() as usize],
        input_lengths: vec![8],
        output_len: 3,
        num_prompts: n,
        request_rate: Some(1000.0 / input["arrival_interval_ms"].as_f64().unwrap()),
        arrival: RunArrival::Constant,
        warmup: 0,
        duration: None,
        seed: 1,
        ignore_eos: false,
        goodput: Goodput::default(),
        fail_on: Vec::new(),
        output_dir: dir.clone(),
        progress: false,
    };
    lmperf::bench::run(spec).await.unwrap();
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("requests.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), n);
    let col = |k: &str| rows.iter().map(|r| r[k].as_f64().unwrap()).collect::<Vec<_>>();
    // A real server's 500 ms is 500 ms plus a millisecond or two of timer and loopback, and
    // with one slot each send waits for the previous end: allow 10 ms + 5 ms per request.
    let close = |got: &[f64], want: &serde_json::Value, what: &str| {
        let want: Vec<f64> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 10.0 + 5.0 * i as f64, "{what}: got {got:?}, want {want:?}");
        }
    };
    // The limiter dispatches each request as soon as the previous one ends.
    let (send, e2e) = (col("send_ms"), col("e2el_ms"));
    for i in 1..n {
        assert!((send[i] - (send[i - 1] + e2e[i - 1])).abs() <= 10.0, "send {i} at {} ms, previous ended at {} ms", send[i], send[i - 1] + e2e[i - 1]);
    }
    close(&col("send_ms"), &want["send_offsets_ms"], "send offsets");
    close(&col("dispatch_delay_ms"), &want["dispatch_delay_ms"], "dispatch delay");
    close(&col("e2el_from_schedule_ms"), &want["e2e_from_schedule_ms"], "E2E from schedule");
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    assert!((mean(col("e2el_ms")) - want["e2e_from_send_mean_ms"].as_f64().unwrap()).abs() <= 15.0);
    assert!((mean(col("e2el_from_schedule_ms")) - want["e2e_from_schedule_mean_ms"].as_f64().unwrap()).abs() <= 30.0);
    assert!((mean(col("ttft_from_schedule_ms")) - want["ttft_from_schedule_mean_ms"].as_f64().unwrap()).abs() <= 30.0);
    // Both views are in the summary too.
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let b = &summary["benchmarks"][0];
    assert!((b["e2el_from_schedule_ms"]["mean"].as_f64().unwrap() - 1900.0).abs() <= 30.0, "{b}");
    assert!((b["e2el_ms"]["mean"].as_f64().unwrap() - 500.0).abs() <= 15.0, "{b}");
    assert_eq!(summary["tokenizer"], "estimate", "no /tokenize on this server");
}

/// Acceptance 1: the seed command with small numbers against the real server: all outputs,
/// counts consistent, percentiles recomputable from requests.jsonl, a gate exits 3.
#[test]
fn seed_command_on_the_real_server() {
    let server = ModelServer::start();
    let dir = std::env::temp_dir().join(format!("lmperf-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(lmperf_bin())
        .args(["run", "--target", &server.url(), "--model", "gemma-3-270m", "--batch-sizes", "1", "2", "--seq-lengths", "64", "128", "--num-prompts", "20", "--output-len", "16"])
        .args(["--goodput", "ttft:2000", "e2el:5000", "--fail-on", "ttft_p99_ms>0.001", "--output-dir", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "the impossible gate trips: {stderr}");
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("requests.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(summary["schema_version"], 1);
    assert_eq!(summary["tokenizer"], "server_llama_cpp");
    assert_eq!(summary["failed_gates"][0], "ttft_p99_ms>0.001");
    let benches = summary["benchmarks"].as_array().unwrap();
    assert_eq!(benches.len(), 4, "1 2 × 64 128");
    let mut total = 0;
    for b in benches {
        let name = b["benchmark"].as_str().unwrap();
        let mine: Vec<&serde_json::Value> = rows.iter().filter(|r| r["benchmark"] == name).collect();
        assert_eq!(b["num_requests"].as_u64().unwrap() as usize, mine.len(), "{name}: summary count = requests.jsonl lines");
        assert_eq!(mine.len(), 20);
        let ok: Vec<&&serde_json::Value> = mine.iter().filter(|r| r["outcome"] == "ok").collect();
        assert_eq!(b["completed"].as_u64().unwrap() as usize, ok.len());
        assert_eq!(ok.len(), 20, "{name}: all requests ok");
        total += mine.len();
        for (metric, field) in [("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("e2el_ms", "e2el_ms")] {
            let v: Vec<f64> = ok.iter().filter_map(|r| r[field].as_f64()).collect();
            for (stat, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("min", 0.0), ("max", 1.0)] {
                let got = b[metric][stat].as_f64().unwrap();
                let want = np_percentile(&v, q);
                assert!((got - want).abs() < 1e-6, "{name} {metric} {stat}: summary {got}, recomputed {want}");
            }
        }
        let itl: Vec<f64> = ok.iter().flat_map(|r| r["itl_ms"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap())).collect();
        assert!((b["itl_ms"]["p99"].as_f64().unwrap() - np_percentile(&itl, 0.99)).abs() < 1e-6);
        // Token-exact prompts and enforced output length.
        let want_in = b["input_len"].as_u64().unwrap();
        assert!(mine.iter().all(|r| r["prompt_tokens"].as_u64() == Some(want_in)), "{name}: prompt lengths");
        assert!(mine.iter().all(|r| r["output_tokens"].as_u64() == Some(16)), "{name}: output lengths");
        assert!(b["goodput"].as_f64().unwrap() > 0.0);
        assert!(b["ttft_ms"]["p50"].as_f64().unwrap() < b["e2el_ms"]["p50"].as_f64().unwrap());
    }
    assert_eq!(total, rows.len());
}

#[test]
fn bad_flags_exit_2() {
    for args in [vec!["--request-rate", "fast"], vec!["--fail-on", "ttft_p98_ms>5"], vec!["--goodput", "latency:5"], vec!["--batch-sizes", "0"]] {
        let out = Command::new(lmperf_bin()).args(["run", "--target", "http://127.0.0.1:9", "--output-dir", "/tmp/x"]).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(args[0]) && err.trim_end().lines().count() == 1, "{args:?}: {err}");
    }
}
