//! `lmperf run` workloads (issue 3): trace replay of every sample in `fixtures/traces/`
//! (acceptance 3), length distributions with targets vs achieved, prompt files and MT-Bench
//! multi-turn, rate and concurrency ramps, seed reproducibility, and the flags' errors.
//!
//! The scripted server here has a `/tokenize` in llama.cpp's form whose tokens are the
//! whitespace-separated words, so calibration is exact and what was *sent* can be counted
//! again from the received bodies; `trace_on_the_real_server` uses llama.cpp's real tokenizer.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lmperf::bench::RunSpec;
use lmperf::bench::workload::{LengthDist, Ramp, RampOver, TraceReplay, Workload};
use lmperf::config::{self, Env, Overrides, raw::RawCanary};
use lmperf_e2e::agent::{lmperf_bin, workspace_root};
use lmperf_e2e::np_percentile;
use lmperf_e2e::peers::shared_model_server;
use lmperf_e2e::scripted::{Frame, Received, Reply, ScriptedServer};
use lmperf_e2e::serial;
use lmperf_e2e::temp;
use serde_json::Value;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

fn fixture(name: &str) -> std::path::PathBuf {
    workspace_root().join("tests/fixtures/traces").join(name)
}

fn body(r: &Received) -> Value {
    serde_json::from_slice(&r.body).unwrap()
}

/// A fast OpenAI-compatible server: `/tokenize` counts words; completions and chat stream
/// `min(max_tokens, cap)` one-word tokens at once, then usage. Chat answers "answer to
/// <words of the last user message>" first.
async fn server(cap: u64) -> ScriptedServer {
    ScriptedServer::start(Arc::new(move |req, _| {
        let b: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        match req.path.as_str() {
            "/tokenize" => {
                let n = b["content"].as_str().map_or(0, |s| s.split_whitespace().count());
                Reply::json(200, &serde_json::json!({ "tokens": vec![1; n] }).to_string())
            }
            "/v1/completions" | "/v1/chat/completions" => {
                let chat = req.path.contains("chat");
                let n = b["max_tokens"].as_u64().unwrap_or(1).min(cap);
                let prompt_words = if chat {
                    b["messages"].as_array().map_or(0, |m| m.iter().map(|x| x["content"].as_str().unwrap_or("").split_whitespace().count()).sum())
                } else {
                    b["prompt"].as_str().unwrap_or("").split_whitespace().count()
                };
                let last_user = b["messages"].as_array().and_then(|m| m.iter().rev().find(|x| x["role"] == "user")).and_then(|x| x["content"].as_str()).unwrap_or("");
                let mut s = String::new();
                for i in 0..n {
                    let text = if i == 0 { format!("answer to {} words ", last_user.split_whitespace().count()) } else { format!("w{i} ") };
                    let choice = if chat { serde_json::json!({ "index": 0, "delta": { "content": text } }) } else { serde_json::json!({ "index": 0, "text": text }) };
                    s += &format!("data: {}\n\n", serde_json::json!({ "choices": [choice] }));
                }
                s += &format!("data: {}\n\ndata: [DONE]\n\n", serde_json::json!({ "choices": [], "usage": { "prompt_tokens": prompt_words, "completion_tokens": n } }));
                Reply::sse(vec![Frame { at: Duration::ZERO, bytes: s.into_bytes() }])
            }
            // A vLLM-style page with a constant queue, so a run's `server` block is known.
            "/metrics" => Reply::Stream {
                status: 200,
                content_type: "text/plain; version=0.0.4".into(),
                frames: vec![Frame { at: Duration::ZERO, bytes: b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 3\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 2\n".to_vec() }],
                cut: false,
            },
            _ => Reply::json(404, r#"{"error":{"message":"not found"}}"#),
        }
    }))
    .await
}

fn spec(url: &str, api: &str, dir: &std::path::Path, workload: Workload) -> RunSpec {
    let o = Overrides {
        targets: vec![url.to_owned()],
        canary: RawCanary {
            model: Some("m".into()),
            api: Some(api.into()),
            max_tokens: Some(8),
            ..RawCanary::default()
        },
        ..Overrides::default()
    };
    RunSpec {
        concurrencies: vec![64],
        input_lengths: vec![16],
        output_len: 8,
        num_prompts: 10,
        seed: 5,
        workload,
        ..RunSpec::new(
            config::load(o, &NoEnv).unwrap().targets.remove(0),
            dir.to_owned(),
        )
    }
}

/// `lmperf ARGS` on a blocking thread (the scripted server keeps serving on the runtime).
async fn run_cli(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || Command::new(lmperf_bin()).args(&args).output().unwrap())
        .await
        .unwrap()
}

fn rows(dir: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// (offset s, input, output) of a trace file, parsed here independently of the daemon.
fn expected(name: &str, limit: usize) -> Vec<(f64, u64, u64)> {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let mut v: Vec<(f64, u64, u64)> = if name.ends_with(".jsonl") {
        text.lines()
            .take(limit)
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|j| {
                (
                    j["timestamp"].as_f64().unwrap() / 1000.0,
                    j["input_length"].as_u64().unwrap(),
                    j["output_length"].as_u64().unwrap(),
                )
            })
            .collect()
    } else {
        let lines = text
            .split("\r\n")
            .flat_map(|l| l.split('\n'))
            .filter(|l| !l.is_empty())
            .skip(1);
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| f[0].contains(':') || f[3] != "0")
            .take(limit)
            .map(|f| {
                if f[0].contains(':') {
                    // Azure: same-day `YYYY-MM-DD HH:MM:SS.fffffff`.
                    let hms: Vec<f64> = f[0]
                        .split(' ')
                        .nth(1)
                        .unwrap()
                        .split(':')
                        .map(|x| x.parse().unwrap())
                        .collect();
                    (
                        hms[0] * 3600.0 + hms[1] * 60.0 + hms[2],
                        f[1].parse().unwrap(),
                        f[2].parse().unwrap(),
                    )
                } else {
                    (
                        f[0].parse().unwrap(),
                        f[2].parse().unwrap(),
                        f[3].parse().unwrap(),
                    )
                }
            })
            .collect()
    };
    let t0 = v.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
    for r in &mut v {
        r.0 -= t0;
    }
    v
}

/// Acceptance 3: every trace sample replays with a speedup and a limit; the sent prompts have
/// the trace's input lengths (exact with this tokenizer), `max_tokens` / `min_tokens` its
/// output lengths, the schedule is the trace's offsets / speedup, and the summary and report
/// name the trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_samples_replay_with_speedup() {
    let srv = server(1000).await;
    let samples = [
        ("azure_llm_2023_code.head2000.csv", 20),
        ("azure_llm_2023_conv.head2000.csv", 20),
        ("burstgpt_1.head3.csv", 3),
        ("mooncake_arxiv_trace.head20.jsonl", 20),
        ("mooncake_conversation_trace.head2000.jsonl", 12),
        ("mooncake_synthetic_trace.head2000.jsonl", 8),
    ];
    for (name, limit) in samples {
        let want = expected(name, limit);
        let span = want.iter().map(|r| r.0).fold(0.0, f64::max);
        // Half a second of replay.
        let speedup = span / 0.5;
        assert!(speedup > 1.0, "{name}: the limit spans some time");
        let trace = lmperf::bench::trace::load(&fixture(name), None, Some(limit)).unwrap();
        let dir = temp::dir(&format!("wl-{name}"));
        let before = srv.requests().len();
        let w = Workload {
            trace: Some(TraceReplay {
                trace: Arc::new(trace),
                speedup,
            }),
            ..Workload::default()
        };
        let mut sp = spec(&srv.url(), "completions", &dir, w);
        sp.warmup = 2;
        let summary = lmperf::bench::run(sp).await.unwrap();
        let rows = rows(&dir);
        assert_eq!(
            rows.len(),
            want.len(),
            "{name}: one request per trace row, warm-up not counted"
        );
        assert_eq!(
            summary.benchmarks[0].completed,
            want.len(),
            "{name}: {:?}",
            summary.benchmarks[0].errors
        );
        let mut lateness_ms = Vec::with_capacity(rows.len());
        for (r, (at, input, output)) in rows.iter().zip(&want) {
            assert_eq!(
                r["prompt_tokens"].as_u64(),
                Some(*input),
                "{name}: input length of {r}"
            );
            assert_eq!(r["prompt_tokens_target"].as_u64(), Some(*input));
            assert_eq!(r["output_tokens_target"].as_u64(), Some(*output));
            assert_eq!(
                r["output_tokens"].as_u64(),
                Some(*output),
                "{name}: achieved output"
            );
            let sched = r["scheduled_ms"].as_f64().unwrap();
            assert!(
                (sched - at / speedup * 1000.0).abs() < 0.01,
                "{name}: scheduled {sched} ms, trace {at} s / {speedup}"
            );
            lateness_ms.push(r["send_ms"].as_f64().unwrap() - sched);
        }
        sent_on_schedule(&lateness_ms, name);
        // What reached the server: prompts of the trace's lengths, its max_tokens and min_tokens.
        let mut sent: Vec<Value> = srv.requests()[before..]
            .iter()
            .filter(|r| r.path == "/v1/completions")
            .map(body)
            .collect();
        // Warm-up first: the first two rows' shapes, with prompts the replay does not reuse.
        let warm: Vec<Value> = sent.drain(..2).collect();
        let mut warm_shapes: Vec<(u64, u64)> = warm
            .iter()
            .map(|w| {
                (
                    w["prompt"].as_str().unwrap().split_whitespace().count() as u64,
                    w["max_tokens"].as_u64().unwrap(),
                )
            })
            .collect();
        let mut first_two: Vec<(u64, u64)> = want.iter().take(2).map(|r| (r.1, r.2)).collect();
        warm_shapes.sort_unstable();
        first_two.sort_unstable();
        assert_eq!(warm_shapes, first_two, "{name}: warm-up shapes");
        assert!(
            warm.iter()
                .all(|w| sent.iter().all(|s| s["prompt"] != w["prompt"])),
            "{name}: warm-up prompt reused"
        );
        let mut got: Vec<(u64, u64, u64)> = sent
            .iter()
            .map(|b| {
                (
                    b["prompt"].as_str().unwrap().split_whitespace().count() as u64,
                    b["max_tokens"].as_u64().unwrap(),
                    b["min_tokens"].as_u64().unwrap(),
                )
            })
            .collect();
        let mut wanted: Vec<(u64, u64, u64)> = want.iter().map(|w| (w.1, w.2, w.2)).collect();
        got.sort_unstable();
        wanted.sort_unstable();
        assert_eq!(got, wanted, "{name}: sent lengths");
        let s: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(s["trace"]["name"], name);
        assert_eq!(s["trace"]["requests"].as_u64(), Some(want.len() as u64));
        assert_eq!(s["benchmarks"][0]["benchmark"], "c64_trace");
        assert!(
            std::fs::read_to_string(dir.join("report.html"))
                .unwrap()
                .contains(&format!("trace <code>{name}</code>")),
            "{name}: report names the trace"
        );
        let lag = rows
            .iter()
            .map(|r| r["send_ms"].as_f64().unwrap() - r["scheduled_ms"].as_f64().unwrap())
            .fold(0.0, f64::max);
        println!(
            "{name}: {} requests, speedup {speedup:.2}, span {:.3} s, send lag max {lag:.2} ms",
            want.len(),
            span / speedup
        );
    }
}

