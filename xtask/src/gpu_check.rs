//! `cargo xtask gpu-check [--seconds N]`: GPU metrics on a machine with a real NVIDIA GPU.
//!
//! 1. `nvidia-smi` must work (else: exit with a message; there is nothing to check).
//! 2. Builds `lmperf` (release) and starts a load: a `torch` matmul loop on GPU 0 when
//!    `python3 -c "import torch"` works, else none (idle checks only).
//! 3. Runs the agent (`[gpu] interval = "500ms"`, one canary target that refuses) for N
//!    seconds (default 15), then reads `/api/v1/status` and `/metrics`.
//! 4. Checks: GPU mode `on`; every GPU `nvidia-smi` lists appears as `hw.id`;
//!    `hw.gpu.memory.usage` within 5 % (or 256 MiB) of `nvidia-smi`'s memory.used; under
//!    load, `hw.gpu.utilization` > 0 on GPU 0; the load's PID is attributed with its command
//!    line. Prints every figure.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok(body)
}

fn smi(query: &str) -> Result<Vec<Vec<String>>> {
    let out = Command::new("nvidia-smi")
        .args([
            &format!("--query-gpu={query}"),
            "--format=csv,noheader,nounits",
        ])
        .output()
        .context("nvidia-smi")?;
    if !out.status.success() {
        bail!(
            "nvidia-smi failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split(',').map(|f| f.trim().to_owned()).collect())
        .collect())
}

/// Values of metric family `name` whose labels contain `label`.
fn prom_values(text: &str, name: &str, label: &str) -> Vec<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

const LOAD: &str = "import torch,time\na=torch.randn(8192,8192,device='cuda')\nt=time.time()\nwhile time.time()-t<600:\n    a=(a@a).clamp_(-1,1)\n    torch.cuda.synchronize()\n";

pub fn run(args: &[String]) -> Result<()> {
    let seconds: u64 = match args {
        [] => 15,
        [flag, n] if flag == "--seconds" => n.parse().context("--seconds N")?,
        _ => bail!("usage: cargo xtask gpu-check [--seconds N]"),
    };
    let gpus = smi("uuid,memory.used,utilization.gpu,name")
        .context("gpu-check needs an NVIDIA GPU and nvidia-smi")?;
    println!("nvidia-smi: {} GPU(s): {:?}", gpus.len(), gpus);
    crate::build_release_lmperf("")?;

    let torch = Command::new("python3")
        .args(["-c", "import torch; assert torch.cuda.is_available()"])
        .status()
        .is_ok_and(|s| s.success());
    let load = if torch {
        println!("load: torch matmul loop on GPU 0");
        Some(Kill(
            Command::new("python3")
                .args(["-c", LOAD])
                .spawn()
                .context("start the torch load")?,
        ))
    } else {
        println!("load: none (torch with CUDA not importable); idle checks only");
        None
    };
    let dir = crate::root().join("target/gpu-check");
    std::fs::create_dir_all(&dir)?;
    let cfg = dir.join("lmperf.toml");
    std::fs::write(
        &cfg,
        "admin_addr = \"127.0.0.1:19466\"\n[canary]\ninterval = \"1s\"\nmodel = \"m\"\n[[target]]\nurl = \"http://127.0.0.1:9\"\n[gpu]\ninterval = \"500ms\"\n",
    )?;
    let log = std::fs::File::create(dir.join("agent.log"))?;
    let _agent = Kill(
        Command::new(crate::root().join("target/release/lmperf"))
            .args(["agent", "--no-otlp", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start lmperf")?,
    );
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let status = http_get("127.0.0.1:19466", "/api/v1/status")?;
    let metrics = http_get("127.0.0.1:19466", "/metrics")?;
    std::fs::write(dir.join("status.json"), &status)?;
    std::fs::write(dir.join("metrics.txt"), &metrics)?;
    let smi_now = smi("uuid,memory.used,utilization.gpu")?;
    println!(
        "agent ran {:.0} s; status and metrics in {}",
        t.elapsed().as_secs_f64(),
        dir.display()
    );

    let mut failures = Vec::new();
    if !status.contains("\"mode\":\"on\"") {
        failures.push(format!("GPU mode is not on: {status}"));
    }
    for (i, row) in smi_now.iter().enumerate() {
        let (uuid, used_mib) = (&row[0], row[1].parse::<f64>().unwrap_or(-1.0));
        let ours = prom_values(
            &metrics,
            "hw_gpu_memory_usage_bytes",
            &format!("hw_id=\"{uuid}\""),
        );
        let util = prom_values(
            &metrics,
            "hw_gpu_utilization_ratio",
            &format!("hw_id=\"{uuid}\""),
        );
        let ours_mib = ours.first().map(|b| b / 1048576.0);
        println!(
            "GPU {i} {uuid}: memory.used nvidia-smi {used_mib:.0} MiB, lmperf {:?} MiB; utilization nvidia-smi {} %, lmperf {:?}",
            ours_mib.map(|m| m.round()),
            row[2],
            util.first()
        );
        match ours_mib {
            None => failures.push(format!("no hw.gpu.memory.usage for {uuid}")),
            Some(m) if (m - used_mib).abs() > (used_mib * 0.05).max(256.0) => failures.push(
                format!("{uuid}: memory {m:.0} MiB vs nvidia-smi {used_mib:.0} MiB"),
            ),
            _ => {}
        }
        if i == 0 && load.is_some() && !util.first().is_some_and(|u| *u > 0.0) {
            failures.push(format!("{uuid}: utilization {util:?} under load"));
        }
    }
    if let Some(l) = &load {
        let pid = format!("process_pid=\"{}\"", l.0.id());
        let held = prom_values(&metrics, "lmperf_gpu_process_memory_usage_bytes", &pid);
        println!(
            "load PID {}: lmperf.gpu.process.memory.usage {:?} bytes",
            l.0.id(),
            held
        );
        if held.is_empty() {
            failures.push(format!("the load's PID {} is not attributed", l.0.id()));
        }
    }
    if failures.is_empty() {
        println!("gpu-check: ok");
        Ok(())
    } else {
        bail!("gpu-check failed:\n  {}", failures.join("\n  "))
    }
}
