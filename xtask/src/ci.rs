//! `cargo xtask ci [-- <cargo test args>]`: the one test command (also `.ci/run`).
//!
//! 0. `cargo xtask arch-check`: no import cycle in daemon/src, pure crates pure (source text
//!    only, no build: seconds)
//! 1. `cargo fmt --all --check`, first because it takes seconds. `tests/peers/install.sh`
//!    then `tests/peers/install-serving.sh` (network and pip, little CPU) start beside it and
//!    run on through the build.
//! 2. As root, the apt packages that build the eBPF probes (`clang libbpf-dev bpftool`), when
//!    missing; those only the e2e tests need install beside the build (their output printed
//!    before the e2e tests, which wait for them): `chromium` (renders the HTML reports) and
//!    Debian's `prometheus` (server and `promtool` for the alert rule tests), with its service
//!    kept from starting. Then the
//!    **lane** starts at nice 19 (`cargo xtask ci-lane`, [`lane`]): `cargo xtask fuzz
//!    --seconds 30` (cargo-fuzz installed once into `$CARGO_HOME/bin`, a nightly build of the
//!    small fuzz crate; the long run is `cargo xtask fuzz`, 10 minutes). At the lowest
//!    priority it takes only the CPU that the build and the tests leave idle.
//! 3. `cargo build --workspace --locked --bins --tests --examples --benches` **through
//!    clippy** ([`clippy_env`]: `clippy-driver` as the workspace's rustc wrapper with `-D
//!    warnings`, as `cargo clippy` itself runs it): the workspace's crates are linted as they
//!    are compiled for the tests (the lints the project allows are named in one place,
//!    `[workspace.lints]` of the root Cargo.toml), so no second, check-only build of every
//!    dependency; a lint fails the build. The tests run the same way (same fingerprints).
//!    Then the peers' install and the tests' packages are waited for.
//! 4. The unit and doc tests (`--lib --bins`, one test at a time per binary,
//!    [`UNIT_TEST_THREADS`]; they need no peer) start in the background at nice 19 (cargo
//!    holds its build lock only while building; their output is printed after the e2e
//!    tests'; under `--stress` they end before the hog starts), beside the integration tests, `--no-fail-fast` (`cargo test --workspace --test '*'`, the
//!    build's packages and features: the one e2e binary, `tests/tests.rs`) with
//!    [`E2E_TEST_THREADS`] tests at a time and, in a plain run, the few long tests that take
//!    no serial lock started at once in a second process of the binary ([`crate::e2e_early`]:
//!    libtest starts tests in name order, so a long one late in the alphabet ended the run
//!    alone), those that
//!    start the real model server or time CPU work one after another (`tests/support/serial.rs`,
//!    whose chain is printed from `LMPERF_SERIAL_LOG`), each test's time printed by libtest
//!    (`--report-time`) and the slowest listed. As root on a kernel with BTF, with
//!    `LMPERF_REQUIRE_EBPF=1` so the probe tests must run; as root, with
//!    `LMPERF_REQUIRE_CHROMIUM=1` so the report render tests must run, and with
//!    `LMPERF_REQUIRE_PROMETHEUS=1` so the alerting rule tests must run; always with
//!    `LMPERF_REQUIRE_SERVING=1` so the serving-path tests (real Dynamo) must run
//! 5. The lane is waited for (its log printed); CI fails if it failed.
//!
//! Each step's time is printed as it ends, and all of them at the end. On a fresh checkout (no
//! `target/debug/lmperf` yet) every cargo command of the run has `CARGO_INCREMENTAL=0`.

