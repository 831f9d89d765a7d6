//! `lmperf run`'s memory over a long run (issue 15): `cargo bench -p lmperf-e2e --bench run_memory`
//! (needs the `lmperf` binary of the same profile: `cargo build --release -p lmperf`; or
//! `LMPERF_BIN=path`). Not a test, not in CI.
//!
//! Runs the real binary (`lmperf run`, open loop, constant arrivals) against the fast stream
//! server of `tests/support` (loopback, its own thread, `--tokens` chat chunks per reply, one
//! write each, or `--gap-ms` apart), and samples the child's resident set (`VmRSS`, and the
//! peak `VmHWM`, of `/proc/PID/status`) against the requests the server has answered, every
//! half second. Prints the RSS at each tenth of the run, the least-squares growth in bytes per
//! request over the run's second half (the first is start-up: connections, buffers, the
//! allocator's arenas, the histograms' ranges, the report sample filling), the peak, and the peak extrapolated to 1 h at 2,000 req/s (7.2 M
//! requests) from that growth. Arguments: `--seconds S` (60), `--rate R` (2000), `--tokens N`
//! (128), `--concurrency C` (256), `--gap-ms G` (0).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::stream_server::{StreamConfig, StreamServer};

/// `VmRSS` and `VmHWM` of `pid`, KiB.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx > 0.0 { sxy / sxx } else { 0.0 }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: f64| {
        args.windows(2)
            .find(|w| w[0] == name)
            .and_then(|w| w[1].parse().ok())
            .unwrap_or(default)
    };
    let (seconds, rate, tokens, concurrency, gap_ms) = (
        arg("--seconds", 60.0),
        arg("--rate", 2000.0),
        arg("--tokens", 128.0) as usize,
        arg("--concurrency", 256.0) as usize,
        arg("--gap-ms", 0.0),
    );
    let requests = (seconds * rate).round() as u64;
    let bin = std::env::var_os("LMPERF_BIN").map_or_else(lmperf_bin, PathBuf::from);
    let server = StreamServer::start(StreamConfig {
        tokens,
        gap: Duration::from_secs_f64(gap_ms / 1000.0),
        prompt_tokens: 128,
        ..StreamConfig::default()
    })
    .expect("stream server");
    let dir = std::env::temp_dir().join(format!("lmperf-run-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(&bin)
        .args([
            "run",
            "--target",
            &server.url(),
            "--model",
            "bench",
            "--api",
            "chat",
            "--seq-lengths",
            "128",
        ])
        .args([
            "--batch-sizes",
            &concurrency.to_string(),
            "--output-len",
            &tokens.to_string(),
            "--num-prompts",
            &requests.to_string(),
        ])
        .args([
            "--request-rate",
            &rate.to_string(),
            "--arrival",
            "constant",
            "--warmup",
            "0",
            "--output-dir",
            dir.to_str().unwrap_or("."),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lmperf run");
    let pid = child.id();
    let t0 = Instant::now();
    let limit = Duration::from_secs_f64(seconds * 4.0 + 300.0);
    let (mut served, mut peak_kib) = (0u64, 0u64);
    // (seconds, requests answered, RSS KiB)
    let mut samples: Vec<(f64, u64, u64)> = Vec::new();
    let status = loop {
        std::thread::sleep(Duration::from_millis(500));
        served += server.drain_count() as u64;
        if let Some((rss, hwm)) = rss_kib(pid) {
            peak_kib = peak_kib.max(hwm);
            samples.push((t0.elapsed().as_secs_f64(), served, rss));
        }
        if let Ok(Some(s)) = child.try_wait() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("run_memory: lmperf run still going after {limit:?}: killed");
            std::process::exit(1);
        }
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    // The child's own peak, as its parent sees it once it has exited.
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let children_max = if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } == 0 {
        ru.ru_maxrss as u64
    } else {
        0
    };
    peak_kib = peak_kib.max(children_max);
    if !status.success() {
        eprintln!("run_memory: lmperf run failed ({status}): {err}");
        std::process::exit(1);
    }
    let summary: serde_json::Value = std::fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let b = &summary["benchmarks"][0];
    let jsonl = std::fs::metadata(dir.join("requests.jsonl"))
        .map(|m| m.len())
        .unwrap_or(0);
    let lines = std::fs::read_to_string(dir.join("requests.jsonl"))
        .map(|s| s.lines().count())
        .unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "run_memory: lmperf run ({}) {requests} requests asked at {rate} req/s × {tokens} tokens, concurrency {concurrency}, server gap {gap_ms} ms: {} completed in {:.1} s ({:.0} req/s achieved, dispatch delay p99 {:.1} ms); requests.jsonl {lines} rows, {:.1} MiB",
        bin.display(),
        b["completed"],
        b["duration_s"].as_f64().unwrap_or(0.0),
        b["request_throughput"].as_f64().unwrap_or(0.0),
        b["dispatch_delay_ms"]["p99"].as_f64().unwrap_or(f64::NAN),
        jsonl as f64 / f64::from(1u32 << 20),
    );
    println!("run_memory: requests answered → RSS (MiB)");
    let total = samples.last().map_or(0, |s| s.1).max(1);
    for tenth in 1..=10u64 {
        if let Some(s) = samples.iter().find(|s| s.1 * 10 >= total * tenth) {
            println!(
                "run_memory:   {:>9} ({:>3} %) at {:>6.1} s → {:>7.1}",
                s.1,
                tenth * 10,
                s.0,
                mib(s.2)
            );
        }
    }
    let steady: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.1 * 2 >= total && s.1 < total)
        .map(|s| (s.1 as f64, s.2 as f64 * 1024.0))
        .collect();
    let per_request = slope(&steady);
    let at_end = samples
        .iter()
        .rev()
        .find(|s| s.1 < total)
        .or(samples.last())
        .map_or(0, |s| s.2);
    let hour = 7_200_000f64;
    let projected =
        peak_kib as f64 * 1024.0 + per_request.max(0.0) * (hour - total as f64).max(0.0);
    println!(
        "run_memory: peak RSS {:.1} MiB (VmHWM); RSS at the end of sending {:.1} MiB; growth over the second half {per_request:.1} bytes/request ({} samples)",
        mib(peak_kib),
        mib(at_end),
        steady.len()
    );
    println!(
        "run_memory: 1 h at 2,000 req/s (7.2 M requests): peak RSS ≤ {:.1} MiB by that growth (keeping every row with its {} ITL values would take ≥ {:.2} GiB for the ITL alone)",
        projected / f64::from(1u32 << 20),
        tokens.saturating_sub(1),
        hour * tokens.saturating_sub(1) as f64 * 8.0 / f64::from(1u32 << 30)
    );
}
