//! `lmperf run`'s flags of LoRA adapters (vLLM's `--lora-modules`, `--lora-assignment`),
//! several endpoints (`--endpoint-policy`; the endpoints are `--target` given more than once)
//! and canary probes under load (`--probe-rate`), converted into
//! [`crate::bench::traffic::Traffic`].

use clap::Args;

use crate::bench::traffic::{Assignment, EndpointPolicy, Lora, Traffic};

/// `lmperf run` flags of where requests go and what is sent beside them.
#[derive(Debug, Default, Args)]
pub struct TrafficArgs {
    /// LoRA adapters to spread the requests over: each request's `model` is one of these
    /// names (as loaded by the server, e.g. vLLM's --lora-modules NAME=PATH);
    /// summary.json gets a block per adapter.
    #[arg(long, value_name = "NAME", num_args = 1.., help_heading = "LoRA")]
    pub lora_modules: Vec<String>,
    /// How requests are spread over --lora-modules: random (seeded by --seed, weighted by
    /// --lora-weights) or round-robin.
    #[arg(long, value_parser = ["random", "round-robin"], default_value = "random", help_heading = "LoRA")]
    pub lora_assignment: String,
    /// Relative weights of the adapters with --lora-assignment random (one per name).
    #[arg(long, value_name = "W", num_args = 1.., requires = "lora_modules", help_heading = "LoRA")]
    pub lora_weights: Vec<f64>,
    /// How one schedule is spread over several --target endpoints: round-robin, or the
    /// endpoint with the fewest requests in flight (least-outstanding).
    #[arg(long, value_parser = ["round-robin", "least-outstanding"], default_value = "round-robin", help_heading = "Endpoints")]
    pub endpoint_policy: String,
    /// Send the agent's small fixed-shape canary at R per second beside each benchmark's
    /// load, summarized apart (`probes`; gates: --fail-on probe_ttft_p99_ms>300).
    #[arg(long, value_name = "R", help_heading = "Probes")]
    pub probe_rate: Option<f64>,
}

impl TrafficArgs {
    /// Checked; `more_endpoints`: the endpoints after the first `--target`.
    pub fn into_traffic(
        self,
        more_endpoints: Vec<crate::config::TargetConfig>,
    ) -> Result<Traffic, String> {
        let lora = if self.lora_modules.is_empty() {
            None
        } else {
            let assignment = match self.lora_assignment.as_str() {
                "round-robin" => Assignment::RoundRobin,
                _ => Assignment::Random,
            };
            if assignment == Assignment::RoundRobin && !self.lora_weights.is_empty() {
                return Err("--lora-weights: weights apply to --lora-assignment random".to_owned());
            }
            Some(Lora::new(self.lora_modules, self.lora_weights, assignment)?)
        };
        if let Some(r) = self.probe_rate
            && !(r.is_finite() && r > 0.0 && r <= 1000.0)
        {
            return Err(format!(
                "--probe-rate {r}: a positive number of probes per second, at most 1000"
            ));
        }
        Ok(Traffic {
            lora,
            more_endpoints,
            endpoint_policy: match self.endpoint_policy.as_str() {
                "least-outstanding" => EndpointPolicy::LeastOutstanding,
                _ => EndpointPolicy::RoundRobin,
            },
            probe_rate: self.probe_rate,
        })
    }
}
