//! The server's profiler on a TPOT regression (issue 38.4): `lmperf run --fail-on` and
//! `lmperf compare --fail-on` with `--profile-on-fail FILE` against scripted servers with the
//! upstream profiler endpoints: vLLM's `POST /start_profile` then `POST /stop_profile` after
//! `seconds` (no body), SGLang's `POST /start_profile {output_dir, num_steps, start_step,
//! activities}` that stops by itself, and 404 where the endpoint is off. The profiler is called
//! exactly once per tripped TPOT gate, never for another gate, and its record is in
//! `summary.json` / `compare.json` `server_profile`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
use lmperf_e2e::temp;

/// A chat server (TPOT 20 ms) with a profiler endpoint answering `profiler_status`.
fn server(rt: &tokio::runtime::Runtime, profiler_status: u16) -> ScriptedServer {
    rt.block_on(ScriptedServer::start(Arc::new(move |req, _| {
        match req.path.as_str() {
            "/v1/chat/completions" => Reply::sse(chat_stream(
                4,
                Duration::from_millis(5),
                Duration::from_millis(20),
                4,
            )),
            "/start_profile" | "/stop_profile" if profiler_status == 200 => Reply::json(200, ""),
            _ => Reply::json(404, r#"{"detail":"Not Found"}"#),
        }
    })))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn profiling_file(dir: &Path, table: &str) -> String {
    let f = dir.join("profiling.toml");
    std::fs::write(&f, format!("[profiling]\n{table}")).unwrap();
    f.to_str().unwrap().to_owned()
}

fn run(url: &str, dir: &Path, gates: &[&str], profiling: &str) -> (Option<i32>, String) {
    let out = Command::new(lmperf_bin())
        .args(["run", "--target", url, "--model", "m", "--api", "chat"])
        .args(["--batch-sizes", "1"])
        .args([
            "--seq-lengths",
            "8",
            "--num-prompts",
            "4",
            "--output-len",
            "4",
        ])
        .arg("--output-dir")
        .arg(dir)
        .arg("--fail-on")
        .args(gates)
        .args(["--profile-on-fail", profiling])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

fn profiler_calls(s: &ScriptedServer) -> Vec<(String, std::time::Instant, Vec<u8>)> {
    s.received
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.path.ends_with("_profile"))
        .map(|r| {
            (
                format!("{} {}", r.method, r.path),
                r.arrived,
                r.body.clone(),
            )
        })
        .collect()
}

#[test]
fn a_tpot_gate_calls_the_vllm_profiler_once_start_then_stop_and_records_it() {
    let rt = runtime();
    let s = server(&rt, 200);
    let root = temp::dir("profile-run");
    let f = profiling_file(
        &root,
        "kind = \"vllm\"\nseconds = \"1s\"\noutput_dir = \"/traces\"\non = [\"tpot_regression\"]\n",
    );
    // A TTFT gate alone: no profile.
    let (code, err) = run(&s.url(), &root.join("ttft"), &["ttft_p99_ms>1"], &f);
    assert_eq!(code, Some(3), "{err}");
    assert!(profiler_calls(&s).is_empty(), "{err}");
    assert!(summary(&root.join("ttft")).get("server_profile").is_none());
    // TPOT 20 ms against a 5 ms gate: start, 1 s, stop; once.
    let (code, err) = run(&s.url(), &root.join("tpot"), &["tpot_mean_ms>5"], &f);
    assert_eq!(code, Some(3), "{err}");
    let calls = profiler_calls(&s);
    let names: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        names,
        ["POST /start_profile", "POST /stop_profile"],
        "{err}"
    );
    assert!(
        calls.iter().all(|c| c.2.is_empty()),
        "vLLM's endpoints take no body"
    );
    assert!(calls[1].1.duration_since(calls[0].1) >= Duration::from_secs(1));
    let p = &summary(&root.join("tpot"))["server_profile"];
    assert_eq!(p["kind"], "vllm");
    assert_eq!(p["trigger"], "tpot_regression");
    assert_eq!(p["outcome"], "done", "{p}");
    assert_eq!(p["detail"], "stopped after 1 s");
    assert_eq!(p["output_dir"], "/traces");
    assert!(
        p["reason"].as_str().unwrap().contains("tpot_mean_ms>5"),
        "{p}"
    );
    assert!(
        err.contains("profiler vllm") && err.contains("/traces"),
        "{err}"
    );
}

/// SGLang's body as upstream's `ProfileReqInput` reads it; a server without the endpoint
/// (404) is `unsupported`; a profiling file without `tpot_regression` in `on` calls nothing.
#[test]
fn compare_calls_sglang_with_its_request_body_and_says_404_once() {
    let rt = runtime();
    let root = temp::dir("profile-compare");
    let ok = server(&rt, 200);
    let (base, new) = (root.join("base"), root.join("new"));
    let (code, err) = run(&ok.url(), &base, &["error_rate>0.5"], "/nonexistent.toml");
    assert_eq!(
        code,
        Some(2),
        "a missing --profile-on-fail file is a bad flag: {err}"
    );
    assert!(
        err.contains("--profile-on-fail") && err.contains("/nonexistent.toml"),
        "{err}"
    );
    let none = profiling_file(&root, "kind = \"sglang\"\non = [\"root_confirmed\"]\n");
    for d in [&base, &new] {
        let (code, err) = run(&ok.url(), d, &["error_rate>0.5"], &none);
        assert_eq!(code, Some(0), "{err}");
    }
    // The new run's TPOT made worse by hand: every row +10 ms.
    let rows = std::fs::read_to_string(new.join("requests.jsonl")).unwrap();
    let slower: String = rows
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let t = v["tpot_ms"].as_f64().unwrap();
            v["tpot_ms"] = (t + 10.0).into();
            format!("{v}\n")
        })
        .collect();
    std::fs::write(new.join("requests.jsonl"), slower).unwrap();
    let compare = |url: &str, table: &str, out: &str| {
        let mut cfg = format!(
            "kind = \"sglang\"\nnum_steps = 5\noutput_dir = \"/tmp/sgl\"\nurl = \"{url}\"\n"
        );
        cfg.push_str(table);
        let f = profiling_file(&root, &cfg);
        let o = Command::new(lmperf_bin())
            .arg("compare")
            .args([&base, &new])
            .args(["--output-dir", root.join(out).to_str().unwrap()])
            .args(["--fail-on", "tpot_mean:+20%", "--profile-on-fail", &f])
            .output()
            .unwrap();
        let c: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.join(out).join("compare.json")).unwrap(),
        )
        .unwrap();
        (
            o.status.code(),
            c,
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, c, err) = compare(&ok.url(), "on = [\"tpot_regression\"]\n", "cmp");
    assert_eq!(code, Some(3), "{err}");
    let calls = profiler_calls(&ok);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0, "POST /start_profile");
    let body: serde_json::Value = serde_json::from_slice(&calls[0].2).unwrap();
    assert_eq!(body["num_steps"], 5);
    assert_eq!(body["output_dir"], "/tmp/sgl");
    assert!(
        body["activities"].is_array() && body.get("start_step").is_some(),
        "{body}"
    );
    assert_eq!(c["server_profile"]["outcome"], "done", "{c}");
    assert_eq!(c["server_profile"]["kind"], "sglang");
    // A server whose profiler is off: 404 is `unsupported`, said in the record.
    let off = server(&rt, 404);
    let (code, c, err) = compare(&off.url(), "on = [\"tpot_regression\"]\n", "cmp404");
    assert_eq!(code, Some(3), "{err}");
    assert_eq!(c["server_profile"]["outcome"], "unsupported", "{c}");
    assert!(
        c["server_profile"]["detail"]
            .as_str()
            .unwrap()
            .contains("404"),
        "{c}"
    );
    assert_eq!(profiler_calls(&off).len(), 1);
}

