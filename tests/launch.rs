//! `lmperf run` as the seed command is written: `--launch` starts the real llama.cpp server
//! through the command template (and stops it), and without `--target` the run goes to
//! `OPENAI_BASE_URL` or vLLM's default port 8000; nothing answering is one error line.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::{lmperf_bin, workspace_root};
use lmperf_e2e::peers::shared_model_server;
use lmperf_e2e::peers::{ModelServer, free_port};
use lmperf_e2e::serial;
use lmperf_e2e::temp;
use serde_json::Value;

fn summary(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// The pid a launched server's `echo $$ > FILE` wrote.
fn pid_in(file: &Path) -> i32 {
    std::fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"))
}

/// The seed command's flags; `LMPERF_SEED_FULL=1` runs it exactly as written (`--seq-lengths
/// 512 1024`, 200 prompts of 128 output tokens per benchmark, ~30 min on 2 cores), else its
/// grid (batch sizes 1 4 8 × two sequence lengths: six benchmarks) with 2 prompts of 64 and
/// 128 tokens, 8 output tokens each. What this test proves is `--launch` (start, readiness,
/// warm-up, every benchmark, `server.log`, `summary.json`, stop): at 512 and 1,024 tokens the
/// prefill was 66 of its 83 s (one llama.cpp thread, ~140 prompt tokens/s). Long prompts on
/// the real server, calibrated to the exact length, are `workload::trace_on_the_real_server`'s
/// (374–879 tokens).
fn seed_args(dir: &Path) -> Vec<String> {
    let full = seed_full();
    let mut a: Vec<String> = [
        "run",
        "--model",
        "gemma-3-270m",
        "--batch-sizes",
        "1",
        "4",
        "8",
        "--seq-lengths",
    ]
    .map(String::from)
    .to_vec();
    a.extend(seed_lengths().map(String::from));
    if full {
        a.extend(["--num-prompts", "200"].map(String::from));
    } else {
        a.extend(["--num-prompts", "2", "--output-len", "8"].map(String::from));
    }
    a.extend(["--output-dir".into(), dir.display().to_string()]);
    a
}

/// A `--launch` template of a "server" that never answers and writes its pid to `pid_file`.
fn sleeping_server(pid_file: &Path) -> String {
    format!(
        "sh -c 'echo $$ > {}; exec sleep 600' # {{port}}",
        pid_file.display()
    )
}

/// `lmperf run --model m --launch TEMPLATE --output-dir DIR EXTRA…`.
fn launch_run(template: &str, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(lmperf_bin());
    cmd.args([
        "run",
        "--model",
        "m",
        "--launch",
        template,
        "--output-dir",
        dir.to_str().unwrap(),
    ])
    .args(extra);
    cmd
}

/// `LMPERF_SEED_FULL=1`: the seed command exactly as written.
fn seed_full() -> bool {
    std::env::var("LMPERF_SEED_FULL").is_ok_and(|v| v == "1")
}

/// The two `--seq-lengths` of [`seed_args`] (tokens).
fn seed_lengths() -> [&'static str; 2] {
    if seed_full() {
        ["512", "1024"]
    } else {
        ["64", "128"]
    }
}

fn check_seed_outputs(dir: &Path) {
    let s = summary(dir);
    let benches = s["benchmarks"].as_array().unwrap();
    assert_eq!(benches.len(), 6, "1 4 8 × two sequence lengths");
    // The whole grid, each benchmark once: concurrency × sequence length.
    let mut names: Vec<&str> = benches
        .iter()
        .map(|b| b["benchmark"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    let mut want: Vec<String> = seed_lengths()
        .iter()
        .flat_map(|l| ["1", "4", "8"].map(|c| format!("c{c}_in{l}")))
        .collect();
    want.sort_unstable();
    assert_eq!(names, want, "the seed's grid");
    for b in benches {
        assert_eq!(b["completed"], b["num_requests"], "{b}");
        assert!(b["num_requests"].as_u64().unwrap() >= 2);
    }
    assert_eq!(s["model"], "gemma-3-270m");
}

/// Acceptance: the seed command with `--launch "<the test model server command>"` and
/// `--model` the test model: the server starts on a free port, is warmed up, every benchmark
/// runs, `server.log` and `summary.json` `server` say what ran, and the server is gone after.
#[test]
fn seed_command_launches_the_real_server_and_stops_it() {
    let _serial = serial::lock_blocking();
    let dir = temp::dir("launch-seed");
    let pid_file = dir.with_extension("pid");
    let script = workspace_root().join("tests/peers/model-server.py");
    // `echo $$; exec`: the server keeps the shell's pid, so the test can look for it after.
    let template = format!(
        "sh -c 'echo $$ > {}; exec python3 {} --host 127.0.0.1 --port {{port}} --alias {{model}}'",
        pid_file.display(),
        script.display()
    );
    let t = Instant::now();
    let out = Command::new(lmperf_bin())
        .args(seed_args(&dir))
        .args(["--launch", &template])
        .env_remove("OPENAI_BASE_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    check_seed_outputs(&dir);
    let s = summary(&dir);
    let server = &s["launch"];
    let port = server["port"].as_u64().unwrap();
    assert_eq!(server["launcher"], "command");
    assert!(
        server["command"]
            .as_str()
            .unwrap()
            .contains(&format!("--port {port} --alias gemma-3-270m")),
        "{server}"
    );
    assert_eq!(s["target"], format!("http://127.0.0.1:{port}/"));
    let startup = server["startup_s"].as_f64().unwrap();
    assert!(
        startup > 0.0 && startup < t.elapsed().as_secs_f64(),
        "{server}"
    );
    assert!(server["warmup_s"].as_f64().unwrap() > 0.0);
    assert!(
        server["version"].as_str().is_some_and(|v| !v.is_empty()),
        "llama.cpp's /props build_info: {server}"
    );
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    assert!(
        log.contains(&format!("READY http://127.0.0.1:{port}")),
        "server.log holds the server's output: {log}"
    );
    assert!(stderr.contains("server stopped"), "{stderr}");
    let pid = pid_in(&pid_file);
    assert!(!pid_alive(pid), "the launched server {pid} must be stopped");
    assert!(
        TcpStream::connect(("127.0.0.1", port as u16)).is_err(),
        "nothing listens on {port} after the run"
    );
    let _ = std::fs::remove_file(pid_file);
}

/// Acceptance: `lmperf run` without `--target` or `--launch` goes to a server on port 8000
/// (vLLM's default), and `OPENAI_BASE_URL` (with `/v1`) takes precedence over that default.
/// One small benchmark each: the seed command's own flags run in full in the `--launch` test,
/// and the target is resolved before, and apart from, the benchmarks.
#[test]
fn seed_command_without_target_uses_port_8000_and_openai_base_url() {
    let _serial = serial::lock_blocking();
    // The shared server is on port 8000 unless something else held it when it started.
    let server = shared_model_server();
    if server.port == 8000 {
        // No --target, no OPENAI_BASE_URL: port 8000. One small benchmark (the seed's six
        // benchmarks run in the `--launch` test; the default target is what this one checks).
        let dir = temp::dir("launch-8000");
        let out = small_run(&dir, None);
        check_small_run(&out, &dir);
        assert_eq!(summary(&dir)["target"], "http://127.0.0.1:8000/");
    } else {
        eprintln!("port 8000 is taken on this machine: testing the OPENAI_BASE_URL path only");
    }
    // OPENAI_BASE_URL wins over the default: a dead one fails even while 8000 answers.
    let dead = free_port();
    let dir = temp::dir("launch-dead");
    let out = small_run(&dir, Some(format!("http://127.0.0.1:{dead}/v1")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&format!("nothing answers at http://127.0.0.1:{dead}/"))
            && err.contains("--target")
            && err.contains("--launch"),
        "{err}"
    );
    // And a live one is used.
    let dir = temp::dir("launch-env");
    let out = small_run(&dir, Some(format!("{}/v1", server.url())));
    check_small_run(&out, &dir);
    assert_eq!(summary(&dir)["target"], format!("{}/", server.url()));
}

/// One small benchmark without `--target`, `OPENAI_BASE_URL` set to `base_url` (unset: `None`).
fn small_run(dir: &Path, base_url: Option<String>) -> std::process::Output {
    let mut cmd = Command::new(lmperf_bin());
    cmd.args([
        "run",
        "--model",
        "gemma-3-270m",
        "--batch-sizes",
        "1",
        "--seq-lengths",
        "64",
        "--num-prompts",
        "2",
        "--output-len",
        "4",
        "--output-dir",
        dir.to_str().unwrap(),
    ]);
    match base_url {
        Some(u) => cmd.env("OPENAI_BASE_URL", u),
        None => cmd.env_remove("OPENAI_BASE_URL"),
    };
    cmd.output().unwrap()
}

/// `small_run`'s run succeeded: its one benchmark, both requests completed.
fn check_small_run(out: &std::process::Output, dir: &Path) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(dir);
    let b = &s["benchmarks"][0];
    assert!(b["completed"] == 2 && b["num_requests"] == 2, "{b}");
}

/// Ctrl-C while the server starts: lmperf stops it (SIGTERM to its process group) and exits 1
/// with one line; the server process is gone.
#[test]
fn ctrl_c_while_the_server_starts_stops_it() {
    let dir = temp::dir("launch-ctrlc");
    let pid_file = dir.join("pid");
    let template = sleeping_server(&pid_file);
    let mut child = launch_run(&template, &dir, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !pid_file.exists() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let pid = pid_in(&pid_file);
    assert!(pid_alive(pid));
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "lmperf did not exit after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("interrupted") && err.contains("server stopped"),
        "{err}"
    );
    assert!(!pid_alive(pid), "the launched server {pid} must be stopped");
}

/// A server that exits before it answers, or never answers within --launch-timeout: one
/// error line each, and nothing left running.
#[test]
fn a_server_that_dies_or_never_answers_is_one_error_line() {
    let dir = temp::dir("launch-dies");
    let out = Command::new(lmperf_bin())
        .args([
            "run",
            "--model",
            "m",
            "--launch",
            "sh -c 'echo no such model >&2; exit 3' # {port}",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("lmperf run: --launch"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("exited (exit status: 3)") && line.contains("no such model"),
        "{line}"
    );

    let dir = temp::dir("launch-slow");
    let pid_file = dir.join("pid");
    let template = sleeping_server(&pid_file);
    let t = Instant::now();
    let out = launch_run(&template, &dir, &["--launch-timeout", "1s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no answer from the server") && err.contains("--launch-timeout"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let pid = pid_in(&pid_file);
    assert!(!pid_alive(pid), "the launched server {pid} must be stopped");
}

#[test]
fn launch_without_model_or_with_target_exits_2() {
    for args in [
        vec!["--launch", "vllm"],
        vec![
            "--launch",
            "vllm",
            "--model",
            "m",
            "--target",
            "http://127.0.0.1:9",
        ],
        vec!["--launch", "serve", "--model", "m"],
    ] {
        let out = Command::new(lmperf_bin())
            .args(["run", "--output-dir", "/tmp/x"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("--launch") || err.contains("--model"),
            "{args:?}: {err}"
        );
    }
}

/// The test model server exits at once on SIGTERM, also while it generates: llama.cpp's
/// server waits for its requests in progress when it is destroyed, which made `lmperf run
/// --launch`'s stop wait its 10 s grace and then SIGKILL it.
#[test]
fn the_model_server_exits_promptly_on_sigterm_while_it_generates() {
    let _serial = serial::lock_blocking();
    use std::io::{Read, Write};
    let mut server = ModelServer::start();
    let port = server.port;
    // A generation of 4000 tokens (minutes on 2 cores), streamed.
    let client = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let body =
            r#"{"prompt":"Once upon a time","max_tokens":4000,"ignore_eos":true,"stream":true}"#;
        write!(s, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
        let mut buf = [0u8; 4096];
        let mut got = 0;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            got += n;
        }
        got
    });
    // Generating: its slot is busy.
    let t = Instant::now();
    while !server
        .metrics()
        .lines()
        .any(|l| l.starts_with("llamacpp:requests_processing") && l.trim_end().ends_with(" 1"))
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the request never started: {}",
            server.metrics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, took) = server
        .terminate(Duration::from_secs(10))
        .expect("exits on SIGTERM within 10 s");
    assert_eq!(status.code(), Some(0));
    // Far below the 10 s grace the bug waited; 5 s holds with a CPU hog beside the server
    // (exiting is a few ms of work, but each wake-up may wait for a core).
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM"
    );
    assert!(client.join().unwrap() > 0, "the stream had started");
}
