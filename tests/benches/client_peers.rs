//! Client benchmark (issue 3, acceptance 5): `lmperf run` (release build) and the Python
//! peers GuideLLM and AIPerf against the same fixed stream server
//! (`lmperf_e2e::stream_server`: loopback, its own thread, 16-token SSE chat reply, server
//! time ~0, optional first-chunk and per-chunk delays). Prints figures; not a test, not in CI.
//! Run it with `cargo xtask bench-client`, which installs the peers into `.venv-bench/` and
//! builds what it needs first.
//!
//! For each tool it prints:
//! - **sustained rate**: the highest rate of a sweep (constant arrivals, `STEP_S` seconds per
//!   step, stopping at the first step that is late and does not keep up either, then one step
//!   at the geometric middle of the highest pass and the failure above it) with
//!   ≤ 1 % schedule miss. Schedule miss is judged by the server alone, the same way for every
//!   tool: take the last N completion requests the server received (N = rate × STEP_S, the
//!   count asked for), sorted by arrival a_0 ≤ … ≤ a_(N−1); request i misses when it never
//!   arrived, when its reply was not written in full, or when a_i > a_0 + i / rate + TOL
//!   (TOL = 10 ms by default). Falling behind by 1 % for 3 s is 30 ms late: a miss. Also
//!   printed: the highest arrival rate of any sweep step whose requests all arrived, on time
//!   or not (the tool's throughput ceiling, comparable to figures that ignore lateness).
//! - **client CPU per 1,000 requests**: user + system CPU of the client's whole process tree
//!   (the harness is a child subreaper and reads `RUSAGE_CHILDREN` around each run, so worker
//!   processes count too): the marginal cost (least-squares slope of CPU over request count
//!   across the sweep steps whose requests all arrived) with the fixed start-up cost (the
//!   intercept), and the total per 1,000 requests at the fixed 500 and 5,000 req/s runs.
//! - **TTFT error** at fixed Poisson rates (500 and 5,000 req/s, `STEP_S` seconds each):
//!   the tool's own TTFT percentile minus the same percentile of the server's TTFT (from the
//!   whole request read to the return of the write that holds the first token), p50 and p99.
//!   Requests cannot be matched one to one across tools, so percentiles are compared; the
//!   server's TTFT is tight (printed), so this is the client's added latency.
//!
//! - **closed loop beside wrk** (`closed_loop.rs`): `lmperf run` at a fixed concurrency and
//!   wrk on one thread against the same server; the rates and their ratio.
//!
//! Settings (environment): `LMPERF_BENCH_CLOSED=0` skips the closed loop; `LMPERF_BENCH_TOOLS` (default `lmperf,guidellm,aiperf`),
//! `LMPERF_BENCH_STEP_S` (3), `LMPERF_BENCH_RATES` (sweep, req/s, comma separated; default
//! 100 doubling to 51,200),
//! `LMPERF_BENCH_FIXED_RATES` (500,5000), `LMPERF_BENCH_TOL_MS` (10), `LMPERF_BENCH_VENV`
//! (`.venv-bench`, one venv per peer below it), `LMPERF_BENCH_TOKENIZER` (a directory with
//! `tokenizer.json`, default `<venv>/tokenizer`), `LMPERF_BENCH_FIRST_DELAY_MS` and
//! `LMPERF_BENCH_GAP_MS` (server delays, 0), `LMPERF_BENCH_STARTUP_S` (time allowed for a
//! tool to start, 120). `LMPERF_BENCH_SERVE_S=N` only serves for N seconds (for runs by hand).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::{lmperf_bin, workspace_root};
use lmperf_e2e::stream_server::{Kind, Served, StreamConfig, StreamServer};

#[path = "client_peers/closed_loop.rs"]
mod closed_loop;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Arrival {
    Constant,
    Poisson,
}

impl Arrival {
    fn name(self) -> &'static str {
        match self {
            Arrival::Constant => "constant",
            Arrival::Poisson => "poisson",
        }
    }
}