use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Tests at a time in the e2e binary. Most e2e tests wait (on calm phases, scrape intervals,
/// timeouts) rather than compute, and those that compute or time the CPU hold the serial lock.
/// A test waiting for that lock holds one of these threads: with 4, on a fresh 2-core machine,
/// serial tests waited 885 s in all (590 s held) and the long unlocked tests started late, so
/// the e2e run took 715 s for a 590 s serial chain and 1,150 s of unlocked test time.
pub const E2E_TEST_THREADS: usize = 6;

/// Tests at a time in the unit test binaries (as before issue 23): some time real sleeps.
pub const UNIT_TEST_THREADS: usize = 1;

/// The peers CI needs: `tests/peers/install.sh` (the model server, collectors, tokenizer),
/// then `tests/peers/install-serving.sh` (NVIDIA Dynamo 1.6.1 and vllm-router 0.1.17, which
/// read the tokenizer install.sh made). Both are network and pip, beside the build.
fn ci_peers_cmd() -> std::process::Command {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg("-c")
        .arg("tests/peers/install.sh && tests/peers/install-serving.sh")
        .current_dir(crate::root());
    cmd
}

pub fn run(args: &[String]) -> Result<()> {
    let Some(opts) = Options::parse(args)? else {
        println!("{USAGE}");
        return Ok(());
    };
    let test_args = opts.test_args.as_slice();
    let mut times = Times::default();
    // A fresh checkout (nothing built yet): incremental compilation only costs there (its
    // caches are written and not read again in this run; ~10–20 % of the workspace crates'
    // compile time), so it is off for every cargo command of the run, the lane's included.
    // (`cargo xtask` has built xtask itself by now: the agent's binary tells.)
    let fresh = !crate::root().join("target/debug/lmperf").exists();
    if fresh {
        println!("==> a fresh checkout: CARGO_INCREMENTAL=0 for this run");
    }
    let clippy = clippy_env()?;
    let cargo = || {
        let mut c = crate::cargo();
        if fresh {
            c.env("CARGO_INCREMENTAL", "0");
        }
        c.envs(clippy.iter().map(|(k, v)| (k, v)));
        c
    };

    // [0] First and cheapest (source text only, no build): import cycles, pure crates.
    println!("\n==> [0/5] cargo xtask arch-check");
    let arch = Instant::now();
    crate::arch_check::run(&[])?;
    times.push("arch-check", arch);

    // [1/5] Format, with the peers installing beside it and the build.
    let peers_log = crate::root().join("target/ci-peers.log");
    std::fs::create_dir_all(crate::root().join("target"))?;
    let peers =
        spawn_logged(ci_peers_cmd(), &peers_log).context("cannot start tests/peers/install.sh")?;
    let style = Instant::now();
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--check"]);
    crate::step("[1/5] cargo fmt --all --check", fmt)?;
    times.push("fmt", style);
    // [2/5] Packages (the build needs clang and libbpf for the probes); the peers go on
    // installing beside the build and are waited for before the tests.
    let started = Instant::now();
    let root = is_root();
    // What only the tests need (chromium, prometheus) installs beside the build, after what
    // the build needs; waited for before the e2e tests.
    let mut test_packages = None;
    if root {
        install_apt_packages(&BUILD_PACKAGES, &mut Say::Echo)?;
        test_packages = Some(std::thread::spawn(install_test_packages));
    } else {
        println!(
            "==> not root: eBPF build packages and chromium not installed, probe and render tests skip themselves"
        );
    }
    times.push("packages", started);

    // The low-priority lane: the short fuzz run at nice 19, beside the build and the tests
    // (which mostly wait on servers and timers): it uses the CPU time that the rest leaves
    // idle instead of minutes of its own. Awaited after the tests.
    let lane_log = crate::root().join("target/ci-lane.log");
    let lane = Instant::now();
    let start_lane = || -> Result<std::process::Child> {
        let mut lane_cmd = lane_cmd()?;
        if fresh {
            lane_cmd.env("CARGO_INCREMENTAL", "0");
        }
        spawn_logged(lane_cmd, &lane_log).context("cannot start the lane")
    };
    // Under --stress the lane starts after the hog stops: at nice 19 it would starve behind it.
    let mut lane_child = if opts.stress_runs == 0 {
        let child = start_lane()?;
        println!(
            "\n==> [5/5] fuzz: started at nice 19 beside the build and the tests (log: {})",
            lane_log.display()
        );
        Some(child)
    } else {
        None
    };

    // [3/5] Build what the tests run.
    let started = Instant::now();
    let mut build = cargo();
    build.args([
        "build",
        "--workspace",
        "--locked",
        "--bins",
        "--tests",
        "--examples",
        "--benches",
    ]);
    crate::step(
        "[3/5] cargo build --workspace --locked --bins --tests --examples --benches (through clippy, -D warnings)",
        build,
    )?;
    times.push("build (with clippy)", started);

    // [4/5] The tests.
    let mut env: Vec<(&str, &str)> = vec![("LMPERF_REQUIRE_SERVING", "1")];
    if root {
        env.push(("LMPERF_REQUIRE_CHROMIUM", "1"));
        env.push(("LMPERF_REQUIRE_PROMETHEUS", "1"));
    }
    if root && std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        env.push(("LMPERF_REQUIRE_EBPF", "1"));
    }
    let started = Instant::now();
    // Every run names the whole workspace: the same packages, so the same features as the
    // build step (`--exclude lmperf-e2e` would drop the e2e package's features and rebuild
    // tokio and all above it: 3.5 min of CPU).
    let (units, header) = spawn_unit_tests(&cargo, test_args, &env, opts.stress_runs > 0)?;
    wait_logged("[4/5] tests/peers/install.sh", peers, &peers_log)?;
    if let Some(t) = test_packages {
        println!("\n==> [2/5] the tests' packages (installed beside the build)");
        t.join()
            .map_err(|_| anyhow::anyhow!("the packages' thread panicked"))??;
    }
    times.push("peers and the tests' packages", started);
    let started = Instant::now();
    let e2e_run = e2e_step(&cargo, test_args, &env, opts.stress_runs)?;
    times.push("integration (e2e) tests", started);
    let started = Instant::now();
    let (unit_run, unit_log) = units.finish()?;
    println!("\n==> {}, run beside the e2e tests", header.trim_end());
    print!("{unit_log}");
    times.push("unit and doc tests (after the e2e)", started);
    if lane_child.is_none() {
        lane_child = Some(start_lane()?);
        println!(
            "\n==> [5/5] fuzz: started at nice 19 after the stressed tests (log: {})",
            lane_log.display()
        );
    }

    let (passed, failed) = (
        unit_run.passed + e2e_run.passed,
        unit_run.failed + e2e_run.failed,
    );
    unit_run.print_slowest("unit test binaries", 5);
    // One plain closing line, so a reader of the log sees the whole suite's count rather than
    // the last test binary's (often the empty doc-test run).
    println!("\nci: {passed} passed, {failed} failed");

    // [5/5] The lane: fuzz, waited for.
    let started = Instant::now();
    let lane_ok = match lane_child {
        Some(child) => wait_logged("[5/5] fuzz (the nice 19 lane)", child, &lane_log),
        None => bail!("the fuzz lane was never started"),
    };
    println!(
        "==> the lane ran {:.1} s in all; CI waited {:.1} s for it after the tests",
        lane.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    times.push("fuzz (after the tests)", started);
    times.print();
    if !unit_run.ok || !e2e_run.ok || failed > 0 {
        bail!("the tests failed");
    }
    lane_ok
}

/// `cmd` at nice 19 (`nice -n 19 <program> <args>`, its environment and directory kept).
fn niced(cmd: &std::process::Command) -> std::process::Command {
    let mut n = std::process::Command::new("nice");
    n.args(["-n", "19"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => n.env(k, v),
            None => n.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        n.current_dir(d);
    }
    n
}

/// The unit and doc tests' run: on its thread, or done.
enum Units {
    Running(std::thread::JoinHandle<Result<(TestRun, String)>>),
    Done((TestRun, String)),
}

impl Units {
    /// Its counts and output, once it has ended.
    fn finish(self) -> Result<(TestRun, String)> {
        match self {
            Units::Done(r) => Ok(r),
            Units::Running(h) => h
                .join()
                .map_err(|_| anyhow::anyhow!("the unit tests' thread panicked"))?,
        }
    }
}

/// The unit and doc tests' run, started on a thread (see [`run`] step 4); returns it with its
/// header. Their output is kept, to be printed after the e2e tests'. With `wait` (`--stress`,
/// whose hog would starve them at nice 19) it has ended when this returns.
fn spawn_unit_tests(
    cargo: &dyn Fn() -> std::process::Command,
    test_args: &[String],
    env: &[(&str, &str)],
    wait: bool,
) -> Result<(Units, String)> {
    // The unit and doc tests run beside the e2e binary (cargo holds its build lock only while
    // building): they are pure and short, the e2e tests mostly wait on servers and timers and
    // hold under a CPU hog (`--stress`); their output is printed after the e2e tests'.
    let mut unit = cargo();
    unit.args([
        "test",
        "--workspace",
        "--locked",
        "--no-fail-fast",
        "--lib",
        "--bins",
    ])
    .args(test_args)
    .env("RUST_TEST_THREADS", UNIT_TEST_THREADS.to_string())
    .envs(env.iter().copied());
    let mut doc = cargo();
    doc.args(["test", "--workspace", "--locked", "--no-fail-fast", "--doc"])
        .args(test_args)
        .envs(env.iter().copied());
    let header = format!(
        "[4/5] cargo test --workspace --locked --no-fail-fast --lib --bins (and --doc) {}",
        test_args.join(" ")
    );
    println!(
        "\n==> {}: started beside the e2e tests (output after them)",
        header.trim_end()
    );
    // At nice 19, as the fuzz lane: the e2e tests' canaries measure latency, and a burst of
    // unit-test and doc-test compiling beside them at the same priority moved a diagnosis
    // onset 10 s early once (`diagnosis::slowdown_is_diagnosed_as_load_surge_within_60_s`).
    let (unit, doc) = (niced(&unit), niced(&doc));
    let units = std::thread::spawn(move || -> Result<(TestRun, String)> {
        let (mut run, mut log) = run_counting_kept(unit)?;
        let (doc_run, doc_log) = run_counting_kept(doc)?;
        run.add(doc_run);
        log.push_str(&doc_log);
        Ok((run, log))
    });
    let units = Units::Running(units);
    Ok(match wait {
        true => (Units::Done(units.finish()?), header),
        false => (units, header),
    })
}

/// `cargo xtask ci`'s usage (`-h`).
const USAGE: &str = "usage: cargo xtask ci [--stress[=N]] [-- <cargo test args>]   e.g. cargo xtask ci -- sse -- --nocapture
  (the arguments go to both test runs: the unit tests and the e2e binary)
  --stress[=N]  run the e2e binary N times (1) beside a CPU hog, one spinning process per core
                at nice 0; the nice-19 fuzz lane starts after it. LMPERF_CI_STRESS=N does the same";

/// What `cargo xtask ci` was asked.
struct Options {
    /// How many times the e2e binary runs beside the CPU hog; 0: once, without it.
    stress_runs: usize,
    /// The arguments after `--`, for both cargo test runs.
    test_args: Vec<String>,
}

impl Options {
    /// `[--stress[=N]] [-- <cargo test args>]`, then `LMPERF_CI_STRESS=N` when no `--stress`
    /// was given. `None`: help was asked.
    fn parse(args: &[String]) -> Result<Option<Options>> {
        let (flags, test_args) = match args.iter().position(|a| a == "--") {
            Some(i) => (&args[..i], args[i + 1..].to_vec()),
            None => (args, Vec::new()),
        };
        let mut stress_runs = None;
        for f in flags {
            match f.as_str() {
                "-h" | "--help" => return Ok(None),
                "--stress" => stress_runs = Some(1),
                s if s.starts_with("--stress=") => {
                    stress_runs = Some(parse_runs("--stress", &s["--stress=".len()..])?);
                }
                other => bail!(
                    "unexpected argument {other:?}; pass cargo test arguments after `--`\n{USAGE}"
                ),
            }
        }
        let stress_runs = match (stress_runs, std::env::var("LMPERF_CI_STRESS")) {
            (Some(n), _) => n,
            (None, Ok(v)) if !v.trim().is_empty() => parse_runs("LMPERF_CI_STRESS", &v)?,
            (None, _) => 0,
        };
        Ok(Some(Options {
            stress_runs,
            test_args,
        }))
    }
}

/// A stress run count, 1 to 20.
fn parse_runs(what: &str, v: &str) -> Result<usize> {
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=20).contains(&n) => Ok(n),
        _ => bail!("{what}={v:?}: expected a number of runs from 1 to 20"),
    }
}

