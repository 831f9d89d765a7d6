//! `lmperf run`'s workload flags (clap), converted into the plain
//! [`crate::bench::workload::WorkloadArgs`] the benchmark validates.

use std::time::Duration;

use clap::Args;

/// `lmperf run` flags of the workload (flattened into the run's flags).
#[derive(Debug, Default, Args)]
#[command(group(clap::ArgGroup::new("prompts_source").args(["prompt_file", "dataset"])))]
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
    /// Multi-turn conversations from --prompt-file's `turns` (MT-Bench question.jsonl), or
    /// every human turn of --dataset sharegpt: each turn sent after the previous answer, with
    /// the history (needs --api chat).
    #[arg(long, requires = "prompts_source", help_heading = "Datasets")]
    pub multi_turn: bool,
    /// A standard dataset: `sharegpt FILE` (vLLM/SGLang ShareGPT JSON: each row's first human
    /// turn, all with --multi-turn) or `jsonl FILE` (vLLM custom: `prompt` or `messages`,
    /// optional `output_len`, `images`). Malformed rows are skipped, counted and named.
    #[arg(long, num_args = 2, value_names = ["FORMAT", "FILE"], help_heading = "Datasets",
          conflicts_with_all = ["prompt_file", "trace", "input_dist", "prefix_len"])]
    pub dataset: Option<Vec<String>>,
    /// Shared-prefix workload: each request starts with one of --prefix-groups system prompts
    /// of exactly N tokens, then a unique suffix (SGLang generated-shared-prefix).
    #[arg(long, value_name = "N", help_heading = "Workload",
          conflicts_with_all = ["prompt_file", "trace"])]
    pub prefix_len: Option<u32>,
    /// Distinct shared prefixes (default 1); requests go group by group.
    #[arg(
        long,
        value_name = "G",
        requires = "prefix_len",
        help_heading = "Workload"
    )]
    pub prefix_groups: Option<u32>,
    /// Requests of a group sent in a row (default: --num-prompts / --prefix-groups).
    #[arg(
        long,
        value_name = "P",
        requires = "prefix_len",
        help_heading = "Workload"
    )]
    pub prompts_per_group: Option<u32>,
    /// Synthetic images per request, sent as image_url data URLs (needs --api chat).
    #[arg(long, value_name = "K", help_heading = "Workload")]
    pub images_per_request: Option<u32>,
    /// Size of the synthetic images, WIDTHxHEIGHT pixels.
    #[arg(
        long,
        value_name = "WxH",
        default_value = "512x512",
        help_heading = "Workload"
    )]
    pub image_size: String,
    /// Encoding of the synthetic images.
    #[arg(long, value_parser = ["png"], default_value = "png", help_heading = "Workload")]
    pub image_format: String,
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
            dataset: a
                .dataset
                .and_then(|v| Some((v.first()?.clone(), v.get(1)?.into()))),
            prefix_len: a.prefix_len,
            prefix_groups: a.prefix_groups,
            prompts_per_group: a.prompts_per_group,
            images_per_request: a.images_per_request,
            image_size: a.image_size,
            image_format: a.image_format,
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
