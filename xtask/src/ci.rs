//! `cargo xtask ci [-- <cargo test args>]`: the one test command (also `.ci/run`).
//!
//! 0. `cargo xtask arch-check`: no import cycle in daemon/src, pure crates pure (no build)
//! 1. `tests/peers/install.sh`: the real peers the integration tests talk to; as root, the
//!    apt packages that build the eBPF probes (`clang libbpf-dev bpftool`) and render the
//!    HTML reports (`chromium`), when missing; and Debian's `prometheus` (server and
//!    `promtool` for tests/alerts.rs), with its service kept from starting
//! 2. `cargo build --workspace --all-targets --locked` (the e2e tests spawn target/debug/lmperf)
//! 3. `cargo test --workspace --locked [args]`: daemon unit tests and tests/ e2e tests; as
//!    root on a kernel with BTF, with `LMPERF_REQUIRE_EBPF=1` so the probe tests must run; as
//!    root, with `LMPERF_REQUIRE_CHROMIUM=1` so the report render tests must run, and with
//!    `LMPERF_REQUIRE_PROMETHEUS=1` so the alerting rule tests must run
//! 4. `cargo xtask fuzz --seconds 60`: a short run of the fuzz target over the stream
//!    measurement (installs cargo-fuzz, builds with nightly: about 4 minutes on 2 cores in all;
//!    the long run is `cargo xtask fuzz`, 10 minutes)

use anyhow::{Result, bail};

pub fn run(args: &[String]) -> Result<()> {
    let test_args: &[String] = match args.split_first() {
        None => &[],
        Some((first, rest)) if first == "--" => rest,
        Some((first, _)) if first == "-h" || first == "--help" => {
            println!(
                "usage: cargo xtask ci [-- <cargo test args>]   e.g. cargo xtask ci -- sse -- --nocapture"
            );
            return Ok(());
        }
        Some((first, _)) => {
            bail!("unexpected argument {first:?}; pass cargo test arguments after `--`")
        }
    };

    // First and cheapest (source text only, no build): import cycles, pure crates.
    println!("\n==> [arch] cargo xtask arch-check");
    crate::arch_check::run(&[])?;

    crate::step("[1/3] tests/peers/install.sh", crate::install_peers_cmd())?;
    let root = is_root();
    if root {
        install_apt_packages()?;
        install_prometheus()?;
    } else {
        println!(
            "==> not root: eBPF build packages and chromium not installed, probe and render tests skip themselves"
        );
    }

    let mut build = crate::cargo();
    build.args(["build", "--workspace", "--all-targets", "--locked"]);
    crate::step(
        "[2/3] cargo build --workspace --all-targets --locked",
        build,
    )?;

    let mut test = crate::cargo();
    // One test at a time per binary (as on main, bb1acdf): the timing tests and the real
    // model server share this machine's CPUs.
    test.args(["test", "--workspace", "--locked", "--no-fail-fast"])
        .args(test_args)
        .env("RUST_TEST_THREADS", "1");
    if root {
        test.env("LMPERF_REQUIRE_CHROMIUM", "1");
        test.env("LMPERF_REQUIRE_PROMETHEUS", "1");
    }
    if root && std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        test.env("LMPERF_REQUIRE_EBPF", "1");
    }
    let header = format!(
        "[3/3] cargo test --workspace --locked --no-fail-fast {}",
        test_args.join(" ")
    );
    println!("==> {}", header.trim_end());
    let (passed, failed, ok) = run_counting(test)?;
    // One plain closing line, so a reader of the log sees the whole suite's count rather than
    // the last test binary's (often the empty doc-test run).
    println!("\nci: {passed} passed, {failed} failed");
    if !ok || failed > 0 {
        bail!("`{}` failed", header.trim_end());
    }
    println!("\n==> [fuzz] cargo xtask fuzz --seconds {CI_FUZZ_SECONDS}");
    crate::fuzz::run(&["--seconds".to_owned(), CI_FUZZ_SECONDS.to_string()])?;
    Ok(())
}

/// Seconds of the fuzz run in CI (`cargo xtask fuzz` alone runs 600).
const CI_FUZZ_SECONDS: u64 = 60;

