//! `cargo xtask demo [--seconds N]`: the whole pipeline on one machine, with real peers.
//!
//! Installs the peers, builds lmperf, then starts on free 127.0.0.1 ports:
//! the llama.cpp model server (Gemma 3 270M), the rotel OTLP collector and
//! `lmperf agent --console` exporting to the collector over http/protobuf. The agent's
//! per-request `span ...` lines and the span names the collector receives are printed
//! live. After N seconds, or on Ctrl-C / SIGTERM / SIGHUP, it prints the agent's
//! /api/v1/status, stops every child (SIGTERM, then SIGKILL after a grace period) and
//! prints a summary. Logs: target/demo/collector.log, target/demo/model-server.log.
//!
//! The children run in their own process groups so that a terminal Ctrl-C reaches only
//! this process, which then shuts them down in order (agent first, so its last export
//! reaches the collector). Unix only.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const COLLECTOR_TIMEOUT: Duration = Duration::from_secs(30);
/// The agent drains in-flight canaries for up to its shutdown_timeout (8 s) on SIGTERM.
const AGENT_GRACE: Duration = Duration::from_secs(15);
const PEER_GRACE: Duration = Duration::from_secs(10);
const SPAN_NAME_MARK: &str = "Name           :";

pub fn run(args: &[String]) -> Result<()> {
    let seconds = parse_args(args)?;
    let root = crate::root();

    crate::step("[1/3] tests/peers/install.sh", crate::install_peers_cmd())?;
    let mut build = crate::cargo();
    build.args(["build", "-p", "lmperf"]);
    crate::step("[2/3] cargo build -p lmperf", build)?;
    println!("\n==> [3/3] model server + collector + agent");

    let logs = root.join("target/demo");
    fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    signals::install();

    // Every child goes into `procs` as soon as it is spawned; its Drop stops them on any
    // exit path (error, panic, normal end).
    let mut procs = Procs::default();
    let [model_port, grpc_port, http_port, admin_port] = free_ports()?;

    // 1. Model server: wait for its READY line on stdout.
    let python = root.join(".venv-peers/bin/python");
    let model_log = File::create(logs.join("model-server.log"))?;
    let mut cmd = Command::new(&python);
    cmd.arg(root.join("tests/peers/model-server.py"))
        .args(["--host", "127.0.0.1", "--port", &model_port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(model_log);
    let mut model = procs.spawn("model server", cmd)?;
    let ready = wait_ready(
        model.stdout.take().expect("piped"),
        READY_TIMEOUT,
        &mut procs,
    )?;
    println!("model server: {ready}  (log: target/demo/model-server.log)");

    // 2. Collector: full output to collector.log, span names to the terminal.
    let collector_log = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(logs.join("collector.log"))?;
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("tests/peers/collector.sh"))
        .args([
            "--grpc",
            &format!("127.0.0.1:{grpc_port}"),
            "--http",
            &format!("127.0.0.1:{http_port}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(collector_log.try_clone()?);
    let mut collector = procs.spawn("collector", cmd)?;
    let spans_received = Arc::new(AtomicUsize::new(0));
    let collector_done = tee_collector(
        collector.stdout.take().expect("piped"),
        collector_log,
        spans_received.clone(),
    );
    wait_tcp(
        SocketAddr::from(([127, 0, 0, 1], http_port)),
        COLLECTOR_TIMEOUT,
        &mut procs,
        "collector",
    )?;
    println!(
        "collector: OTLP grpc 127.0.0.1:{grpc_port}, http 127.0.0.1:{http_port}  (log: target/demo/collector.log)"
    );

    // 3. Agent: its console lines go straight to the terminal, logs (stderr) too.
    let admin = format!("127.0.0.1:{admin_port}");
    let mut cmd = Command::new(root.join("target/debug/lmperf"));
    cmd.arg("agent")
        .args(["--target", &format!("http://127.0.0.1:{model_port}")])
        .args(["--interval", "1s", "--console"])
        .args([
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{http_port}"),
            "--otlp-protocol",
            "http/protobuf",
        ])
        .args(["--admin-addr", &admin])
        .env("OTEL_METRIC_EXPORT_INTERVAL", "5000")
        .env_remove("OTEL_SDK_DISABLED")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    println!("agent: admin http://{admin}  (/healthz /readyz /metrics /api/v1/status)");
    match seconds {
        Some(n) => println!("running for {n} s (Ctrl-C stops earlier)\n"),
        None => println!("running until Ctrl-C\n"),
    }
    let started = Instant::now();
    let mut agent = procs.spawn("agent", cmd)?;
    let console_lines = Arc::new(AtomicUsize::new(0));
    let agent_done = stream_agent(agent.stdout.take().expect("piped"), console_lines.clone());

    // Run until the deadline, a signal, or the agent exiting on its own.
    let deadline = seconds.map(|n| started + Duration::from_secs(n));
    let mut early_exit: Option<(&str, ExitStatus)> = None;
    while early_exit.is_none() {
        if signals::requested() {
            println!("\ndemo: signal received, stopping");
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        for (name, p) in [
            ("agent", &agent),
            ("model server", &model),
            ("collector", &collector),
        ] {
            if let Some(status) = procs.try_wait(p)? {
                eprintln!("\ndemo: the {name} exited unexpectedly ({status})");
                early_exit = Some((name, status));
                break;
            }
        }
        thread::sleep(Duration::from_millis(100));
    }

    if early_exit.is_none_or(|(name, _)| name != "agent") {
        match http_get(&admin, "/api/v1/status") {
            Ok(body) => println!("\nGET http://{admin}/api/v1/status\n{body}"),
            Err(e) => eprintln!("\ndemo: cannot fetch http://{admin}/api/v1/status: {e:#}"),
        }
    }

    // Agent first (it flushes spans/metrics to the collector), then the peers.
    let agent_status = procs.stop(&agent, AGENT_GRACE);
    let _ = agent_done.recv_timeout(Duration::from_secs(2));
    let collector_status = procs.stop(&collector, PEER_GRACE);
    let model_status = procs.stop(&model, PEER_GRACE);
    let _ = collector_done.recv_timeout(Duration::from_secs(2));

    let show = |s: &Result<ExitStatus>| match s {
        Ok(s) => s.to_string(),
        Err(e) => format!("{e:#}"),
    };
    println!(
        "\ndemo: {:.0} s, {} requests measured (agent console), {} spans received by the collector; \
         agent {}, collector {}, model server {}; logs in target/demo/",
        started.elapsed().as_secs_f64(),
        console_lines.load(Ordering::SeqCst),
        spans_received.load(Ordering::SeqCst),
        show(&agent_status),
        show(&collector_status),
        show(&model_status),
    );
    if let Some((name, status)) = early_exit {
        bail!("the {name} exited before the end of the demo ({status})");
    }
    if !agent_status?.success() {
        bail!("the agent did not exit cleanly");
    }
    Ok(())
}

fn parse_args(args: &[String]) -> Result<Option<u64>> {
    let mut seconds = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = match a.as_str() {
            "--seconds" => it
                .next()
                .ok_or_else(|| anyhow!("--seconds needs a value"))?
                .as_str(),
            s if s.starts_with("--seconds=") => &s["--seconds=".len()..],
            "-h" | "--help" => {
                println!("usage: cargo xtask demo [--seconds N]   (default: run until Ctrl-C)");
                std::process::exit(0);
            }
            other => bail!("unexpected argument {other:?}; usage: cargo xtask demo [--seconds N]"),
        };
        seconds = Some(
            value
                .parse::<u64>()
                .map_err(|_| anyhow!("--seconds expects a whole number, got {value:?}"))?,
        );
    }
    Ok(seconds)
}

/// Four distinct free ports: bind them all to port 0 at once, then release.
fn free_ports() -> Result<[u16; 4]> {
    let listeners = (0..4)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .context("cannot bind a free port on 127.0.0.1")?;
    let mut ports = [0u16; 4];
    for (p, l) in ports.iter_mut().zip(&listeners) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}

/// Reads the model server's stdout until `READY ...`; keeps draining it afterwards.
fn wait_ready(stdout: ChildStdout, timeout: Duration, procs: &mut Procs) -> Result<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref().map_while(Result::ok) {
            if line.starts_with("READY ") {
                let _ = tx.send(line);
                break;
            }
            println!("model server: {line}");
        }
        for _ in lines.map_while(Result::ok) {}
    });
    let started = Instant::now();
    loop {
        if signals::requested() {
            bail!("interrupted while waiting for the model server");
        }
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => return Ok(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!(
                    "the model server exited before READY; see target/demo/model-server.log ({})",
                    procs.last_status()
                )
            }
            Err(mpsc::RecvTimeoutError::Timeout) if started.elapsed() > timeout => {
                bail!(
                    "no READY line from the model server after {timeout:?}; see target/demo/model-server.log"
                )
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// Waits until `addr` accepts TCP connections (or the newest child exits).
fn wait_tcp(addr: SocketAddr, timeout: Duration, procs: &mut Procs, what: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
            return Ok(());
        }
        if signals::requested() {
            bail!("interrupted while waiting for the {what}");
        }
        if let Some(status) = procs.newest_exited()? {
            bail!(
                "the {what} exited ({status}) before listening on {addr}; see its log in target/demo/"
            );
        }
        if started.elapsed() > timeout {
            bail!("the {what} did not listen on {addr} within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Copies the collector's stdout to its log and prints received span names.
/// The returned channel disconnects when the collector's stdout closes.
fn tee_collector(
    stdout: ChildStdout,
    mut log: File,
    spans: Arc<AtomicUsize>,
) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        let _tx = tx;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = writeln!(log, "{line}");
            if let Some(pos) = line.find(SPAN_NAME_MARK) {
                spans.fetch_add(1, Ordering::SeqCst);
                println!(
                    "collector received: {}",
                    line[pos + SPAN_NAME_MARK.len()..].trim()
                );
            }
        }
        let _ = log.flush();
    });
    rx
}

/// Prints the agent's console lines as they come.
fn stream_agent(stdout: ChildStdout, count: Arc<AtomicUsize>) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        let _tx = tx;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("span ") {
                count.fetch_add(1, Ordering::SeqCst);
            }
            println!("{line}");
        }
    });
    rx
}

