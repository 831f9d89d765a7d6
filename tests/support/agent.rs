//! Runs the real `lmperf` binary as a child process and talks to its admin HTTP.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// `target/debug/lmperf`, next to this test binary (`target/debug/deps/…`); `LMPERF_BIN`
/// overrides it (a benchmark's harness built in another profile than the agent it measures).
pub fn lmperf_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("LMPERF_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("lmperf");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p lmperf` first (`--release` for benchmarks; cargo xtask ci builds the debug one)",
        bin.display()
    );
    bin
}

/// A running agent; killed when dropped.
pub struct Agent {
    child: Child,
    pub admin: SocketAddr,
    /// Its own `XDG_RUNTIME_DIR`, so that agents running at once do not share the default
    /// control socket (`<dir>/lmperf/control.sock`); removed when dropped.
    pub runtime_dir: PathBuf,
    pub stdout: Arc<Mutex<Vec<String>>>,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

fn pump(
    r: impl Read + Send + 'static,
    into: Arc<Mutex<Vec<String>>>,
    started: Option<std::sync::mpsc::Sender<SocketAddr>>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            // `admin=ADDR` in a text line, `"admin":"ADDR"` in a JSON line (`--log-format json`).
            if let Some(tx) = &started
                && line.contains("Agent started.")
                && let Some(a) = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("admin="))
                    .or_else(|| {
                        let (_, rest) = line.split_once("\"admin\":\"")?;
                        rest.split('"').next()
                    })
                && let Ok(addr) = a.parse()
            {
                let _ = tx.send(addr);
            }
            if let Ok(mut g) = into.lock() {
                g.push(line);
            }
        }
    });
}

impl Agent {
    /// Starts `lmperf agent ARGS` (with `--admin-addr 127.0.0.1:0` unless given) and waits for
    /// its "Agent started." line. Panics with the agent's stderr if it does not start.
    pub fn spawn(args: &[&str], envs: &[(&str, &str)]) -> Agent {
        Self::spawn_wrapped(&[], args, envs)
    }

    /// As [`Agent::spawn`], run through `wrapper` (e.g. `setpriv … --`) when not empty.
    pub fn spawn_wrapped(wrapper: &[&str], args: &[&str], envs: &[(&str, &str)]) -> Agent {
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(lmperf_bin());
                c
            }
            None => Command::new(lmperf_bin()),
        };
        cmd.arg("agent").args(args);
        if !args.contains(&"--admin-addr") {
            cmd.args(["--admin-addr", "127.0.0.1:0"]);
        }
        cmd.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
            .env_remove("LMPERF_API_KEY");
        cmd.env("RUST_LOG", "info");
        static SPAWNED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let runtime_dir = std::env::temp_dir().join(format!(
            "lmperf-test-run-{}-{}",
            std::process::id(),
            SPAWNED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::create_dir_all(&runtime_dir);
        cmd.env("XDG_RUNTIME_DIR", &runtime_dir);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = cmd.spawn().expect("spawn lmperf");
        let stdout: Arc<Mutex<Vec<String>>> = Arc::default();
        let stderr: Arc<Mutex<Vec<String>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        pump(child.stdout.take().expect("stdout"), stdout.clone(), None);
        pump(
            child.stderr.take().expect("stderr"),
            stderr.clone(),
            Some(tx),
        );
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(admin) => Agent {
                child,
                admin,
                runtime_dir,
                stdout,
                stderr,
            },
            Err(_) => {
                let _ = child.kill();
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "agent did not start; stderr:\n{}",
                    stderr.lock().map(|g| g.join("\n")).unwrap_or_default()
                );
            }
        }
    }

    /// `GET path` on the admin server: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path)
    }

    /// The `/api/v1/status` document.
    pub fn status(&self) -> serde_json::Value {
        let (code, body) = self.get("/api/v1/status");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("status JSON")
    }

    /// Waits until `pred(status)` holds or `timeout` passes; returns the last status.
    pub fn wait_status(
        &self,
        timeout: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let t = Instant::now();
        loop {
            let s = self.status();
            if pred(&s) || t.elapsed() > timeout {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The agent's default control socket (`<its XDG_RUNTIME_DIR>/lmperf/control.sock`).
    pub fn control_socket(&self) -> PathBuf {
        self.runtime_dir.join("lmperf/control.sock")
    }

    /// `lmperf ctl --addr unix:<its control socket> ARGS`, without a control token from the
    /// environment: (exit code, -1 for a signal; stdout; stderr).
    pub fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(lmperf_bin())
            .args(["ctl", "--addr"])
            .arg(format!("unix:{}", self.control_socket().display()))
            .args(args)
            .env_remove("LMPERF_CONTROL_TOKEN")
            .output()
            .expect("run lmperf ctl");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The requests the agent keeps (`lmperf ctl --json recent --limit 4096 ARGS`), oldest
    /// first; panics unless `ctl` succeeds.
    pub fn recent(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let mut all = vec!["--json", "recent", "--limit", "4096"];
        all.extend_from_slice(args);
        let (code, out, err) = self.ctl(&all);
        assert_eq!(code, 0, "lmperf ctl recent: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("ctl recent JSON");
        v["requests"].as_array().cloned().unwrap_or_default()
    }

    /// SIGTERM, then waits up to `timeout` for the exit off the async runtime; returns the exit
    /// code (`None`: still running, or ended by a signal) and the agent, for its logs.
    pub async fn stop(mut self, timeout: Duration) -> (Option<i32>, Agent) {
        self.sigterm();
        tokio::task::spawn_blocking(move || {
            let code = self.wait_exit(timeout).and_then(|s| s.code());
            (code, self)
        })
        .await
        .expect("the wait task")
    }

    pub fn sigterm(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// Waits for the exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if let Ok(Some(s)) = self.child.try_wait() {
                // Let the pump threads drain.
                std::thread::sleep(Duration::from_millis(100));
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().map(|g| g.join("\n")).unwrap_or_default()
    }

    pub fn stdout_text(&self) -> String {
        self.stdout.lock().map(|g| g.join("\n")).unwrap_or_default()
    }

    /// Resident set size in KiB, from /proc.
    pub fn rss_kib(&self) -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
    }
}

/// A minimal blocking HTTP/1.1 GET: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, None)
}

/// A minimal blocking HTTP/1.1 POST of a JSON body: (status, body).
pub fn http_post_json(addr: SocketAddr, path: &str, json: &str) -> (u16, String) {
    http_request(addr, "POST", path, Some(json))
}

fn http_request(addr: SocketAddr, method: &str, path: &str, json: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let body = json.map_or(String::new(), |j| {
        format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{j}",
            j.len()
        )
    });
    let end = if json.is_some() { "" } else { "\r\n" };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{body}{end}"
    )
    .expect("write");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (code, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// Sum of a Prometheus counter's samples whose line matches all `labels` (`k="v"`): the
/// name the tests import ([`crate::prom_text::sum`]).
pub use crate::prom_text::sum as prom_sum;
