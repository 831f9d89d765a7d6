//! `lmperf run`: the seed command on the real model server, and the scheduler case
//! `../shared/cases/sse/07_vllm_54101_client_queueing.json` against a scripted server.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lmperf::bench::{RunArrival, RunSpec};
use lmperf::config::{self, Env, Overrides, raw::RawCanary};
use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::np_percentile;
use lmperf_e2e::peers::shared_model_server;
use lmperf_e2e::scripted::{Frame, Reply, ScriptedServer};
use lmperf_e2e::serial;
use lmperf_e2e::temp;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

/// A `/v1/completions` target at `url` for model `m`, `max_tokens` per request.
fn completions_target(url: &str, max_tokens: u32) -> lmperf::config::TargetConfig {
    let o = Overrides {
        targets: vec![url.to_owned()],
        canary: RawCanary {
            model: Some("m".into()),
            api: Some("completions".into()),
            max_tokens: Some(max_tokens),
            ..RawCanary::default()
        },
        ..Overrides::default()
    };
    config::load(o, &NoEnv).unwrap().targets.remove(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn case_07_vllm_54101_client_queueing() {
    let _serial = serial::lock().await;
    let case = lmperf_e2e::case("sse/07_vllm_54101_client_queueing.json");
    let (input, want) = (&case["input"], &case["expected"]);
    let ttft = Duration::from_millis(input["server_ttft_ms"].as_u64().unwrap());
    let service = Duration::from_millis(input["server_service_ms"].as_u64().unwrap());
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        let tok = |t: Duration, text: &str, fin: &str| Frame {
            at: t,
            bytes: format!(
                "data: {{\"choices\":[{{\"text\":\"{text}\",\"finish_reason\":{fin}}}]}}\n\n"
            )
            .into_bytes(),
        };
        Reply::sse(vec![
            tok(ttft, "a", "null"),
            tok(ttft + (service - ttft) / 2, "b", "null"),
            tok(service, "c", "\"length\""),
            Frame {
                at: service,
                bytes: b"data: [DONE]\n\n".to_vec(),
            },
        ])
    }))
    .await;
    let target = completions_target(&server.url(), 3);
    let dir = temp::dir("case07");
    let n = input["num_requests"].as_u64().unwrap() as usize;
    let spec = RunSpec {
        concurrencies: vec![input["max_concurrency"].as_u64().unwrap() as usize],
        input_lengths: vec![8],
        output_len: 3,
        num_prompts: n,
        request_rate: Some(1000.0 / input["arrival_interval_ms"].as_f64().unwrap()),
        arrival: RunArrival::Constant,
        seed: 1,
        ignore_eos: false,
        ..RunSpec::new(target, dir.clone())
    };
    lmperf::bench::run(spec).await.unwrap();
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), n);
    let col = |k: &str| {
        rows.iter()
            .map(|r| r[k].as_f64().unwrap())
            .collect::<Vec<_>>()
    };
    let want_col = |k: &str| -> Vec<f64> {
        want[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    // Load-proof: what the limiter guarantees, checked as relations between the columns and
    // against the server's own clock; the case's offsets (an ideal machine where each request
    // takes exactly 500 ms) are lower bounds, since a late wake-up only adds.
    const ROUNDING_MS: f64 = 1e-3;
    let (scheduled, send, delay) = (
        col("scheduled_ms"),
        col("send_ms"),
        col("dispatch_delay_ms"),
    );
    let (e2e, e2e_sched) = (col("e2el_ms"), col("e2el_from_schedule_ms"));
    let (first, first_sched) = (col("ttft_ms"), col("ttft_from_schedule_ms"));
    let interval = input["arrival_interval_ms"].as_f64().unwrap();
    for i in 0..n {
        // The schedule is the case's constant arrivals, whatever the machine's load.
        assert!(
            (scheduled[i] - i as f64 * interval).abs() <= ROUNDING_MS,
            "scheduled {scheduled:?}"
        );
        // Each view is the other plus the wait for the slot.
        assert!(
            (delay[i] - (send[i] - scheduled[i])).abs() <= ROUNDING_MS,
            "{:?}",
            rows[i]
        );
        assert!(
            (e2e_sched[i] - (e2e[i] + delay[i])).abs() <= ROUNDING_MS,
            "{:?}",
            rows[i]
        );
        assert!(
            (first_sched[i] - (first[i] + delay[i])).abs() <= ROUNDING_MS,
            "{:?}",
            rows[i]
        );
        // No request ends before the server's 500 ms (nor its first token before 100 ms).
        assert!(
            e2e[i] >= service.as_secs_f64() * 1e3 - ROUNDING_MS,
            "E2E {e2e:?}"
        );
        assert!(
            first[i] >= ttft.as_secs_f64() * 1e3 - ROUNDING_MS,
            "TTFT {first:?}"
        );
    }
    // One slot: a send never before the previous end, and as soon as it: within 40 ms, far
    // below the 500 ms steps (the gaps seen on 2 cores beside a CPU hog: a few ms).
    let mut worst_gap: f64 = 0.0;
    for i in 1..n {
        let gap = send[i] - (send[i - 1] + e2e[i - 1]);
        worst_gap = worst_gap.max(gap);
        assert!(
            (-ROUNDING_MS..=40.0).contains(&gap),
            "send {i} at {} ms, previous ended at {} ms",
            send[i],
            send[i - 1] + e2e[i - 1]
        );
    }
    println!("case 07: the longest wait from a request's end to the next send {worst_gap:.1} ms");
    // The server's own clock: it never held two requests at once (each arrived after the
    // previous reply's last write).
    // (The benchmark's requests are the last n completions: the warm-up comes first.)
    let got: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/completions")
        .collect();
    assert!(got.len() >= n, "{} completions on the server", got.len());
    let got = &got[got.len() - n..];
    for w in got.windows(2) {
        let last_write = w[0].written.lock().unwrap().last().map(|x| x.1).unwrap();
        assert!(
            w[1].arrived >= last_write,
            "two requests at once on the server"
        );
    }
    // The case's values are what an unloaded machine gives: lower bounds here.
    let at_least = |got: &[f64], want: Vec<f64>, what: &str| {
        assert_eq!(got.len(), want.len());
        assert!(
            got.iter().zip(&want).all(|(g, w)| *g >= w - ROUNDING_MS),
            "{what}: got {got:?}, want at least {want:?}"
        );
    };
    at_least(&send, want_col("send_offsets_ms"), "send offsets");
    at_least(&delay, want_col("dispatch_delay_ms"), "dispatch delay");
    at_least(
        &e2e_sched,
        want_col("e2e_from_schedule_ms"),
        "E2E from schedule",
    );
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    assert!(mean(&e2e) >= want["e2e_from_send_mean_ms"].as_f64().unwrap() - ROUNDING_MS);
    assert!(mean(&e2e_sched) >= want["e2e_from_schedule_mean_ms"].as_f64().unwrap() - ROUNDING_MS);
    assert!(
        mean(&first_sched) >= want["ttft_from_schedule_mean_ms"].as_f64().unwrap() - ROUNDING_MS
    );
    // Both views are in the summary too.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let b = &summary["benchmarks"][0];
    for (key, rows_mean) in [
        ("e2el_from_schedule_ms", mean(&e2e_sched)),
        ("e2el_ms", mean(&e2e)),
        ("ttft_from_schedule_ms", mean(&first_sched)),
    ] {
        let got = b[key]["mean"]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} in {b}"));
        assert!(
            (got - rows_mean).abs() <= 1e-6 * rows_mean,
            "{key}: {got} vs the rows' {rows_mean}"
        );
    }
    assert_eq!(
        summary["tokenizer"], "estimate",
        "no /tokenize on this server"
    );
}