/// [4/5] The integration tests: the e2e binary once, or under `--stress` `runs` times, each
/// beside a CPU hog ([`crate::hog`]), each run's summary printed and all of them at the end.
/// The returned run holds every run's counts (a test failing in any run fails CI).
fn e2e_step(
    cargo: &dyn Fn() -> std::process::Command,
    test_args: &[String],
    env: &[(&str, &str)],
    runs: usize,
) -> Result<TestRun> {
    let serial_log = crate::root().join("target/ci-serial.log");
    // A plain run starts the long lock-free tests at once in a second process; a run given
    // test arguments (a filter) runs as asked.
    let early = if test_args.is_empty() {
        Some(crate::e2e_early::find(cargo)?)
    } else {
        None
    };
    let mut total: Option<TestRun> = None;
    let mut summaries = Vec::new();
    for k in 1..=runs.max(1) {
        let _ = std::fs::remove_file(&serial_log);
        let mut e2e = cargo();
        // libtest prints each test's time with `--report-time`, an unstable option it accepts
        // when RUSTC_BOOTSTRAP is set at run time: set through a runner, for the test binary
        // only (set for cargo, it would rebuild proc-macro2 and everything above it).
        e2e.args([
            "--config",
            r#"target.'cfg(all())'.runner = ["env", "RUSTC_BOOTSTRAP=1"]"#,
            "test",
            "--workspace",
            "--locked",
            "--no-fail-fast",
            "--test",
            "*",
        ])
        .args(test_args);
        if !test_args.iter().any(|a| a == "--") {
            e2e.arg("--");
        }
        if early.is_some() {
            e2e.args(crate::e2e_early::skip_args());
        }
        e2e.args(["-Z", "unstable-options", "--report-time"])
            .env("RUST_TEST_THREADS", E2E_TEST_THREADS.to_string())
            .env("LMPERF_SERIAL_LOG", &serial_log)
            .envs(env.iter().copied());
        let stress = if runs > 0 {
            format!(", stress run {k} of {runs} beside a CPU hog")
        } else {
            String::new()
        };
        println!(
            "\n==> [4/5] cargo test --workspace --locked --no-fail-fast --test '*' {} (the e2e binary and any other integration test, {E2E_TEST_THREADS} tests at a time{stress})",
            test_args.join(" ")
        );
        let started = Instant::now();
        let hog = if runs > 0 {
            Some(crate::hog::Hog::start()?)
        } else {
            None
        };
        let early_run = match &early {
            Some(bin) => {
                let mut cmd = crate::e2e_early::command(bin);
                cmd.env("LMPERF_SERIAL_LOG", &serial_log)
                    .envs(env.iter().copied());
                println!(
                    "==> and at once beside it, the long tests without the serial lock (xtask/src/e2e_early.rs): {}",
                    crate::e2e_early::EARLY.join(" ")
                );
                Some(std::thread::spawn(move || run_counting(cmd)))
            }
            None => None,
        };
        let mut run = run_counting(e2e)?;
        if let Some(handle) = early_run {
            let er = handle
                .join()
                .map_err(|_| anyhow::anyhow!("the early e2e process's reader panicked"))??;
            crate::e2e_early::check_ran(er.passed + er.failed)?;
            run.add(er);
        }
        drop(hog);
        let line = format!(
            "{} passed, {} failed in {:.0} s{stress}",
            run.passed,
            run.failed,
            started.elapsed().as_secs_f64()
        );
        println!("==> e2e: {line}");
        summaries.push(line);
        run.print_slowest("e2e tests", 15);
        print_serial_chain(&serial_log, 12);
        match &mut total {
            Some(t) => t.add(run),
            None => total = Some(run),
        }
    }
    if runs > 0 {
        println!("\nci: the {runs} stress runs of the e2e binary:");
        for s in &summaries {
            println!("  {s}");
        }
    }
    total.context("no e2e run")
}