struct Settings {
    tools: Vec<String>,
    step_s: f64,
    rates: Vec<f64>,
    fixed_rates: Vec<f64>,
    tol: Duration,
    venv: PathBuf,
    tokenizer: PathBuf,
    startup_s: f64,
    input_tokens: u32,
    output_tokens: usize,
    scratch: PathBuf,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn list(text: &str) -> Vec<f64> {
    text.split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

impl Settings {
    fn from_env() -> Self {
        let root = workspace_root();
        let venv = PathBuf::from(env_or(
            "LMPERF_BENCH_VENV",
            &root.join(".venv-bench").to_string_lossy(),
        ));
        let tokenizer = std::env::var("LMPERF_BENCH_TOKENIZER")
            .map(PathBuf::from)
            .unwrap_or_else(|_| venv.join("tokenizer"));
        Self {
            tools: env_or("LMPERF_BENCH_TOOLS", "lmperf,guidellm,aiperf")
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            step_s: env_or("LMPERF_BENCH_STEP_S", "3").parse().unwrap_or(3.0),
            rates: list(&env_or(
                "LMPERF_BENCH_RATES",
                "100,200,400,800,1600,3200,6400,12800,25600,51200",
            )),
            fixed_rates: list(&env_or("LMPERF_BENCH_FIXED_RATES", "500,5000")),
            tol: Duration::from_secs_f64(
                env_or("LMPERF_BENCH_TOL_MS", "10")
                    .parse::<f64>()
                    .unwrap_or(10.0)
                    / 1000.0,
            ),
            tokenizer,
            venv,
            startup_s: env_or("LMPERF_BENCH_STARTUP_S", "120")
                .parse()
                .unwrap_or(120.0),
            input_tokens: 128,
            output_tokens: 16,
            scratch: root.join("target/bench-client"),
        }
    }
}

/// The clients under test.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tool {
    Lmperf,
    GuideLlm,
    AiPerf,
}

impl Tool {
    fn parse(name: &str) -> Option<Tool> {
        match name {
            "lmperf" => Some(Tool::Lmperf),
            "guidellm" => Some(Tool::GuideLlm),
            "aiperf" => Some(Tool::AiPerf),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Tool::Lmperf => "lmperf",
            Tool::GuideLlm => "guidellm",
            Tool::AiPerf => "aiperf",
        }
    }

    /// Why the tool cannot run here, if it cannot.
    fn missing(self, s: &Settings) -> Option<String> {
        let exe = match self {
            Tool::Lmperf => return None,
            Tool::GuideLlm => s.venv.join("guidellm/bin/guidellm"),
            Tool::AiPerf => s.venv.join("aiperf/bin/aiperf"),
        };
        if !exe.exists() {
            return Some(format!(
                "{} not found (cargo xtask bench-client installs it)",
                exe.display()
            ));
        }
        (!s.tokenizer.join("tokenizer.json").exists())
            .then(|| format!("no tokenizer.json in {}", s.tokenizer.display()))
    }

