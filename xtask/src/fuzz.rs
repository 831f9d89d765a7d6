//! `cargo xtask fuzz [--seconds N] [--jobs J]`: the cargo fuzz target over the stream
//! measurement (`daemon/fuzz/`, target `stream_measurer`), then its figures: executions,
//! coverage (libFuzzer's edges `cov` and features `ft`), corpus size, time, peak memory.
//!
//! 1. `cargo-fuzz`: the one on PATH (`$CARGO_HOME/bin`, where an earlier run installed it),
//!    else from crates.io (`cargo install cargo-fuzz --locked`, once for the machine: a fresh
//!    clone does not build it again);
//! 2. `cargo +nightly fuzz run stream_measurer` (nightly only here: the sanitizer-coverage
//!    flags need it; the rest of the project builds on stable) with the corpus of the repo
//!    (`daemon/fuzz/corpus/stream_measurer`, read) and a working corpus in
//!    `target/fuzz-corpus/` (new inputs go there), for N seconds (default 600), at most
//!    2 GiB of memory and 64 KiB per input. A crash or a leak fails the task and leaves its
//!    input in `daemon/fuzz/artifacts/`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

const TARGET: &str = "stream_measurer";
/// The fuzz run's memory limit, MiB (libFuzzer `-rss_limit_mb`).
const RSS_LIMIT_MB: u32 = 2048;

pub fn run(args: &[String]) -> Result<()> {
    let mut seconds: u64 = 600;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                let v = it.next().context("--seconds needs a value")?;
                seconds = v
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .with_context(|| format!("--seconds {v:?}: a positive whole number"))?;
            }
            "-h" | "--help" => {
                println!("usage: cargo xtask fuzz [--seconds N]   (default 600)");
                return Ok(());
            }
            other => bail!("unexpected argument {other:?}; usage: cargo xtask fuzz [--seconds N]"),
        }
    }
    let root = crate::root();
    // Earlier versions installed it here; still used when present.
    let tools = root.join("target/tools");
    if !tools.join("bin/cargo-fuzz").exists() && !cargo_fuzz_on_path() {
        let mut install = crate::cargo();
        install.args(["install", "cargo-fuzz", "--locked"]);
        crate::step("cargo install cargo-fuzz --locked", install)?;
    }
    check_nightly()?;
    let work = root.join("target/fuzz-corpus").join(TARGET);
    std::fs::create_dir_all(&work).with_context(|| format!("{}", work.display()))?;
    let seeds = root.join("daemon/fuzz/corpus").join(TARGET);
    let path = std::env::join_paths(std::iter::once(tools.join("bin")).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;

    // `cargo` from PATH: the rustup proxy, which understands `+nightly` (`$CARGO` is stable's).
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root.join("daemon"))
        .env("PATH", path)
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        // A stable clippy-driver from the caller's `cargo clippy` environment cannot build
        // with nightly's sysroot.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .args([
            "+nightly",
            "fuzz",
            "run",
            "--debug-assertions",
            "--sanitizer",
            "none",
            "--target-dir",
        ])
        .arg(root.join("target/fuzz"))
        .arg(TARGET)
        .arg(&work)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .args(["-max_len=65536", "-print_final_stats=1", "-print_pcs=0"])
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    println!(
        "\n==> cargo +nightly fuzz run {TARGET} ({seconds} s, corpus {})",
        rel(&root, &seeds)
    );
    let started = std::time::Instant::now();
    let mut child = cmd
        .spawn()
        .context("cannot start `cargo +nightly fuzz` (is rustup on PATH?)")?;
    let mut stats = Stats::default();
    if let Some(err) = child.stderr.take() {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            stats.read(&line);
            // libFuzzer's NEW/REDUCE lines are many; keep its milestones, the build and errors.
            if !(line.starts_with('#') && (line.contains("\tNEW ") || line.contains("\tREDUCE "))) {
                eprintln!("{line}");
            }
        }
    }
    let status = child.wait()?;
    let elapsed = started.elapsed().as_secs_f64();
    println!("\n{}", stats.summary(seconds, elapsed));
    if !status.success() {
        bail!(
            "the fuzz run failed ({status}): see the crash input under daemon/fuzz/artifacts/{TARGET}/"
        );
    }
    if stats.execs.is_none() {
        bail!("the fuzz run printed no statistics");
    }
    Ok(())
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// Whether `cargo fuzz` runs (`cargo-fuzz` in `$CARGO_HOME/bin` or elsewhere on PATH).
fn cargo_fuzz_on_path() -> bool {
    Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn check_nightly() -> Result<()> {
    let out = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .context("rustup not found: cargo fuzz needs the nightly toolchain through rustup")?;
    if !String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.starts_with("nightly"))
    {
        bail!(
            "no nightly toolchain (`rustup toolchain list`): cargo fuzz needs one (`rustup toolchain install nightly`)"
        );
    }
    Ok(())
}