/// A minimal HTTP/1.1 GET with `Connection: close` (std only); returns the body.
fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr.parse()?, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed HTTP response"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("{status}");
    }
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok(if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The demo's children. Dropping it SIGTERMs (then SIGKILLs) whatever still runs, newest first.
#[derive(Default)]
struct Procs {
    children: Vec<(String, Child)>,
    last: Option<ExitStatus>,
}

/// A handle to one entry of [`Procs`] (its index), plus the stdout taken at spawn.
struct Proc {
    idx: usize,
    stdout: Option<ChildStdout>,
}

impl Procs {
    fn spawn(&mut self, name: &str, mut cmd: Command) -> Result<Proc> {
        // Own process group: a terminal Ctrl-C reaches only xtask, which stops children in order.
        cmd.process_group(0);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start the {name}"))?;
        let stdout = child.stdout.take();
        self.children.push((name.to_owned(), child));
        Ok(Proc {
            idx: self.children.len() - 1,
            stdout,
        })
    }

    fn try_wait(&mut self, p: &Proc) -> Result<Option<ExitStatus>> {
        Ok(self.children[p.idx].1.try_wait()?)
    }

    fn newest_exited(&mut self) -> Result<Option<ExitStatus>> {
        match self.children.last_mut() {
            Some((_, c)) => Ok(c.try_wait()?),
            None => Ok(None),
        }
    }

    fn last_status(&mut self) -> String {
        if let Some((_, c)) = self.children.last_mut()
            && let Ok(Some(s)) = c.wait_timeout(Duration::from_secs(2))
        {
            self.last = Some(s);
        }
        self.last
            .map_or_else(|| "still running".to_owned(), |s| s.to_string())
    }

    fn stop(&mut self, p: &Proc, grace: Duration) -> Result<ExitStatus> {
        let (name, child) = &mut self.children[p.idx];
        terminate(name, child, grace)
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (name, child) in self.children.iter_mut().rev() {
            if let Err(e) = terminate(name, child, PEER_GRACE) {
                eprintln!("demo: stopping the {name}: {e:#}");
            }
        }
    }
}

/// SIGTERM (via `kill -TERM`, std has only SIGKILL), wait up to `grace`, then SIGKILL.
/// Safe to call again: an already reaped child just returns its status.
fn terminate(name: &str, child: &mut Child, grace: Duration) -> Result<ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status); // not running; its pid is not ours to signal any more
    }
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .stdin(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if sent {
        if let Some(status) = child.wait_timeout(grace)? {
            return Ok(status);
        }
        eprintln!("demo: the {name} ignored SIGTERM for {grace:?}; killing it");
    }
    child.kill().ok();
    Ok(child.wait()?)
}

