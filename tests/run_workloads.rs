//! `lmperf run` workloads of issue 27: standard datasets with malformed rows (`--dataset
//! sharegpt|jsonl`), synthetic images (`--images-per-request`) against scripted servers, and
//! shared prefixes (`--prefix-len`, `--prefix-groups`) against the real llama.cpp server.
//!
//! The scripted vLLM-style server counts tokens as words: `/tokenize` with `messages` adds 3
//! per message and 2 for the generation prompt (its "chat template"), and its usage counts
//! the same, plus 64 tokens per image; so every request's `prompt_tokens` can be checked
//! against the server's own count.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::peers::{ModelServer, free_port};
use lmperf_e2e::scripted::{Frame, Reply, ScriptedServer, base64_decode};
use lmperf_e2e::serial;
use lmperf_e2e::temp;
use serde_json::Value;

const IMAGE_TOKENS: usize = 64;

/// The images the scripted server decoded: (width, height, encoded bytes), `None` for one
/// that is not a PNG data URL.
type Decoded = Arc<Mutex<Vec<Option<(u32, u32, usize)>>>>;

struct Run {
    summary: Value,
    rows: Vec<Value>,
    stderr: String,
    report: String,
}

fn run(url: &str, name: &str, args: &[&str]) -> Run {
    let dir = temp::dir(&format!("workloads-{name}"));
    let out = Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            url,
            "--model",
            "m",
            "--output-len",
            "2",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{name}: {stderr}");
    let summary =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let rows = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let report = std::fs::read_to_string(dir.join("report.html")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        summary,
        rows,
        stderr,
        report,
    }
}

/// Words of a message's content (text parts of a content array too) and its images.
fn words_and_images(content: &Value) -> (usize, Vec<String>) {
    match content {
        Value::String(s) => (s.split_whitespace().count(), Vec::new()),
        Value::Array(parts) => {
            let mut n = 0;
            let mut images = Vec::new();
            for p in parts {
                if let Some(t) = p["text"].as_str() {
                    n += t.split_whitespace().count();
                }
                if let Some(u) = p["image_url"]["url"].as_str() {
                    images.push(u.to_owned());
                }
            }
            (n, images)
        }
        _ => (0, Vec::new()),
    }
}

/// The decoded (width, height, encoded bytes) of a `data:image/png;base64,` URL.
fn png_size(url: &str) -> Option<(u32, u32, usize)> {
    let b64 = url.strip_prefix("data:image/png;base64,")?;
    let bytes = base64_decode(b64)?;
    let len = bytes.len();
    let reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .ok()?;
    let info = reader.info();
    Some((info.width, info.height, len))
}

