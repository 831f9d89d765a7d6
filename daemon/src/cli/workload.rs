//! `lmperf run`'s workload flags (clap), converted into the plain
//! [`crate::bench::workload::WorkloadArgs`] the benchmark validates.

use std::time::Duration;

use clap::Args;

/// `lmperf run` flags of the workload (flattened into the run's flags).
#[derive(Debug, Default, Args)]
pub struct WorkloadArgs {
    /// Input length distribution in tokens, instead of --seq-lengths: fixed:N,
    /// uniform:min=A,max=B, normal:mean=M,std=S, lognormal:mu=M,sigma=S, zipf:n=N,s=S
    /// (normal and lognormal take min=, max= to clip).
    #[arg(long, value_name = "DIST", help_heading = "Workload")]
    pub input_dist: Option<String>,
    /// Output length distribution in tokens (max_tokens per request), instead of --output-len.
    #[arg(long, value_name = "DIST", help_heading = "Workload")]
    pub output_dist: Option<String>,
    /// Replay a trace: arrival times, input and output lengths (Azure LLM CSV, BurstGPT CSV,
    /// Mooncake JSONL). One benchmark per concurrency; --num-prompts does not apply.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["prompt_file", "input_dist", "ramp"], help_heading = "Datasets")]
    pub trace: Option<std::path::PathBuf>,
    /// Trace format (default: detected from the first line).
    #[arg(long, value_parser = ["azure", "burstgpt", "mooncake"], requires = "trace", help_heading = "Datasets")]
    pub trace_format: Option<String>,
    /// Replay the trace this many times faster (arrival offsets divided by it).
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "X",
        help_heading = "Datasets"
    )]
    pub trace_speedup: f64,
    /// Replay only the first N requests of the trace.
    #[arg(long, value_name = "N", requires = "trace", help_heading = "Datasets")]
    pub trace_limit: Option<usize>,
    /// Prompts from a file: JSONL with a prompt/text field (or turns), or CSV with a prompt column.
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with = "input_dist",
        help_heading = "Datasets"
    )]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Multi-turn conversations from --prompt-file's `turns` (MT-Bench question.jsonl): each
    /// turn sent after the previous answer, with the history (needs --api chat).
    #[arg(long, requires = "prompt_file", help_heading = "Datasets")]
    pub multi_turn: bool,
    /// Ramp the request rate (open loop) instead of --request-rate, or the concurrency
    /// (closed loop, see --ramp-over).
    #[arg(long, value_parser = ["linear", "exponential", "sawtooth"], requires_all = ["ramp_from", "ramp_to", "ramp_duration"], help_heading = "Workload")]
    pub ramp: Option<String>,
    /// What the ramp drives: the request rate (default), or the concurrency (requests in
    /// flight, sent as soon as a slot is free; needs --request-rate inf).
    #[arg(long, value_parser = ["rate", "concurrency"], requires = "ramp", help_heading = "Workload")]
    pub ramp_over: Option<String>,
    /// Rate (requests per second) or concurrency at the start of the ramp.
    #[arg(long, value_name = "R", requires = "ramp", help_heading = "Workload")]
    pub ramp_from: Option<f64>,
    /// Rate (requests per second) or concurrency at the end of the ramp.
    #[arg(long, value_name = "R", requires = "ramp", help_heading = "Workload")]
    pub ramp_to: Option<f64>,
    /// Length of the ramp (the sawtooth's period), e.g. 60s.
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration, requires = "ramp", help_heading = "Workload")]
    pub ramp_duration: Option<Duration>,
    /// A Hugging Face tokenizer.json (or its directory) for exact prompt lengths, used instead
    /// of the server's /tokenize (needed where the server has none).
    #[arg(long, value_name = "PATH", help_heading = "Datasets")]
    pub tokenizer: Option<std::path::PathBuf>,
    /// The model's chat template, to count --api chat requests exactly: a Jinja file or a
    /// tokenizer_config.json (default: the tokenizer_config.json beside --tokenizer, else the
    /// server's own template).
    #[arg(long, value_name = "PATH", help_heading = "Datasets")]
    pub chat_template: Option<std::path::PathBuf>,
}

impl From<WorkloadArgs> for crate::bench::workload::WorkloadArgs {
    fn from(a: WorkloadArgs) -> Self {
        Self {
            input_dist: a.input_dist,
            output_dist: a.output_dist,
            trace: a.trace,
            trace_format: a.trace_format,
            trace_speedup: a.trace_speedup,
            trace_limit: a.trace_limit,
            prompt_file: a.prompt_file,
            multi_turn: a.multi_turn,
            ramp: a.ramp,
            ramp_over: a.ramp_over,
            ramp_from: a.ramp_from,
            ramp_to: a.ramp_to,
            ramp_duration: a.ramp_duration,
            tokenizer: a.tokenizer,
            chat_template: a.chat_template,
        }
    }
}
