//! [`RunContext`]: what the phases of one `lmperf run` share once the target answers.

use std::sync::Arc;

use super::{RunSpec, export};
use crate::canary::client::Clients;
use crate::load::prompts::TokenizeClient;

/// What `run_on`'s phases (the profile, the rate search, the benchmarks and their warm-ups)
/// share: the run's spec, the HTTP clients, the model served, the extra request-body fields
/// (`ignore_eos`, `n`), the prompt tokenizer and the OTLP export (none without `--otlp`;
/// warm-ups are not exported).
pub(crate) struct RunContext<'a> {
    pub spec: &'a RunSpec,
    pub clients: &'a Clients,
    pub model: &'a str,
    pub extra: &'a serde_json::Map<String, serde_json::Value>,
    pub tok: &'a TokenizeClient,
    pub telemetry: Option<Arc<export::BenchTelemetry>>,
}
