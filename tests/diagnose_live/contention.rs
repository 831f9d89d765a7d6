//! Live contention episodes on the real llama.cpp server (issue 28), `cargo xtask diagnose-live
//! [--episode NAME] [--record]`: the agent with its production config (canaries 1/s of 4 tokens,
//! the server's `/metrics` scraped each second, the diagnosis and its node signals on) against
//! the real server (Gemma 3 270M, 2 slots, 1 thread), calm for `CALM_S`, then one fault:
//!
//! - `cpu_quota`: the server runs in its own cgroup (v1 `cpu`, a quota of 2 cores: never
//!   throttled on this 2-core machine); at the onset its CFS quota is cut to 20 % of a core
//!   (`cpu.cfs_quota_us` 20000 of a 100000 µs period), as `systemctl set-property CPUQuota=20%`
//!   or a lowered `resources.limits.cpu` does. Expected: `cpu_throttling` within 60 s, the
//!   throttled share in its evidence.
//! - `cpu_hog`: a neighbour process spinning both cores (two `sh` busy loops). Expected:
//!   `node_cpu_pressure`.
//! - `memory_limit`: the server in its own memory cgroup (v1 `memory`, limit 3 × its usage),
//!   its model file a private copy charged to that cgroup; at the onset the limit is cut to the
//!   server's anonymous memory plus half its file pages, so the mapped weights are reclaimed
//!   and read again at every token (the server thrashes, the node's PSI memory rises, the
//!   cgroup sits at its limit). A memory hog outside a cgroup cannot do this safely here: with
//!   no swap, anonymous memory cannot be reclaimed, and a hog large enough to make reclaim
//!   stall (≈ 20 of the 23 GiB, most of it page cache of other users' builds) risks the OOM
//!   killer on their processes. Expected: `memory_pressure`.
//! - `surge_then_503`: the agent's target is a proxy in front of the server; at the onset 4
//!   closed-loop clients of 48-token answers load the server (2 slots), and 20 s later the
//!   proxy answers 503 to 3 of every 5 chat requests. Expected: `load_surge` and `error_burst`
//!   both in the top three.
//!
//! Each prints one block: the first `root_confirmed` (its top cause and score, the time from the
//! injection), the expected cause's time and evidence line, the top three. With
//! `LMPERF_EPISODE_DIR` set the episode is recorded (`tests/fixtures/episodes/README.md`): the
//! canaries the agent kept, the server samples of its status, and the node and cgroup values the
//! test read each second from the same files the agent reads (`lmperf::node`), with the server's
//! own CPU wait and CPU use (`server_cpu_wait`, `server_cpu`: its threads' schedstat,
//! `lmperf::node::cpu_wait`).
//!
//! The cgroup episodes need root and cgroup v1 (this machine's `cpu` and `memory` hierarchies
//! under `/sys/fs/cgroup`); they restore what they changed (the pids moved back, the child
//! cgroups removed) when they end, also on a panic.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lmperf::node::{cgroup, cpu_wait, psi};
use lmperf_e2e::agent::{Agent, workspace_root};
use lmperf_e2e::peers::{ModelServer, free_port};
use lmperf_e2e::temp;
use serde_json::Value;

use super::real::{Load, REAL_CANARY, Seen, agent_config, model_server, story};
use super::{CALM_S, enabled, recorded, unix_now};

/// Polls after the onset, at most.
const WATCH_S: u64 = 90;
/// Polls after the onset, at least (the episode keeps this much, confirmed or not).
const HOLD_S: u64 = 60;
/// The delay of the second fault of `surge_then_503`.
const SECOND_FAULT_S: u64 = 20;
/// The v1 hierarchies.
const CPU_V1: &str = "/sys/fs/cgroup/cpu";
const MEMORY_V1: &str = "/sys/fs/cgroup/memory";