    /// The command for `n` requests at `rate` req/s, writing its results under `dir`.
    fn command(
        self,
        s: &Settings,
        url: &str,
        rate: f64,
        n: usize,
        arrival: Arrival,
        dir: &Path,
    ) -> Command {
        let (rate_s, n_s) = (format!("{rate}"), n.to_string());
        match self {
            Tool::Lmperf => {
                let mut c = Command::new(lmperf_bin());
                c.args([
                    "run",
                    "--target",
                    url,
                    "--model",
                    "bench",
                    "--api",
                    "chat",
                    "--batch-sizes",
                    "10000",
                ]);
                c.args([
                    "--seq-lengths",
                    &s.input_tokens.to_string(),
                    "--output-len",
                    &s.output_tokens.to_string(),
                ]);
                c.args([
                    "--num-prompts",
                    &n_s,
                    "--request-rate",
                    &rate_s,
                    "--arrival",
                    arrival.name(),
                    "--timeout",
                    "30s",
                ]);
                c.arg("--output-dir").arg(dir);
                c
            }
            Tool::GuideLlm => {
                let mut c = Command::new(s.venv.join("guidellm/bin/guidellm"));
                c.arg("run").arg("--backend").arg(format!(
                    "kind=openai_http,target={url},model=bench,request_format=/v1/chat/completions"
                ));
                c.arg("--profile")
                    .arg(format!("kind={},rate={rate_s}", arrival.name()));
                c.arg("--constraint")
                    .arg(format!("kind=max_requests,count={n_s}"));
                c.arg("--data").arg(format!(
                    "kind=synthetic_text,prompt_tokens={},output_tokens={}",
                    s.input_tokens, s.output_tokens
                ));
                c.arg("--tokenizer")
                    .arg(format!("kind=hf_auto,model={}", s.tokenizer.display()));
                c.arg("--output").arg(format!(
                    "kind=json,path={}",
                    dir.join("benchmarks.json").display()
                ));
                c.arg("--disable-console-interactive");
                c
            }
            Tool::AiPerf => {
                let mut c = Command::new(s.venv.join("aiperf/bin/aiperf"));
                c.args([
                    "profile",
                    "--model",
                    "bench",
                    "--url",
                    url,
                    "--endpoint-type",
                    "chat",
                    "--streaming",
                ]);
                c.args([
                    "--request-rate",
                    &rate_s,
                    "--request-rate-mode",
                    arrival.name(),
                    "--request-count",
                    &n_s,
                ]);
                c.args([
                    "--synthetic-input-tokens-mean",
                    &s.input_tokens.to_string(),
                    "--synthetic-input-tokens-stddev",
                    "0",
                ]);
                c.args([
                    "--output-tokens-mean",
                    &s.output_tokens.to_string(),
                    "--output-tokens-stddev",
                    "0",
                ]);
                c.arg("--tokenizer").arg(&s.tokenizer);
                c.arg("--artifact-dir").arg(dir);
                c.args([
                    "--ui-type",
                    "none",
                    "--no-server-metrics",
                    "--no-gpu-telemetry",
                ]);
                c
            }
        }
    }

    /// The TTFTs (ms) of successful requests as the tool reports them.
    fn ttfts_ms(self, dir: &Path) -> Result<Vec<f64>, String> {
        match self {
            Tool::Lmperf => {
                let text = read(&dir.join("requests.jsonl"))?;
                Ok(text
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .filter(|v| v["outcome"] == "ok")
                    .filter_map(|v| v["ttft_ms"].as_f64())
                    .collect())
            }
            Tool::GuideLlm => {
                let v: serde_json::Value =
                    serde_json::from_str(&read(&dir.join("benchmarks.json"))?)
                        .map_err(|e| e.to_string())?;
                let reqs = &v["benchmarks"][0]["requests"]["successful"];
                let list = reqs
                    .as_array()
                    .ok_or("no benchmarks[0].requests.successful")?;
                Ok(list
                    .iter()
                    .filter_map(|r| {
                        r["time_to_first_token_ms"].as_f64().or_else(|| {
                            let (a, b) = (
                                r["first_token_time"].as_f64()?,
                                r["request_start_time"].as_f64()?,
                            );
                            Some((a - b) * 1000.0)
                        })
                    })
                    .collect())
            }
            Tool::AiPerf => {
                let path = find_file(dir, "profile_export.jsonl")
                    .ok_or_else(|| format!("no profile_export.jsonl under {}", dir.display()))?;
                let text = read(&path)?;
                Ok(text
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .filter_map(|v| {
                        let m = &v["metrics"]["time_to_first_token"];
                        let value = m["value"].as_f64()?;
                        Some(match m["unit"].as_str() {
                            Some("ns") => value / 1e6,
                            Some("us") => value / 1e3,
                            Some("s") => value * 1e3,
                            _ => value,
                        })
                    })
                    .collect())
            }
        }
    }
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let p = entry.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if p.file_name().is_some_and(|n| n == name) {
            return Some(p);
        }
    }
    None
}