/// What libFuzzer said: the last status line's `cov`/`ft`/`corp`, and the final stats.
#[derive(Debug, Default, PartialEq)]
struct Stats {
    execs: Option<u64>,
    execs_per_sec: Option<u64>,
    cov: Option<u64>,
    ft: Option<u64>,
    corpus: Option<u64>,
    peak_rss_mb: Option<u64>,
    /// `Done N runs in S second(s)`.
    done_secs: Option<u64>,
}

/// The number after `key` in `line` (`cov: 123`, `corp: 45/6Kb`).
fn after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

impl Stats {
    fn read(&mut self, line: &str) {
        if line.starts_with('#') {
            if let Some(n) = after(line, "#") {
                self.execs = Some(n);
            }
            self.cov = after(line, "cov:").or(self.cov);
            self.ft = after(line, "ft:").or(self.ft);
            self.corpus = after(line, "corp:").or(self.corpus);
        } else if let Some(n) = after(line, "stat::number_of_executed_units:") {
            self.execs = Some(n);
        } else if let Some(n) = after(line, "stat::average_exec_per_sec:") {
            self.execs_per_sec = Some(n);
        } else if let Some(n) = after(line, "stat::peak_rss_mb:") {
            self.peak_rss_mb = Some(n);
        } else if line.starts_with("Done ") {
            self.execs = after(line, "Done ").or(self.execs);
            self.done_secs = after(line, " in ");
        }
    }

    fn summary(&self, asked: u64, elapsed: f64) -> String {
        let n = |v: Option<u64>| v.map_or("?".to_owned(), |v| v.to_string());
        format!(
            "fuzz: {TARGET}: {} executions in {} s of fuzzing ({} exec/s; {elapsed:.0} s with the build, {asked} s asked), coverage: {} edges, {} features, corpus {} inputs, peak RSS {} MB",
            n(self.execs),
            n(self.done_secs),
            n(self.execs_per_sec),
            n(self.cov),
            n(self.ft),
            n(self.corpus),
            n(self.peak_rss_mb),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_figures() {
        let mut s = Stats::default();
        for l in [
            "#2\tINITED cov: 812 ft: 1690 corp: 29/15Kb exec/s: 0 rss: 40Mb",
            "#131072\tpulse  cov: 1021 ft: 4122 corp: 310/60Kb lim: 4096 exec/s: 43690 rss: 380Mb",
            "#1500000\tDONE   cov: 1030 ft: 4300 corp: 320/62Kb lim: 4096 exec/s: 25000 rss: 412Mb",
            "Done 1500000 runs in 61 second(s)",
            "stat::number_of_executed_units: 1500000",
            "stat::average_exec_per_sec:     24590",
            "stat::peak_rss_mb:              412",
        ] {
            s.read(l);
        }
        assert_eq!(
            s,
            Stats {
                execs: Some(1_500_000),
                execs_per_sec: Some(24590),
                cov: Some(1030),
                ft: Some(4300),
                corpus: Some(320),
                peak_rss_mb: Some(412),
                done_secs: Some(61)
            }
        );
        assert!(s.summary(60, 75.0).contains("1500000 executions in 61 s"));
    }
}
