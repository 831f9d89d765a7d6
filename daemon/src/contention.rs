//! The node's and the model servers' contention signals as the operator sees them, next to the
//! GPU's: the latest node sample ([`crate::node::NodeSample`]) the diagnosis was fed, kept as
//! it came, in `/api/v1/status` `node` ([`NodeView`]) and on `/metrics` as observable gauges
//! that read it ([`register_gauges`]: no file read of their own, nothing done between scrapes).
//! A value the sample lacks (no PSI on the kernel, no cgroup found, no memory limit) has no
//! series and no field; never a 0.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use serde::Serialize;

use crate::node::NodeSample;
use crate::telemetry::names as n;

/// The latest node sample and, per target, its OOM kills summed since the agent started (each
/// sample holds those since the previous one).
#[derive(Debug, Default)]
pub struct LatestNode {
    inner: Mutex<Latest>,
}

#[derive(Debug, Default)]
struct Latest {
    at: Option<SystemTime>,
    sample: NodeSample,
    oom_kills_total: BTreeMap<String, u64>,
}

/// `/api/v1/status` `node`: the latest node sample (absent values left out).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    /// When it was sampled, Unix seconds.
    pub at_unix_s: f64,
    /// The node's PSI `avg10` shares (0..1), from `/proc/pressure/*`.
    pub psi: PsiView,
    /// The agent's own CPU use since the previous sample, cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_cpu_cores: Option<f64>,
    /// Each target's model server, by target name.
    pub targets: Vec<TargetContentionView>,
}

/// PSI `avg10` shares (0..1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PsiView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_some: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_some: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_full: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_some: Option<f64>,
}

/// One target's model server: its CPU wait and use, and its cgroup's throttling, memory and
/// OOM kills.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetContentionView {
    pub target: String,
    /// Seconds per second its threads waited for a CPU since the previous sample.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_wait_s_per_s: Option<f64>,
    /// Its CPU use since the previous sample, cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<f64>,
    /// Share of its cgroup's CFS periods throttled since the previous sample (0..1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_throttled_share: Option<f64>,
    /// Its cgroup's `memory.current` ÷ `memory.max` (0..1); absent without a limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_usage_ratio: Option<f64>,
    /// OOM kills in its cgroup since the agent started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kills_total: Option<u64>,
}

impl LatestNode {
    /// Keeps `sample`, taken at `at`, as the latest; adds its OOM kills to each target's total.
    pub fn record(&self, at: SystemTime, sample: &NodeSample) {
        let Ok(mut l) = self.inner.lock() else {
            return;
        };
        for (t, c) in &sample.targets {
            if let Some(k) = c.oom_kills {
                let total = l.oom_kills_total.entry(t.clone()).or_default();
                *total = total.saturating_add(k);
            }
        }
        l.at = Some(at);
        l.sample.clone_from(sample);
    }

    /// The latest sample; `None` before the first.
    pub fn view(&self) -> Option<NodeView> {
        let l = self.inner.lock().ok()?;
        let at = l.at?;
        let s = &l.sample;
        Some(NodeView {
            at_unix_s: crate::diagnosis::report::unix_s(at),
            psi: PsiView {
                cpu_some: s.cpu_some,
                memory_some: s.memory_some,
                memory_full: s.memory_full,
                io_some: s.io_some,
            },
            agent_cpu_cores: s.agent_cpu_cores,
            targets: s
                .targets
                .iter()
                .map(|(t, c)| TargetContentionView {
                    target: t.clone(),
                    cpu_wait_s_per_s: c.cpu_wait_s_per_s,
                    cpu_cores: c.cpu_cores,
                    cpu_throttled_share: c.cpu_throttled_share,
                    memory_usage_ratio: c.memory_usage_ratio,
                    oom_kills_total: l.oom_kills_total.get(t).copied(),
                })
                .collect(),
        })
    }
}

