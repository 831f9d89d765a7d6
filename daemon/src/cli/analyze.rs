//! `lmperf analyze`'s flags (clap), converted into the plain
//! [`crate::analyze::command::AnalyzeArgs`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::analyze::command as domain;

/// Output format of `lmperf analyze`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The scorecard, as `lmperf ctl diagnose` prints it.
    Text,
    /// The versioned `Diagnosis` document, with the 30 s slices of cause scores (`timeline`).
    Json,
    /// scorecard.html: ranked causes, evidence plots, the top-3 bottleneck heatmap.
    Html,
}

/// `lmperf analyze` flags.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// An `lmperf run` output directory (its requests.jsonl): each benchmark is a target.
    #[arg(
        value_name = "RUN_DIR",
        required_unless_present_any = ["agent", "prometheus"],
        conflicts_with_all = ["agent", "prometheus"]
    )]
    pub run_dir: Option<PathBuf>,
    /// A live agent's admin address (host:port or URL): its /api/v1/diagnosis.
    #[arg(long, value_name = "ADDR", conflicts_with = "prometheus")]
    pub agent: Option<String>,
    /// A Prometheus server (URL) holding the fleet's lmperf series: every node's targets are
    /// diagnosed over the last WINDOW (default 30m) and the fleet view says whether one node,
    /// one model or every node moved.
    #[arg(long, value_name = "URL")]
    pub prometheus: Option<String>,
    /// With --prometheus: the resolution of the range queries.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub step: Duration,
    /// With --prometheus: the range of rate() (at least 4 scrape intervals).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1m")]
    pub rate_window: Duration,
    /// Only diagnoses of the last WINDOW (of the run; for an agent, an idle target shows its
    /// last confirmed diagnosis of the window). Default: the whole run, the agent's default.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub window: Option<Duration>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Write here instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

impl From<Format> for domain::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Text => Self::Text,
            Format::Json => Self::Json,
            Format::Html => Self::Html,
        }
    }
}

impl From<AnalyzeArgs> for domain::AnalyzeArgs {
    fn from(a: AnalyzeArgs) -> Self {
        Self {
            run_dir: a.run_dir,
            agent: a.agent,
            prometheus: a.prometheus,
            step: a.step,
            rate_window: a.rate_window,
            window: a.window,
            format: a.format.into(),
            output: a.output,
        }
    }
}
