//! `lmperf analyze RUN_DIR | --agent ADDR | --prometheus URL [--window 5m] [--format text|json|html]
//! [--output FILE]`. Exit codes: 0 done (whatever the diagnosis), 1 the data could not be read,
//! 2 bad command line.

use std::path::PathBuf;
use std::time::Duration;

use super::{html, offline, prometheus};
use crate::diagnosis::scorecard;

/// Output format of `lmperf analyze`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The scorecard, as `lmperf ctl diagnose` prints it.
    Text,
    /// The versioned `Diagnosis` document, with the 30 s slices of cause scores (`timeline`).
    Json,
    /// scorecard.html: ranked causes, evidence plots, the top-3 bottleneck heatmap.
    Html,
}

/// What `lmperf analyze` reads and writes (the CLI's flags, `cli::AnalyzeArgs`, converted).
#[derive(Debug)]
pub struct AnalyzeArgs {
    /// An `lmperf run` output directory (its requests.jsonl): each benchmark is a target.
    pub run_dir: Option<PathBuf>,
    /// A live agent's admin address (host:port or URL): its /api/v1/diagnosis.
    pub agent: Option<String>,
    /// A Prometheus server (URL) holding the fleet's lmperf series.
    pub prometheus: Option<String>,
    /// With `prometheus`: the resolution of the range queries.
    pub step: Duration,
    /// With `prometheus`: the range of rate() (at least 4 scrape intervals).
    pub rate_window: Duration,
    /// Only diagnoses of the last `window`; `None`: the whole run, the agent's default (for
    /// `prometheus`: 30 min).
    pub window: Option<Duration>,
    pub format: Format,
    /// Write here instead of standard output.
    pub output: Option<PathBuf>,
}

/// Runs `lmperf analyze`; returns the exit code.
pub async fn run(args: AnalyzeArgs) -> u8 {
    let mut fleet = None;
    let analysis = match (&args.run_dir, &args.agent) {
        (Some(dir), _) => {
            let dir = dir.clone();
            let window = args.window;
            match tokio::task::spawn_blocking(move || offline::analyze_run(&dir, window)).await {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("lmperf analyze: {e}");
                    return 1;
                }
            }
        }
        (None, Some(addr)) => offline::analyze_agent(addr, args.window).await,
        (None, None) if args.prometheus.is_some() => {
            let q = prometheus::PromQuery {
                url: args.prometheus.clone().unwrap_or_default(),
                window: args.window.unwrap_or(Duration::from_secs(30 * 60)),
                step: args.step,
                rate_window: args.rate_window,
            };
            match prometheus::analyze_prometheus(&q).await {
                Ok((a, f)) => {
                    fleet = Some(f);
                    Ok(a)
                }
                Err(e) => Err(e),
            }
        }
        (None, None) => {
            eprintln!("lmperf analyze: give RUN_DIR, --agent ADDR or --prometheus URL");
            return 2;
        }
    };
    let a = match analysis {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lmperf analyze: {e}");
            return 1;
        }
    };
    let out = match args.format {
        Format::Text => {
            let mut s = scorecard::text(&a.diagnosis);
            if let Some(f) = &fleet {
                s.push_str(&prometheus::fleet_text(f));
            }
            s
        }
        Format::Json => match serde_json::to_string_pretty(&serde_json::json!({
            "source": a.source,
            "diagnosis": a.diagnosis,
            "timeline": a.timeline,
            "fleet": fleet,
        })) {
            Ok(s) => s + "\n",
            Err(e) => {
                eprintln!("lmperf analyze: {e}");
                return 1;
            }
        },
        Format::Html => html::render(&a),
    };
    match &args.output {
        Some(p) => {
            if let Err(e) = std::fs::write(p, out) {
                eprintln!("lmperf analyze: {}: {e}", p.display());
                return 1;
            }
            eprintln!("lmperf analyze: {} written", p.display());
        }
        None => print!("{out}"),
    }
    0
}