/// One episode's ground truth and words.
struct Spec {
    name: String,
    /// The fault's cause (the episode's `cause`); empty for a control.
    cause: &'static str,
    /// A second fault's cause and its delay after the first (concurrent faults).
    second: Option<(&'static str, u64)>,
    magnitude: String,
    notes: String,
}

/// The node's and the server cgroup's values, read by the test each second from the files
/// the agent reads (`lmperf::node`), as episode series.
struct NodeProbe {
    cgroup: cgroup::CgroupDirs,
    /// The server's process: its threads' CPU wait (as the agent reads it on a plain host).
    server: Option<(u32, cpu_wait::CpuWaitMeter)>,
    prev_cpu: Option<cgroup::CpuStat>,
    prev_oom: Option<u64>,
    agent_pid: u32,
    prev_agent: Option<(Instant, f64)>,
    series: BTreeMap<String, Vec<[f64; 2]>>,
    /// The target is a router (`kind = "router"`): its cgroup is the router's, its throttling
    /// recorded as `router_cpu_throttled`, as the agent feeds it.
    router: bool,
}

impl NodeProbe {
    fn new(cgroup: cgroup::CgroupDirs, server_pid: Option<u32>, agent_pid: u32) -> Self {
        Self {
            router: false,
            cgroup,
            server: server_pid.map(|p| (p, cpu_wait::CpuWaitMeter::default())),
            prev_cpu: None,
            prev_oom: None,
            agent_pid,
            prev_agent: None,
            series: BTreeMap::new(),
        }
    }

    fn sample(&mut self, offset_s: f64) {
        let mut push = |k: &str, v: Option<f64>| {
            if let Some(v) = v {
                self.series
                    .entry(k.to_owned())
                    .or_default()
                    .push([offset_s, v]);
            }
        };
        let p = psi::read(Path::new("/proc"));
        push(
            "node_cpu_pressure",
            p.cpu.and_then(|x| x.some).map(|l| l.avg10),
        );
        push(
            "node_memory_pressure",
            p.memory.and_then(|x| x.some).map(|l| l.avg10),
        );
        push(
            "node_io_pressure",
            p.io.and_then(|x| x.some).map(|l| l.avg10),
        );
        let now = Instant::now();
        let ticks = std::fs::read_to_string(format!("/proc/{}/stat", self.agent_pid))
            .ok()
            .and_then(|s| lmperf::node::parse_stat_cpu_ticks(&s));
        if let Some(t) = ticks {
            let cpu_s = t as f64 / 100.0;
            if let Some((at, prev)) = self.prev_agent {
                let dt = now.duration_since(at).as_secs_f64();
                push(
                    "agent_cpu",
                    (dt > 0.0).then(|| (cpu_s - prev).max(0.0) / dt),
                );
            }
            self.prev_agent = Some((now, cpu_s));
        }
        if let Some((pid, meter)) = &mut self.server {
            let w = meter.sample(Path::new("/proc"), &cpu_wait::Source::Pids(vec![*pid]), now);
            push("server_cpu_wait", w.map(|w| w.wait_s_per_s));
            push("server_cpu", w.and_then(|w| w.cpu_cores));
        }
        if self.cgroup.is_empty() {
            return;
        }
        let r = cgroup::read(&self.cgroup);
        let share = match (self.prev_cpu, r.cpu) {
            (Some(a), Some(b)) => cgroup::throttled_share(&a, &b),
            _ => None,
        };
        let throttled = if self.router {
            "router_cpu_throttled"
        } else {
            "cgroup_cpu_throttled"
        };
        push(throttled, share);
        push(
            "cgroup_memory_usage",
            match (r.memory_bytes, r.memory_limit_bytes) {
                (Some(m), Some(l)) if l > 0 => Some((m as f64 / l as f64).min(1.0)),
                _ => None,
            },
        );
        push(
            "cgroup_oom_kill",
            match (self.prev_oom, r.oom_kills) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64),
                _ => None,
            },
        );
        self.prev_cpu = r.cpu.or(self.prev_cpu);
        self.prev_oom = r.oom_kills.or(self.prev_oom);
    }
}

/// What one episode saw after its onset: each poll's target diagnosis, seconds from the onset.
struct Outcome {
    polls: Vec<(f64, Value)>,
    warn_lines: Vec<String>,
}

/// The agent on `url` (its production config: canaries 1/s, 1 s scrape, the diagnosis on), calm
/// for `CALM_S`, then `inject()` (its guard ends the fault when dropped); polls each second until
/// `done` holds after `HOLD_S`, at most `WATCH_S`. Records the episode when `LMPERF_EPISODE_DIR`
/// is set. `cgroup`: the server's cgroup the probe reads; `server_pid`: its process.
fn run<G>(
    spec: &Spec,
    url: &str,
    cgroup: cgroup::CgroupDirs,
    server_pid: Option<u32>,
    inject: impl FnOnce() -> G,
    done: impl Fn(&[(f64, Value)]) -> bool,
) -> Outcome {
    let target = "metrics_interval = \"1s\"\n";
    run_with(spec, (url, target), cgroup, server_pid, inject, done)
}