/// Acceptance 1: the seed command with small numbers against the real server: all outputs,
/// counts consistent, percentiles recomputable from requests.jsonl, a gate exits 3.
#[test]
fn seed_command_on_the_real_server() {
    let _serial = serial::lock_blocking();
    let server = shared_model_server();
    let dir = temp::dir("run");
    let out = Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            &server.url(),
            "--model",
            "gemma-3-270m",
            "--batch-sizes",
            "1",
            "2",
            "--seq-lengths",
            "64",
            "128",
            "--num-prompts",
            "8",
            "--output-len",
            "8",
        ])
        .args([
            // Bounds a loaded 2-core machine keeps (under a load average of 9, TTFTs of the
            // real server reach seconds): goodput must be computed, not near its edge.
            "--goodput",
            "ttft:20000",
            "e2el:60000",
            "--fail-on",
            "ttft_p99_ms>0.001",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "the impossible gate trips: {stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(summary["schema_version"], 1);
    assert_eq!(summary["tokenizer"], "server_llama_cpp");
    assert_eq!(summary["failed_gates"][0], "ttft_p99_ms>0.001");
    let benches = summary["benchmarks"].as_array().unwrap();
    assert_eq!(benches.len(), 4, "1 2 × 64 128");
    let mut total = 0;
    for b in benches {
        let name = b["benchmark"].as_str().unwrap();
        let mine: Vec<&serde_json::Value> =
            rows.iter().filter(|r| r["benchmark"] == name).collect();
        assert_eq!(
            b["num_requests"].as_u64().unwrap() as usize,
            mine.len(),
            "{name}: summary count = requests.jsonl lines"
        );
        assert_eq!(mine.len(), 8);
        let ok: Vec<&&serde_json::Value> = mine.iter().filter(|r| r["outcome"] == "ok").collect();
        assert_eq!(b["completed"].as_u64().unwrap() as usize, ok.len());
        assert_eq!(ok.len(), 8, "{name}: all requests ok");
        total += mine.len();
        for (metric, field) in [
            ("ttft_ms", "ttft_ms"),
            ("tpot_ms", "tpot_ms"),
            ("e2el_ms", "e2el_ms"),
        ] {
            let v: Vec<f64> = ok.iter().filter_map(|r| r[field].as_f64()).collect();
            for (stat, q) in [
                ("p50", 0.5),
                ("p90", 0.9),
                ("p99", 0.99),
                ("min", 0.0),
                ("max", 1.0),
            ] {
                let got = b[metric][stat].as_f64().unwrap();
                let want = np_percentile(&v, q);
                // Summary percentiles: HDR histograms at 3 significant digits (min, max exact).
                assert!(
                    (got - want).abs() <= 1e-3 * want.abs() + 1e-6,
                    "{name} {metric} {stat}: summary {got}, recomputed {want}"
                );
            }
        }
        let itl: Vec<f64> = ok
            .iter()
            .flat_map(|r| {
                r["itl_ms"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
            })
            .collect();
        let itl_p99 = np_percentile(&itl, 0.99);
        assert!((b["itl_ms"]["p99"].as_f64().unwrap() - itl_p99).abs() <= 1e-3 * itl_p99 + 1e-6);
        // Token-exact prompts and enforced output length.
        let want_in = b["input_len"].as_u64().unwrap();
        assert!(
            mine.iter()
                .all(|r| r["prompt_tokens"].as_u64() == Some(want_in)),
            "{name}: prompt lengths"
        );
        assert!(
            mine.iter().all(|r| r["output_tokens"].as_u64() == Some(8)),
            "{name}: output lengths"
        );
        assert!(b["goodput"].as_f64().unwrap() > 0.0);
        assert!(b["ttft_ms"]["p50"].as_f64().unwrap() < b["e2el_ms"]["p50"].as_f64().unwrap());
    }
    assert_eq!(total, rows.len());

    // report.html: self-contained, and its heatmap holds summary.json's values.
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    for fetch in [
        "<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import",
    ] {
        assert!(
            !html.contains(fetch),
            "report.html must fetch nothing: found {fetch}"
        );
    }
    for b in benches {
        assert!(html.contains(&format!("<td>{}</td>", b["benchmark"].as_str().unwrap())));
    }
    // Each benchmark's requests fill one length bucket of its concurrency's heatmap (exact
    // prompt lengths 64 → [64,128), 128 → [128,256); 8 output tokens → [8,16)), so that cell's
    // p99 TTFT is the benchmark's.
    for b in benches {
        let name = b["benchmark"].as_str().unwrap();
        let input = if b["input_len"] == 64 {
            "[64,128)"
        } else {
            "[128,256)"
        };
        let attr = format!(
            r#"data-metric="ttft_p99" data-concurrency="{}" data-input="{input}" data-output="[8,16)" data-count="8" data-value=""#,
            b["concurrency"]
        );
        let at = html
            .find(&attr)
            .unwrap_or_else(|| panic!("no heatmap cell for {name}: {attr}"));
        let rest = &html[at + attr.len()..];
        let value: f64 = rest[..rest.find('"').unwrap()].parse().unwrap();
        // The heatmap's cells are exact (from the rows); summary.json's percentiles are within
        // 3 significant digits of them.
        let want = b["ttft_ms"]["p99"].as_f64().unwrap();
        assert!(
            (value - want).abs() <= 1e-3 * want,
            "{name}: heatmap p99 TTFT {value} = summary.json {want}"
        );
    }
    assert!(
        html.contains("SLO compliance") && html.contains("(pass)"),
        "the e2el:60000 SLO passes"
    );
}

#[test]
fn bad_flags_exit_2() {
    for args in [
        vec!["--request-rate", "fast"],
        vec!["--fail-on", "ttft_p98_ms>5"],
        vec!["--goodput", "latency:5"],
        vec!["--batch-sizes", "0"],
        vec!["--repeat", "0"],
        vec!["--otlp-endpoint", "ftp://127.0.0.1:4317"],
    ] {
        let out = Command::new(lmperf_bin())
            .args([
                "run",
                "--target",
                "http://127.0.0.1:9",
                "--output-dir",
                "/tmp/x",
            ])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(args[0]) && err.trim_end().lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

/// Acceptance 2 of issue 3: a run at a Poisson rate of 200 req/s against a fast scripted
/// server achieves 198–202 req/s, a Kolmogorov–Smirnov test does not reject, at 1 %, that the
/// gaps are exponential with rate 200, and the sends follow the schedule.
///
/// 20 s (4,000 arrivals) in CI, where it holds the serial lock; `LMPERF_POISSON_SECONDS=60`
/// runs the issue's 60 s (12,000). What 20 s keeps: the schedule is seeded (seed 7), so its
/// realized rate is one fixed number (199.99 req/s over the first 4,000 gaps) and the 198–202
/// band is as tight as at 60 s: it fails for a client that lags its schedule by 1 % over the
/// run (0.2 s) or a rate error of 1 %. The KS test's critical value at 1 % is 0.0257 with 3,999
/// gaps (0.0149 with 11,999): simulated, it rejects exponential gaps of a wrong rate with
/// power 0.91 at 8 % off and 0.995 at 10 % (at 60 s: 0.96 at 5 %), and any non-exponential
/// shape of the same mean whose D exceeds 0.026 (constant gaps: D ≈ 0.37).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poisson_200_per_second() {
    let _serial = serial::lock().await;
    let seconds: usize = std::env::var("LMPERF_POISSON_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let rate = 200.0;
    let server = ScriptedServer::start(Arc::new(|req, _| {
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        Reply::sse(vec![Frame { at: Duration::ZERO, bytes: b"data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n".to_vec() }])
    }))
    .await;
    let target = completions_target(&server.url(), 1);
    let dir = temp::dir("poisson");
    let n = seconds * rate as usize;
    let spec = RunSpec {
        concurrencies: vec![256],
        input_lengths: vec![4],
        output_len: 1,
        num_prompts: n,
        request_rate: Some(rate),
        seed: 7,
        ignore_eos: false,
        ..RunSpec::new(target, dir.clone())
    };
    let summary = lmperf::bench::run(spec).await.unwrap();
    assert_eq!(
        summary.benchmarks[0].completed, n,
        "every request ok: {:?}",
        summary.benchmarks[0].errors
    );
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut sends: Vec<f64> = rows
        .iter()
        .map(|r| r["send_ms"].as_f64().unwrap() / 1000.0)
        .collect();
    sends.sort_by(f64::total_cmp);
    let achieved = (n - 1) as f64 / (sends[n - 1] - sends[0]);
    assert!(
        (198.0..=202.0).contains(&achieved),
        "achieved {achieved:.2} req/s"
    );
    // KS: D = sup |F_n(x) − (1 − e^(−λx))| over the gaps; critical value at 1 %: 1.628/√m.
    // On the schedule, which must not be rejected; on the actual sends it is reported, since
    // the client's own dispatch time (~0.1 ms in a debug build) stretches the tiniest gaps.
    let ks = |times: &[f64]| {
        let mut gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort_by(f64::total_cmp);
        let m = gaps.len() as f64;
        let d = gaps
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let f = 1.0 - (-rate * x).exp();
                (f - i as f64 / m).abs().max(((i + 1) as f64 / m - f).abs())
            })
            .fold(0.0, f64::max);
        (d, 1.628 / m.sqrt())
    };
    let mut scheduled: Vec<f64> = rows
        .iter()
        .map(|r| r["scheduled_ms"].as_f64().unwrap() / 1000.0)
        .collect();
    scheduled.sort_by(f64::total_cmp);
    let (d, critical) = ks(&scheduled);
    assert!(
        d < critical,
        "KS D = {d:.5} ≥ {critical:.5}: scheduled gaps are not exponential at rate {rate}"
    );
    let (d_sent, _) = ks(&sends);
    // The sends follow the schedule: on an idle machine every request leaves within a couple
    // of milliseconds (printed below); CI runs other e2e tests on the same 2 cores beside this
    // one, where a wake-up can be 3-25 ms late, so the bound is what busy cores keep (a client
    // that fell behind its 5 ms mean gap would lag by seconds).
    let lag = summary.benchmarks[0]
        .dispatch_delay_ms
        .as_ref()
        .map_or(f64::NAN, |d| d.p99);
    assert!(lag < 30.0, "dispatch delay p99 {lag:.3} ms");
    println!(
        "poisson {rate}/s for {seconds} s: achieved {achieved:.2} req/s, KS D schedule {d:.5} / sends {d_sent:.5} (critical {critical:.5})"
    );
    println!("dispatch delay p99 {lag:.3} ms");
}

/// Issue 4's `lmperf run` parts: peak VRAM per benchmark, VRAM efficiency, and the
/// `--fail-on vram_pct>92` gate, with a scripted NVML whose second GPU fills up while the
/// second benchmark (concurrency 2) runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peak_vram_per_benchmark_and_the_vram_gate() {
    use lmperf::bench::vram::GpuSource;
    use lmperf::gpu::fake::FakeHandle;
    let fake = FakeHandle::with_gpus(2);
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let script_fake = fake.clone();
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        // The server "allocates" more KV cache once it is asked for the second benchmark's
        // prompts (every request after the 10th).
        if in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 10 {
            script_fake.lock().devices[1].memory.used = 133 << 30;
        }
        let tok = |t: u64, fin: &str| Frame {
            at: Duration::from_millis(t),
            bytes: format!(
                "data: {{\"choices\":[{{\"text\":\"a\",\"finish_reason\":{fin}}}]}}\n\n"
            )
            .into_bytes(),
        };
        Reply::sse(vec![
            tok(20, "null"),
            tok(60, "null"),
            tok(100, "\"length\""),
            Frame {
                at: Duration::from_millis(100),
                bytes: b"data: [DONE]\n\n".to_vec(),
            },
        ])
    }))
    .await;
    let target = completions_target(&server.url(), 3);
    let dir = temp::dir("vram");
    let spec = RunSpec {
        concurrencies: vec![1, 2],
        input_lengths: vec![8],
        output_len: 3,
        num_prompts: 10,
        seed: 3,
        ignore_eos: false,
        fail_on: vec![lmperf::bench::parse_gate("vram_pct>92").unwrap()],
        gpu: GpuSource::Fake(fake.clone()),
        ..RunSpec::new(target, dir.clone())
    };
    let summary = lmperf::bench::run(spec).await.unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(json["gpu"]["mode"], "on", "{}", json["gpu"]);
    let (b1, b2) = (
        &json["benchmarks"][0]["vram"],
        &json["benchmarks"][1]["vram"],
    );
    let gib = |g: u64| (g << 30) as f64;
    // Benchmark 1: both GPUs at the fake's 71 GiB of 141 GiB.
    assert_eq!(
        b1["peak_used_bytes"].as_f64().unwrap(),
        gib(71) * 2.0,
        "{b1}"
    );
    assert_eq!(b1["total_bytes"].as_f64().unwrap(), gib(141) * 2.0);
    assert!(
        (b1["peak_used_pct"].as_f64().unwrap() - 71.0 / 141.0 * 100.0).abs() < 1e-6,
        "{b1}"
    );
    // Benchmark 2: GPU 1 at 133 GiB = 94.3 %.
    assert_eq!(
        b2["peak_used_bytes"].as_f64().unwrap(),
        gib(71) + gib(133),
        "{b2}"
    );
    assert!(
        (b2["peak_used_pct"].as_f64().unwrap() - 133.0 / 141.0 * 100.0).abs() < 1e-6,
        "{b2}"
    );
    for (b, v) in summary.benchmarks.iter().zip([b1, b2]) {
        let want = b.output_token_throughput / (v["peak_used_bytes"].as_f64().unwrap() / 1e9);
        assert!(
            (v["efficiency_tok_s_per_gb"].as_f64().unwrap() - want).abs() < 1e-9 * want,
            "{v}"
        );
        assert!(v["samples"].as_u64().unwrap() >= 1);
    }
    // The gate trips on the second benchmark only, and says so.
    assert_eq!(summary.failed_gates, vec!["vram_pct>92".to_owned()]);
}

