//! Closed loop beside wrk (issue 40): `lmperf run` at concurrency `C` (`--request-rate inf`,
//! a new request as soon as one ends) and wrk, the reference HTTP load generator, on one
//! thread (`-t1 -cC`, its Lua script posting the same chat request), against the same stream
//! server, on the same cores. Each rate is the server's own: (arrivals − 1) / (last − first
//! arrival) of the completions it received, so both are judged by one yardstick. Printed with
//! the ratio lmperf / wrk (target ≥ 0.25) and the load average.
//!
//! Settings: `LMPERF_BENCH_CLOSED_CONC` (concurrency, 64), `LMPERF_BENCH_CLOSED_N` (lmperf's
//! requests, 20,000), `LMPERF_BENCH_CLOSED_S` (wrk's seconds, 5), `LMPERF_BENCH_WRK` (the
//! binary, `wrk`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::stream_server::{Kind, StreamServer};

use super::{Settings, children_cpu, env_or, loadavg, reap_leftovers};

/// One tool's closed-loop run.
pub struct ClosedLoop {
    pub tool: &'static str,
    /// Completions the server received.
    pub arrived: usize,
    /// Their arrival rate, req/s; `None` with fewer than 2.
    pub rate: Option<f64>,
    /// The client's CPU (its process tree), seconds.
    pub cpu_s: f64,
    pub load: String,
    /// Why it did not run, when it did not.
    pub skipped: Option<String>,
}

/// Runs wrk, then lmperf, closed loop against `server`; prints each and the ratio.
pub fn run(s: &Settings, server: &StreamServer) -> Vec<ClosedLoop> {
    let conc: usize = env_or("LMPERF_BENCH_CLOSED_CONC", "64")
        .parse()
        .unwrap_or(64);
    let n: usize = env_or("LMPERF_BENCH_CLOSED_N", "20000")
        .parse()
        .unwrap_or(20_000);
    let secs: f64 = env_or("LMPERF_BENCH_CLOSED_S", "5").parse().unwrap_or(5.0);
    println!(
        "\nclosed loop, concurrency {conc} (wrk {secs} s on one thread, lmperf {n} requests):"
    );
    let url = server.url();
    let wrk = wrk_command(s, &url, conc, secs);
    let lmperf = lmperf_command(s, &url, conc, n);
    let out = vec![
        match wrk {
            Ok(cmd) => one("wrk", cmd, server, Duration::from_secs_f64(secs + 30.0)),
            Err(why) => skipped("wrk", why),
        },
        one("lmperf", lmperf, server, Duration::from_secs(120)),
    ];
    for r in &out {
        match &r.skipped {
            Some(why) => println!("  {:<8} closed loop: skipped: {why}", r.tool),
            None => println!(
                "  {:<8} closed loop: {:>7} completions at {:>9} req/s (server arrivals), client CPU {:.2} s   [load {}]",
                r.tool,
                r.arrived,
                r.rate.map_or("-".to_owned(), |v| format!("{v:.0}")),
                r.cpu_s,
                r.load
            ),
        }
    }
    if let (Some(w), Some(l)) = (out[0].rate, out[1].rate) {
        println!(
            "  lmperf / wrk closed-loop rate: {:.2} (target >= 0.25)",
            l / w
        );
    }
    out
}

fn skipped(tool: &'static str, why: String) -> ClosedLoop {
    ClosedLoop {
        tool,
        arrived: 0,
        rate: None,
        cpu_s: 0.0,
        load: loadavg(),
        skipped: Some(why),
    }
}

/// wrk on one thread with `conc` connections for `secs`, posting a streaming chat request
/// (its Lua script written beside the other tools' scratch files).
fn wrk_command(s: &Settings, url: &str, conc: usize, secs: f64) -> Result<Command, String> {
    let bin = env_or("LMPERF_BENCH_WRK", "wrk");
    let found = Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        return Err(format!(
            "{bin} not found (Debian: apt-get install wrk; cargo xtask bench-client installs it as root)"
        ));
    }
    let body = serde_json::json!({
        "model": "bench",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": s.output_tokens,
        "stream": true,
    });
    let script = format!(
        "wrk.method = \"POST\"\nwrk.body = {body:?}\nwrk.headers[\"Content-Type\"] = \"application/json\"\n",
        body = body.to_string()
    );
    let path = s.scratch.join("wrk-post.lua");
    std::fs::create_dir_all(&s.scratch).map_err(|e| format!("{}: {e}", s.scratch.display()))?;
    std::fs::write(&path, script).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut c = Command::new(bin);
    c.args(["-t1", &format!("-c{conc}"), &format!("-d{secs}s"), "-s"])
        .arg(&path)
        .arg(format!("{url}/v1/chat/completions"));
    Ok(c)
}

fn lmperf_command(s: &Settings, url: &str, conc: usize, n: usize) -> Command {
    let dir = s.scratch.join("lmperf-closed");
    let _ = std::fs::remove_dir_all(&dir);
    let mut c = Command::new(lmperf_bin());
    c.args(["run", "--target", url, "--model", "bench", "--api", "chat"])
        .args(["--batch-sizes", &conc.to_string()])
        .args(["--seq-lengths", &s.input_tokens.to_string()])
        .args(["--output-len", &s.output_tokens.to_string()])
        .args(["--num-prompts", &n.to_string(), "--request-rate", "inf"])
        .args(["--timeout", "30s", "--output-dir"])
        .arg(dir);
    c
}

/// Runs `cmd` (killed after `limit`) and reads the server's arrivals during it.
fn one(tool: &'static str, mut cmd: Command, server: &StreamServer, limit: Duration) -> ClosedLoop {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.env("NO_PROXY", "127.0.0.1,localhost");
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    server.clear();
    let cpu0 = children_cpu();
    let t0 = Instant::now();
    match cmd.spawn() {
        Ok(mut child) => loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if t0.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    // SAFETY: the process group of the child we started.
                    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                    let _ = child.wait();
                    break;
                }
            }
        },
        Err(e) => return skipped(tool, format!("cannot start: {e}")),
    }
    reap_leftovers();
    let cpu = children_cpu().saturating_sub(cpu0);
    let mut arrivals: Vec<Instant> = server
        .served()
        .into_iter()
        .filter(|r| r.kind == Kind::Completion)
        .map(|r| r.arrived)
        .collect();
    arrivals.sort();
    let rate = match (arrivals.first(), arrivals.last()) {
        (Some(a), Some(b)) if arrivals.len() > 1 && b > a => {
            Some((arrivals.len() - 1) as f64 / b.duration_since(*a).as_secs_f64())
        }
        _ => None,
    };
    ClosedLoop {
        tool,
        arrived: arrivals.len(),
        rate,
        cpu_s: cpu.as_secs_f64(),
        load: loadavg(),
        skipped: None,
    }
}
