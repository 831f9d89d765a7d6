//! Chat prompts exact to the token (issue 19): `lmperf run --api chat` counts the chat template.
//!
//! Against the real llama.cpp server (Gemma 3 270M; its GGUF has no chat template, so llama.cpp
//! applies its chatml fallback, which Gemma's vocabulary tokenizes as text): the server's own
//! template (`/apply-template`), a local `tokenizer.json` + chat template with the server's
//! `/tokenize` and `/apply-template` out of reach (a proxy that forwards `/v1/*` only, as an
//! API gateway does), prompt files and multi-turn conversations, and the raw-text estimate
//! that the mismatch counter catches. A scripted vLLM-style server checks `/tokenize` with
//! `messages`.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lmperf_e2e::agent::{lmperf_bin, workspace_root};
use lmperf_e2e::peers::shared_model_server;
use lmperf_e2e::peers::{ModelServer, free_port};
use lmperf_e2e::scripted::{Reply, ScriptedServer};
use lmperf_e2e::serial;
use lmperf_e2e::temp;
use serde_json::Value;

struct Run {
    summary: Value,
    rows: Vec<Value>,
    stderr: String,
}

/// `lmperf run --api chat` against `url` with small numbers (2 prompts of 2 output tokens by
/// default) and `args`; exit 0.
fn run_chat(url: &str, name: &str, args: &[&str]) -> Run {
    let dir = temp::dir(&format!("chat-{name}"));
    let out = Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            url,
            "--model",
            "gemma-3-270m",
            "--api",
            "chat",
            "--num-prompts",
            "2",
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
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        summary,
        rows,
        stderr,
    }
}

/// Every request of `run` asked for one of `lengths`, got exactly that many `prompt_tokens`
/// from `source`, and the server counted the same (+1 for its BOS); no mismatch counted.
fn exact_lengths(run: &Run, lengths: &[u64], source: &str) {
    assert_eq!(run.rows.len(), lengths.len() * 2, "{}", run.stderr);
    for r in &run.rows {
        let asked = r["prompt_tokens_target"].as_u64().unwrap();
        assert!(lengths.contains(&asked), "{r}");
        assert_eq!(
            (
                r["outcome"].as_str(),
                r["prompt_tokens"].as_u64(),
                r["prompt_tokens_source"].as_str()
            ),
            (Some("ok"), Some(asked), Some(source)),
            "{r}"
        );
        let server = r["input_tokens"].as_u64().unwrap();
        assert!(
            server == asked || server == asked + 1,
            "asked {asked}, the server counted {server}: {r}"
        );
    }
    matching_counts(run, source);
}

/// The templated `prompt_tokens` of every request equal the server's count (+1 for BOS), and
/// the summary counts no mismatch.
fn matching_counts(run: &Run, source: &str) {
    for r in &run.rows {
        let (ours, server) = (
            r["prompt_tokens"].as_u64().unwrap(),
            r["input_tokens"].as_u64().unwrap(),
        );
        assert!(
            server == ours || server == ours + 1,
            "prompt_tokens {ours}, the server counted {server}: {r}"
        );
        assert_eq!(r["prompt_tokens_source"], source, "{r}");
    }
    assert_eq!(run.summary["prompt_tokens_source"], source);
    assert_eq!(run.summary["prompt_tokens_mismatch"], 0, "{}", run.stderr);
    assert!(
        run.summary["benchmarks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["prompt_tokens_mismatch"] == 0)
    );
}

/// A reverse proxy in front of `upstream` that forwards `/v1/*` and answers 404 to every other
/// path (an API gateway without the server's `/tokenize` and `/apply-template`); it records
/// the paths asked. One request per connection (`Connection: close` both ways).
struct Proxy {
    port: u16,
    paths: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let paths: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = paths.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let seen = seen.clone();
                std::thread::spawn(move || Self::serve(conn, upstream, &seen));
            }
        });
        Self { port, paths }
    }

    fn serve(conn: TcpStream, upstream: u16, seen: &Mutex<Vec<String>>) {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
        let Some(req) = lmperf_e2e::proxy::read_request(&conn) else {
            return;
        };
        seen.lock().unwrap().push(req.path.clone());
        let mut client = conn;
        if !req.path.starts_with("/v1/") {
            let _ = client.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
            return;
        }
        lmperf_e2e::proxy::forward(&req, upstream, &mut client);
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn paths(&self) -> Vec<String> {
        self.paths.lock().unwrap().clone()
    }
}