/// Every request refused by the server (llama.cpp's context error): the terminal line and
/// the report name the server's type and message, and the empty latency section says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_error_reason_reaches_the_terminal_and_the_report() {
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        Reply::json(400, r#"{"error":{"code":400,"message":"request (3001 tokens) exceeds the available context size (2048 tokens)","type":"exceed_context_size_error"}}"#)
    }))
    .await;
    let dir = temp::dir("run-reason");
    let url = server.url();
    let d = dir.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(lmperf_bin())
            .args([
                "run",
                "--target",
                &url,
                "--model",
                "m",
                "--api",
                "completions",
                "--seq-lengths",
                "8",
            ])
            .args([
                "--num-prompts",
                "3",
                "--warmup",
                "0",
                "--output-len",
                "2",
                "--output-dir",
                d.to_str().unwrap(),
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let reason = "3 × 400 exceed_context_size_error: request (3001 tokens) exceeds the available context size (2048 tokens)";
    assert!(err.contains(&format!("failed: {reason}")), "{err}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        s["benchmarks"][0]["error_messages"]["400 exceed_context_size_error"],
        "request (3001 tokens) exceeds the available context size (2048 tokens)"
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        html.contains(&format!("3 failed</b> ({reason})")),
        "paragraph"
    );
    assert!(
        html.contains(&format!("<li>c1_in8: {reason}</li>")),
        "errors section"
    );
    assert!(html.contains("<h2>Latency over time</h2><p>No successful request.</p>"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A scripted completions server whose first `fast` requests answer in 40 ms (two tokens) and
/// every later one only after 30 s.
async fn fast_then_slow(fast: usize) -> ScriptedServer {
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    ScriptedServer::start(Arc::new(move |req, _| {
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        let slow = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= fast;
        let base = if slow { 30_000 } else { 0 };
        let tok = |ms: u64, fin: &str| Frame {
            at: Duration::from_millis(base + ms),
            bytes: format!(
                "data: {{\"choices\":[{{\"text\":\"a\",\"finish_reason\":{fin}}}]}}\n\n"
            )
            .into_bytes(),
        };
        Reply::sse(vec![
            tok(20, "null"),
            tok(40, "\"length\""),
            Frame {
                at: Duration::from_millis(base + 40),
                bytes: b"data: [DONE]\n\n".to_vec(),
            },
        ])
    }))
    .await
}

/// Ctrl-C during a capacity search, after step 0 finished: exit 1, step 0 written
/// (`interrupted: true`, a partial `capacity` that says `stopped: interrupted`, its rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_a_capacity_search_writes_the_steps_that_completed() {
    // Step 0's 10 requests answer in 40 ms, later steps' take 30 s.
    let server = fast_then_slow(10).await;
    let dir = temp::dir("run-ctrlc-cap");
    let mut child = tokio::process::Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            &server.url(),
            "--model",
            "m",
            "--api",
            "completions",
            "--batch-sizes",
            "16",
            "--seq-lengths",
            "8",
        ])
        .args([
            "--find-max-rate",
            "--slo",
            "ttft_p99:5s",
            "--request-rate",
            "100",
            "--step-requests",
            "10",
        ])
        .args([
            "--warmup",
            "0",
            "--output-len",
            "2",
            "--no-ignore-eos",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let mut text = String::new();
    let t = std::time::Instant::now();
    while !text.contains("lmperf run: step 0:") {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::io::AsyncReadExt::read(&mut err, &mut buf),
        )
        .await
        .expect("step 0 within 30 s")
        .unwrap();
        assert!(n > 0 && t.elapsed() < Duration::from_secs(30), "{text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("exit within 15 s of Ctrl-C")
        .unwrap();
    let mut rest = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut err, &mut rest)
        .await
        .unwrap();
    text.push_str(&rest);
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.contains("interrupted (Ctrl-C or SIGTERM) during step1_")
            && text.contains("the 1 completed benchmark(s) are written in"),
        "{text}"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["interrupted"], true);
    let benches = s["benchmarks"].as_array().unwrap();
    assert_eq!(benches.len(), 1, "{s}");
    assert_eq!(
        (
            benches[0]["benchmark"].as_str(),
            benches[0]["completed"].as_u64()
        ),
        (Some("step0_r100.000"), Some(10)),
        "{s}"
    );
    let c = &s["capacity"];
    assert_eq!(c["stopped"], "interrupted", "{c}");
    assert_eq!(c["steps"].as_array().unwrap().len(), 1, "{c}");
    assert_eq!(c["steps"][0]["offered_rate"].as_f64(), Some(100.0), "{c}");
    assert_eq!(
        std::fs::read_to_string(dir.join("requests.jsonl"))
            .unwrap()
            .lines()
            .count(),
        10
    );
    assert!(dir.join("report.html").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C (SIGINT) during the second of two benchmarks: exit 1 with one line, and the first
/// benchmark's results are written (`summary.json` `interrupted: true`, its requests in
/// `requests.jsonl`, `report.html`). The new-user walk lost a whole run's results this way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_writes_the_benchmarks_that_completed() {
    // The first benchmark's 10 requests answer in 40 ms, the second's take 30 s: the
    // interrupt always lands during the second.
    let server = fast_then_slow(10).await;
    let dir = temp::dir("run-ctrlc");
    // c1: 10 requests one at a time (~0.5 s); c2: 10 requests of 30 s each.
    let mut child = tokio::process::Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            &server.url(),
            "--model",
            "m",
            "--api",
            "completions",
            "--batch-sizes",
            "1",
            "2",
            "--seq-lengths",
            "8",
        ])
        .args([
            "--num-prompts",
            "10",
            "--warmup",
            "0",
            "--output-len",
            "2",
            "--no-ignore-eos",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Wait until the first benchmark has ended (its line is printed), then interrupt.
    let mut err = child.stderr.take().unwrap();
    let mut text = String::new();
    let t = std::time::Instant::now();
    while !text.contains("lmperf run: c1_") {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::io::AsyncReadExt::read(&mut err, &mut buf),
        )
        .await
        .expect("first benchmark within 30 s")
        .unwrap();
        assert!(n > 0 && t.elapsed() < Duration::from_secs(30), "{text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let pid = child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("exit within 15 s of Ctrl-C")
        .unwrap();
    let mut rest = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut err, &mut rest)
        .await
        .unwrap();
    text.push_str(&rest);
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.contains("lmperf run: interrupted (Ctrl-C or SIGTERM) during c2_")
            && text.contains("the 1 completed benchmark(s) are written in"),
        "{text}"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["interrupted"], true);
    let benches = s["benchmarks"].as_array().unwrap();
    assert_eq!(benches.len(), 1, "{s}");
    assert_eq!(
        (
            benches[0]["benchmark"].as_str(),
            benches[0]["completed"].as_u64()
        ),
        (Some("c1_in8"), Some(10)),
        "{s}"
    );
    let rows = std::fs::read_to_string(dir.join("requests.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 10);
    assert!(dir.join("report.html").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 50.5: a server whose `/tokenize` answers slowly makes the run pause before its
/// first send (its prompts are calibrated there). The pause is said on the terminal and in
/// `summary.json` (`prepare_s`), and `server_samples.jsonl` counts from the first send, as
/// `requests.jsonl` does: every sample that saw a request at the server lies within the
/// requests' own span (one slot, back-to-back requests of 1.2 s), not shifted by the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_samples_share_the_requests_clock_after_a_pause_to_make_prompts() {
    use lmperf_e2e::slot_server::{SlotExtras, k_slot_server_with};
    let (url, _held) = k_slot_server_with(
        1,
        Duration::from_millis(1200),
        SlotExtras {
            tokenize_delay: Duration::from_millis(400),
            metrics: true,
        },
    )
    .await;
    let dir = temp::dir("run-prepare-clock");
    let d = dir.clone();
    let err = tokio::task::spawn_blocking(move || {
        let out = Command::new(lmperf_bin())
            .args(["run", "--output-dir", d.to_str().unwrap()])
            .args(["--target", &url, "--model", "m", "--batch-sizes", "1"])
            .args([
                "--num-prompts",
                "4",
                "--seq-lengths",
                "16",
                "--output-len",
                "4",
            ])
            .args(["--warmup", "0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        err
    })
    .await
    .unwrap();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let summary: serde_json::Value = serde_json::from_str(&read("summary.json")).unwrap();
    let b = &summary["benchmarks"][0];
    let prepare_s = b["prepare_s"].as_f64().unwrap();
    assert!(prepare_s > 1.0, "prompts made at 400 ms a /tokenize: {b}");
    assert!(
        err.contains("s making the first prompts") && err.contains("before the first send"),
        "{err}"
    );
    let rows: Vec<serde_json::Value> = read("requests.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4);
    let first_send = rows
        .iter()
        .map(|r| r["send_ms"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    let last_end = rows
        .iter()
        .map(|r| r["send_ms"].as_f64().unwrap() + r["e2el_ms"].as_f64().unwrap())
        .fold(0.0, f64::max);
    let samples: Vec<serde_json::Value> = read("server_samples.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let busy: Vec<f64> = samples
        .iter()
        .filter(|s| s["requests_running"].as_f64() == Some(1.0))
        .map(|s| s["t_ms"].as_f64().unwrap())
        .collect();
    println!(
        "prepare {prepare_s:.2} s; requests {first_send:.0}..{last_end:.0} ms; samples seeing one running at {busy:?} ms"
    );
    // 4 × 1.2 s at one scrape a second: several samples saw a request.
    assert!(busy.len() >= 2, "{samples:?}");
    // Stamped when the scrape starts: a sample that saw a request is no later than its end
    // and no earlier than its send less the scrape's own time (bounded here by 250 ms on a
    // loaded machine; the pause it would be shifted by is over a second).
    for t in &busy {
        assert!(
            (first_send - 250.0..=last_end).contains(t),
            "sample at {t} ms saw a request; requests ran {first_send}..{last_end} ms (pause {prepare_s} s)"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