/// The serial lock's chain from `tests/support/serial.rs`'s log (`test\twaited s\theld s`
/// lines): the sum of the held times is the floor of the e2e run's wall time.
fn print_serial_chain(log: &std::path::Path, n: usize) {
    let Ok(text) = std::fs::read_to_string(log) else {
        return;
    };
    let mut held: Vec<(f64, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let name = f.next()?;
            let secs = f.nth(1)?.parse::<f64>().ok()?;
            Some((secs, name))
        })
        .collect();
    held.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total: f64 = held.iter().map(|h| h.0).sum();
    println!(
        "\nci: serial chain: {} tests held the lock {total:.0} s in all (the e2e run's floor); the longest:",
        held.len()
    );
    for (secs, name) in held.iter().take(n) {
        println!("  {secs:>7.1} s  {name}");
    }
}

/// `nice -n 19 <this xtask binary> ci-lane`: the binary itself rather than `cargo xtask`,
/// which would wait for the build directory's lock that `cargo test` holds.
fn lane_cmd() -> Result<std::process::Command> {
    let exe = crate::hog::xtask_exe()?;
    let mut cmd = std::process::Command::new("nice");
    cmd.args(["-n", "19"])
        .arg(exe)
        .arg("ci-lane")
        .current_dir(crate::root());
    Ok(cmd)
}