/// CPU (user + system) of every reaped descendant of this process.
fn children_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Pids whose parent is this process (orphans handed to us as subreaper, and our child).
fn my_children() -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<i32>().ok())
                })
                == Some(me)
        })
        .collect()
}

/// Kills (by pid) and reaps whatever the last tool left behind, so its CPU is counted.
fn reap_leftovers() {
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            // SAFETY: plain syscalls on pids that are our own children.
            while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
            let left = my_children();
            if left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                break;
            }
            for pid in &left {
                unsafe { libc::kill(*pid, signal) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One run of one tool.
struct Run {
    n: usize,
    rate: f64,
    wall: Duration,
    cpu: Duration,
    /// Exit code, or `None` when killed at the time limit.
    exit: Option<i32>,
    /// The completion requests the server saw during the run, by arrival.
    served: Vec<Served>,
    dir: PathBuf,
}

fn run_tool(
    s: &Settings,
    server: &StreamServer,
    tool: Tool,
    rate: f64,
    n: usize,
    arrival: Arrival,
    label: &str,
) -> Run {
    let dir = s.scratch.join(format!("{}-{label}", tool.name()));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::create_dir_all(&dir);
    let mut cmd = tool.command(s, &server.url(), rate, n, arrival, &dir);
    let log = |name: &str| {
        std::fs::File::create(dir.join(name))
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null())
    };
    cmd.stdin(Stdio::null())
        .stdout(log("stdout.log"))
        .stderr(log("stderr.log"));
    // No proxy for loopback. (HF_HUB_OFFLINE=1 would make AIPerf take the tokenizer directory
    // for a hub repository id.)
    cmd.env("NO_PROXY", "127.0.0.1,localhost");
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let limit = Duration::from_secs_f64(s.startup_s + 3.0 * n as f64 / rate + 30.0);
    server.clear();
    let cpu0 = children_cpu();
    let t0 = Instant::now();
    let mut exit = None;
    match cmd.spawn() {
        Ok(mut child) => loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    exit = Some(status.code().unwrap_or(-1));
                    break;
                }
                Ok(None) if t0.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    // SAFETY: the process group of the child we started.
                    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                    let _ = child.wait();
                    break;
                }
            }
        },
        Err(e) => eprintln!("{}: cannot start: {e}", tool.name()),
    }
    let wall = t0.elapsed();
    reap_leftovers();
    let cpu = children_cpu().saturating_sub(cpu0);
    let mut served: Vec<Served> = server
        .served()
        .into_iter()
        .filter(|r| r.kind == Kind::Completion)
        .collect();
    served.sort_by_key(|r| r.arrived);
    Run {
        n,
        rate,
        wall,
        cpu,
        exit,
        served,
        dir,
    }
}

/// The schedule check of a constant-rate run (see the module docs).
struct Schedule {
    arrived: usize,
    missed: usize,
    /// (arrivals − 1) / (last − first arrival), req/s.
    achieved: f64,
    /// Largest lateness against the slot, ms.
    max_late_ms: f64,
}