trait WaitTimeout {
    fn wait_timeout(&mut self, timeout: Duration) -> std::io::Result<Option<ExitStatus>>;
}

impl WaitTimeout for Child {
    fn wait_timeout(&mut self, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
        let started = Instant::now();
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(Some(s));
            }
            if started.elapsed() >= timeout {
                return Ok(None);
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Ctrl-C, SIGTERM and SIGHUP set a flag instead of killing xtask, so that the children
/// are always stopped and the status printed. std has no signal API; this declares libc's
/// `signal()` (std links libc already) rather than adding a crate. The handler only
/// stores to an atomic, which is async-signal-safe; children get default dispositions
/// back on exec.
mod signals {
    use std::sync::atomic::{AtomicBool, Ordering};

    static REQUESTED: AtomicBool = AtomicBool::new(false);

    const SIGHUP: i32 = 1;
    const SIGINT: i32 = 2;
    const SIGTERM: i32 = 15;

    unsafe extern "C" {
        fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
    }

    extern "C" fn on_signal(_signum: i32) {
        REQUESTED.store(true, Ordering::SeqCst);
    }

    pub fn install() {
        for sig in [SIGHUP, SIGINT, SIGTERM] {
            // SAFETY: `on_signal` is async-signal-safe (one atomic store) and lives forever.
            unsafe {
                signal(sig, on_signal);
            }
        }
    }

    pub fn requested() -> bool {
        REQUESTED.load(Ordering::SeqCst)
    }
}