/// Packages that build `ebpf/` (clang for `-target bpf`, libbpf's headers, bpftool for
/// inspecting the object), and Debian's `chromium`, which `tests/outputs.rs` renders
/// report.html and compare.html with.
const APT_PACKAGES: [&str; 4] = ["clang", "libbpf-dev", "bpftool", "chromium"];

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Installs [`APT_PACKAGES`] with apt when `dpkg -s` says one is missing (idempotent).
fn install_apt_packages() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !std::process::Command::new("dpkg")
                .args(["-s", p])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        println!("==> apt packages present ({})", APT_PACKAGES.join(" "));
        return Ok(());
    }
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        &format!(
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {}",
            missing.join(" ")
        ),
    ]);
    crate::step(&format!("apt-get install {}", missing.join(" ")), cmd)
}

/// Installs Debian's `prometheus` (the server and `promtool`; 2.42 on bookworm) when missing,
/// without its recommended node exporter. Its postinst would start the `prometheus` service
/// (listening on :9090): a `policy-rc.d` that denies every start is put in place for the
/// install when none exists (Docker images ship one) and removed after, so nothing stays
/// running or listening; the tests start their own server on loopback.
fn install_prometheus() -> Result<()> {
    let present = std::process::Command::new("dpkg")
        .args(["-s", "prometheus"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        println!("==> apt package present (prometheus)");
        return Ok(());
    }
    let policy = std::path::Path::new("/usr/sbin/policy-rc.d");
    let ours = !policy.exists();
    if ours {
        use std::os::unix::fs::PermissionsExt;
        let deny = "#!/bin/sh\n# lmperf xtask ci: no service starts during the install\nexit 101\n";
        std::fs::write(policy, deny)?;
        std::fs::set_permissions(policy, std::fs::Permissions::from_mode(0o755))?;
    }
    let mut cmd = std::process::Command::new("sh");
    let install = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
                   apt-get install -y -qq --no-install-recommends prometheus";
    cmd.args(["-c", install]);
    let result = crate::step("apt-get install prometheus", cmd);
    if ours {
        let _ = std::fs::remove_file(policy);
    }
    result
}

/// Runs `cmd`, echoing its stdout, and sums the `test result:` lines of libtest.
fn run_counting(mut cmd: std::process::Command) -> Result<(u64, u64, bool)> {
    use std::io::{BufRead, BufReader, Read};
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    // Both streams through one channel: cargo names each test binary on stderr ("Running
    // alerts.rs (…)"), the harness prints its "finished in" on stdout.
    let (tx, rx) = std::sync::mpsc::channel::<(bool, String)>();
    fn forward(
        r: impl Read + Send + 'static,
        is_err: bool,
        tx: std::sync::mpsc::Sender<(bool, String)>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                if tx.send((is_err, line)).is_err() {
                    break;
                }
            }
        })
    }
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(forward(out, false, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(forward(err, true, tx.clone()));
    }
    drop(tx);
    let (mut passed, mut failed) = (0, 0);
    let mut binary = String::new();
    let mut times: Vec<(f64, String)> = Vec::new();
    for (is_err, line) in rx {
        if is_err {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
        if let Some(rest) = line.trim_start().strip_prefix("Running ") {
            binary = rest.split(" (").next().unwrap_or(rest).to_owned();
        }
        if let Some(rest) = line.strip_prefix("test result: ") {
            passed += count(rest, " passed");
            failed += count(rest, " failed");
            if let Some(secs) = rest
                .rsplit("finished in ")
                .next()
                .and_then(|t| t.trim().strip_suffix('s'))
                .and_then(|t| t.parse::<f64>().ok())
            {
                times.push((secs, binary.clone()));
            }
        }
    }
    for r in readers {
        let _ = r.join();
    }
    // The slowest test binaries, so the 30-minute budget of CI is watched where it goes.
    times.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total: f64 = times.iter().map(|t| t.0).sum();
    println!("\nci: test binaries took {total:.0} s in all; the slowest:");
    for (secs, name) in times.iter().take(10) {
        println!("  {secs:>7.1} s  {name}");
    }
    Ok((passed, failed, child.wait()?.success()))
}

/// `ok. 22 passed; 0 failed; …` → the number before `what`.
fn count(line: &str, what: &str) -> u64 {
    line.split(';')
        .find_map(|part| {
            part.trim()
                .trim_start_matches("ok. ")
                .trim_start_matches("FAILED. ")
                .strip_suffix(what.trim_start())
                .map(str::trim)
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}
