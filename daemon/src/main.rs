//! The `lmperf` binary: parse, configure, run. Exit codes: 0 done, 1 runtime failure,
//! 2 bad command line or configuration.

use std::process::ExitCode;

use clap::Parser;
use lmperf::cli::{Cli, Command};
use lmperf::config::{self, ProcessEnv};

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    // A config given as a pipe (`--config <(…)`) can be read only once, and it is read twice
    // (the log format first, then the whole file): copied once to a private file both read.
    let mut piped_copy = None;
    if let Command::Agent(a) = &mut cli.command
        && let Some(path) = a.config.as_ref().filter(|p| !p.is_file() && p.exists())
    {
        match copy_piped_config(path) {
            Ok(copy) => {
                a.config = Some(copy.clone());
                piped_copy = Some(copy);
            }
            Err(e) => {
                eprintln!("lmperf: config error: {}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    }
    let code = run(cli);
    if let Some(copy) = piped_copy {
        let _ = std::fs::remove_file(copy);
    }
    code
}

/// Reads the config at `path` (a pipe or other non-regular file) once into a file of this
/// process in the temp directory (mode 0600) and returns that file's path.
///
/// # Errors
/// The config cannot be read or the copy cannot be written.
fn copy_piped_config(path: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let text = std::fs::read(path)?;
    let copy = std::env::temp_dir().join(format!("lmperf-config-{}.toml", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&copy)?;
    f.write_all(&text)?;
    Ok(copy)
}

fn run(cli: Cli) -> ExitCode {
    // Logging starts first (the configuration logs its own warnings): the flag, else the
    // agent's config file, else LMPERF_LOG_FORMAT.
    let config_file = match &cli.command {
        Command::Agent(a) => a.config.clone(),
        _ => None,
    };
    let log_format = match config::log_format::resolve(
        cli.log_format.as_deref(),
        config_file.as_deref(),
        &ProcessEnv,
    ) {
        Ok(format) => {
            lmperf::logging::init(format);
            format
        }
        Err(e) => {
            eprintln!("lmperf: config error: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Run(args) => {
            let profiling = match profiling_file(args.profile_on_fail.as_ref()) {
                Ok(p) => p,
                Err(code) => return code,
            };
            let spec = match args.into_spec(&ProcessEnv) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("lmperf: {e}");
                    return ExitCode::from(2);
                }
            };
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            let dir = spec.output_dir.clone();
            let url = spec.target.base_url.clone();
            let result = rt.block_on(async {
                let mut r = lmperf::bench::run(spec).await;
                if let (Ok(summary), Some(cfg)) = (&mut r, profiling) {
                    profile_run(summary, cfg, &url, &dir).await;
                }
                r
            });
            // An interrupted run may leave its dispatcher thread pacing: do not wait for it.
            rt.shutdown_timeout(std::time::Duration::from_millis(500));
            match result {
                Ok(summary) if !summary.failed_gates.is_empty() => {
                    eprintln!(
                        "lmperf run: gates tripped: {}; results in {}",
                        summary.failed_gates.join(", "),
                        dir.display()
                    );
                    ExitCode::from(3)
                }
                Ok(_) => {
                    eprintln!("lmperf run: results in {}", dir.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("lmperf run: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Ctl(args) => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            ExitCode::from(rt.block_on(lmperf::control::client::run(args.into(), &ProcessEnv)))
        }
        Command::Compare(args) => compare(args),
        Command::Analyze(args) => match runtime() {
            Ok(rt) => ExitCode::from(rt.block_on(lmperf::analyze::command::run(args.into()))),
            Err(code) => code,
        },
        Command::Agent(args) => {
            let overrides = args.into_overrides();
            let again = overrides.clone();
            let (flag, file) = (cli.log_format.clone(), overrides.config.clone());
            let reload = lmperf::reload::Loader {
                path: overrides.config.clone(),
                load: Box::new(move || config::load(again.clone(), &ProcessEnv)),
                log_format: Box::new(move || {
                    config::log_format::resolve(flag.as_deref(), file.as_deref(), &ProcessEnv)
                }),
                running_log_format: log_format,
            };
            let cfg = match config::load(overrides, &ProcessEnv) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("lmperf: config error: {e}");
                    return ExitCode::from(2);
                }
            };
            // Before the runtime: the process has one thread while it drops its capabilities
            // (and while it caps the allocator's arenas, which only a lone thread may).
            lmperf::heap::limit_arenas();
            let privileged = match lmperf::agent::prepare(&cfg) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("lmperf: {e:#}");
                    return ExitCode::from(1);
                }
            };
            let rt = match agent_runtime() {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            match rt.block_on(lmperf::agent::run(
                cfg,
                privileged,
                &ProcessEnv,
                lmperf::agent::shutdown_signal(),
                Some(reload),
            )) {
                Ok(()) => {
                    rt.shutdown_timeout(std::time::Duration::from_millis(200));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("lmperf: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// `--profile-on-fail FILE`'s `[profiling]` table; a bad file exits 2 naming it.
fn profiling_file(
    path: Option<&std::path::PathBuf>,
) -> Result<Option<lmperf::config::profiling::ProfilingConfig>, ExitCode> {
    path.map(lmperf::config::profiling::load_file)
        .transpose()
        .map_err(|e| {
            eprintln!("lmperf: {e}");
            ExitCode::from(2)
        })
}

/// `lmperf run --profile-on-fail`: a tripped TPOT gate calls the server's profiler once; its
/// record goes into `summary.json` and one line.
async fn profile_run(
    summary: &mut lmperf::bench::Summary,
    cfg: lmperf::config::profiling::ProfilingConfig,
    url: &url::Url,
    dir: &std::path::Path,
) {
    use lmperf::profiler::on_fail;
    let Some(gate) = on_fail::tpot_gate(&summary.failed_gates) else {
        return;
    };
    summary.server_profile = on_fail::call(cfg, url, gate).await;
    if let Some(p) = &summary.server_profile {
        eprintln!("lmperf run: {}", on_fail::line(p));
        if let Err(e) = lmperf::bench::runner::rewrite_summary(dir, summary) {
            eprintln!("lmperf run: {e}");
        }
    }
}

/// `lmperf compare --profile-on-fail`: as [`profile_run`], into `compare.json`; the server is
/// the new run's target unless the file names a `url`.
fn profile_compare(
    c: &mut lmperf::bench::compare::Comparison,
    cfg: lmperf::config::profiling::ProfilingConfig,
    dir: &std::path::Path,
) {
    use lmperf::profiler::on_fail;
    let Some(gate) = on_fail::tpot_gate(&c.failed_gates).map(str::to_owned) else {
        return;
    };
    let Some(url) = cfg
        .url
        .clone()
        .or_else(|| url::Url::parse(&c.new.target).ok())
    else {
        eprintln!(
            "lmperf compare: profiler not called: the new run's target {:?} is no URL; set url in [profiling]",
            c.new.target
        );
        return;
    };
    let Ok(rt) = runtime() else { return };
    c.server_profile = rt.block_on(on_fail::call(cfg, &url, &gate));
    if let Some(p) = &c.server_profile {
        eprintln!("lmperf compare: {}", on_fail::line(p));
        if let Err(e) = lmperf::bench::compare::write_json(dir, c) {
            eprintln!("lmperf compare: {e}");
        }
    }
}

/// `lmperf compare BASE_TRACE NEW_TRACE`: 0 done, 1 an unreadable trace or output, 2 a gate
/// asked of traces.
fn compare_traces(args: lmperf::cli::CompareArgs) -> ExitCode {
    use lmperf::bench::compare_trace;
    if !args.fail_on.is_empty() || args.profile_on_fail.is_some() {
        eprintln!(
            "lmperf: --fail-on and --profile-on-fail apply to run directories, not to two traces"
        );
        return ExitCode::from(2);
    }
    let out = args.output_dir.clone().unwrap_or_else(|| {
        args.new_dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| ".".into(), std::path::Path::to_path_buf)
    });
    match compare_trace::compare_traces(&args.base_dir, &args.new_dir, &out) {
        Ok(c) => {
            print!("{}", compare_trace::table(&c));
            let top = c.top_regression.as_ref().map_or_else(
                || "nothing takes longer".to_owned(),
                |r| format!("largest regression {} {:+.1} µs a step", r.name, r.delta_us),
            );
            eprintln!(
                "lmperf compare: traces: {top}; compare.json and compare.html in {}",
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lmperf compare: {e}");
            ExitCode::from(1)
        }
    }
}

/// `lmperf compare`: 0 done, 1 unreadable input or output, 2 bad flags, 3 a gate tripped.
fn compare(args: lmperf::cli::CompareArgs) -> ExitCode {
    if lmperf::bench::compare_trace::is_trace_pair(&args.base_dir, &args.new_dir) {
        return compare_traces(args);
    }
    let profiling = match profiling_file(args.profile_on_fail.as_ref()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let spec = match args.into_spec() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lmperf: {e}");
            return ExitCode::from(2);
        }
    };
    match lmperf::bench::compare::compare(&spec) {
        Ok(mut c) => {
            if let Some(cfg) = profiling {
                profile_compare(&mut c, cfg, &spec.output_dir);
            }
            let regressions: Vec<String> = c
                .benchmarks
                .iter()
                .flat_map(|b| {
                    b.metrics
                        .iter()
                        .filter(|m| m.verdict == lmperf::bench::compare::Verdict::Regression)
                        .map(move |m| format!("{} {}", b.benchmark, m.metric))
                })
                .collect();
            let listed = if regressions.is_empty() {
                String::new()
            } else {
                format!(" ({})", regressions.join(", "))
            };
            print!("{}", lmperf::bench::compare_text::table(&c));
            for w in &c.warnings {
                eprintln!("lmperf compare: warning: {w}");
            }
            let plural = |n: usize, one: &str, many: &str| {
                format!("{n} {}", if n == 1 { one } else { many })
            };
            eprintln!(
                "lmperf compare: {}, {}{listed}; compare.json and compare.html in {}",
                plural(c.benchmarks.len(), "benchmark", "benchmarks"),
                plural(regressions.len(), "regression", "regressions"),
                spec.output_dir.display()
            );
            for (side, names) in [("base", &c.only_in_base), ("new", &c.only_in_new)] {
                if !names.is_empty() {
                    eprintln!("lmperf compare: only in {side}: {}", names.join(", "));
                }
            }
            if c.benchmarks.is_empty() {
                // Nothing compared: a gate must not pass on it.
                eprintln!(
                    "lmperf compare: no benchmark name in common between {} and {}: nothing was compared",
                    spec.base_dir.display(),
                    spec.new_dir.display()
                );
                return ExitCode::from(1);
            }
            if c.failed_gates.is_empty() {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "lmperf compare: gates tripped: {}",
                    c.gates
                        .iter()
                        .filter(|g| g.tripped)
                        .map(|g| format!("{} on {}", g.gate, g.benchmarks.join(", ")))
                        .collect::<Vec<_>>()
                        .join("; ")
                );
                ExitCode::from(3)
            }
        }
        Err(e @ lmperf::bench::compare::CompareError::Invalid { .. }) => {
            eprintln!("lmperf: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("lmperf compare: {e}");
            ExitCode::from(1)
        }
    }
}

/// The tokio runtime of the one-shot commands: two workers (the work is IO, and a benchmark's
/// client must not wait behind its own bookkeeping).
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    runtime_with(2)
}

/// The agent's runtime: one thread, the main one (tokio's current-thread scheduler). Its
/// steady work is a few canaries, scrapes and exports a second, all IO; two workers woke each
/// other for every stream frame (parking, stealing: ~700 context switches a second for 8
/// targets, most of the agent's CPU), and one worker beside the main thread still cost a
/// fifth of the wake-ups (`agent_cost`: 130 → 103 a second, 0.875 → 0.76 % of a core,
/// paired). What computes (the diagnosis step, the node's files, large pages, the metric
/// exporter's shutdown) runs on the blocking pool, so a canary's frames are still read the
/// moment they arrive.
fn agent_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("lmperf: cannot start the runtime: {e}");
            ExitCode::from(1)
        })
}

fn runtime_with(workers: usize) -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("lmperf: cannot start the runtime: {e}");
            ExitCode::from(1)
        })
}