/// Registers the node's and the model servers' gauges on `meter`, each reading the latest
/// sample of `latest` at collection ([`crate::telemetry::names`] `METRIC_NODE_*`,
/// `METRIC_SERVER_CPU_*`, `METRIC_SERVER_MEMORY_*`, `METRIC_SERVER_OOM_KILLS`).
pub fn register_gauges(meter: &Meter, latest: Arc<LatestNode>) {
    let l = latest.clone();
    let _psi = meter
        .f64_observable_gauge(n::METRIC_NODE_PRESSURE)
        .with_unit("1")
        .with_description("Node PSI avg10: share of the last 10 s some (or all: full) tasks stalled on the resource, 0..1 (/proc/pressure).")
        .with_callback(move |obs| {
            if let Some(v) = l.view() {
                for (resource, stall, x) in [
                    ("cpu", "some", v.psi.cpu_some),
                    ("memory", "some", v.psi.memory_some),
                    ("memory", "full", v.psi.memory_full),
                    ("io", "some", v.psi.io_some),
                ] {
                    if let Some(x) = x {
                        obs.observe(x, &[KeyValue::new(n::LMPERF_NODE_PRESSURE_RESOURCE, resource), KeyValue::new(n::LMPERF_NODE_PRESSURE_STALL, stall)]);
                    }
                }
            }
        })
        .build();
    // Per target: (metric, unit, description, the value of a view).
    type Pick = fn(&TargetContentionView) -> Option<f64>;
    let per_target: [(&'static str, &'static str, &'static str, Pick); 4] = [
        (
            n::METRIC_SERVER_CPU_WAIT,
            "s/s",
            "Seconds per second the model server's threads waited for a CPU (run delay, /proc/PID/task/*/schedstat, or its cgroup's cpu.pressure).",
            |t| t.cpu_wait_s_per_s,
        ),
        (
            n::METRIC_SERVER_CPU_USAGE,
            "{cpu}",
            "The model server's CPU use, cores.",
            |t| t.cpu_cores,
        ),
        (
            n::METRIC_SERVER_CPU_THROTTLED,
            "1",
            "Share of the model server's cgroup CFS periods throttled (cpu.stat nr_throttled ÷ nr_periods over the sample), 0..1.",
            |t| t.cpu_throttled_share,
        ),
        (
            n::METRIC_SERVER_MEMORY_LIMIT_UTILIZATION,
            "1",
            "The model server's cgroup memory used of its limit (memory.current ÷ memory.max), 0..1.",
            |t| t.memory_usage_ratio,
        ),
    ];
    for (name, unit, description, pick) in per_target {
        let l = latest.clone();
        let _g = meter
            .f64_observable_gauge(name)
            .with_unit(unit)
            .with_description(description)
            .with_callback(move |obs| {
                if let Some(v) = l.view() {
                    for t in &v.targets {
                        if let Some(x) = pick(t) {
                            obs.observe(x, &[KeyValue::new(n::LMPERF_TARGET, t.target.clone())]);
                        }
                    }
                }
            })
            .build();
    }
    let _oom = meter
        .u64_observable_counter(n::METRIC_SERVER_OOM_KILLS)
        .with_unit("{kill}")
        .with_description("OOM kills in the model server's cgroup since the agent started (memory.events oom_kill).")
        .with_callback(move |obs| {
            if let Some(v) = latest.view() {
                for t in &v.targets {
                    if let Some(k) = t.oom_kills_total {
                        obs.observe(k, &[KeyValue::new(n::LMPERF_TARGET, t.target.clone())]);
                    }
                }
            }
        })
        .build();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::TargetContention;

    /// Through the production `/metrics` path: the meter's Prometheus registry, text-encoded.
    #[test]
    fn the_latest_sample_is_in_the_view_and_on_metrics_absent_values_have_no_series() {
        let o = crate::config::Overrides {
            targets: vec!["http://127.0.0.1:1".into()],
            no_otlp: true,
            ..crate::config::Overrides::default()
        };
        let cfg = crate::config::load(o, &NoEnv).expect("config");
        let telemetry = crate::telemetry::Telemetry::init(&cfg.otlp, &NoEnv).expect("telemetry");
        let latest = Arc::new(LatestNode::default());
        register_gauges(&telemetry.meter(), latest.clone());
        assert_eq!(latest.view(), None);
        let sample = |oom| NodeSample {
            cpu_some: Some(0.42),
            memory_some: None,
            memory_full: None,
            io_some: Some(0.03),
            agent_cpu_cores: Some(0.01),
            targets: vec![
                (
                    "vllm".to_owned(),
                    TargetContention {
                        cpu_throttled_share: Some(0.25),
                        memory_usage_ratio: Some(0.8),
                        oom_kills: Some(oom),
                        cpu_wait_s_per_s: Some(1.5),
                        cpu_cores: Some(3.25),
                    },
                ),
                ("plain".to_owned(), TargetContention::default()),
            ],
        };
        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        latest.record(t0, &sample(1));
        latest.record(t0 + std::time::Duration::from_secs(1), &sample(2));
        let v = latest.view().expect("a sample");
        assert_eq!(v.at_unix_s, 1_700_000_001.0);
        let json = serde_json::to_value(&v).expect("JSON");
        assert_eq!(
            json["psi"],
            serde_json::json!({"cpu_some": 0.42, "io_some": 0.03})
        );
        assert_eq!(
            json["targets"][0],
            serde_json::json!({"target": "vllm", "cpu_wait_s_per_s": 1.5, "cpu_cores": 3.25,
                "cpu_throttled_share": 0.25, "memory_usage_ratio": 0.8, "oom_kills_total": 3})
        );
        assert_eq!(json["targets"][1], serde_json::json!({"target": "plain"}));

        let mut text = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&telemetry.registry.gather(), &mut text)
            .expect("encode");
        let value = |prefix: &str, labels: &[&str]| -> Vec<f64> {
            text.lines()
                .filter(|l| !l.starts_with('#') && l.starts_with(prefix))
                .filter(|l| labels.iter().all(|x| l.contains(x)))
                .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
                .collect()
        };
        let cpu = [
            "lmperf_node_pressure_resource=\"cpu\"",
            "lmperf_node_pressure_stall=\"some\"",
        ];
        assert_eq!(value("lmperf_node_pressure", &cpu), vec![0.42], "{text}");
        assert_eq!(
            value(
                "lmperf_node_pressure",
                &["lmperf_node_pressure_resource=\"io\""]
            ),
            vec![0.03]
        );
        // No memory PSI in the sample: no series, not a 0.
        assert!(
            value(
                "lmperf_node_pressure",
                &["lmperf_node_pressure_resource=\"memory\""]
            )
            .is_empty(),
            "{text}"
        );
        let vllm = ["lmperf_target=\"vllm\""];
        let plain = ["lmperf_target=\"plain\""];
        for (prefix, want) in [
            ("lmperf_server_cpu_wait", 1.5),
            ("lmperf_server_cpu_usage", 3.25),
            ("lmperf_server_cpu_throttled", 0.25),
            ("lmperf_server_memory_limit_utilization", 0.8),
            ("lmperf_server_oom_kills", 3.0),
        ] {
            assert_eq!(value(prefix, &vllm), vec![want], "{prefix}: {text}");
            assert!(value(prefix, &plain).is_empty(), "{prefix}: {text}");
        }
    }

    struct NoEnv;
    impl crate::config::Env for NoEnv {
        fn var(&self, _: &str) -> Option<String> {
            None
        }
    }
}
