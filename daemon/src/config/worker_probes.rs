//! `worker_probes`, `worker_probe_interval`, `worker_probe_max_rate`: a low-rate canary pinned
//! to each worker behind a router target (`canary::probes`), so that a worker the router never
//! picks is measured too. On by default; it acts on `kind = "router"` targets whose router is
//! NVIDIA Dynamo (its page registers workers, or its replies name them), the only router whose
//! requests lmperf can pin (`nvext.backend_instance_id`); `worker_probes = false` turns it off.

use std::time::Duration;

use super::ConfigError;
use super::raw::RawCanary;

/// Each worker's probe interval by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Probes per second per target at most, by default: 10 workers at the default interval.
pub const DEFAULT_MAX_RATE: f64 = 1.0;
/// Bounds of `worker_probe_interval`.
const INTERVAL_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(600));
/// The highest `worker_probe_max_rate`.
const MAX_RATE: f64 = 20.0;

/// The pinned probes of one target's workers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerProbes {
    /// `worker_probes` (default true).
    pub enabled: bool,
    /// Each worker is probed once per this (1 s to 10 min; default 10 s).
    pub interval: Duration,
    /// Probes per second of the target at most, all workers together (above 0, at most 20;
    /// default 1): with more workers than `interval × max_rate`, each is probed less often.
    pub max_rate: f64,
}

impl Default for WorkerProbes {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: DEFAULT_INTERVAL,
            max_rate: DEFAULT_MAX_RATE,
        }
    }
}

/// The probes of target `field` as written.
///
/// # Errors
/// An interval outside 1 s to 10 min, a rate not in (0, 20], each naming the field and value.
pub fn validate(field: &str, t: &RawCanary) -> Result<WorkerProbes, ConfigError> {
    let interval = t.worker_probe_interval.unwrap_or(DEFAULT_INTERVAL);
    if interval < INTERVAL_RANGE.0 || interval > INTERVAL_RANGE.1 {
        return Err(ConfigError::invalid(
            format!("{field}.worker_probe_interval"),
            humantime::format_duration(interval),
            "between 1s and 10m",
        ));
    }
    let max_rate = t.worker_probe_max_rate.unwrap_or(DEFAULT_MAX_RATE);
    if !(max_rate > 0.0 && max_rate <= MAX_RATE) {
        return Err(ConfigError::invalid(
            format!("{field}.worker_probe_max_rate"),
            max_rate,
            "above 0 and at most 20 probes per second",
        ));
    }
    Ok(WorkerProbes {
        enabled: t.worker_probes.unwrap_or(true),
        interval,
        max_rate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bounds() {
        let mut t = RawCanary::default();
        assert_eq!(
            validate("target[0]", &t).ok(),
            Some(WorkerProbes::default())
        );
        t.worker_probes = Some(false);
        t.worker_probe_interval = Some(Duration::from_secs(5));
        t.worker_probe_max_rate = Some(0.5);
        assert_eq!(
            validate("target[0]", &t).ok(),
            Some(WorkerProbes {
                enabled: false,
                interval: Duration::from_secs(5),
                max_rate: 0.5
            })
        );
        t.worker_probe_interval = Some(Duration::from_millis(500));
        let e = validate("target[0]", &t).unwrap_err().to_string();
        assert!(
            e.contains("target[0].worker_probe_interval") && e.contains("500ms"),
            "{e}"
        );
        t.worker_probe_interval = None;
        t.worker_probe_max_rate = Some(0.0);
        let e = validate("target[0]", &t).unwrap_err().to_string();
        assert!(
            e.contains("target[0].worker_probe_max_rate") && e.contains('0'),
            "{e}"
        );
    }
}