/// `cargo xtask ci-lane` (started by `ci`, at nice 19): `cargo xtask fuzz --seconds 30`.
pub fn lane(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("unexpected argument {a:?}: ci-lane takes none");
    }
    println!("\n==> cargo xtask fuzz --seconds {CI_FUZZ_SECONDS}");
    crate::fuzz::run(&["--seconds".to_owned(), CI_FUZZ_SECONDS.to_string()])
}

/// The environment that makes a cargo build lint the workspace's crates as `cargo clippy
/// --workspace -- -D warnings` does, while compiling them for real: `clippy-driver` of the
/// active toolchain as `RUSTC_WORKSPACE_WRAPPER` (dependencies are compiled by plain rustc
/// and not linted) and `CLIPPY_ARGS` (the arguments after `--`, `__CLIPPY_HACKERY__`-joined
/// as cargo-clippy passes them). Every cargo command of a CI run gets it, so the tests reuse
/// the build.
///
/// # Errors
/// `rustc --print sysroot` fails, or the toolchain has no `clippy-driver` (`rustup
/// component add clippy`).
pub fn clippy_env() -> Result<Vec<(&'static str, String)>> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = std::process::Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .with_context(|| format!("cannot run {rustc} --print sysroot"))?;
    if !out.status.success() {
        bail!("{rustc} --print sysroot failed ({})", out.status);
    }
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let driver = std::path::Path::new(&sysroot).join("bin/clippy-driver");
    if !driver.exists() {
        bail!(
            "no clippy in this toolchain ({} is missing): rustup component add clippy",
            driver.display()
        );
    }
    Ok(vec![
        ("RUSTC_WORKSPACE_WRAPPER", driver.display().to_string()),
        (
            "CLIPPY_ARGS",
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__".to_owned(),
        ),
    ])
}

