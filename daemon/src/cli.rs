//! The command line. Flags stay close to what the user typed; [`crate::config::load`] does
//! the validation.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::Overrides;
use crate::config::raw::RawCanary;

#[derive(Debug, Parser)]
#[command(name = "lmperf", version, about = "LLM inference canary agent and benchmark: TTFT, ITL, TPOT, E2E as GenAI spans and metrics over OTLP")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent: continuous canary requests to the targets, exported over OTLP.
    Agent(AgentArgs),
}

/// `lmperf agent` flags. Canary flags apply to every target and override the config file.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// TOML configuration file (see the README for its keys).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Base URL of an OpenAI-compatible server; repeat for several targets.
    #[arg(long = "target", value_name = "URL")]
    pub targets: Vec<String>,
    /// Model name; default: the first model of GET /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    /// API to call.
    #[arg(long, value_parser = ["chat", "completions"])]
    pub api: Option<String>,
    /// Mean gap between canaries per target, jittered ±10 % (e.g. 5s, 500ms).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "rate")]
    pub interval: Option<Duration>,
    /// Canaries per second per target (e.g. 2 or 2/s).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Arrival process with --rate.
    #[arg(long, value_parser = ["poisson", "constant"], requires = "rate")]
    pub arrival: Option<String>,
    /// max_tokens of each canary.
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// Deadline of one canary request (e.g. 60s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Name of the environment variable that holds the API key (default LMPERF_API_KEY).
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// File that holds the API key.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<String>,
    /// Admin HTTP address (/healthz, /readyz, /metrics, /api/v1/status).
    #[arg(long, value_name = "ADDR")]
    pub admin_addr: Option<String>,
    /// OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4318 or :4317).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf).
    #[arg(long, value_parser = ["grpc", "http/protobuf"])]
    pub otlp_protocol: Option<String>,
    /// Do not export over OTLP (metrics stay on /metrics).
    #[arg(long)]
    pub no_otlp: bool,
    /// Print one line per measured request on stdout.
    #[arg(long)]
    pub console: bool,
}

/// Parses `2`, `2.5` or `2/s`.
fn parse_rate(s: &str) -> Result<f64, String> {
    let n = s.strip_suffix("/s").unwrap_or(s);
    n.trim().parse::<f64>().map_err(|_| format!("expected requests per second such as 2 or 2/s, got {s:?}"))
}

impl AgentArgs {
    pub fn into_overrides(self) -> Overrides {
        Overrides {
            config: self.config,
            targets: self.targets,
            canary: RawCanary {
                model: self.model,
                api: self.api,
                interval: self.interval,
                rate: self.rate,
                arrival: self.arrival,
                max_tokens: self.max_tokens,
                timeout: self.timeout,
                api_key_env: self.api_key_env,
                api_key_file: self.api_key_file,
                ..RawCanary::default()
            },
            admin_addr: self.admin_addr,
            console: self.console,
            otlp_endpoint: self.otlp_endpoint,
            otlp_protocol: self.otlp_protocol,
            no_otlp: self.no_otlp,
        }
    }
}
