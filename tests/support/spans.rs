//! Realistic canary spans for export tests and benchmarks, built by the agent's own code.

use std::time::{Duration, SystemTime};

use lmperf::canary::client::Measured;
use lmperf::measure::{StreamEnd, StreamMeasurer};
use lmperf::sampler::adaptive::{Decision, Reason};
use lmperf::telemetry::spans::{SpanContextInfo, TraceIds, build_span};
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::trace::SpanData;

/// A measured 16-token chat request.
pub fn measured() -> Measured {
    let mut m = StreamMeasurer::new(200, 1 << 20);
    m.on_bytes(Duration::from_millis(40), b"data: {\"id\":\"chatcmpl-1\",\"model\":\"m\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
    for i in 0..16u64 {
        let fin = if i == 15 { "\"length\"" } else { "null" };
        m.on_bytes(Duration::from_millis(50 + 10 * i), format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t\"}},\"finish_reason\":{fin}}}]}}\n\n").as_bytes());
    }
    m.on_bytes(Duration::from_millis(201), b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":16}}\n\ndata: [DONE]\n\n");
    Measured {
        record: m.finish(StreamEnd::Eof, Duration::from_millis(202)),
        wall_start: SystemTime::now(),
        retries: 0,
        conn: None,
    }
}

/// A factory of spans like the agent's (about 30 attributes).
pub struct SpanFactory {
    m: Measured,
    scope: InstrumentationScope,
}

impl Default for SpanFactory {
    fn default() -> Self {
        Self {
            m: measured(),
            scope: InstrumentationScope::builder("lmperf").build(),
        }
    }
}

impl SpanFactory {
    /// One span with fresh ids, kept for `reason`.
    pub fn span(&self, reason: Reason) -> SpanData {
        let ids = TraceIds::random(&lmperf::sampler::head::HeadSampler::AlwaysOn);
        let info = SpanContextInfo {
            target: "bench",
            operation: "chat",
            provider: "vllm",
            request_model: "m",
            max_tokens: 16,
            server_address: "127.0.0.1",
            server_port: 8000,
            prompt_id: "mtbench-120",
            events: Vec::new(),
            extra: Vec::new(),
        };
        let p = if reason.is_priority() { 1.0 } else { 0.1 };
        build_span(
            ids,
            &info,
            &self.m,
            &Decision {
                keep: true,
                reason,
                probability: p,
                transition: None,
                spike: None,
            },
            &self.scope,
        )
    }
}

/// This process's resident set size in KiB.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system) of this process so far.
pub fn cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10) // USER_HZ = 100 on Linux
}