/// The vLLM-style scripted server; `images` collects every image it decoded (W, H, bytes),
/// `None` for one that did not decode as PNG.
async fn word_server(images: Decoded) -> ScriptedServer {
    ScriptedServer::start(Arc::new(move |req, _| {
        let b: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let templated = |messages: &Value, decode: bool| -> usize {
            messages.as_array().map_or(0, |m| {
                m.iter()
                    .map(|x| {
                        let (words, urls) = words_and_images(&x["content"]);
                        if decode {
                            let mut seen = images.lock().unwrap();
                            seen.extend(urls.iter().map(|u| png_size(u)));
                        }
                        3 + words + IMAGE_TOKENS * urls.len()
                    })
                    .sum::<usize>()
                    + 2
            })
        };
        match req.path.as_str() {
            "/tokenize" if b.get("messages").is_some() => Reply::json(
                200,
                &serde_json::json!({ "count": templated(&b["messages"], false), "tokens": [] })
                    .to_string(),
            ),
            "/tokenize" => match b["prompt"].as_str() {
                Some(p) => Reply::json(
                    200,
                    &serde_json::json!({ "count": p.split_whitespace().count() }).to_string(),
                ),
                None => Reply::json(400, r#"{"error":{"message":"prompt is required"}}"#),
            },
            "/v1/chat/completions" => {
                let usage = serde_json::json!({ "prompt_tokens": templated(&b["messages"], true), "completion_tokens": 1, "total_tokens": 1 });
                let chunk = serde_json::json!({ "choices": [{ "index": 0, "delta": { "content": "ok" }, "finish_reason": "length" }] });
                let body = format!(
                    "data: {chunk}\n\ndata: {}\n\ndata: [DONE]\n\n",
                    serde_json::json!({ "choices": [], "usage": usage })
                );
                Reply::sse(vec![Frame {
                    at: Duration::ZERO,
                    bytes: body.into_bytes(),
                }])
            }
            _ => Reply::json(404, r#"{"error":{"message":"not found"}}"#),
        }
    }))
    .await
}

/// Every request's `prompt_tokens` is the server's own count of it.
/// The dataset block of `run`: `(position, rows)` kept, these bad rows skipped (by index or
/// line), each named on stderr as `FILE <at>`.
fn skipped_rows(run: &Run, file: &str, (position, rows): (&str, u64), bad: &[u64], at: &[&str]) {
    let d = &run.summary["workload"]["dataset"];
    assert_eq!(
        (d["rows"].as_u64(), d["skipped_rows"].as_u64()),
        (Some(rows), Some(bad.len() as u64)),
        "{d}"
    );
    assert_eq!(d["bad_row_position"], position);
    let got: Vec<u64> = d["bad_rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["line"].as_u64().unwrap())
        .collect();
    assert_eq!(got, bad);
    for at in at {
        assert!(
            run.stderr.contains(&format!("{file} {at}")),
            "{at}: {}",
            run.stderr
        );
    }
}

fn exact(run: &Run) {
    for r in &run.rows {
        assert_eq!(r["outcome"], "ok", "{r}");
        assert_eq!(
            r["prompt_tokens"].as_u64(),
            r["input_tokens"].as_u64(),
            "{r}"
        );
    }
    assert_eq!(run.summary["prompt_tokens_mismatch"], 0, "{}", run.stderr);
}

/// ShareGPT and vLLM-custom JSONL files with malformed rows: the bad rows are skipped,
/// counted and named by their index (ShareGPT array) or line (JSONL), in the warnings and in
/// `summary.json`; the good rows are sent, each counted exactly (a `messages` row with its
/// template, a row's `output_len` as its `max_tokens`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datasets_with_malformed_rows() {
    let server = word_server(Arc::default()).await;
    let url = server.url();
    let sharegpt = temp::file(
        "share.json",
        r#"[
  {"id": "a", "conversations": [{"from": "human", "value": "one two three four"}, {"from": "gpt", "value": "x"}, {"from": "human", "value": "five six"}]},
  {"id": "b"},
  {"id": "c", "conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "seven eight nine"}]},
  7,
  {"id": "e", "conversations": [{"from": "human", "value": 12}]}
]"#,
    );
    let jsonl = temp::file(
        "custom.jsonl",
        "{\"prompt\": \"alpha beta gamma delta epsilon\", \"output_len\": 5}\n\
         not json at all\n\
         \n\
         {\"messages\": [{\"role\": \"system\", \"content\": \"be brief please\"}, {\"role\": \"user\", \"content\": \"why is the sky blue\"}]}\n\
         {\"prompt\": \"x\", \"output_len\": -3}\n\
         {\"question\": \"no prompt here\"}\n\
         {\"prompt\": \"zeta eta\"}\n",
    );
    let (u, s, j) = (url.clone(), sharegpt.clone(), jsonl.clone());
    let (share, custom) = tokio::task::spawn_blocking(move || {
        let share = run(
            &u,
            "sharegpt",
            &[
                "--api",
                "chat",
                "--num-prompts",
                "2",
                "--dataset",
                "sharegpt",
                s.to_str().unwrap(),
            ],
        );
        let custom = run(
            &u,
            "jsonl",
            &[
                "--api",
                "chat",
                "--num-prompts",
                "3",
                "--dataset",
                "jsonl",
                j.to_str().unwrap(),
            ],
        );
        (share, custom)
    })
    .await
    .unwrap();

    // ShareGPT: rows 1, 3 and 4 of the array skipped; rows 0 and 2 sent (first human turn).
    assert_eq!(share.summary["workload"]["dataset"]["format"], "sharegpt");
    skipped_rows(
        &share,
        "share.json",
        ("index", 2),
        &[1, 3, 4],
        &[
            "row 1: no `conversations` array",
            "row 3: ",
            "row 4: conversations[0]",
        ],
    );
    exact(&share);
    // One user message of 4 or 3 words: 3 + words + 2.
    let mut tokens: Vec<u64> = share
        .rows
        .iter()
        .map(|r| r["prompt_tokens"].as_u64().unwrap())
        .collect();
    tokens.sort_unstable();
    assert_eq!(tokens, [8, 9], "{:?}", share.rows);
    assert!(share.report.contains(r#"data-skipped="3""#));

    // JSONL: lines 2, 5 and 6 skipped (the empty line 3 is not a row); lines 1, 4, 7 sent.
    skipped_rows(
        &custom,
        "custom.jsonl",
        ("line", 3),
        &[2, 5, 6],
        &[
            "line 2: not JSON",
            "line 5: output_len -3",
            "line 6: no `prompt`",
        ],
    );
    exact(&custom);
    let mut got: Vec<(u64, u64)> = custom
        .rows
        .iter()
        .map(|r| {
            (
                r["prompt_tokens"].as_u64().unwrap(),
                r["output_tokens_target"].as_u64().unwrap(),
            )
        })
        .collect();
    got.sort_unstable();
    // "zeta eta": 3+2+2 = 7, max_tokens the run's 2; "alpha … epsilon": 3+5+2 = 10 with its
    // output_len 5; the messages row: (3+3) + (3+5) + 2 = 16.
    assert_eq!(got, [(7, 2), (10, 5), (16, 2)]);
}

/// Synthetic images: each request carries K PNG data URLs that the server decodes to W×H;
/// the rows report the encoded bytes and the image tokens the server counted beyond the text;
/// `benchmarks[].images.by_size` buckets them by size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synthetic_images_decode_to_their_size() {
    let seen: Decoded = Arc::default();
    let server = word_server(seen.clone()).await;
    let url = server.url();
    let r = tokio::task::spawn_blocking(move || {
        run(
            &url,
            "images",
            &[
                "--api",
                "chat",
                "--num-prompts",
                "3",
                "--seq-lengths",
                "20",
                "--images-per-request",
                "2",
                "--image-size",
                "48x32",
            ],
        )
    })
    .await
    .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 6, "3 requests × 2 images");
    assert!(
        seen.iter().all(|s| matches!(s, Some((48, 32, _)))),
        "{seen:?}"
    );
    let server_bytes: u64 = seen.iter().flatten().map(|(_, _, n)| *n as u64).sum();
    let mut row_bytes = 0;
    for row in &r.rows {
        assert_eq!(row["outcome"], "ok", "{row}");
        assert_eq!(row["images"], 2);
        assert_eq!(row["image_size"], "48x32");
        row_bytes += row["image_bytes"].as_u64().unwrap();
        // The text is counted exactly; the server adds its image tokens.
        assert_eq!(row["prompt_tokens"], 20, "{row}");
        assert_eq!(
            row["input_tokens"].as_u64(),
            Some(20 + 2 * IMAGE_TOKENS as u64),
            "{row}"
        );
    }
    assert_eq!(row_bytes, server_bytes);
    let b = &r.summary["benchmarks"][0]["images"];
    assert_eq!(
        (b["requests"].as_u64(), b["images"].as_u64()),
        (Some(3), Some(6))
    );
    assert_eq!(b["image_bytes"].as_u64(), Some(server_bytes));
    let size = &b["by_size"]["48x32"];
    assert_eq!(size["image_tokens"].as_u64(), Some(6 * IMAGE_TOKENS as u64));
    assert_eq!(
        size["image_tokens_per_image"].as_f64(),
        Some(IMAGE_TOKENS as f64)
    );
    assert_eq!(
        r.summary["prompt_tokens_mismatch"], 0,
        "images are not a mismatch"
    );
    assert_eq!(r.summary["workload"]["images"]["width"], 48);
    assert!(r.report.contains(r#"data-size="48x32""#));
}

/// Shared prefixes against the real llama.cpp server (one slot, the full KV cache kept so a
/// cached prefix is reused): 2 groups × 2 requests with a 96-token prefix, sent group by
/// group. The later requests of a group find the prefix in the server's cache (its usage's
/// `cached_tokens`) as predicted within ±10 %, and their TTFT is below the first's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefix_hits_the_llama_cpp_cache() {
    let _serial = serial::lock().await;
    let server = ModelServer::start_with(free_port(), &["--parallel", "1", "--swa-full"]);
    let url = server.url();
    let r = tokio::task::spawn_blocking(move || {
        run(
            &url,
            "prefix",
            &[
                "--api",
                "completions",
                "--num-prompts",
                "4",
                "--seq-lengths",
                "112",
                "--prefix-len",
                "96",
                "--prefix-groups",
                "2",
            ],
        )
    })
    .await
    .unwrap();
    let p = &r.summary["benchmarks"][0]["prefix_cache"];
    assert_eq!(
        (p["requests_first"].as_u64(), p["requests_later"].as_u64()),
        (Some(2), Some(2)),
        "{p}"
    );
    let expected = p["expected_cached_tokens"].as_f64().unwrap();
    assert_eq!(expected, 2.0 * 96.0, "{p}");
    let later = p["server_cached_tokens_later"].as_f64().unwrap();
    assert!(
        (later - expected).abs() <= 0.1 * expected,
        "the server cached {later} prompt tokens of the later requests, predicted {expected}: {p}"
    );
    let (want, got) = (
        p["expected_hit_ratio"].as_f64().unwrap(),
        p["server_hit_ratio"].as_f64().unwrap(),
    );
    assert!(
        (got - want).abs() <= 0.1 * want,
        "hit ratio {got} vs {want}: {p}"
    );
    let (first, later_ttft) = (
        p["ttft_first_ms"]["p50"].as_f64().unwrap(),
        p["ttft_later_ms"]["p50"].as_f64().unwrap(),
    );
    assert!(
        later_ttft < first,
        "TTFT later {later_ttft} ms vs first {first} ms: {p}"
    );
    for row in &r.rows {
        assert_eq!(row["prefix_shared_tokens"], 96, "{row}");
        let server = row["input_tokens"].as_u64().unwrap();
        let ours = row["prompt_tokens"].as_u64().unwrap();
        assert!(server == ours || server == ours + 1, "{row}");
    }
    eprintln!(
        "shared prefix: expected hit ratio {want:.3}, server {got:.3}; later-in-group cached {later} of {expected} predicted; TTFT p50 first {first:.1} ms, later {later_ttft:.1} ms"
    );
}

/// A shared prefix as long as an input length leaves no room for each request's own suffix:
/// refused before anything is sent, naming the flag, its value and the shortest length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_longer_than_an_input_length_is_refused() {
    let server = word_server(Arc::default()).await;
    let url = server.url();
    let dir = temp::dir("workloads-prefix-too-long");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(lmperf_bin())
            .args(["run", "--target", &url, "--model", "m", "--output-len", "2"])
            .args(["--seq-lengths", "64", "256", "--prefix-len", "64"])
            .args(["--prefix-groups", "2", "--num-prompts", "2", "--output-dir"])
            .arg(&dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(r#"--prefix-len = "64""#) && stderr.contains("(64 tokens)"),
        "{stderr}"
    );
    let completions = server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/completions"))
        .count();
    assert_eq!(completions, 0, "nothing sent");
}
