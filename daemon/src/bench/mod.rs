//! `lmperf run`: one-shot benchmarks with the agent's own client and measurement.
//!
//! One benchmark per (concurrency, input length). Each sends `num_prompts` synthetic prompts
//! of that exact token length, open loop on an absolute schedule (`--request-rate`, Poisson /
//! gamma / constant gaps; `inf` sends all at once) with at most `concurrency` in flight. A
//! request that waits for a free slot records its dispatch delay, and latencies are reported
//! both from the send and from the schedule (`../shared/cases/sse/07_*`). Results go to
//! `requests.jsonl` (one line per request), `summary.json` (schema below, versioned) and
//! `report.html` (self-contained charts and tables, see [`report`]).

pub mod accumulator;
pub mod aggregate;
pub mod benchmark;
pub mod buckets;
pub mod capacity;
pub mod compare;
pub mod compare_text;
pub mod compare_trace;
pub mod context;
pub mod direct;
pub mod export;
pub mod find_rate;
pub mod gates;
pub mod groups;
pub mod launch;
pub mod offered;
pub mod oom;
pub mod probe;
pub mod profile;
pub mod progress;
pub mod prompt_tokens;
pub mod repeat;
pub mod report;
pub mod rows;
pub mod runner;
pub mod server;
pub mod server_timing;
pub mod slots;
pub mod spec;
pub mod stats;
pub mod summary;
pub mod summary_csv;
pub mod traffic;
pub mod vram;
pub mod workload_stats;

pub use crate::load::{chat_template, dataset, feed, prompts, tokens, trace, workload};
pub use benchmark::summarize;
pub(crate) use benchmark::{RowKey, one_benchmark, row, shape};
pub(crate) use gates::gate_trips;
pub use gates::parse_gate;
pub use runner::run;
pub(crate) use runner::write_jsonl;
pub use spec::{BenchError, Gate, Goodput, RunArrival, RunSpec};
pub use summary::{BenchSummary, ChoiceRow, RequestRow, Summary};

/// Version of `summary.json` and `requests.jsonl`; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;