/// The largest Mooncake input in the samples (134,773 tokens, synthetic trace line 250) is
/// made to its exact length and sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_134k_token_prompt() {
    let srv = server(4).await;
    let line = std::fs::read_to_string(fixture("mooncake_synthetic_trace.head2000.jsonl"))
        .unwrap()
        .lines()
        .nth(249)
        .unwrap()
        .to_owned();
    assert!(line.contains("\"input_length\": 134773"));
    let dir = temp::dir("wl-moon134k");
    let f = dir.join("big.jsonl");
    std::fs::write(&f, line + "\n").unwrap();
    let trace = lmperf::bench::trace::load(&f, None, None).unwrap();
    let w = Workload {
        trace: Some(TraceReplay {
            trace: Arc::new(trace),
            speedup: 1.0,
        }),
        ..Workload::default()
    };
    lmperf::bench::run(spec(&srv.url(), "completions", &dir, w))
        .await
        .unwrap();
    let r = &rows(&dir)[0];
    assert_eq!(r["prompt_tokens"], 134_773);
    let sent = srv
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/completions")
        .map(body)
        .next()
        .unwrap();
    assert_eq!(
        sent["prompt"].as_str().unwrap().split_whitespace().count(),
        134_773
    );
}

/// Mooncake `hash_ids`: two rows that share their first hash id send the same first 512-token
/// block (identical leading tokens) and differ after it; a row with other ids shares nothing;
/// every prompt keeps its exact length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_shared_hash_ids_share_prompt_blocks() {
    let srv = server(4).await;
    let dir = temp::dir("wl-moonhash");
    let f = dir.join("shared.jsonl");
    let lines = [
        r#"{"timestamp": 0, "input_length": 700, "output_length": 2, "hash_ids": [7, 1]}"#,
        r#"{"timestamp": 1, "input_length": 900, "output_length": 2, "hash_ids": [7, 2]}"#,
        r#"{"timestamp": 2, "input_length": 600, "output_length": 2, "hash_ids": [3, 4]}"#,
    ];
    std::fs::write(&f, lines.join("\n") + "\n").unwrap();
    let trace = lmperf::bench::trace::load(&f, None, None).unwrap();
    let w = Workload {
        trace: Some(TraceReplay {
            trace: Arc::new(trace),
            speedup: 1.0,
        }),
        ..Workload::default()
    };
    let mut sp = spec(&srv.url(), "completions", &dir, w);
    sp.concurrencies = vec![1];
    lmperf::bench::run(sp).await.unwrap();
    let r = rows(&dir);
    assert_eq!(
        r.iter()
            .map(|r| r["prompt_tokens"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [700, 900, 600],
        "exact lengths"
    );
    let sent: Vec<Vec<String>> = srv
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/completions")
        .map(|r| {
            body(r)["prompt"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .collect();
    assert_eq!(sent.len(), 3);
    // The server's /tokenize counts words: a block of 512 tokens is 512 words.
    assert_eq!(
        sent[0][..512],
        sent[1][..512],
        "shared first hash id: identical leading 512 tokens"
    );
    assert_ne!(
        sent[0][512..600],
        sent[1][512..600],
        "hash ids 1 and 2 differ"
    );
    assert_ne!(
        sent[0][..16],
        sent[2][..16],
        "hash id 3 shares nothing with 7"
    );
}

/// Length distributions: per-request targets from the seeded samplers, prompts of exactly the
/// sampled input length, max_tokens / min_tokens the sampled output length, achieved output
/// reported per request and in the summary (a server that stops at 300 tokens falls short).
/// Same seed, same prompts and schedule; another seed, others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn length_distributions_targets_vs_achieved_and_seed() {
    let srv = server(300).await;
    let w = || Workload {
        input_dist: Some(
            LengthDist::parse("--input-dist", "lognormal:mu=4.5,sigma=0.5,max=400").unwrap(),
        ),
        output_dist: Some(LengthDist::parse("--output-dist", "uniform:min=100,max=500").unwrap()),
        ..Workload::default()
    };
    let mut runs = Vec::new();
    for (i, seed) in [5u64, 5, 6].into_iter().enumerate() {
        let dir = temp::dir(&format!("wl-dist{i}"));
        let before = srv.requests().len();
        let mut sp = spec(&srv.url(), "completions", &dir, w());
        sp.seed = seed;
        sp.num_prompts = 40;
        sp.request_rate = Some(200.0);
        let summary = lmperf::bench::run(sp).await.unwrap();
        let rows = rows(&dir);
        assert_eq!(rows.len(), 40);
        let b = &summary.benchmarks[0];
        assert_eq!(b.benchmark, "c64_dist");
        for r in &rows {
            assert_eq!(
                r["prompt_tokens"], r["prompt_tokens_target"],
                "exact input length: {r}"
            );
            let (target, got) = (
                r["output_tokens_target"].as_u64().unwrap(),
                r["output_tokens"].as_u64().unwrap(),
            );
            assert!((100..=500).contains(&target));
            assert_eq!(got, target.min(300), "achieved = what the server gave");
        }
        let short = rows
            .iter()
            .filter(|r| r["output_tokens_target"].as_u64().unwrap() > 300)
            .count();
        assert!(short > 0 && short < 40);
        assert_eq!(b.output_tokens_short, short);
        let mean_target = rows
            .iter()
            .map(|r| r["output_tokens_target"].as_f64().unwrap())
            .sum::<f64>()
            / 40.0;
        assert!((b.output_tokens_target.as_ref().unwrap().mean - mean_target).abs() < 1e-9);
        assert!(b.output_tokens.as_ref().unwrap().max <= 300.0);
        let sent: Vec<(String, u64, u64)> = srv.requests()[before..]
            .iter()
            .filter(|r| r.path == "/v1/completions")
            .map(body)
            .map(|b| {
                (
                    b["prompt"].as_str().unwrap().to_owned(),
                    b["max_tokens"].as_u64().unwrap(),
                    b["min_tokens"].as_u64().unwrap(),
                )
            })
            .collect();
        assert!(
            sent.iter().all(|s| s.1 == s.2),
            "min_tokens = max_tokens with ignore-EOS"
        );
        let mut sent = sent;
        sent.sort();
        let sched: Vec<f64> = rows
            .iter()
            .map(|r| r["scheduled_ms"].as_f64().unwrap())
            .collect();
        runs.push((sent, sched));
    }
    assert_eq!(
        runs[0], runs[1],
        "same seed: same prompts, lengths and schedule"
    );
    assert_ne!(runs[0].0, runs[2].0, "another seed: other prompts");
    assert_ne!(runs[0].1, runs[2].1, "another seed: another schedule");
}

/// A CSV prompt file (CRLF, quoted) on completions, and MT-Bench two-turn conversations on
/// chat: the second turn goes after the first answer and carries it; both are measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_file_and_multi_turn() {
    let srv = server(5).await;
    let dir = temp::dir("wl-csv");
    let file =
        lmperf::bench::dataset::load(&fixture("awesome_chatgpt_prompts.csv"), false).unwrap();
    let all: Vec<String> = file
        .conversations
        .iter()
        .map(|c| c.turns[0].clone())
        .collect();
    let w = Workload {
        prompt_file: Some(Arc::new(file)),
        ..Workload::default()
    };
    lmperf::bench::run(spec(&srv.url(), "completions", &dir, w))
        .await
        .unwrap();
    let rows_csv = rows(&dir);
    let sent: Vec<String> = srv
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/completions")
        .map(|r| body(r)["prompt"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(sent.len(), 10);
    assert!(
        sent.iter().all(|p| all.contains(p)),
        "prompts come from the file, verbatim"
    );
    for r in &rows_csv {
        assert_eq!(r["benchmark"], "c64_file");
        let p = &sent
            .iter()
            .find(|p| p.split_whitespace().count() as u64 == r["prompt_tokens"].as_u64().unwrap());
        assert!(p.is_some(), "prompt_tokens is the tokenizer's count: {r}");
    }

    let dir = temp::dir("wl-mt");
    let file = lmperf::bench::dataset::load(&fixture("mt_bench_questions.jsonl"), true).unwrap();
    let w = Workload {
        prompt_file: Some(Arc::new(file)),
        multi_turn: true,
        ..Workload::default()
    };
    let mut sp = spec(&srv.url(), "chat", &dir, w);
    sp.num_prompts = 6;
    sp.concurrencies = vec![3];
    let summary = lmperf::bench::run(sp).await.unwrap();
    let rows = rows(&dir);
    assert_eq!(rows.len(), 12, "6 conversations × 2 turns");
    assert_eq!(summary.benchmarks[0].completed, 12);
    for pair in rows.chunks(2) {
        assert_eq!(
            (
                pair[0]["index"].clone(),
                pair[0]["turn"].clone(),
                pair[1]["turn"].clone()
            ),
            (pair[1]["index"].clone(), 0.into(), 1.into())
        );
        let first_end = pair[0]["send_ms"].as_f64().unwrap() + pair[0]["e2el_ms"].as_f64().unwrap();
        assert!(
            pair[1]["send_ms"].as_f64().unwrap() >= first_end - 0.01,
            "turn 2 after turn 1 ends: {pair:?}"
        );
        assert!(
            pair[1]["input_tokens"].as_u64().unwrap() > pair[0]["input_tokens"].as_u64().unwrap(),
            "turn 2 carries the history"
        );
    }
    let chats: Vec<Value> = srv
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(body)
        .collect();
    let seconds: Vec<&Value> = chats
        .iter()
        .filter(|b| b["messages"].as_array().unwrap().len() == 3)
        .collect();
    assert_eq!(seconds.len(), 6);
    for b in seconds {
        let m = b["messages"].as_array().unwrap();
        let first_user = m[0]["content"].as_str().unwrap();
        let want_answer = format!(
            "answer to {} words w1 w2 w3 w4 ",
            first_user.split_whitespace().count()
        );
        assert_eq!(
            (m[1]["role"].as_str(), m[1]["content"].as_str()),
            (Some("assistant"), Some(want_answer.as_str())),
            "the first answer, verbatim"
        );
        assert_eq!(m[2]["role"], "user");
        let q = chats.iter().find(|c| {
            c["messages"].as_array().unwrap().len() == 1
                && c["messages"][0]["content"] == first_user
        });
        assert!(q.is_some(), "the first turn was sent alone");
    }
}

/// `--ramp linear` through the command line: the offsets follow the integral of the rate
/// (constant arrivals: request i at Λ⁻¹(i)), and the sends follow the offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ramp_linear_from_the_command_line() {
    let _serial = serial::lock().await;
    let srv = server(2).await;
    let dir = temp::dir("wl-ramp");
    let out = run_cli(
        [
            "run",
            "--target",
            &srv.url(),
            "--model",
            "m",
            "--num-prompts",
            "150",
            "--seq-lengths",
            "8",
            "--output-len",
            "2",
            "--batch-sizes",
            "32",
            "--ramp",
            "linear",
            "--ramp-from",
            "20",
            "--ramp-to",
            "180",
            "--ramp-duration",
            "1s",
            "--arrival",
            "constant",
            "--seed",
            "3",
            "--output-dir",
            dir.to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows(&dir);
    assert_eq!(rows.len(), 150);
    let r = Ramp::new("linear", 20.0, 180.0, Duration::from_secs(1)).unwrap();
    // Λ(t) = 20 t + 80 t² for t ≤ 1 s (100 requests), then 180/s.
    for (i, row) in rows.iter().enumerate() {
        let t = row["scheduled_ms"].as_f64().unwrap() / 1000.0;
        let lambda = if t <= 1.0 {
            20.0 * t + 80.0 * t * t
        } else {
            100.0 + 180.0 * (t - 1.0)
        };
        assert!(
            (lambda - i as f64).abs() < 1e-3,
            "request {i} at {t} s: Λ = {lambda}"
        );
        assert!((r.integral(t) - lambda).abs() < 1e-6);
    }
    let lateness_ms: Vec<f64> = rows
        .iter()
        .map(|r| r["send_ms"].as_f64().unwrap() - r["scheduled_ms"].as_f64().unwrap())
        .collect();
    sent_on_schedule(&lateness_ms, "linear ramp");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["workload"]["ramp"]["kind"], "linear");
}

/// Replies take `SLOW` (one token, usage, `[DONE]` all at once then). The usage's
/// `prompt_tokens` is the server's arrival number of the request, so each row of
/// `requests.jsonl` (its `input_tokens`) names the arrival the server recorded for it.
const SLOW: Duration = Duration::from_millis(50);

type Arrivals = Arc<std::sync::Mutex<Vec<(u64, std::time::Instant)>>>;

async fn slow_server() -> (ScriptedServer, Arrivals) {
    let arrivals: Arrivals = Arc::default();
    let log = arrivals.clone();
    let srv = ScriptedServer::start(Arc::new(move |req, n| {
        let b: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        if req.path == "/tokenize" {
            let n = b["content"].as_str().map_or(0, |s| s.split_whitespace().count());
            return Reply::json(200, &serde_json::json!({ "tokens": vec![1; n] }).to_string());
        }
        log.lock().unwrap().push((n as u64, req.arrived));
        let chunk = serde_json::json!({ "choices": [{ "index": 0, "text": "w " }] });
        let usage = serde_json::json!({ "choices": [], "usage": { "prompt_tokens": n, "completion_tokens": 1 } });
        Reply::sse(vec![Frame { at: SLOW, bytes: format!("data: {chunk}\n\ndata: {usage}\n\ndata: [DONE]\n\n").into_bytes() }])
    }))
    .await;
    (srv, arrivals)
}

/// Per measured row, by send time: (send s, concurrency_limit, requests in flight at the
/// server when it arrived, the highest concurrency_limit among those). In flight at the
/// server: arrived at or before it and within `SLOW` of their arrival, both on the server's
/// own clock (`Received::arrived`, the instant its frames count from: it writes the reply no
/// sooner than `SLOW` after it, however late a loaded machine wakes it, so no client can
/// have the reply earlier). The last-dispatched of those was dispatched with all of them in
/// flight, so a correct limiter keeps the count ≤ that highest limit, with no tolerance.
fn in_flight_at_server(
    rows: &[Value],
    arrivals: &[(u64, std::time::Instant)],
) -> Vec<(f64, usize, usize, usize)> {
    let at: std::collections::HashMap<u64, std::time::Instant> = arrivals.iter().copied().collect();
    let window = SLOW;
    let mut out: Vec<(f64, usize, usize, usize)> = rows
        .iter()
        .map(|r| {
            let a = at[&r["input_tokens"].as_u64().unwrap()];
            let with: Vec<&Value> = rows
                .iter()
                .filter(|o| {
                    let b = at[&o["input_tokens"].as_u64().unwrap()];
                    b <= a && a < b + window
                })
                .collect();
            let max_limit = with
                .iter()
                .map(|o| o["concurrency_limit"].as_u64().unwrap() as usize)
                .max()
                .unwrap();
            (
                r["send_ms"].as_f64().unwrap() / 1000.0,
                r["concurrency_limit"].as_u64().unwrap() as usize,
                with.len(),
                max_limit,
            )
        })
        .collect();
    out.sort_by(|x, y| x.0.total_cmp(&y.0));
    out
}

/// `--ramp linear --ramp-over concurrency 1 → 8 over 2 s` through the command line against a
/// server whose replies take 50 ms: requests go closed loop, the server never has more in
/// flight than the limit (+0), reaches 8 near the end, the recorded limits rise with the
/// ramp, and `--duration` ends the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_ramp_linear_from_the_command_line() {
    let (srv, arrivals) = slow_server().await;
    let dir = temp::dir("wl-cramp");
    let out = run_cli(
        [
            "run",
            "--target",
            &srv.url(),
            "--model",
            "m",
            "--num-prompts",
            "1000",
            "--seq-lengths",
            "8",
            "--output-len",
            "1",
            "--duration",
            "2500ms",
            "--ramp",
            "linear",
            "--ramp-over",
            "concurrency",
            "--ramp-from",
            "1",
            "--ramp-to",
            "8",
            "--ramp-duration",
            "2s",
            "--output-dir",
            dir.to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows(&dir);
    let ramp = Ramp::new_over(
        "linear",
        1.0,
        8.0,
        Duration::from_secs(2),
        RampOver::Concurrency,
    )
    .unwrap();
    // Closed loop at 1..8 in flight, 50 ms each: ∫ c(t) dt / 50 ms ≈ 4.5·2/0.05 + 8·0.5/0.05 = 260.
    assert!(
        (200..=275).contains(&rows.len()),
        "{} requests in 2.5 s",
        rows.len()
    );
    assert!(
        rows.iter()
            .all(|r| r["outcome"] == "ok" && r["benchmark"] == "c8_in8"),
        "{:?}",
        rows[0]
    );
    let seen = in_flight_at_server(&rows, &arrivals.lock().unwrap());
    for &(t, limit, in_flight, max_limit) in &seen {
        assert!(t <= 2.5 + 0.002, "sent at {t} s, after --duration");
        // The limit at dispatch is the ramp's then (read within the 1 ms tick; 10 ms allows for a busy machine).
        assert!(
            limit == ramp.concurrency_at(t) || limit == ramp.concurrency_at(t - 0.01),
            "limit {limit} at {t} s"
        );
        assert!(
            in_flight <= max_limit,
            "{in_flight} in flight at the server at {t} s, limit {max_limit}"
        );
    }
    let limits: Vec<usize> = seen.iter().map(|s| s.1).collect();
    assert!(
        limits.windows(2).all(|w| w[0] <= w[1]),
        "limits rise: {limits:?}"
    );
    assert_eq!((limits[0], limits[limits.len() - 1]), (1, 8));
    assert!(
        (1..=8).all(|k| limits.contains(&k)),
        "every step of the ramp: {limits:?}"
    );
    let peak = |a: f64, b: f64| {
        seen.iter()
            .filter(|s| (a..b).contains(&s.0))
            .map(|s| s.2)
            .max()
            .unwrap_or(0)
    };
    assert_eq!(peak(0.0, 0.1), 1, "one at a time at the start");
    assert_eq!(peak(1.9, 2.6), 8, "8 in flight at the server near the end");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        (
            s["workload"]["ramp"]["over"].as_str(),
            s["workload"]["ramp"]["to"].as_f64()
        ),
        (Some("concurrency"), Some(8.0))
    );
    assert_eq!(s["benchmarks"][0]["concurrency"], 8);
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        html.contains("Latency vs concurrency (ramp)")
            && html.contains("c8_in8: latency vs concurrency limit"),
        "report section"
    );
    let per_step: Vec<usize> = (1..=8)
        .map(|k| seen.iter().filter(|s| s.1 == k).count())
        .collect();
    println!(
        "concurrency ramp 1 → 8: {} requests, per limit {per_step:?}, server peaks per 0.5 s {:?}",
        rows.len(),
        (0..5)
            .map(|k| peak(k as f64 * 0.5, (k + 1) as f64 * 0.5))
            .collect::<Vec<_>>()
    );
}

/// A sawtooth concurrency ramp (1 → 6 every second) through the library: the limit rises,
/// falls back to 1 at 1 s and rises again; the server sees the in-flight count fall with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_ramp_sawtooth_falls_back() {
    let (srv, arrivals) = slow_server().await;
    let dir = temp::dir("wl-cramp-saw");
    let ramp = Ramp::new_over(
        "sawtooth",
        1.0,
        6.0,
        Duration::from_secs(1),
        RampOver::Concurrency,
    )
    .unwrap();
    let mut sp = spec(
        &srv.url(),
        "completions",
        &dir,
        Workload {
            ramp: Some(ramp),
            ..Workload::default()
        },
    );
    sp.num_prompts = 1000;
    sp.duration = Some(Duration::from_millis(1600));
    sp.input_lengths = vec![8];
    lmperf::bench::run(sp).await.unwrap();
    let rows = rows(&dir);
    let seen = in_flight_at_server(&rows, &arrivals.lock().unwrap());
    assert!(seen.iter().all(|s| s.2 <= s.3), "{seen:?}");
    assert!(
        seen.iter()
            .all(|s| s.1 == ramp.concurrency_at(s.0) || s.1 == ramp.concurrency_at(s.0 - 0.01)),
        "{seen:?}"
    );
    let window = |a: f64, b: f64| {
        seen.iter()
            .filter(|s| (a..b).contains(&s.0))
            .collect::<Vec<_>>()
    };
    let (top, fallen, again) = (window(0.9, 1.0), window(1.15, 1.3), window(1.5, 1.6));
    assert!(
        top.iter().map(|s| s.2).max() >= Some(5),
        "near 6 in flight before the fall: {top:?}"
    );
    assert!(
        !fallen.is_empty() && fallen.iter().all(|s| s.1 <= 2 && s.2 <= 2),
        "fell back to ≤ 2 in flight after 1 s: {fallen:?}"
    );
    assert!(
        again.iter().map(|s| s.1).max() >= Some(4),
        "rising again: {again:?}"
    );
    let limits: Vec<usize> = seen.iter().map(|s| s.1).collect();
    let fall = limits.windows(2).position(|w| w[1] < w[0]).unwrap();
    assert!(limits[fall] >= 5 && limits[fall + 1] <= 2, "{limits:?}");
}

#[test]
fn bad_workload_flags_exit_2_naming_the_flag() {
    let trace = fixture("burstgpt_1.head3.csv");
    let cases: Vec<Vec<&str>> = vec![
        vec!["--input-dist", "lognormal:mu=7.1"],
        vec!["--output-dist", "uniform:min=9,max=1"],
        vec!["--trace", "/nonexistent/trace.csv"],
        vec!["--trace-speedup", "0", "--trace", trace.to_str().unwrap()],
        vec![
            "--ramp-from",
            "0",
            "--ramp",
            "exponential",
            "--ramp-to",
            "5",
            "--ramp-duration",
            "1s",
        ],
        vec!["--prompt-file", "/nonexistent/p.jsonl"],
        vec![
            "--request-rate",
            "10",
            "--ramp",
            "linear",
            "--ramp-over",
            "concurrency",
            "--ramp-from",
            "1",
            "--ramp-to",
            "8",
            "--ramp-duration",
            "2s",
        ],
        vec![
            "--ramp-from",
            "0.5",
            "--ramp",
            "linear",
            "--ramp-over",
            "concurrency",
            "--ramp-to",
            "8",
            "--ramp-duration",
            "2s",
        ],
        vec![
            "--ramp-to",
            "0",
            "--ramp",
            "sawtooth",
            "--ramp-over",
            "concurrency",
            "--ramp-from",
            "2",
            "--ramp-duration",
            "2s",
        ],
        vec![
            "--batch-sizes",
            "4",
            "--ramp",
            "linear",
            "--ramp-over",
            "concurrency",
            "--ramp-from",
            "1",
            "--ramp-to",
            "8",
            "--ramp-duration",
            "2s",
        ],
    ];
    for args in cases {
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

/// Acceptance 3 on the real server: an Azure conversation trace replayed with llama.cpp's
/// own tokenizer. The calibrated prompts have exactly the trace's lengths by `/tokenize`
/// (tolerance 0 tokens; the search ends with single-token steps); the server's own
/// `prompt_tokens` adds its BOS token (tolerance +1).
#[test]
fn trace_on_the_real_server() {
    let _serial = serial::lock_blocking();
    let server = shared_model_server();
    let dir = temp::dir("wl-real-trace");
    let out = Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            &server.url(),
            "--model",
            "gemma-3-270m",
            "--trace",
            fixture("azure_llm_2023_conv.head2000.csv")
                .to_str()
                .unwrap(),
        ])
        .args([
            "--trace-limit",
            "4",
            "--trace-speedup",
            "20",
            "--batch-sizes",
            "4",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = expected("azure_llm_2023_conv.head2000.csv", 4);
    let rows = rows(&dir);
    assert_eq!(rows.len(), 4);
    for (r, (_, input, output)) in rows.iter().zip(&want) {
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(r["prompt_tokens"].as_u64(), Some(*input), "{r}");
        let server_in = r["input_tokens"].as_u64().unwrap();
        assert!(
            server_in >= *input && server_in <= input + 1,
            "server counts {server_in} for {input}: {r}"
        );
        assert_eq!(
            r["output_tokens"].as_u64(),
            Some(*output),
            "ignore_eos + min_tokens: {r}"
        );
    }
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        (
            s["trace"]["name"].as_str(),
            s["trace"]["format"].as_str(),
            s["tokenizer"].as_str()
        ),
        (
            Some("azure_llm_2023_conv.head2000.csv"),
            Some("azure"),
            Some("server_llama_cpp")
        )
    );
}

/// A local `tokenizer.json` (`--tokenizer`) calibrates the prompts without one `/tokenize` call:
/// the fixture's tokens are whitespace-separated words, as the scripted server counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_tokenizer_json_instead_of_tokenize() {
    let server = server(4).await;
    let dir = temp::dir("wl-local-tokenizer");
    let tok = lmperf::bench::prompts::LocalTokenizer::load(
        &workspace_root().join("tests/fixtures/tokenizers/whitespace-words.json"),
    )
    .unwrap();
    assert_eq!(tok.count("the quick  brown\tfox and"), Some(5));
    let mut s = spec(
        &server.url(),
        "completions",
        &dir,
        Workload {
            tokenizer: Some(tok),
            ..Workload::default()
        },
    );
    s.input_lengths = vec![37];
    s.num_prompts = 6;
    let summary = lmperf::bench::run(s).await.unwrap();
    assert_eq!(summary.benchmarks[0].completed, 6);
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(json["tokenizer"], "local_file");
    assert!(
        json["workload"]["tokenizer_file"]
            .as_str()
            .unwrap()
            .ends_with("whitespace-words.json")
    );
    for r in rows(&dir) {
        assert_eq!(
            (r["prompt_tokens"].as_u64(), r["input_tokens"].as_u64()),
            (Some(37), Some(37)),
            "{r}"
        );
    }
    let received = server.requests();
    assert!(
        received.iter().all(|r| r.path != "/tokenize"),
        "no /tokenize call with a local tokenizer"
    );
    // Besides the 6 completions the run reads the server's /metrics and identity routes.
    assert_eq!(
        received
            .iter()
            .filter(|r| r.path.ends_with("/completions"))
            .count(),
        6
    );
    // A file that is not a tokenizer is refused naming the flag and the file.
    let out = Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            &server.url(),
            "--model",
            "m",
            "--tokenizer",
            "Cargo.toml",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .current_dir(workspace_root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--tokenizer") && err.contains("Cargo.toml: not a usable tokenizer.json"),
        "{err}"
    );
}

/// The Gemma 3 tokenizer.json built from the GGUF's metadata (tests/peers/install.sh) counts
/// exactly as llama.cpp's `/tokenize` does, and `lmperf run --tokenizer` with it sends prompts
/// of the exact length (the server's usage adds its BOS token).
#[test]
fn gemma_tokenizer_json_matches_llama_cpp() {
    let _serial = serial::lock_blocking();
    let path = workspace_root().join(".venv-peers/tokenizer/tokenizer.json");
    assert!(
        path.exists(),
        "{} missing: run tests/peers/install.sh",
        path.display()
    );
    let tok = lmperf::bench::prompts::LocalTokenizer::load(&path).unwrap();
    let server = shared_model_server();
    let texts: Vec<String> = std::fs::read_to_string(fixture("mt_bench_questions.jsonl"))
        .unwrap()
        .lines()
        .take(25)
        .flat_map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["turns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .chain([
            "Hello world, this is a test.".to_owned(),
            "ünïcödé — 東京 🚀 tabs\tand  spaces\n\nnew lines".to_owned(),
        ])
        .collect();
    let addr: std::net::SocketAddr = server
        .url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    for t in &texts {
        let (code, body) = lmperf_e2e::agent::http_post_json(
            addr,
            "/tokenize",
            &serde_json::json!({ "content": t, "add_special": false }).to_string(),
        );
        assert_eq!(code, 200, "{body}");
        let server_count = serde_json::from_str::<Value>(&body).unwrap()["tokens"]
            .as_array()
            .unwrap()
            .len() as u32;
        assert_eq!(tok.count(t), Some(server_count), "{t:?}");
    }
    let dir = temp::dir("wl-gemma-tokenizer");
    let out = Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            &server.url(),
            "--model",
            "gemma-3-270m",
            "--tokenizer",
            path.to_str().unwrap(),
        ])
        .args([
            "--seq-lengths",
            "64",
            "--num-prompts",
            "3",
            "--output-len",
            "4",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in rows(&dir) {
        assert_eq!(r["prompt_tokens"].as_u64(), Some(64), "{r}");
        assert!(
            matches!(r["input_tokens"].as_u64(), Some(64 | 65)),
            "server counts {}: {r}",
            r["input_tokens"]
        );
    }
}

/// `lmperf run --profile FILE`: the seed's three-part profile runs; an edit of the file while it
/// runs applies from the next step (rate ×4, fixed prompt length) without dropping a request;
/// each row records its profile revision; the summary and report mark the change; a bad
/// profile is one line naming key and value, exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_hot_update_while_running() {
    let srv = server(4).await;
    let dir = temp::dir("wl-profile");
    let file = dir.join("load.yaml");
    // 40 output tokens/s ÷ 4 per request = 10 req/s.
    std::fs::write(&file, "profile: burst-llm-eval\nprompt_length: {distribution: lognormal, mu: 60, sigma: 0.3, max: 200}\nconcurrency: {ramp: exponential, base: 4, step: 1s, max: 16}\ntoken_rate: {mode: constant, target: 40/s, jitter: 15%}\n").unwrap();
    let out_dir = dir.join("out");
    let args: Vec<String> = [
        "run",
        "--target",
        &srv.url(),
        "--model",
        "m",
        "--output-len",
        "4",
        "--duration",
        "4s",
        "--num-prompts",
        "20",
        "--profile",
        file.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    let run = tokio::spawn(run_cli(args));
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // 160 tokens/s = 40 req/s, prompts of exactly 32 tokens.
    std::fs::write(&file, "profile: burst-llm-eval\nprompt_length: {distribution: fixed, value: 32}\nconcurrency: {ramp: exponential, base: 4, step: 1s, max: 16}\ntoken_rate: {mode: constant, target: 160/s}\n").unwrap();
    let out = run.await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows(&out_dir);
    assert!(
        rows.iter().all(|r| r["outcome"] == "ok"),
        "no request dropped"
    );
    // --duration bounds the run, not --num-prompts 20: every request the schedule planned
    // before the end is sent (about 10 req/s then 40: 90 or more, however late each went out
    // on a loaded machine); the result line is printed.
    assert!(rows.len() > 40, "{} rows", rows.len());
    let last_ms = rows
        .iter()
        .filter_map(|r| r["scheduled_ms"].as_f64())
        .fold(0.0, f64::max);
    assert!(
        (3800.0..4000.0).contains(&last_ms),
        "the last request planned at {last_ms} ms of 4 s"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "lmperf run: profile_burst-llm-eval: {} requests, {} ok, ",
            rows.len(),
            rows.len()
        )),
        "{err}"
    );
    let (r0, r1): (Vec<&Value>, Vec<&Value>) =
        rows.iter().partition(|r| r["profile_revision"] == 0);
    assert!(r1.iter().all(|r| r["profile_revision"] == 1));
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    let change = s["profile"]["revisions"][1][0].as_f64().unwrap();
    // Written 2 s after the process started; its t0 is after start-up (tokenizer detection),
    // which a loaded machine makes longer, and the watch may see it late: within the run, with
    // time after it for the new rate to show.
    assert!((0.0..3.5).contains(&change), "revision 1 at {change} s");
    assert_eq!(s["profile"]["name"], "burst-llm-eval");
    // Rates before and after: ~10 and ~40 req/s, from the planned gaps (each within the
    // profile's jitter of its rate, however short the window a slow start left).
    let rate = |rs: &[&Value], from: f64, to: f64| {
        let mut at: Vec<f64> = rs
            .iter()
            .map(|r| r["scheduled_ms"].as_f64().unwrap() / 1000.0)
            .filter(|t| (from..to).contains(t))
            .collect();
        at.sort_by(f64::total_cmp);
        assert!(
            at.len() >= 2,
            "{} planned in {from:.2}..{to:.2} s",
            at.len()
        );
        (at.len() - 1) as f64 / (at[at.len() - 1] - at[0])
    };
    let before = rate(&r0, 0.0, change - 0.1);
    let after = rate(&r1, change + 0.1, 3.9);
    assert!(
        (8.0..12.5).contains(&before) && (32.0..48.0).contains(&after),
        "{before} req/s then {after} req/s"
    );
    assert!(
        r1.iter().all(|r| r["prompt_tokens"] == 32),
        "fixed prompt length after the change"
    );
    assert!(
        r0.iter()
            .any(|r| r["prompt_tokens"] != r0[0]["prompt_tokens"]),
        "lognormal lengths before"
    );
    let html = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    assert!(
        html.contains(r#"data-revision="1""#),
        "the report marks the change"
    );
    // The server's own signals are read during a profile run too (the new-user walk found
    // `server: null` and no server_samples.jsonl).
    let sv = &s["benchmarks"][0]["server"];
    assert_eq!(
        (sv["waiting_max"].as_f64(), sv["running_max"].as_f64()),
        (Some(3.0), Some(2.0)),
        "{sv}"
    );
    let samples = std::fs::read_to_string(out_dir.join("server_samples.jsonl")).unwrap();
    assert!(samples.lines().count() >= 2, "{samples}");

    std::fs::write(
        &file,
        "profile: x\ntoken_rate: {mode: constant, target: 10/s, jiter: 5%}\n",
    )
    .unwrap();
    let out = run_cli(
        [
            "run",
            "--target",
            &srv.url(),
            "--profile",
            file.to_str().unwrap(),
            "--output-dir",
            out_dir.to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.trim_end().lines().count() == 1
            && err.contains("token_rate.jiter = \"5%\": unknown key"),
        "{err}"
    );
}

/// `token_rate: {mode: adaptive}` against a scripted server with a known decode-rate floor:
/// each stream decodes at 100 tokens/s (10 ms per token) while the output tokens asked over the
/// last 250 ms stay at or below 300 tokens/s, and at 20 tokens/s (50 ms per token) above. With
/// a floor of 50 tokens/s per stream, the levels 100, 150 and 225 tokens/s hold and 337.5
/// breaks it, so the highest sustainable token throughput is 225 tokens/s; after settling the
/// load returns to that level and the streams to 100 tokens/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_token_rate_finds_the_servers_decode_rate_floor() {
    let _serial = serial::lock().await;
    const TOKENS: u64 = 4;
    let arrivals: Arc<std::sync::Mutex<std::collections::VecDeque<std::time::Instant>>> =
        Arc::default();
    let srv = ScriptedServer::start(Arc::new({
        let arrivals = arrivals.clone();
        move |req: &Received, _| {
            if req.path == "/tokenize" {
                let n = body(req)["content"].as_str().map_or(0, |s| s.split_whitespace().count());
                return Reply::json(200, &serde_json::json!({ "tokens": vec![1; n] }).to_string());
            }
            let offered_tokens_per_s = {
                let mut a = arrivals.lock().unwrap();
                a.push_back(req.arrived);
                // Over the last 500 ms: a busy machine's bunched or late sends move a few
                // arrivals across the window's edge, 7 short of the threshold at 225 and 7
                // past it at 337.5 tokens/s (a 250 ms window at a threshold of 300 called 13
                // of 55 streams fast at 337.5 on 2 cores beside a CPU hog).
                while a.front().is_some_and(|t| req.arrived.duration_since(*t) > Duration::from_millis(500)) {
                    a.pop_front();
                }
                a.len() as u64 * TOKENS * 2
            };
            // Midway between the profile's levels 225 and 337.5 tokens/s.
            let gap = Duration::from_millis(if offered_tokens_per_s > 281 { 50 } else { 10 });
            let mut frames: Vec<Frame> = (0..TOKENS)
                .map(|i| Frame { at: gap * i as u32, bytes: format!("data: {}\n\n", serde_json::json!({ "choices": [{ "index": 0, "text": format!("w{i} ") }] })).into_bytes() })
                .collect();
            let end = gap * (TOKENS - 1) as u32;
            frames.push(Frame { at: end, bytes: format!("data: {}\n\ndata: [DONE]\n\n", serde_json::json!({ "choices": [], "usage": { "prompt_tokens": 8, "completion_tokens": TOKENS } })).into_bytes() });
            Reply::sse(frames)
        }
    }))
    .await;
    let dir = temp::dir("wl-adaptive");
    let file = dir.join("adaptive.yaml");
    std::fs::write(&file, "profile: find-floor\nprompt_length: {distribution: fixed, value: 8}\nconcurrency: {ramp: fixed, base: 64}\ntoken_rate: {mode: adaptive, target: 100/s, increase: 50%, step: 1s, floor: 50}\n").unwrap();
    let out_dir = dir.join("out");
    let args: Vec<String> = [
        "run",
        "--target",
        &srv.url(),
        "--model",
        "m",
        "--api",
        "completions",
        "--output-len",
        "4",
        "--num-prompts",
        "10000",
        "--duration",
        "5.5s",
        "--profile",
        file.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    let out = run_cli(args).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(
        s["profile"]["sustained_token_rate"].as_f64(),
        Some(225.0),
        "{}",
        s["profile"]
    );
    let rows = rows(&out_dir);
    assert!(rows.iter().all(|r| r["outcome"] == "ok"));
    let at = |r: &Value| r["scheduled_ms"].as_f64().unwrap() / 1000.0;
    let tpot = |r: &Value| r["tpot_ms"].as_f64().unwrap();
    let window = |from: f64, to: f64| {
        rows.iter()
            .filter(|r| (from..to).contains(&at(r)))
            .collect::<Vec<_>>()
    };
    // Levels 100, 150, 225 tokens/s: streams at 100 tokens/s.
    let held = window(0.0, 2.95);
    assert!(
        held.len() >= 100 && held.iter().all(|r| tpot(r) < 25.0),
        "{} rows, TPOT {:?}",
        held.len(),
        held.iter().map(|r| tpot(r)).collect::<Vec<_>>()
    );
    // Level 337.5 tokens/s (84 req/s): the server slows each stream below the floor.
    let broke = window(3.3, 3.95);
    let slow = broke.iter().filter(|r| tpot(r) >= 40.0).count();
    assert!(
        slow * 10 >= broke.len() * 9,
        "{slow} of {} streams slow at 337.5 tokens/s",
        broke.len()
    );
    // Settled back at 225 tokens/s = 56 req/s, streams fast again.
    let settled = window(4.4, 5.4);
    assert!(
        (45..=68).contains(&settled.len()),
        "{} req/s after settling",
        settled.len()
    );
    assert!(
        settled.iter().all(|r| tpot(r) < 25.0),
        "{:?}",
        settled.iter().map(|r| tpot(r)).collect::<Vec<_>>()
    );
}

/// Issue 15 part 2 on the real server (llama.cpp with Gemma 3 270M on one thread, two slots;
/// ~0.5 s per request of 32 prompt and 8 output tokens here): `lmperf run --profile` with a
/// fixed 32-token prompt, a linear concurrency ramp 1 → 2 at 4 s and a constant 4 output
/// tokens/s (0.5 req/s of 8 tokens), then an edit at ~7.5 s to a fixed 24-token prompt and 8
/// tokens/s (1 req/s): loads the server keeps up with (1.5 req/s at 2 in flight did not, with
/// other builds on the machine: E2E 1.2-1.7 s, sends waiting for a slot). Checked on the rows: revision 0 then 1,
/// the new revision's first request sent within 0.3 s of the change, each revision's achieved
/// output-token rate (tokens of its requests over their send span) within 10 % of its target
/// while no request waits for a slot, each prompt exactly the revision's length by `/tokenize`
/// and the server's own count that +1 (BOS), every request 8 output tokens, the concurrency
/// limit 1 before 4 s and 2 after; the summary and report mark the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_hot_update_on_the_real_server() {
    let _serial = serial::lock().await;
    let server = shared_model_server();
    let dir = temp::dir("wl-profile-real");
    let file = dir.join("load.yaml");
    let concurrency = "concurrency: {ramp: linear, base: 1, step: 4s, max: 2}\n";
    std::fs::write(&file, format!("profile: real-ramp\nprompt_length: {{distribution: fixed, value: 32}}\n{concurrency}token_rate: {{mode: constant, target: 4/s}}\n")).unwrap();
    let out_dir = dir.join("out");
    let args: Vec<String> = [
        "run",
        "--target",
        &server.url(),
        "--model",
        "gemma-3-270m",
        "--output-len",
        "8",
        "--num-prompts",
        "1000",
        "--duration",
        "16s",
        "--profile",
        file.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    let started = std::time::Instant::now();
    let run = tokio::spawn(run_cli(args));
    tokio::time::sleep(Duration::from_secs(8)).await;
    std::fs::write(&file, format!("profile: real-ramp\nprompt_length: {{distribution: fixed, value: 24}}\n{concurrency}token_rate: {{mode: constant, target: 8/s}}\n")).unwrap();
    let out = run.await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    let change = s["profile"]["revisions"][1][0].as_f64().unwrap();
    assert_eq!(
        s["profile"]["revisions"].as_array().unwrap().len(),
        2,
        "{}",
        s["profile"]
    );
    assert_eq!(s["profile"]["revisions"][1][1], 1);
    // Written 8 s after the process started; its t0 is after start-up (tokenizer detection).
    assert!((5.5..8.2).contains(&change), "revision 1 at {change} s");
    let rows = rows(&out_dir);
    assert!(
        rows.iter()
            .all(|r| r["outcome"] == "ok" && r["output_tokens"] == 8),
        "no request dropped, 8 tokens each: {rows:?}"
    );
    let revs: Vec<u64> = rows
        .iter()
        .map(|r| r["profile_revision"].as_u64().unwrap())
        .collect();
    assert!(
        revs.windows(2).all(|w| w[0] <= w[1]) && revs.contains(&0) && revs.contains(&1),
        "revision 0 then 1: {revs:?}"
    );
    let at = |r: &Value, k: &str| r[k].as_f64().unwrap() / 1000.0;
    let mut figures = Vec::new();
    for (rev, len, target) in [(0, 32, 4.0), (1, 24, 8.0)] {
        let mine: Vec<&Value> = rows
            .iter()
            .filter(|r| r["profile_revision"] == rev)
            .collect();
        for r in &mine {
            assert_eq!(
                (
                    r["prompt_tokens"].as_u64(),
                    r["prompt_tokens_source"].as_str()
                ),
                (Some(len), Some("server_tokenize")),
                "{r}"
            );
            let server_in = r["input_tokens"].as_u64().unwrap();
            assert!(
                server_in == len || server_in == len + 1,
                "server counts {server_in} for {len}: {r}"
            );
            // Sent under revision 0 before the change, under revision 1 after it.
            assert!(
                if rev == 0 {
                    at(r, "scheduled_ms") < change
                } else {
                    at(r, "scheduled_ms") >= change - 0.01
                },
                "{r}"
            );
            let limit = if at(r, "send_ms") < 3.99 {
                1
            } else if at(r, "send_ms") > 4.01 {
                2
            } else {
                r["concurrency_limit"].as_u64().unwrap()
            };
            assert_eq!(
                r["concurrency_limit"].as_u64(),
                Some(limit),
                "linear ramp 1 → 2 at 4 s: {r}"
            );
        }
        // A send waits only for a free slot (beyond its prompt's calibration, a few /tokenize
        // calls): every send that waited 300 ms or more was due while its concurrency limit's
        // requests were all in flight. How long the CPU-bound real server holds a slot depends
        // on the machine's load (a CPU hog beside it makes it slower), so no count of waits is
        // asserted: the rule that explains each wait is.
        let delays: Vec<f64> = mine
            .iter()
            .map(|r| r["dispatch_delay_ms"].as_f64().unwrap())
            .collect();
        for r in mine
            .iter()
            .filter(|r| r["dispatch_delay_ms"].as_f64() >= Some(300.0))
        {
            let due = r["scheduled_ms"].as_f64().unwrap();
            let in_flight = rows
                .iter()
                .filter(|o| {
                    let send = o["send_ms"].as_f64().unwrap();
                    send <= due && due < send + o["e2el_ms"].as_f64().unwrap()
                })
                .count() as u64;
            assert!(
                in_flight >= r["concurrency_limit"].as_u64().unwrap(),
                "revision {rev}: waited with a slot free ({in_flight} in flight when due): {r}; dispatch delays {delays:?} ms"
            );
        }
        // The rate the schedule kept (when each send was due): a send that waited for a slot
        // is explained above; the realized send times follow the server's speed on this
        // machine.
        let (first, last) = (
            at(mine[0], "scheduled_ms"),
            at(mine[mine.len() - 1], "scheduled_ms"),
        );
        let tokens: u64 = mine[1..]
            .iter()
            .map(|r| r["output_tokens"].as_u64().unwrap())
            .sum();
        let rate = tokens as f64 / (last - first);
        assert!(
            mine.len() >= 3 && (rate / target - 1.0).abs() <= 0.10,
            "revision {rev}: {} requests, {rate:.2} output tokens/s for {target}",
            mine.len()
        );
        figures.push((
            rev,
            mine.len(),
            rate,
            first,
            delays.iter().copied().fold(0.0, f64::max),
        ));
    }
    let first_new = figures[1].3;
    assert!(
        first_new - change < 0.3,
        "the new rate starts at the change ({change:.2} s), its first request at {first_new:.2} s"
    );
    assert_eq!(
        (
            s["benchmarks"][0]["prompt_tokens_mismatch"].as_u64(),
            s["tokenizer"].as_str()
        ),
        (Some(0), Some("server_llama_cpp"))
    );
    let html = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    // (Compared as numbers: serde_json's default parse may be one ulp off the printed value.)
    let marked: Option<f64> = html
        .split(r#"data-revision="1" data-at-s=""#)
        .nth(1)
        .and_then(|t| t.split('"').next())
        .and_then(|v| v.parse().ok());
    assert!(
        marked.is_some_and(|m| (m - change).abs() < 1e-9),
        "the report marks the change at {change} s: {marked:?}"
    );
    println!(
        "profile on the real server: change at {change:.2} s; per revision (rev, requests, output tokens/s, first send s, max dispatch delay ms): {figures:?}; test {:.1} s",
        took.as_secs_f64()
    );
}

/// Issue 15 part 4: a closed loop's `dispatch_delay_ms` counts from the moment the request's
/// slot became free, not from the benchmark's start. `lmperf run` without `--request-rate` at
/// concurrency 1 and 2, 60 requests each, against a server whose replies take 50 ms: the last
/// requests start ~3 s (c1) and ~1.5 s (c2) after the start, yet every delay is small (p50
/// under 1 ms, p99 under 10 ms, max under one service time, 50 ms; measured here p50 0.03 ms,
/// p99 2-4 ms on a loaded 2-core machine), where counted from the start they would reach
/// ~3 s; at concurrency 1 each request is due when the previous ended (its `scheduled_ms` is
/// the previous send + E2E, typically +0.75 ms, within 20 ms); summary.json's
/// `dispatch_delay_ms` is the rows' (count, min, max exact, mean to 1e-9, percentiles within
/// the histograms' 0.1 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_dispatch_delay_counts_from_the_free_slot() {
    let _serial = serial::lock().await;
    let (srv, _) = slow_server().await;
    let dir = temp::dir("wl-closed-delay");
    let started = std::time::Instant::now();
    let out = run_cli(
        [
            "run",
            "--target",
            &srv.url(),
            "--model",
            "m",
            "--batch-sizes",
            "1",
            "2",
            "--num-prompts",
            "60",
            "--seq-lengths",
            "8",
            "--output-len",
            "1",
            "--output-dir",
            dir.to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows(&dir);
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let mut figures = Vec::new();
    for (k, c) in [1u64, 2].into_iter().enumerate() {
        let mine: Vec<&Value> = rows.iter().filter(|r| r["concurrency"] == c).collect();
        assert_eq!(mine.len(), 60);
        assert!(mine.iter().all(|r| r["outcome"] == "ok"));
        let col = |key: &str| {
            mine.iter()
                .map(|r| r[key].as_f64().unwrap())
                .collect::<Vec<f64>>()
        };
        let (delay, send, scheduled, e2e) = (
            col("dispatch_delay_ms"),
            col("send_ms"),
            col("scheduled_ms"),
            col("e2el_ms"),
        );
        let last_send = send.iter().copied().fold(0.0, f64::max);
        // 60 × 50 ms / c: the last sends are seconds after the start (a delay counted from the
        // start would be that).
        assert!(
            last_send > 2900.0 / c as f64 - 100.0,
            "c{c}: last send at {last_send} ms"
        );
        let (p50, p99, max) = (
            np_percentile(&delay, 0.5),
            np_percentile(&delay, 0.99),
            delay.iter().copied().fold(0.0, f64::max),
        );
        assert!(
            p50 < 1.0 && p99 < 10.0 && max < 50.0,
            "c{c}: dispatch delays p50 {p50} ms, p99 {p99} ms, max {max} ms: {delay:?}"
        );
        if c == 1 {
            for i in 1..mine.len() {
                let ended = send[i - 1] + e2e[i - 1];
                assert!(
                    (ended - 0.5..ended + 20.0).contains(&scheduled[i]),
                    "request {i} due at {} ms, previous ended at {ended} ms",
                    scheduled[i]
                );
            }
        }
        let b = &s["benchmarks"][k];
        assert_eq!(b["concurrency"], c);
        let d = &b["dispatch_delay_ms"];
        assert_eq!(d["count"].as_u64(), Some(60));
        let min = delay.iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!(
            (d["min"].as_f64(), d["max"].as_f64()),
            (Some(min), Some(max)),
            "{d}"
        );
        let mean = delay.iter().sum::<f64>() / 60.0;
        assert!(
            (d["mean"].as_f64().unwrap() - mean).abs() <= 1e-9 * mean.max(1.0),
            "{d} vs mean {mean}"
        );
        for (q, key) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")] {
            let want = np_percentile(&delay, q);
            let got = d[key].as_f64().unwrap();
            assert!(
                (got - want).abs() <= 1e-3 * want + 1e-6,
                "c{c} {key}: summary {got}, rows {want}"
            );
        }
        figures.push((c, last_send, p50, p99, max));
    }
    println!(
        "closed loop, 50 ms replies (c, last send ms, dispatch delay p50/p99/max ms): {figures:?}; test {:.1} s",
        took.as_secs_f64()
    );
}

/// Each request sent on its schedule: never before it (exact), and late by what a loaded
/// machine's wake-ups add, not by a pacing that drifts: the median lateness under 50 ms, the
/// worst under 250 ms (2 cores beside a CPU hog: the worst seen well under 50 ms).
fn sent_on_schedule(lateness_ms: &[f64], what: &str) {
    assert!(!lateness_ms.is_empty(), "{what}: no request");
    assert!(
        lateness_ms.iter().all(|l| *l >= -1e-3),
        "{what}: a request sent before its time: {lateness_ms:?}"
    );
    let mut sorted = lateness_ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    let (median, worst) = (sorted[sorted.len() / 2], sorted[sorted.len() - 1]);
    assert!(
        median < 50.0 && worst < 250.0,
        "{what}: sends late by {median:.1} ms (median), {worst:.1} ms (worst): {lateness_ms:?}"
    );
}

/// Issue 54: a profile asking 20 requests/s of a server that takes 150 ms each, one at a time
/// (`--batch-sizes 1`, no concurrency in the profile), for 3 s: about 60 due, 20 or fewer
/// sent, the rest never sent; `summary.json` `offered` says so and the warning names the
/// concurrency cap. Bounds that hold on a loaded machine: a slower client sends fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_the_server_cannot_keep_up_with_says_what_was_never_sent() {
    let srv = ScriptedServer::start(Arc::new(|req, _| {
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        let tok = format!(
            "data: {}\n\ndata: [DONE]\n\n",
            serde_json::json!({ "choices": [{ "index": 0, "text": "a b c d", "finish_reason": "length" }], "usage": { "prompt_tokens": 8, "completion_tokens": 4 } })
        );
        Reply::sse(vec![Frame {
            at: Duration::from_millis(150),
            bytes: tok.into_bytes(),
        }])
    }))
    .await;
    let dir = temp::dir("wl-offered");
    let file = dir.join("load.yaml");
    // 80 output tokens/s ÷ 4 per request = 20 req/s.
    std::fs::write(&file, "profile: too-fast\nprompt_length: {distribution: fixed, value: 8}\ntoken_rate: {mode: constant, target: 80/s}\n").unwrap();
    let out_dir = dir.join("out");
    let args: Vec<String> = [
        "run",
        "--target",
        &srv.url(),
        "--model",
        "m",
        "--api",
        "completions",
        "--output-len",
        "4",
        "--batch-sizes",
        "1",
        "--duration",
        "3s",
        "--profile",
        file.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    let out = run_cli(args).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    let o = &s["benchmarks"][0]["offered"];
    let n = |k: &str| o[k].as_u64().unwrap_or_else(|| panic!("{k} in {o:#}"));
    let sent = rows(&out_dir).len() as u64;
    assert_eq!(n("sent"), sent, "{o:#}");
    assert_eq!(n("sent") + n("never_sent"), n("due"), "{o:#}");
    assert!((50..=62).contains(&n("due")), "about 60 due in 3 s: {o:#}");
    assert!(sent <= 21, "150 ms each, one at a time: {o:#}");
    assert!(n("never_sent") >= 30, "{o:#}");
    assert_eq!(o["held_back_by"], "concurrency cap", "{o:#}");
    assert!(
        err.contains(&format!(
            "lmperf run: warning: profile_too-fast: {sent} of {} due requests sent, {} never sent",
            n("due"),
            n("never_sent")
        )) && err.contains("the concurrency cap (1) held them back: raise --batch-sizes"),
        "{err}"
    );
}