/// Seconds of the fuzz run in CI (`cargo xtask fuzz` alone runs 600).
const CI_FUZZ_SECONDS: u64 = 30;

/// Each step's wall time, for the closing table.
#[derive(Default)]
struct Times(Vec<(&'static str, f64)>);

impl Times {
    fn push(&mut self, step: &'static str, started: Instant) {
        self.0.push((step, started.elapsed().as_secs_f64()));
    }

    fn print(&self) {
        let total: f64 = self.0.iter().map(|t| t.1).sum();
        println!("\nci: steps (wall time):");
        for (step, secs) in &self.0 {
            println!("  {secs:>7.1} s  {step}");
        }
        println!("  {total:>7.1} s  in all ({:.1} min)", total / 60.0);
    }
}

/// Starts `cmd` with its stdout and stderr into `log`.
fn spawn_logged(
    mut cmd: std::process::Command,
    log: &std::path::Path,
) -> Result<std::process::Child> {
    let out = std::fs::File::create(log).with_context(|| format!("{}", log.display()))?;
    let err = out.try_clone()?;
    Ok(cmd.stdout(out).stderr(err).spawn()?)
}

/// Waits for `child` started by [`spawn_logged`], prints its log, fails unless it exited 0.
fn wait_logged(header: &str, mut child: std::process::Child, log: &std::path::Path) -> Result<()> {
    println!("\n==> {header}");
    let started = Instant::now();
    let status = child.wait()?;
    print!("{}", std::fs::read_to_string(log).unwrap_or_default());
    if !status.success() {
        bail!("`{header}` failed ({status})");
    }
    println!(
        "==> {header}: ok (waited {:.1} s for it)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Packages that build `ebpf/` (clang for `-target bpf`, libbpf's headers, bpftool for
/// inspecting the object): installed before the build.
const BUILD_PACKAGES: [&str; 3] = ["clang", "libbpf-dev", "bpftool"];
/// Debian's `chromium`, which `tests/outputs.rs` renders report.html and compare.html with:
/// only the e2e tests need it, so it installs beside the build.
const TEST_PACKAGES: [&str; 1] = ["chromium"];

/// Whether this process runs as root (`id -u` is 0).
pub(crate) fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Where an install step's output goes: echoed (before the build), or kept to be printed
/// later (beside the build, whose output is echoed).
enum Say {
    Echo,
    Keep(String),
}

impl Say {
    fn line(&mut self, s: &str) {
        match self {
            Say::Echo => println!("{s}"),
            Say::Keep(log) => {
                log.push_str(s);
                log.push('\n');
            }
        }
    }

    /// Runs `cmd` as step `header`: [`crate::step`] when echoed, else its output kept.
    fn step(&mut self, header: &str, mut cmd: std::process::Command) -> Result<()> {
        let log = match self {
            Say::Echo => return crate::step(header, cmd),
            Say::Keep(log) => log,
        };
        let started = Instant::now();
        let out = cmd
            .output()
            .with_context(|| format!("cannot start `{header}`"))?;
        log.push_str(&format!("==> {header}\n"));
        log.push_str(&String::from_utf8_lossy(&out.stdout));
        log.push_str(&String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            bail!("`{header}` failed ({}):\n{log}", out.status);
        }
        log.push_str(&format!(
            "==> {header}: ok ({:.1} s)\n",
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// What was kept (empty when echoed).
    fn kept(self) -> String {
        match self {
            Say::Echo => String::new(),
            Say::Keep(log) => log,
        }
    }
}

/// Installs what only the e2e tests need ([`TEST_PACKAGES`], then `prometheus`), its output
/// kept and printed when done (it runs beside the build).
fn install_test_packages() -> Result<()> {
    let mut say = Say::Keep(String::new());
    let r =
        install_apt_packages(&TEST_PACKAGES, &mut say).and_then(|()| install_prometheus(&mut say));
    print!("{}", say.kept());
    r
}

/// Installs `packages` with apt when `dpkg -s` says one is missing (idempotent).
fn install_apt_packages(packages: &[&str], say: &mut Say) -> Result<()> {
    let missing: Vec<&str> = packages
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
        say.line(&format!(
            "==> apt packages present ({})",
            packages.join(" ")
        ));
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
    say.step(&format!("apt-get install {}", missing.join(" ")), cmd)
}

/// Installs Debian's `prometheus` (the server and `promtool`; 2.42 on bookworm) when missing,
/// without its recommended node exporter. Its postinst would start the `prometheus` service
/// (listening on :9090): a `policy-rc.d` that denies every start is put in place for the
/// install when none exists (Docker images ship one) and removed after, so nothing stays
/// running or listening; the tests start their own server on loopback.
fn install_prometheus(say: &mut Say) -> Result<()> {
    let present = std::process::Command::new("dpkg")
        .args(["-s", "prometheus"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        say.line("==> apt package present (prometheus)");
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
    let result = say.step("apt-get install prometheus", cmd);
    if ours {
        let _ = std::fs::remove_file(policy);
    }
    result
}

/// What one `cargo test` printed: the counts of its `test result:` lines, each binary's time,
/// and each test's time where libtest printed it (`--report-time`).
struct TestRun {
    passed: u64,
    failed: u64,
    ok: bool,
    binaries: Vec<(f64, String)>,
    tests: Vec<(f64, String)>,
}

impl TestRun {
    /// Both runs' counts and times together.
    fn add(&mut self, o: TestRun) {
        self.passed += o.passed;
        self.failed += o.failed;
        self.ok &= o.ok;
        self.binaries.extend(o.binaries);
        self.tests.extend(o.tests);
    }

    /// The `n` slowest tests (when their times were printed), else the `n` slowest binaries,
    /// and the sum, so the CI budget is watched where it goes.
    fn print_slowest(&self, what: &str, n: usize) {
        let (list, total) = if self.tests.is_empty() {
            (
                &self.binaries,
                self.binaries.iter().map(|t| t.0).sum::<f64>(),
            )
        } else {
            (&self.tests, self.tests.iter().map(|t| t.0).sum::<f64>())
        };
        let mut sorted: Vec<&(f64, String)> = list.iter().collect();
        sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
        println!("\nci: {what}: {total:.0} s of test time in all; the slowest:");
        for (secs, name) in sorted.iter().take(n) {
            println!("  {secs:>7.1} s  {name}");
        }
    }
}

/// Runs `cmd`, echoing its output, and reads libtest's lines: `test result:` (counts, binary
/// time) and `test NAME ... ok <1.234s>` (a test's time, with `--report-time`).
fn run_counting(cmd: std::process::Command) -> Result<TestRun> {
    run_counting_to(cmd, None)
}

/// [`run_counting`] with the output kept, not echoed (a run beside another's output).
fn run_counting_kept(cmd: std::process::Command) -> Result<(TestRun, String)> {
    let mut log = String::new();
    let run = run_counting_to(cmd, Some(&mut log))?;
    Ok((run, log))
}

/// [`run_counting`], the output into `keep` where given, else echoed.
fn run_counting_to(
    mut cmd: std::process::Command,
    mut keep: Option<&mut String>,
) -> Result<TestRun> {
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
    let mut run = TestRun {
        passed: 0,
        failed: 0,
        ok: false,
        binaries: Vec::new(),
        tests: Vec::new(),
    };
    let mut binary = String::new();
    for (is_err, line) in rx {
        match keep.as_deref_mut() {
            Some(log) => {
                log.push_str(&line);
                log.push('\n');
            }
            None if is_err => eprintln!("{line}"),
            None => println!("{line}"),
        }
        if let Some(rest) = line.trim_start().strip_prefix("Running ") {
            binary = rest.split(" (").next().unwrap_or(rest).to_owned();
        }
        if let Some(rest) = line.strip_prefix("test result: ") {
            run.passed += count(rest, " passed");
            run.failed += count(rest, " failed");
            if let Some(secs) = rest
                .rsplit("finished in ")
                .next()
                .and_then(|t| t.trim().strip_suffix('s'))
                .and_then(|t| t.parse::<f64>().ok())
            {
                run.binaries.push((secs, binary.clone()));
            }
        }
        if let Some(t) = test_time(&line) {
            run.tests.push(t);
        }
    }
    for r in readers {
        let _ = r.join();
    }
    run.ok = child.wait()?.success();
    Ok(run)
}

/// `test sse_cases::case_01 ... ok <1.234s>` → (1.234, "sse_cases::case_01").
fn test_time(line: &str) -> Option<(f64, String)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.split_once(" ... ")?;
    let secs = result
        .rsplit_once('<')?
        .1
        .strip_suffix("s>")?
        .parse::<f64>()
        .ok()?;
    Some((secs, name.to_owned()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libtest_lines() {
        assert_eq!(
            test_time("test sse_cases::case_01_x ... ok <1.234s>"),
            Some((1.234, "sse_cases::case_01_x".to_owned()))
        );
        assert_eq!(
            test_time("test spike::overload ... FAILED <295.020s>"),
            Some((295.02, "spike::overload".to_owned()))
        );
        assert_eq!(test_time("test spike::calm ... ignored"), None);
        assert_eq!(test_time("test a::b ... ok"), None);
        let r = "ok. 22 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.01s";
        assert_eq!((count(r, " passed"), count(r, " failed")), (22, 1));
    }
}