/// A tokenizer directory for Gemma with a chat template: the tokenizer.json that
/// tests/peers/install.sh builds from the GGUF, and a tokenizer_config.json whose
/// `chat_template` is llama.cpp's chatml fallback (the template the server applies to this
/// GGUF; `tests/fixtures/chat_templates/chatml.jinja`, as its `/props` reports it).
fn gemma_tokenizer_dir() -> std::path::PathBuf {
    let json = workspace_root().join(".venv-peers/tokenizer/tokenizer.json");
    assert!(
        json.exists(),
        "{} missing: run tests/peers/install.sh",
        json.display()
    );
    let dir = temp::dir("chat-tokenizer");
    std::os::unix::fs::symlink(&json, dir.join("tokenizer.json")).unwrap();
    let template = std::fs::read_to_string(
        workspace_root().join("tests/fixtures/chat_templates/chatml.jinja"),
    )
    .unwrap();
    let config = serde_json::json!({ "bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

/// Acceptance: the templated length equals the asked length (the server's count, ±1 for its
/// BOS) with the server's own template and with a local tokenizer.json + chat template when the
/// server's `/tokenize` is out of reach; prompt files and multi-turn conversations report their
/// templated lengths; the mismatch counter is 0 there and counts every request of the raw-text
/// estimate, whose requests are then bucketed by the server's counts.
#[test]
fn chat_prompts_count_the_template_on_the_real_server() {
    let _serial = serial::lock_blocking();
    let server = shared_model_server();
    let mt_bench = workspace_root().join("tests/fixtures/traces/mt_bench_questions.jsonl");
    let mt_bench = mt_bench.to_str().unwrap();

    // The server's own template: llama.cpp's /apply-template, then /tokenize.
    let run = run_chat(
        &server.url(),
        "server",
        &["--seq-lengths", "32", "64", "128"],
    );
    exact_lengths(&run, &[32, 64, 128], "server_template");
    assert_eq!(run.summary["chat_template"], "server: POST /apply-template");
    assert!(
        run.stderr.contains("counted with their chat template"),
        "{}",
        run.stderr
    );

    // A local tokenizer.json + chat template, the server's /tokenize and /apply-template out of
    // reach: not one call to them.
    let proxy = Proxy::start(server.port);
    let tokenizer = gemma_tokenizer_dir();
    let run = run_chat(
        &proxy.url(),
        "local",
        &[
            "--seq-lengths",
            "32",
            "64",
            "128",
            "--tokenizer",
            tokenizer.to_str().unwrap(),
        ],
    );
    exact_lengths(&run, &[32, 64, 128], "local_template");
    assert!(
        run.summary["chat_template"]
            .as_str()
            .unwrap()
            .ends_with("tokenizer_config.json"),
        "{}",
        run.summary["chat_template"]
    );
    let paths = proxy.paths();
    assert_eq!(
        paths
            .iter()
            .filter(|p| *p == "/v1/chat/completions")
            .count(),
        6,
        "{paths:?}"
    );
    assert!(
        !paths
            .iter()
            .any(|p| p == "/tokenize" || p == "/apply-template"),
        "{paths:?}"
    );

    // A prompt file, and multi-turn conversations (the history and the template counted
    // before each turn), with the server's template and with the local one.
    let run = run_chat(&server.url(), "file", &["--prompt-file", mt_bench]);
    assert_eq!(run.rows.len(), 2);
    matching_counts(&run, "server_template");
    for (url, name, source, extra) in [
        (server.url(), "multi-server", "server_template", None),
        (
            proxy.url(),
            "multi-local",
            "local_template",
            Some(tokenizer.to_str().unwrap()),
        ),
    ] {
        let mut args = vec!["--prompt-file", mt_bench, "--multi-turn"];
        args.extend(extra.iter().flat_map(|t| ["--tokenizer", *t]));
        let run = run_chat(&url, name, &args);
        assert_eq!(
            run.rows.len(),
            4,
            "2 conversations × 2 turns: {}",
            run.stderr
        );
        matching_counts(&run, source);
        for pair in run.rows.chunks(2) {
            assert_eq!(
                (pair[0]["turn"].as_u64(), pair[1]["turn"].as_u64()),
                (Some(0), Some(1))
            );
            assert!(
                pair[1]["prompt_tokens"].as_u64() > pair[0]["prompt_tokens"].as_u64(),
                "turn 2 carries the history: {pair:?}"
            );
        }
    }

    // Forcing the raw-text estimate (through the proxy, no tokenizer): every request is a
    // mismatch, said on stderr, and bucketed by the server's count.
    let run = run_chat(&proxy.url(), "estimate", &["--seq-lengths", "16"]);
    assert_eq!(run.summary["prompt_tokens_source"], "estimate");
    assert_eq!(run.summary["prompt_tokens_mismatch"], 2, "{}", run.stderr);
    assert_eq!(run.summary["benchmarks"][0]["prompt_tokens_mismatch"], 2);
    assert!(
        run.stderr.contains("no chat template to count")
            && run
                .stderr
                .contains("2 request(s) whose server-reported input tokens differ"),
        "{}",
        run.stderr
    );
    let cells = run.summary["length_buckets"][0]["cells"]
        .as_array()
        .unwrap();
    for r in &run.rows {
        let (ours, server) = (
            r["prompt_tokens"].as_u64().unwrap(),
            r["input_tokens"].as_u64().unwrap(),
        );
        assert!(server > ours + 1, "the template is not counted: {r}");
        let lo = 1u64 << server.ilog2();
        assert_ne!(
            lo,
            1u64 << ours.ilog2(),
            "a case where the two counts bucket apart: {r}"
        );
        assert!(
            cells.iter().any(|c| c["input"]["lo"] == lo),
            "bucketed by the server's {server}: {cells:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&tokenizer);
}

/// A real model's template with special tokens: Gemma 3's (`<start_of_turn>`, `<bos>` written by
/// the template), served by llama.cpp (`--chat-template-file`) and rendered locally from the
/// fixture `tokenizer_config.json` with Gemma's tokenizer.json: both count what the server
/// counts, for synthetic prompts and for multi-turn conversations (`assistant` → `model`).
#[test]
fn gemma3_template_local_and_server_agree() {
    let _serial = serial::lock_blocking();
    let fixture =
        workspace_root().join("tests/fixtures/chat_templates/gemma3/tokenizer_config.json");
    let config: Value = serde_json::from_str(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    let dir = temp::dir("chat-gemma3");
    let template = dir.join("gemma3.jinja");
    std::fs::write(&template, config["chat_template"].as_str().unwrap()).unwrap();
    let json = workspace_root().join(".venv-peers/tokenizer/tokenizer.json");
    std::os::unix::fs::symlink(&json, dir.join("tokenizer.json")).unwrap();
    std::fs::copy(&fixture, dir.join("tokenizer_config.json")).unwrap();
    let server = ModelServer::start_with(
        free_port(),
        &[
            "--threads",
            "1",
            "--chat-template-file",
            template.to_str().unwrap(),
        ],
    );
    let run = run_chat(
        &server.url(),
        "gemma3-server",
        &["--seq-lengths", "32", "64"],
    );
    exact_lengths(&run, &[32, 64], "server_template");
    let run = run_chat(
        &server.url(),
        "gemma3-local",
        &[
            "--seq-lengths",
            "32",
            "64",
            "--tokenizer",
            dir.to_str().unwrap(),
        ],
    );
    exact_lengths(&run, &[32, 64], "local_template");
    let mt_bench = workspace_root().join("tests/fixtures/traces/mt_bench_questions.jsonl");
    let run = run_chat(
        &server.url(),
        "gemma3-multi",
        &[
            "--prompt-file",
            mt_bench.to_str().unwrap(),
            "--multi-turn",
            "--tokenizer",
            dir.to_str().unwrap(),
        ],
    );
    assert_eq!(run.rows.len(), 4, "{}", run.stderr);
    matching_counts(&run, "local_template");
    let _ = std::fs::remove_dir_all(&dir);
}

/// vLLM and SGLang: `POST /tokenize` with `messages` applies the server's template. The scripted
/// server's "template" adds 3 tokens per message and 2 for the generation prompt to the words,
/// in `/tokenize` and in its usage alike; it has no `/apply-template`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_with_messages_on_a_vllm_style_server() {
    let templated = |messages: &Value| -> usize {
        messages.as_array().map_or(0, |m| {
            m.iter()
                .map(|x| {
                    3 + x["content"]
                        .as_str()
                        .unwrap_or("")
                        .split_whitespace()
                        .count()
                })
                .sum::<usize>()
                + 2
        })
    };
    let server = ScriptedServer::start(Arc::new(move |req, _| {
        let b: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        match req.path.as_str() {
            "/tokenize" if b.get("messages").is_some() => Reply::json(200, &serde_json::json!({ "count": templated(&b["messages"]), "tokens": [] }).to_string()),
            "/tokenize" => match b["prompt"].as_str() {
                Some(p) => Reply::json(200, &serde_json::json!({ "count": p.split_whitespace().count() }).to_string()),
                None => Reply::json(400, r#"{"error":{"message":"prompt is required"}}"#),
            },
            "/v1/chat/completions" => {
                let usage = serde_json::json!({ "prompt_tokens": templated(&b["messages"]), "completion_tokens": 1, "total_tokens": 1 });
                let chunk = serde_json::json!({ "choices": [{ "index": 0, "delta": { "content": "ok" }, "finish_reason": "length" }] });
                let body = format!("data: {chunk}\n\ndata: {}\n\ndata: [DONE]\n\n", serde_json::json!({ "choices": [], "usage": usage }));
                Reply::sse(vec![lmperf_e2e::scripted::Frame { at: Duration::ZERO, bytes: body.into_bytes() }])
            }
            _ => Reply::json(404, r#"{"error":{"message":"not found"}}"#),
        }
    }))
    .await;
    let url = server.url();
    let run =
        tokio::task::spawn_blocking(move || run_chat(&url, "vllm", &["--seq-lengths", "20", "50"]))
            .await
            .unwrap();
    assert_eq!(
        run.summary["chat_template"],
        "server: POST /tokenize with messages"
    );
    for r in &run.rows {
        let asked = r["prompt_tokens_target"].as_u64().unwrap();
        assert_eq!(
            (r["prompt_tokens"].as_u64(), r["input_tokens"].as_u64()),
            (Some(asked), Some(asked)),
            "{r}"
        );
    }
    matching_counts(&run, "server_template");
    let with_messages = server
        .requests()
        .iter()
        .filter(|r| {
            r.path == "/tokenize"
                && serde_json::from_slice::<Value>(&r.body).is_ok_and(|b| b["messages"].is_array())
        })
        .count();
    assert!(
        with_messages >= 4,
        "the prompts were sized with /tokenize and messages ({with_messages} calls)"
    );

    // --seq-lengths 3 under a template of 5 tokens around an empty message: warned, and the
    // summary's input_len is the achieved mean, not 3.
    let url = server.url();
    let short =
        tokio::task::spawn_blocking(move || run_chat(&url, "vllm-short", &["--seq-lengths", "3"]))
            .await
            .unwrap();
    assert!(
        short
            .stderr
            .contains("warning: --seq-lengths 3 shorter than the chat template's own 5 tokens"),
        "{}",
        short.stderr
    );
    let sent: Vec<u64> = short
        .rows
        .iter()
        .map(|r| r["prompt_tokens"].as_u64().unwrap())
        .collect();
    let mean = (sent.iter().sum::<u64>() as f64 / sent.len() as f64).round() as u64;
    assert!(mean > 5, "{sent:?}");
    assert_eq!(
        short.summary["benchmarks"][0]["input_len"].as_u64(),
        Some(mean),
        "{}",
        short.summary
    );

    // --chat-template: a file that is no template is refused naming the flag (exit 2); one
    // with completions is refused too (it counts chat requests).
    let dir = temp::dir("chat-bad-template");
    let lmperf = |args: &[&str]| {
        Command::new(lmperf_bin())
            .args([
                "run",
                "--target",
                &server.url(),
                "--model",
                "m",
                "--num-prompts",
                "1",
            ])
            .args(["--output-dir", dir.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap()
    };
    let not_a_template = workspace_root().join("Cargo.toml");
    let chatml = workspace_root().join("tests/fixtures/chat_templates/chatml.jinja");
    for (api, file, code, part) in [
        (
            "chat",
            &not_a_template,
            2,
            "Cargo.toml: not a chat template",
        ),
        ("completions", &chatml, 2, "needs --api chat"),
    ] {
        let out = lmperf(&["--api", api, "--chat-template", file.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert!(
            err.contains("--chat-template") && err.contains(part),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