/// [`run`] with the target's own settings (`target`: TOML under `[[target]]`).
fn run_with<G>(
    spec: &Spec,
    (url, target): (&str, &str),
    cgroup: cgroup::CgroupDirs,
    server_pid: Option<u32>,
    inject: impl FnOnce() -> G,
    done: impl Fn(&[(f64, Value)]) -> bool,
) -> Outcome {
    let dir = temp::dir(&format!("diag-contention-{}", spec.cause));
    let cfg = agent_config(&dir, url, "gemma-3-270m", REAL_CANARY, target, false);
    let agent = Agent::spawn(&["--config", &cfg, "--no-otlp"], &[]);
    let start = unix_now().floor();
    let mut seen = Seen::default();
    let mut probe = NodeProbe::new(cgroup, server_pid, agent.pid());
    probe.router = target.contains("kind = \"router\"");
    let poll = |seen: &mut Seen, probe: &mut NodeProbe| -> Value {
        let (_, body) = agent.get("/api/v1/diagnosis?target=t0");
        seen.server_sample(&agent.status());
        probe.sample(unix_now() - start);
        serde_json::from_str::<Value>(&body)
            .map(|v| v["targets"][0].clone())
            .unwrap_or(Value::Null)
    };
    for _ in 0..CALM_S {
        std::thread::sleep(Duration::from_secs(1));
        let t = poll(&mut seen, &mut probe);
        if t["state"] == "root_confirmed" {
            eprintln!(
                "{}: root_confirmed before the fault (+{:.0} s): {}",
                spec.name,
                unix_now() - start,
                t["summary"]
            );
        }
    }
    // The fault's start: a rolling restart's injection takes its whole restart (a new worker
    // started and serving, the old one stopped), counted in the time to the diagnosis.
    let onset = unix_now();
    let t0 = Instant::now();
    let guard = inject();
    let mut polls = Vec::new();
    while t0.elapsed() < Duration::from_secs(WATCH_S) {
        std::thread::sleep(Duration::from_secs(1));
        let t = poll(&mut seen, &mut probe);
        polls.push((t0.elapsed().as_secs_f64(), t));
        if t0.elapsed() >= Duration::from_secs(HOLD_S) && done(&polls) {
            break;
        }
    }
    let mut series = recorded(&agent, "t0", start);
    drop(guard);
    let warn_lines = agent
        .stderr_text()
        .lines()
        .filter(|l| l.contains("Diagnosis:"))
        .map(str::to_owned)
        .collect();
    drop(agent);
    for (at_ms, sigs) in &seen.server {
        let off = *at_ms as f64 / 1000.0 - start;
        for &(name, x) in sigs {
            series.entry(name.to_owned()).or_default().push([off, x]);
        }
    }
    series.extend(probe.series);
    for pts in series.values_mut() {
        pts.sort_by(|a, b| a[0].total_cmp(&b[0]));
    }
    let episode = serde_json::json!({
        "format": "lmperf-episode/1",
        "name": spec.name,
        "source": "live",
        // An empty cause is a control: a fault nothing should page for.
        "cause": (!spec.cause.is_empty()).then_some(spec.cause),
        "magnitude": spec.magnitude,
        "target": "t0",
        "start_unix_s": start,
        "duration_s": (unix_now() - start).ceil(),
        "onset_offset_s": (onset - start).round(),
        "notes": spec.notes,
        "series": {"t0": series},
    });
    if let Ok(out) = std::env::var("LMPERF_EPISODE_DIR") {
        let p = Path::new(&out).join(format!("{}.json", spec.name));
        std::fs::write(&p, serde_json::to_vec(&episode).unwrap()).unwrap();
        eprintln!("recorded {}", p.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Outcome { polls, warn_lines }
}

/// The causes of a diagnosis, `cause score` each.
fn ranked(t: &Value, n: usize) -> String {
    t["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .take(n)
        .map(|c| {
            format!(
                "{} {:.2}",
                c["cause"].as_str().unwrap_or("?"),
                c["score"].as_f64().unwrap_or(0.0)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `cause` is confirmed in `t`: its state `root_confirmed` with `cause` the top cause or
/// one of the roots.
fn confirms(t: &Value, cause: &str) -> bool {
    t["state"] == "root_confirmed"
        && (t["causes"][0]["cause"] == cause
            || t["roots"]
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x == cause)))
}

/// Whether every one of `causes` is among the first three of `t`, confirmed.
fn in_top_three(t: &Value, causes: &[&str]) -> bool {
    let top: Vec<&Value> = t["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .take(3)
        .collect();
    t["state"] == "root_confirmed" && causes.iter().all(|c| top.iter().any(|x| x["cause"] == *c))
}

/// The evidence of `cause` in `t` in one line: each signal's before → after and its rule.
fn evidence_line(t: &Value, cause: &str) -> String {
    let Some(c) = t["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["cause"] == cause)
    else {
        return format!("({cause} not ranked)");
    };
    c["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let mut s = format!(
                "{} {:.3} -> {:.3} (peak {:.3})",
                e["signal"].as_str().unwrap_or("?"),
                e["before"].as_f64().unwrap_or(f64::NAN),
                e["after"].as_f64().unwrap_or(f64::NAN),
                e["peak"].as_f64().unwrap_or(f64::NAN)
            );
            if let Some(r) = e["rule"].as_str() {
                s.push_str(": ");
                s.push_str(r);
            }
            s
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Prints the episode's block and returns the first poll (seconds from the onset, diagnosis)
/// where `hit` held.
fn report<'a>(
    spec: &Spec,
    out: &'a Outcome,
    expected: &str,
    hit: impl Fn(&Value) -> bool,
) -> Option<&'a (f64, Value)> {
    let first = out
        .polls
        .iter()
        .find(|(_, t)| t["state"] == "root_confirmed");
    let found = out.polls.iter().find(|(_, t)| hit(t));
    let warning = out.polls.iter().find(|(_, t)| t["state"] == "warning");
    println!("diagnose-live {} ({}):", spec.name, spec.magnitude);
    // Every poll, for a miss's post-mortem: `LMPERF_DIAGNOSE_POLLS=DIR`.
    if let Ok(dir) = std::env::var("LMPERF_DIAGNOSE_POLLS") {
        let polls: Vec<Value> = out
            .polls
            .iter()
            .map(|(at, t)| serde_json::json!({"at_s": at, "target": t}))
            .collect();
        let p = Path::new(&dir).join(format!("{}.polls.json", spec.name));
        if std::fs::write(&p, serde_json::to_vec(&polls).unwrap_or_default()).is_ok() {
            println!("  polls written to {}", p.display());
        }
    }
    if let Some((second, after)) = spec.second {
        println!(
            "  faults: {} at the injection, {second} {after} s later",
            spec.cause
        );
    }
    match first {
        Some((at, t)) => {
            println!(
                "  first root_confirmed {at:.0} s after the injection: {} (scope {}, worker {})",
                ranked(t, 1),
                t["scope"],
                t["worker"]
            );
            if let Some(top) = t["causes"][0]["cause"].as_str().filter(|c| *c != expected) {
                println!("  evidence {top}: {}", evidence_line(t, top));
            }
        }
        None => println!(
            "  no root_confirmed within {} s of the injection (last state {})",
            out.polls.last().map_or(0.0, |p| p.0).round(),
            out.polls
                .last()
                .map_or(Value::Null, |p| p.1["state"].clone())
        ),
    }
    if let Some((at, t)) = warning {
        println!(
            "  first warning {at:.0} s after the injection: {}",
            t["summary"]
        );
    }
    match found {
        Some((at, t)) => {
            println!("  {expected}: {at:.0} s after the injection");
            for c in expected.split(" + ") {
                println!("  evidence {c}: {}", evidence_line(t, c));
            }
            println!("  top three: {}", ranked(t, 3));
            println!("  summary: {}", t["summary"]);
        }
        None => {
            println!("  {expected}: MISSED");
            if let Some((at, t)) = out.polls.iter().rev().find(|(_, t)| t["state"] != "idle") {
                println!(
                    "  last non-idle ({at:.0} s, {}): {}",
                    t["state"],
                    ranked(t, 3)
                );
                println!("  summary: {}", t["summary"]);
            }
        }
    }
    println!("  WARN Diagnosis lines: {}", out.warn_lines.len());
    found
}

// ---- cgroup v1 helpers -------------------------------------------------------------------

/// The path of `pid`'s cgroup in the v1 hierarchy whose controllers include `controller`.
fn v1_path_of(pid: u32, controller: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, ctrls, path) = (p.next()?, p.next()?, p.next()?);
        ctrls
            .split(',')
            .any(|c| c == controller)
            .then(|| path.trim_start_matches('/').to_owned())
    })
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value)
}

/// A child cgroup of a v1 hierarchy (`root`) made for the episode: the pids moved into it go
/// back to where they were, and it is removed, when it drops.
struct V1Cgroup {
    dir: PathBuf,
    /// Each moved pid and the directory it came from.
    moved: Vec<(u32, PathBuf)>,
}

impl V1Cgroup {
    /// A new child of `root` (`CPU_V1`, `MEMORY_V1`); panics, saying why, without one.
    fn create(root: &str, name: &str) -> Self {
        let root = Path::new(root);
        assert!(
            root.join("cgroup.procs").is_file(),
            "{} is not a cgroup v1 hierarchy: these episodes need cgroup v1 (mount | grep cgroup) and root",
            root.display()
        );
        let dir = root.join(format!("lmperf-live-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("mkdir {}: {e} (root needed)", dir.display()));
        Self {
            dir,
            moved: Vec::new(),
        }
    }

    /// Moves process `pid` (all its threads) into this cgroup.
    fn enter(&mut self, pid: u32, controller: &str) {
        let root = self.dir.parent().unwrap().to_path_buf();
        let from = root.join(v1_path_of(pid, controller).unwrap_or_default());
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
        self.moved.push((pid, from));
    }

    /// Moves `pid` back to where it came from.
    fn leave(&mut self, pid: u32) {
        if let Some(i) = self.moved.iter().position(|(p, _)| *p == pid) {
            let (_, from) = self.moved.remove(i);
            let _ = write(&from.join("cgroup.procs"), &pid.to_string());
        }
    }

    fn set(&self, file: &str, value: &str) -> std::io::Result<()> {
        write(&self.dir.join(file), value)
    }

    fn read_u64(&self, file: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// A key of `memory.stat`.
    fn stat(&self, key: &str) -> Option<u64> {
        let t = std::fs::read_to_string(self.dir.join("memory.stat")).ok()?;
        cgroup::keyed(&t, key)
    }
}

impl Drop for V1Cgroup {
    fn drop(&mut self) {
        for (pid, from) in std::mem::take(&mut self.moved) {
            let _ = write(&from.join("cgroup.procs"), &pid.to_string());
        }
        // Whatever is left (a server's children) goes to the hierarchy's root.
        let root = self.dir.parent().unwrap().to_path_buf();
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = write(&root.join("cgroup.procs"), p);
            }
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// The pid of the process listening on `port` (the model server).
fn server_pid(port: u16) -> u32 {
    lmperf::node::pid_listening(Path::new("/proc"), port)
        .unwrap_or_else(|| panic!("no process listens on port {port}"))
}

// ---- (a) CFS quota --------------------------------------------------------------------------

/// (a) The server's CFS quota cut from 2 cores to 20 % of a core.
#[test]
fn live_cpu_quota_on_llamacpp() {
    if !enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let server = model_server();
    let pid = server_pid(server.port);
    let mut cg = V1Cgroup::create(CPU_V1, "cpu");
    cg.set("cpu.cfs_period_us", "100000").unwrap();
    cg.set("cpu.cfs_quota_us", "200000").unwrap();
    cg.enter(pid, "cpu");
    let spec = Spec {
        name: "live-cpu_throttling-llamacpp-quota20-1".into(),
        cause: "cpu_throttling",
        second: None,
        magnitude: "CFS quota 2 cores -> 20 % of a core (cgroup v1 cpu.cfs_quota_us 200000 -> 20000 of 100000)".into(),
        notes: "tests/diagnose_live/contention.rs: the agent's canaries (1/s, 4 tokens) and its 1 s scrape of the real llama.cpp server (Gemma 3 270M, --parallel 2, --threads 1) in its own cgroup v1 cpu cgroup; from the onset its CFS quota is cut to 20 % of a core (node_* and cgroup_* series: /proc/pressure and the cgroup's cpu.stat read by the test each second, as the agent reads them)".into(),
    };
    let dirs = cgroup::dirs_of_pid(Path::new("/proc"), pid, Path::new("/sys/fs/cgroup"));
    let out = run(
        &spec,
        &server.url(),
        dirs,
        Some(pid),
        || cg.set("cpu.cfs_quota_us", "20000").unwrap(),
        |p| p.iter().any(|(_, t)| confirms(t, "cpu_throttling")),
    );
    let nr = std::fs::read_to_string(cg.dir.join("cpu.stat")).unwrap_or_default();
    drop(server);
    drop(cg);
    let hit = report(&spec, &out, "cpu_throttling", |t| {
        confirms(t, "cpu_throttling")
    });
    println!("  cpu.stat at the end: {}", nr.replace('\n', " "));
    let (at, t) = hit.expect("cpu_throttling not confirmed");
    assert!(*at <= 60.0, "cpu_throttling after {at:.0} s (> 60 s)");
    let ev = evidence_line(t, "cpu_throttling");
    assert!(ev.contains("cgroup_cpu_throttled"), "{ev}");
}

// ---- (b) a neighbour spinning both cores -------------------------------------------------------

/// Busy-loop processes, killed when dropped.
struct Spinners(Vec<Child>);

impl Spinners {
    fn start(n: usize) -> Self {
        Self(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// (b) A neighbour process spinning both cores.
#[test]
fn live_cpu_hog_on_llamacpp() {
    if !enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let server = model_server();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let spec = Spec {
        name: "live-node_cpu_pressure-llamacpp-spin-1".into(),
        cause: "node_cpu_pressure",
        second: None,
        magnitude: format!("{cores} busy-loop processes (every core)"),
        notes: format!(
            "tests/diagnose_live/contention.rs: the agent's canaries (1/s, 4 tokens) and its 1 s scrape of the real llama.cpp server (Gemma 3 270M, --parallel 2, --threads 1); from the onset a neighbour spins every core ({cores} `sh` busy loops) (node_* series: /proc/pressure, server_cpu_wait and server_cpu: the server's threads' /proc/PID/task/*/schedstat, read by the test each second, as the agent reads them)"
        ),
    };
    let pid = server_pid(server.port);
    let dirs = cgroup::dirs_of_pid(Path::new("/proc"), pid, Path::new("/sys/fs/cgroup"));
    let out = run(
        &spec,
        &server.url(),
        dirs,
        Some(pid),
        || Spinners::start(cores),
        |p| p.iter().any(|(_, t)| confirms(t, "node_cpu_pressure")),
    );
    drop(server);
    let hit = report(&spec, &out, "node_cpu_pressure", |t| {
        confirms(t, "node_cpu_pressure")
    });
    assert!(hit.is_some(), "node_cpu_pressure not confirmed");
}

// ---- (c) the server's memory cgroup at its limit ----------------------------------------------

/// (c) The server's memory limit cut to its anonymous memory + half its file pages.
#[test]
fn live_memory_limit_on_llamacpp() {
    if !enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let mut cg = V1Cgroup::create(MEMORY_V1, "mem");
    // The model's pages are charged to the cgroup of the process that first reads them: a
    // private copy, written and mapped from inside the cgroup (the test enters it while it
    // copies the model and starts the server, then leaves).
    let model = workspace_root().join(".venv-peers/models/gemma-3-270m-q4_k_m.gguf");
    let copy = temp::dir("diag-contention-model").join("model.gguf");
    let me = std::process::id();
    cg.enter(me, "memory");
    std::fs::copy(&model, &copy).expect("copy the model");
    let port = free_port();
    let server =
        ModelServer::start_with(port, &["--threads", "1", "--model", copy.to_str().unwrap()]);
    cg.leave(me);
    let usage = cg.read_u64("memory.usage_in_bytes").unwrap_or(0);
    let calm_limit = (3 * usage).max(1 << 30);
    cg.set("memory.limit_in_bytes", &calm_limit.to_string())
        .unwrap();
    let pid = server_pid(port);
    let dirs = cgroup::dirs_of_pid(Path::new("/proc"), pid, Path::new("/sys/fs/cgroup"));
    let limit = std::sync::Mutex::new(0u64);
    let spec = Spec {
        name: "live-memory_pressure-llamacpp-limit-1".into(),
        cause: "memory_pressure",
        second: None,
        magnitude: "memory limit 3 x usage -> anonymous + half the file pages (the mapped weights reclaimed)".into(),
        notes: "tests/diagnose_live/contention.rs: the agent's canaries (1/s, 4 tokens) and its 1 s scrape of the real llama.cpp server (Gemma 3 270M, --parallel 2, --threads 1, a private copy of the model mapped from its own cgroup v1 memory cgroup, limit 3 x its usage); from the onset the limit is cut to its anonymous memory plus half its file pages, so the weights are read again at every token (node_* and cgroup_* series: /proc/pressure and the cgroup's memory files read by the test each second, as the agent reads them)".into(),
    };
    let out = run(
        &spec,
        &server.url(),
        dirs,
        Some(pid),
        || {
            let rss = cg.stat("total_rss").or_else(|| cg.stat("rss")).unwrap_or(0);
            let cache = cg
                .stat("total_cache")
                .or_else(|| cg.stat("cache"))
                .unwrap_or(0);
            let mut l = rss + cache / 2;
            // The kernel refuses a limit it cannot reclaim down to (EBUSY): a little more.
            while cg.set("memory.limit_in_bytes", &l.to_string()).is_err() && l < calm_limit {
                l += 16 << 20;
            }
            println!(
                "memory_limit: usage {} MiB (anonymous {} MiB, file {} MiB) -> limit {} MiB",
                (rss + cache) >> 20,
                rss >> 20,
                cache >> 20,
                l >> 20
            );
            *limit.lock().unwrap() = l;
        },
        |p| p.iter().any(|(_, t)| confirms(t, "memory_pressure")),
    );
    let failcnt = cg.read_u64("memory.failcnt");
    let oom = std::fs::read_to_string(cg.dir.join("memory.oom_control")).unwrap_or_default();
    drop(server);
    drop(cg);
    let _ = std::fs::remove_file(&copy);
    let hit = report(&spec, &out, "memory_pressure", |t| {
        confirms(t, "memory_pressure")
    });
    println!(
        "  cgroup at the end: limit {} MiB, failcnt {failcnt:?}, {}",
        *limit.lock().unwrap() >> 20,
        oom.replace('\n', " ")
    );
    assert!(hit.is_some(), "memory_pressure not confirmed");
}

// ---- (d) a load surge, then a 503 burst ------------------------------------------------------

/// A reverse proxy in front of `upstream` (every path, one request per connection) that, while
/// `failing`, answers 503 to 3 of every 5 chat requests.
struct FailingProxy {
    port: u16,
    failing: Arc<AtomicBool>,
    refused: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FailingProxy {
    fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let failing = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, r, s) = (failing.clone(), refused.clone(), stop.clone());
        std::thread::spawn(move || {
            let chats = Arc::new(AtomicUsize::new(0));
            for conn in listener.incoming().map_while(Result::ok) {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let (f, r, chats) = (f.clone(), r.clone(), chats.clone());
                std::thread::spawn(move || serve(conn, upstream, &f, &r, &chats));
            }
        });
        Self {
            port,
            failing,
            refused,
            stop,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for FailingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(
    conn: TcpStream,
    upstream: u16,
    failing: &AtomicBool,
    refused: &AtomicUsize,
    chats: &AtomicUsize,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(120)));
    let Some(req) = lmperf_e2e::proxy::read_request(&conn) else {
        return;
    };
    let mut client = conn;
    if req.path.ends_with("/chat/completions") {
        let n = chats.fetch_add(1, Ordering::Relaxed);
        if failing.load(Ordering::Relaxed) && n % 5 < 3 {
            refused.fetch_add(1, Ordering::Relaxed);
            let body = r#"{"error":{"message":"overloaded","type":"server_error"}}"#;
            let _ = client.write_all(
                format!(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
            return;
        }
    }
    lmperf_e2e::proxy::forward(&req, upstream, &mut client);
}

/// The surge's clients and the proxy's 503s, switched on `SECOND_FAULT_S` after them; both end
/// when dropped.
struct SurgeThen503 {
    _load: Load,
    failing: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Drop for SurgeThen503 {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.failing.store(false, Ordering::Relaxed);
    }
}

/// (d) 4 closed-loop clients, then 20 s later 503 to 3 chat requests in 5.
#[test]
fn live_surge_then_503_on_llamacpp() {
    if !enabled() {
        return;
    }
    let _serial = lmperf_e2e::serial::lock_blocking();
    let server = model_server();
    let proxy = FailingProxy::start(server.port);
    let spec = Spec {
        name: "live-load_surge-then-error_burst-llamacpp-1".into(),
        cause: "load_surge",
        second: Some(("error_burst", SECOND_FAULT_S)),
        magnitude: format!(
            "4 closed-loop clients of 48-token answers on 2 slots; {SECOND_FAULT_S} s later 503 to 3 of 5 chat requests"
        ),
        notes: format!(
            "tests/diagnose_live/contention.rs: the agent's canaries (1/s, 4 tokens) and its 1 s scrape of the real llama.cpp server (Gemma 3 270M, --parallel 2, --threads 1) through a proxy; from the onset 4 more clients send 48-token story requests to the server back to back (load_surge), and {SECOND_FAULT_S} s later the proxy answers 503 to 3 of every 5 chat requests (error_burst): two faults, the episode's cause the first"
        ),
    };
    let port = server.port;
    let (failing, stop) = (proxy.failing.clone(), Arc::new(AtomicBool::new(false)));
    let out = run(
        &spec,
        &proxy.url(),
        cgroup::CgroupDirs::default(),
        Some(server_pid(server.port)),
        || {
            let load = Load::start(port, 4, story);
            let (f, s) = (failing.clone(), stop.clone());
            std::thread::spawn(move || {
                let t = Instant::now();
                while t.elapsed() < Duration::from_secs(SECOND_FAULT_S) {
                    if s.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                f.store(true, Ordering::Relaxed);
            });
            SurgeThen503 {
                _load: load,
                failing: failing.clone(),
                stop: stop.clone(),
            }
        },
        |p| {
            p.iter()
                .any(|(_, t)| in_top_three(t, &["load_surge", "error_burst"]))
        },
    );
    let refused = proxy.refused.load(Ordering::Relaxed);
    drop(proxy);
    drop(server);
    let first_surge = out.polls.iter().find(|(_, t)| confirms(t, "load_surge"));
    let hit = report(&spec, &out, "load_surge + error_burst", |t| {
        in_top_three(t, &["load_surge", "error_burst"])
    });
    if let Some((at, t)) = first_surge {
        println!(
            "  load_surge alone confirmed first {at:.0} s after the surge: {}",
            ranked(t, 3)
        );
    }
    println!(
        "  (the 503s began {SECOND_FAULT_S} s after the surge; the proxy refused {refused} chat requests)"
    );
    let (_, t) = hit.expect("load_surge and error_burst not both in the top three");
    let roots = &t["roots"];
    println!("  roots: {roots}");
}

/// A calm run of `secs` seconds through a router (issue 53): the agent on `url` with the
/// target's settings `target`, no fault, polled each second. Returns the `root_confirmed`
/// transitions the polls saw and the polls not idle; each confirmation is printed.
fn calm_through(name: &str, (url, target): (&str, &str), secs: u64) -> (usize, usize) {
    let dir = temp::dir(name);
    let cfg = agent_config(&dir, url, "gemma-3-270m", REAL_CANARY, target, false);
    let agent = Agent::spawn(&["--config", &cfg, "--no-otlp"], &[]);
    let (mut confirmations, mut not_idle, mut was) = (0, 0, false);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        let (_, body) = agent.get("/api/v1/diagnosis?target=t0");
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let state = v["targets"][0]["state"].as_str().unwrap_or("");
        not_idle += usize::from(!state.is_empty() && state != "idle");
        let confirmed = state == "root_confirmed";
        if confirmed && !was {
            confirmations += 1;
            eprintln!(
                "{name}: root_confirmed at +{:.0} s: {}\n{:#}",
                t.elapsed().as_secs_f64(),
                v["targets"][0]["summary"],
                v["targets"][0]
            );
        }
        was = confirmed;
    }
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
    (confirmations, not_idle)
}

/// `LMPERF_DIAGNOSE_CALM_S`, the calm runs' length (`cargo xtask diagnose-eval --calm 10m`).
fn calm_secs() -> Option<u64> {
    let secs = std::env::var("LMPERF_DIAGNOSE_CALM_S")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    if secs.is_none() {
        eprintln!("skipped: set LMPERF_DIAGNOSE_CALM_S=N (cargo xtask diagnose-eval --calm 10m)");
    }
    secs
}

// ---- the serving path (issue 53): vllm-router in front of two real servers -----------------

#[path = "serving_path.rs"]
mod serving_path;

#[path = "dynamo.rs"]
mod dynamo;