/// `lmperf compare` of two real torch.profiler traces (tests/fixtures/torch_traces): the slowed
/// layer first on the terminal, in compare.json and compare.html (next to NEW by default);
/// gates are refused for traces.
#[test]
fn compare_of_two_traces_names_the_slowed_module_first() {
    let root = temp::dir("trace-compare");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch_traces");
    let (base, slow) = (root.join("base.json.gz"), root.join("slow.json.gz"));
    std::fs::copy(fixtures.join("base.json.gz"), &base).unwrap();
    std::fs::copy(fixtures.join("slow.json.gz"), &slow).unwrap();
    let o = Command::new(lmperf_bin())
        .args(["compare", base.to_str().unwrap(), slow.to_str().unwrap()])
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{err}");
    let first = out.lines().nth(2).unwrap_or_default();
    assert!(
        first
            .trim_start()
            .starts_with("Model_0/DecoderLayer_2/Attention_2 "),
        "{out}"
    );
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("compare.json")).unwrap()).unwrap();
    assert_eq!(
        c["top_regression"]["name"],
        "Model_0/DecoderLayer_2/Attention_2"
    );
    assert!(root.join("compare.html").is_file());
    let o = Command::new(lmperf_bin())
        .args(["compare", base.to_str().unwrap(), slow.to_str().unwrap()])
        .args(["--fail-on", "tpot_mean:+5%"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}
