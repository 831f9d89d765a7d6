//! Cost of the eBPF probes (issue 5, acceptance 3). As root, after `cargo build --release -p lmperf`:
//!
//! ```text
//! cargo bench -p lmperf-e2e --bench net_probe_cost [-- RATE SECONDS]
//! ```
//!
//! Drives RATE (default 5,000) HTTP requests/s for SECONDS (default 5) over 8 loopback
//! keep-alive connections to a fast scripted server (each response a 4-frame SSE stream, so
//! several segments a request), with an agent whose target is that server, twice: probes
//! disabled, then on. Prints, with `kernel.bpf_stats_enabled` set for the run (restored
//! after): each lmperf program's run count and ns per run (`run_time_ns / run_cnt` from
//! `BPF_OBJ_GET_INFO_BY_FD`; target ≤ 1 µs), and the agent's CPU (utime + stime from
//! `/proc/PID/stat`) in both runs. Not a test: figures only.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lmperf_e2e::agent::Agent;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};

const CONNECTIONS: usize = 8;
const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Sets `kernel.bpf_stats_enabled` to 1 and puts the old value back when dropped.
struct StatsEnabled(String);

impl StatsEnabled {
    fn set() -> std::io::Result<Self> {
        let old = std::fs::read_to_string(SYSCTL)?.trim().to_owned();
        std::fs::write(SYSCTL, "1")?;
        Ok(StatsEnabled(old))
    }
}

impl Drop for StatsEnabled {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(SYSCTL, &self.0) {
            eprintln!("cannot restore {SYSCTL} to {}: {e}", self.0);
        }
    }
}

/// (name, run count, run time ns) of each loaded lmperf program.
fn program_stats() -> Vec<(String, u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| {
            let name = p.name_as_str()?.to_owned();
            name.starts_with("lmperf_")
                .then(|| (name, p.run_count(), p.run_time().as_nanos() as u64))
        })
        .collect()
}

/// utime + stime of `pid`, seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after_comm
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // Fields after the comm start at 3 (state, not a number, skipped by the parse): utime
    // and stime are fields 14 and 15, at 10 and 11 of the numeric rest.
    let ticks = f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// One keep-alive connection sending requests on an absolute schedule of `period` until
/// `count` are done or `deadline` passes; returns how many completed.
fn drive(addr: SocketAddr, period: Duration, count: u64, deadline: Instant) -> u64 {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let start = Instant::now();
    let mut buf = vec![0u8; 16384];
    let mut done = 0;
    while done < count && Instant::now() < deadline {
        let due = start + period * done as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if s.write_all(req.as_bytes()).is_err() {
            break;
        }
        let mut got = Vec::new();
        while !got.ends_with(b"0\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return done,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        done += 1;
    }
    done
}

struct Run {
    rate: f64,
    agent_cpu: f64,
    programs: Vec<(String, u64, u64)>,
    net: serde_json::Value,
}

fn run(server: &ScriptedServer, probes: bool, rate: f64, secs: f64) -> Run {
    let cfg = std::env::temp_dir().join(format!(
        "lmperf-probe-cost-{}-{probes}.toml",
        std::process::id()
    ));
    std::fs::write(
        &cfg,
        format!("[canary]\nprovider = \"openai\"\n[net]\nenabled = {probes}\n"),
    )
    .unwrap();
    let agent = Agent::spawn(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--target",
            &server.url(),
            "--model",
            "m",
            "--interval",
            "1s",
            "--no-otlp",
        ],
        &[],
    );
    let net = agent.wait_status(Duration::from_secs(5), |s| s["net"]["mode"] != "starting")["net"]
        .clone();
    let before = program_stats();
    let cpu0 = cpu_seconds(agent.pid());
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(secs + 2.0);
    let per_conn = (rate * secs / CONNECTIONS as f64).ceil() as u64;
    let period = Duration::from_secs_f64(CONNECTIONS as f64 / rate);
    let addr = server.addr;
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|_| std::thread::spawn(move || drive(addr, period, per_conn, deadline)))
        .collect();
    let done: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let wall = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300)); // let the agent drain the ring buffer
    let agent_cpu = (cpu_seconds(agent.pid()) - cpu0) / (t0.elapsed().as_secs_f64());
    let after = program_stats();
    let programs = after
        .iter()
        .map(|(name, cnt, ns)| {
            let (c0, n0) = before
                .iter()
                .find(|b| &b.0 == name)
                .map_or((0, 0), |b| (b.1, b.2));
            (name.clone(), cnt - c0, ns - n0)
        })
        .collect();
    let net = agent.status()["net"].clone().as_object().map(|o| serde_json::json!({ "mode": o["mode"], "events": o["events"], "dropped": o["dropped"] })).unwrap_or(net);
    let _ = std::fs::remove_file(cfg);
    Run {
        rate: done as f64 / wall,
        agent_cpu,
        programs,
        net,
    }
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("net_probe_cost: skipped (needs root for the probes and {SYSCTL})");
        return;
    }
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rate, secs) = (
        args.first().copied().unwrap_or(5000.0),
        args.get(1).copied().unwrap_or(5.0).min(60.0),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(2, Duration::ZERO, Duration::ZERO, 1))
    })));
    let stats = match StatsEnabled::set() {
        Ok(s) => s,
        Err(e) => {
            println!("net_probe_cost: cannot set {SYSCTL}: {e}");
            return;
        }
    };
    println!(
        "net_probe_cost: {rate} requests/s for {secs} s over {CONNECTIONS} loopback connections"
    );
    let off = run(&server, false, rate, secs);
    let on = run(&server, true, rate, secs);
    drop(stats);
    for (label, r) in [("probes off", &off), ("probes on ", &on)] {
        println!(
            "  {label}: {:8.0} requests/s achieved, agent CPU {:6.2} % of one core, net {}",
            r.rate,
            r.agent_cpu * 100.0,
            r.net
        );
    }
    let mut total = (0u64, 0u64);
    for (name, cnt, ns) in &on.programs {
        total = (total.0 + cnt, total.1 + ns);
        println!(
            "  {name:<16} {cnt:>9} runs  {:>7.0} ns/run",
            *ns as f64 / (*cnt).max(1) as f64
        );
    }
    println!(
        "  all programs     {:>9} runs  {:>7.0} ns/run (target ≤ 1000), {:.2} % of one core",
        total.0,
        total.1 as f64 / total.0.max(1) as f64,
        total.1 as f64 / 1e9 / secs * 100.0
    );
    println!(
        "  agent CPU with probes on minus off: {:+.2} % of one core",
        (on.agent_cpu - off.agent_cpu) * 100.0
    );
    println!(
        "  {SYSCTL} restored to {}",
        std::fs::read_to_string(SYSCTL).unwrap_or_default().trim()
    );
}
