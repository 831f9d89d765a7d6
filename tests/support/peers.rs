//! The real third-party peers installed by `tests/peers/install.sh`: llama.cpp's server
//! (xllamacpp) with Gemma 3 270M, and the rotel OpenTelemetry collector.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agent::workspace_root;

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn venv_ready() {
    let root = workspace_root();
    assert!(
        root.join(".venv-peers/bin/python").exists(),
        "the real peers are not installed: run tests/peers/install.sh (cargo xtask ci does)"
    );
}

fn kill_term(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// llama.cpp's server with Gemma 3 270M (model id `gemma-3-270m`).
pub struct ModelServer {
    child: Child,
    pub port: u16,
}

impl ModelServer {
    pub fn start() -> Self {
        Self::start_with(free_port(), &[])
    }

    /// Starts it on `port` with extra `model-server.py` arguments (`--alias`, `--parallel`, …).
    pub fn start_with(port: u16, args: &[&str]) -> Self {
        venv_ready();
        let mut child = Command::new("python3")
            .arg(workspace_root().join("tests/peers/model-server.py"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("start model server");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("READY") {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(120)).is_err() {
            let _ = child.kill();
            panic!("model server did not become ready on port {port}");
        }
        Self { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends SIGTERM and waits at most `timeout` for the exit: its status and how long it took.
    pub fn terminate(&mut self, timeout: Duration) -> Option<(std::process::ExitStatus, Duration)> {
        let t = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        while t.elapsed() < timeout {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some((s, t.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills it with SIGKILL (no graceful exit: as an OOM kill or a crash ends it) and waits
    /// for the exit.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server's own Prometheus counters (`llamacpp:*`).
    pub fn metrics(&self) -> String {
        crate::agent::http_get(SocketAddr::from(([127, 0, 0, 1], self.port)), "/metrics").1
    }
}

/// The model server that tests with its default arguments share, started on first use.
static SHARED: std::sync::OnceLock<ModelServer> = std::sync::OnceLock::new();

/// The real model server with default arguments, one for the whole test process: tests that
/// need no arguments of their own use it instead of starting one each (5–10 s each on 2
/// cores). Use it only while holding the serial lock (`serial::lock`), so one test at a time
/// sends to it. Started on first use on port 8000 when that is free (vLLM's default port,
/// which `launch`'s default-target test needs), else on a free port; it exits with this test
/// process (`model-server.py` watches its parent). Returns once the server has no request in
/// progress or deferred (a previous test's last requests are finished), at most 60 s.
pub fn shared_model_server() -> &'static ModelServer {
    let server = SHARED.get_or_init(|| {
        let port = if TcpListener::bind(("127.0.0.1", 8000)).is_ok() {
            8000
        } else {
            free_port()
        };
        ModelServer::start_with(port, &[])
    });
    server.wait_idle(Duration::from_secs(60));
    server
}

impl ModelServer {
    /// Waits until the server's `llamacpp:requests_processing` and `requests_deferred` are 0,
    /// at most `timeout`; false if they were not.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let t = Instant::now();
        loop {
            let m = self.metrics();
            let busy = ["llamacpp:requests_processing", "llamacpp:requests_deferred"]
                .iter()
                .map(|n| crate::prom_text::first(&m, n, &[]).unwrap_or(0.0))
                .sum::<f64>();
            if busy == 0.0 && m.contains("llamacpp:requests_processing") {
                return true;
            }
            if t.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        kill_term(&mut self.child);
    }
}

/// One span as rotel's debug exporter printed it.
#[derive(Debug, Clone, Default)]
pub struct PrintedSpan {
    pub trace_id: String,
    pub name: String,
    pub kind: String,
    pub status: String,
    /// Attribute → printed value, e.g. `Int(16)`, `Str(chat)`, `Double(0.1)`.
    pub attributes: BTreeMap<String, String>,
    /// Resource attributes of its batch.
    pub resource: BTreeMap<String, String>,
}

/// The rotel collector (OTLP gRPC + HTTP receivers, debug printing).
pub struct Collector {
    child: Child,
    pub grpc: u16,
    pub http: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

/// The `rotel-agent` executable inside the peers' virtual environment.
pub fn rotel_agent() -> std::path::PathBuf {
    venv_ready();
    let lib = workspace_root().join(".venv-peers/lib");
    std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path().join("site-packages/rotel/rotel-agent"))
        .find(|p| p.exists())
        .expect("rotel-agent in .venv-peers")
}

/// rotel with the blackhole exporter and no printing: a fast real OTLP receiver.
pub struct QuietCollector {
    child: Child,
}

impl QuietCollector {
    pub fn start(grpc: u16, http: u16) -> Self {
        let child = Command::new(rotel_agent())
            .args([
                "start",
                "--otlp-grpc-endpoint",
                &format!("127.0.0.1:{grpc}"),
                "--otlp-http-endpoint",
                &format!("127.0.0.1:{http}"),
                "--exporter",
                "blackhole",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("start rotel");
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", grpc)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "rotel did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child }
    }
}

impl Drop for QuietCollector {
    fn drop(&mut self) {
        kill_term(&mut self.child);
    }
}

impl Collector {
    pub fn start() -> Self {
        venv_ready();
        let (grpc, http) = (free_port(), free_port());
        let mut child = Command::new("bash")
            .arg(workspace_root().join("tests/peers/collector.sh"))
            .args([
                "--grpc",
                &format!("127.0.0.1:{grpc}"),
                "--http",
                &format!("127.0.0.1:{http}"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("start collector");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let out = child.stdout.take().expect("stdout");
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(mut g) = l.lock() {
                    g.push(line);
                }
            }
        });
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", http)).is_err()
            || TcpStream::connect(("127.0.0.1", grpc)).is_err()
        {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "collector did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            grpc,
            http,
            lines,
        }
    }

    pub fn text(&self) -> String {
        self.lines.lock().map(|g| g.join("\n")).unwrap_or_default()
    }

    /// Every span printed so far.
    pub fn spans(&self) -> Vec<PrintedSpan> {
        parse_spans(&self.text())
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        kill_term(&mut self.child);
    }
}

fn attr_line(l: &str) -> Option<(String, String)> {
    let rest = l.trim_start().strip_prefix("-> ")?;
    let (k, v) = rest.split_once(": ")?;
    Some((k.to_owned(), v.to_owned()))
}

/// Parses rotel's `--debug-log-verbosity detailed` span output.
pub fn parse_spans(text: &str) -> Vec<PrintedSpan> {
    #[derive(PartialEq)]
    enum Sec {
        None,
        Resource,
        Span,
        Attrs,
        Other,
    }
    let mut out = Vec::new();
    let mut resource = BTreeMap::new();
    let mut cur: Option<PrintedSpan> = None;
    let mut sec = Sec::None;
    for l in text.lines() {
        let t = l.trim();
        if t.starts_with("ResourceSpans #")
            || t.starts_with("ResourceMetrics #")
            || t.starts_with("ResourceLog")
        {
            out.extend(cur.take());
            resource = BTreeMap::new();
            sec = if t.starts_with("ResourceSpans") {
                Sec::Resource
            } else {
                Sec::Other
            };
            continue;
        }
        if t == "Resource attributes:" {
            continue;
        }
        if t.starts_with("Span #") {
            out.extend(cur.take());
            cur = Some(PrintedSpan {
                resource: resource.clone(),
                ..PrintedSpan::default()
            });
            sec = Sec::Span;
            continue;
        }
        if t == "Attributes:" && cur.is_some() {
            sec = Sec::Attrs;
            continue;
        }
        if t == "Events:"
            || t == "Links:"
            || t.starts_with("ScopeSpans")
            || t.starts_with("InstrumentationScope")
        {
            if t.starts_with("ScopeSpans") || t.starts_with("InstrumentationScope") {
                out.extend(cur.take());
            }
            if sec == Sec::Attrs || sec == Sec::Span {
                sec = Sec::Other;
            }
            continue;
        }
        match sec {
            Sec::Resource => {
                if let Some((k, v)) = attr_line(l) {
                    resource.insert(k, v);
                }
            }
            Sec::Span => {
                if let Some(c) = cur.as_mut()
                    && let Some((k, v)) = t.split_once(':')
                {
                    let v = v.trim().to_owned();
                    match k.trim() {
                        "Trace ID" => c.trace_id = v,
                        "Name" => c.name = v,
                        "Kind" => c.kind = v,
                        "Status code" => c.status = v,
                        _ => {}
                    }
                }
            }
            Sec::Attrs => {
                if let (Some(c), Some((k, v))) = (cur.as_mut(), attr_line(l)) {
                    c.attributes.insert(k, v);
                }
            }
            _ => {}
        }
    }
    out.extend(cur);
    out
}

/// The inner value of a printed attribute: `Int(16)` → `16`.
pub fn inner(v: &str) -> &str {
    v.split_once('(')
        .map(|(_, r)| r.strip_suffix(')').unwrap_or(r))
        .unwrap_or(v)
}

/// vllm-router's command line (`.venv-serving/bin/vllm-router`, `bin`): listening on
/// 127.0.0.1:`port`, routing to `workers` by `policy`, its Prometheus page on 127.0.0.1:`prom`,
/// its output to `log`.
pub fn vllm_router_command(
    bin: &std::path::Path,
    (port, prom): (u16, u16),
    workers: &[String],
    policy: &str,
    log: std::fs::File,
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .arg("--worker-urls")
        .args(workers)
        .args(["--policy", policy, "--prometheus-host", "127.0.0.1"])
        .args(["--prometheus-port", &prom.to_string()])
        .stdin(Stdio::null());
    if let Ok(out) = log.try_clone() {
        cmd.stdout(out);
    }
    cmd.stderr(log);
    cmd
}