fn schedule(run: &Run, tol: Duration) -> Schedule {
    let last_n = &run.served[run.served.len().saturating_sub(run.n)..];
    let Some(first) = last_n.first() else {
        return Schedule {
            arrived: 0,
            missed: run.n,
            achieved: 0.0,
            max_late_ms: f64::NAN,
        };
    };
    let mut missed = run.n - last_n.len();
    let mut max_late = 0.0f64;
    for (i, r) in last_n.iter().enumerate() {
        let slot = first.arrived + Duration::from_secs_f64(i as f64 / run.rate);
        let late = r.arrived.saturating_duration_since(slot);
        max_late = max_late.max(late.as_secs_f64() * 1000.0);
        if late > tol || !r.complete {
            missed += 1;
        }
    }
    let span = last_n.last().map_or(0.0, |l| {
        l.arrived.duration_since(first.arrived).as_secs_f64()
    });
    Schedule {
        arrived: last_n.len(),
        missed,
        achieved: if span > 0.0 {
            (last_n.len() - 1) as f64 / span
        } else {
            0.0
        },
        max_late_ms: max_late,
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest rank.
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Least-squares line through (requests, CPU s): (seconds per request, intercept seconds).
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    if points.len() < 2 || sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let slope = sxy / sxx;
    Some((slope, my - slope * mx))
}

struct Fixed {
    rate: f64,
    client_n: usize,
    client: (f64, f64),
    server: (f64, f64),
    achieved: f64,
    cpu_per_1k_ms: f64,
    note: String,
}

struct ToolResult {
    tool: Tool,
    sustained: Option<f64>,
    /// Highest arrival rate of a completed sweep step, on time or not.
    max_achieved: f64,
    cpu_fit: Option<(f64, f64)>,
    fixed: Vec<Fixed>,
    skipped: Option<String>,
}

/// One sweep step: (passed, kept up). A step keeps up when the tool exited 0, every request
/// arrived and the arrival rate was within 5 % of the rate asked for, late or not; such steps
/// add a (requests, CPU seconds) point for the CPU fit and raise `max_achieved` (the tool's
/// throughput ceiling).
fn sweep_step(
    s: &Settings,
    server: &StreamServer,
    tool: Tool,
    rate: f64,
    points: &mut Vec<(f64, f64)>,
    max_achieved: &mut f64,
) -> (bool, bool) {
    let n = ((rate * s.step_s).round() as usize).max(10);
    let run = run_tool(
        s,
        server,
        tool,
        rate,
        n,
        Arrival::Constant,
        &format!("sweep-{rate}"),
    );
    let sc = schedule(&run, s.tol);
    let pass = run.exit == Some(0) && sc.missed * 100 <= n;
    println!(
        "  {:<8} sweep {:>7.0} req/s x {:>6}: {} arrived {:>6}, missed {:>5} ({:>5.1} %), achieved {:>8.0} req/s, max late {:>8.1} ms, exit {:?}, wall {:>5.1} s, CPU {:>6.2} s   [load {}]",
        tool.name(),
        rate,
        n,
        if pass { "PASS" } else { "FAIL" },
        sc.arrived,
        sc.missed,
        100.0 * sc.missed as f64 / n as f64,
        sc.achieved,
        sc.max_late_ms,
        run.exit,
        run.wall.as_secs_f64(),
        run.cpu.as_secs_f64(),
        loadavg()
    );
    if !pass && run.exit != Some(0) {
        println!("           (logs in {})", run.dir.display());
    }
    let kept_up = run.exit == Some(0) && sc.arrived == n && sc.achieved >= 0.95 * rate;
    if kept_up {
        points.push((n as f64, run.cpu.as_secs_f64()));
        *max_achieved = max_achieved.max(sc.achieved);
    }
    (pass, kept_up)
}

fn bench_tool(s: &Settings, server: &StreamServer, tool: Tool) -> ToolResult {
    if let Some(why) = tool.missing(s) {
        println!("  {:<8} skipped: {why}", tool.name());
        return ToolResult {
            tool,
            sustained: None,
            max_achieved: 0.0,
            cpu_fit: None,
            fixed: vec![],
            skipped: Some(why),
        };
    }
    let mut points = Vec::new();
    let mut max_achieved = 0.0;
    let mut sustained = None;
    // Up the rates until a step neither passes nor keeps up (a late step that keeps up goes
    // on, to find the throughput ceiling); then one step at the geometric middle of the
    // highest pass and the failure above it.
    let mut failed_above: Option<f64> = None;
    for &rate in &s.rates {
        let (pass, kept_up) = sweep_step(s, server, tool, rate, &mut points, &mut max_achieved);
        if pass {
            sustained = Some(rate);
            failed_above = None;
        } else if failed_above.is_none() {
            failed_above = Some(rate);
        }
        if !pass && !kept_up {
            break;
        }
    }
    if let Some(hi) = failed_above {
        let lo = sustained.unwrap_or(hi / 2.0);
        let mid = ((lo * hi).sqrt() / 10.0).round() * 10.0;
        if mid > lo && sweep_step(s, server, tool, mid, &mut points, &mut max_achieved).0 {
            sustained = Some(mid);
        }
    }
    let mut fixed = Vec::new();
    for &rate in &s.fixed_rates {
        let n = ((rate * s.step_s).round() as usize).max(10);
        let run = run_tool(
            s,
            server,
            tool,
            rate,
            n,
            Arrival::Poisson,
            &format!("poisson-{rate}"),
        );
        let last_n = &run.served[run.served.len().saturating_sub(n)..];
        let server_ttft = sorted(
            last_n
                .iter()
                .map(|r| r.ttft().as_secs_f64() * 1000.0)
                .collect(),
        );
        let (client, note) = match tool.ttfts_ms(&run.dir) {
            Ok(v) => (sorted(v), String::new()),
            Err(e) => (vec![], e),
        };
        let span = match (last_n.first(), last_n.last()) {
            (Some(a), Some(b)) if b.arrived > a.arrived => {
                b.arrived.duration_since(a.arrived).as_secs_f64()
            }
            _ => 0.0,
        };
        let f = Fixed {
            rate,
            client_n: client.len(),
            client: (quantile(&client, 0.5), quantile(&client, 0.99)),
            server: (quantile(&server_ttft, 0.5), quantile(&server_ttft, 0.99)),
            achieved: if span > 0.0 {
                (last_n.len() - 1) as f64 / span
            } else {
                0.0
            },
            cpu_per_1k_ms: run.cpu.as_secs_f64() * 1e6 / n as f64,
            note,
        };
        println!(
            "  {:<8} poisson {:>5.0} req/s x {:>6}: tool TTFT p50 {:>8.3} p99 {:>8.3} ms ({} values), server TTFT p50 {:.3} p99 {:.3} ms, error p50 {:>8.3} p99 {:>8.3} ms; arrivals {} at {:.0} req/s; exit {:?}; CPU {:.2} s = {:.0} ms per 1,000   [load {}] {}",
            tool.name(),
            rate,
            n,
            f.client.0,
            f.client.1,
            f.client_n,
            f.server.0,
            f.server.1,
            f.client.0 - f.server.0,
            f.client.1 - f.server.1,
            last_n.len(),
            f.achieved,
            run.exit,
            run.cpu.as_secs_f64(),
            f.cpu_per_1k_ms,
            loadavg(),
            f.note
        );
        fixed.push(f);
    }
    ToolResult {
        tool,
        sustained,
        max_achieved,
        cpu_fit: fit(&points),
        fixed,
        skipped: None,
    }
}

fn main() {
    let s = Settings::from_env();
    // Orphaned worker processes of a tool become our children, so their CPU is counted.
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let cfg = StreamConfig {
        tokens: s.output_tokens,
        first_delay: Duration::from_secs_f64(
            env_or("LMPERF_BENCH_FIRST_DELAY_MS", "0")
                .parse::<f64>()
                .unwrap_or(0.0)
                / 1000.0,
        ),
        gap: Duration::from_secs_f64(
            env_or("LMPERF_BENCH_GAP_MS", "0")
                .parse::<f64>()
                .unwrap_or(0.0)
                / 1000.0,
        ),
        prompt_tokens: u64::from(s.input_tokens),
    };
    let server = StreamServer::start(cfg).expect("stream server");
    if let Some(secs) = std::env::var("LMPERF_BENCH_SERVE_S")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // Only serve (for experiments with a client run by hand), then print the server's record.
        println!("serving {} for {secs} s", server.url());
        std::thread::sleep(Duration::from_secs(secs));
        let served: Vec<Served> = server
            .served()
            .into_iter()
            .filter(|r| r.kind == Kind::Completion)
            .collect();
        let ttft = sorted(
            served
                .iter()
                .map(|r| r.ttft().as_secs_f64() * 1000.0)
                .collect(),
        );
        println!(
            "served {} completions, server TTFT p50 {:.3} p99 {:.3} ms",
            served.len(),
            quantile(&ttft, 0.5),
            quantile(&ttft, 0.99)
        );
        return;
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "client benchmark: stream server {} ({} tokens, first chunk after {:?}, {:?} between chunks), {cores} cores, {} s per step, miss tolerance {:?}, load {}",
        server.url(),
        cfg.tokens,
        cfg.first_delay,
        cfg.gap,
        s.step_s,
        s.tol,
        loadavg()
    );
    let mut results = Vec::new();
    for name in &s.tools {
        let Some(tool) = Tool::parse(name) else {
            println!("unknown tool {name:?} (lmperf, guidellm, aiperf)");
            continue;
        };
        results.push(bench_tool(&s, &server, tool));
    }
    let closed = if env_or("LMPERF_BENCH_CLOSED", "1") == "0" {
        Vec::new()
    } else {
        closed_loop::run(&s, &server)
    };
    println!("\nsummary (load {}):", loadavg());
    println!(
        "  tool     | sustained req/s (<=1 % miss) | max achieved req/s | CPU ms/1k req (marginal; start-up s) | CPU ms/1k @500/s | @5000/s | TTFT err p50/p99 ms @500/s | @5000/s"
    );
    for r in &results {
        if let Some(why) = &r.skipped {
            println!("  {:<8} | skipped: {why}", r.tool.name());
            continue;
        }
        let at = |rate: f64| r.fixed.iter().find(|f| f.rate == rate);
        let err = |rate: f64| {
            at(rate).map_or("-".to_owned(), |f| {
                format!(
                    "{:.3} / {:.3}",
                    f.client.0 - f.server.0,
                    f.client.1 - f.server.1
                )
            })
        };
        let cpu =
            |rate: f64| at(rate).map_or("-".to_owned(), |f| format!("{:.0}", f.cpu_per_1k_ms));
        println!(
            "  {:<8} | {:>28} | {:>18.0} | {:>36} | {:>16} | {:>7} | {:>26} | {}",
            r.tool.name(),
            r.sustained.map_or("none".to_owned(), |v| format!("{v:.0}")),
            r.max_achieved,
            r.cpu_fit.map_or("-".to_owned(), |(slope, icpt)| format!(
                "{:.0}; {:.2}",
                slope * 1e6,
                icpt
            )),
            cpu(500.0),
            cpu(5000.0),
            err(500.0),
            err(5000.0)
        );
    }
    let best_peer = results
        .iter()
        .filter(|r| r.tool != Tool::Lmperf)
        .filter_map(|r| r.sustained)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    if let (Some(best), Some(ours)) = (
        best_peer,
        results
            .iter()
            .find(|r| r.tool == Tool::Lmperf)
            .and_then(|r| r.sustained),
    ) {
        println!(
            "  lmperf / best peer sustained rate: {:.1}x (target >= 10x)",
            ours / best
        );
    }
    if let [wrk, ours] = closed.as_slice()
        && let (Some(w), Some(l)) = (wrk.rate, ours.rate)
    {
        println!(
            "  closed loop: lmperf {l:.0} req/s, wrk {w:.0} req/s: {:.2} of wrk (target >= 0.25)",
            l / w
        );
    }
    println!("  targets: lmperf TTFT error p99 <= 0.3 ms at 500 req/s, <= 1 ms at 5,000 req/s");
}
