//! The head sampler of the standard `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`
//! variables (OpenTelemetry SDK environment variable specification). When either is set it
//! replaces the adaptive sampler; the decision is made before the request, so the
//! `traceparent` sampled flag tells the server the truth.

use opentelemetry::trace::TraceId;

use super::threshold;

/// Canaries are root spans, so the `parentbased_*` samplers act as their root sampler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HeadSampler {
    AlwaysOn,
    AlwaysOff,
    /// Keep a trace when its id falls below the ratio (as the SDK's `TraceIdRatioBased`).
    TraceIdRatio(f64),
}

impl HeadSampler {
    /// Reads the sampler from the two variables' values. Unknown or bad values fall back to
    /// `always_on` with a warning, as the spec asks.
    pub fn from_env_values(name: Option<&str>, arg: Option<&str>) -> Self {
        let ratio = || match arg.map(str::parse::<f64>) {
            Some(Ok(r)) if (0.0..=1.0).contains(&r) => r,
            None => 1.0,
            Some(_) => {
                tracing::warn!(value = ?arg, "OTEL_TRACES_SAMPLER_ARG is not a ratio in [0, 1]; using 1.0.");
                1.0
            }
        };
        match name {
            None | Some("always_on" | "parentbased_always_on") => HeadSampler::AlwaysOn,
            Some("always_off" | "parentbased_always_off") => HeadSampler::AlwaysOff,
            Some("traceidratio" | "parentbased_traceidratio") => HeadSampler::TraceIdRatio(ratio()),
            Some(other) => {
                tracing::warn!(
                    value = other,
                    "Unsupported OTEL_TRACES_SAMPLER; using always_on."
                );
                HeadSampler::AlwaysOn
            }
        }
    }

    /// Keep probability.
    pub fn probability(&self) -> f64 {
        match *self {
            HeadSampler::AlwaysOn => 1.0,
            HeadSampler::AlwaysOff => 0.0,
            HeadSampler::TraceIdRatio(r) => r,
        }
    }

    /// Decided on the trace id's 56 random bits, consistently with the `ot=th:` threshold.
    pub fn should_sample(&self, trace_id: TraceId) -> bool {
        match *self {
            HeadSampler::AlwaysOn => true,
            HeadSampler::AlwaysOff => false,
            HeadSampler::TraceIdRatio(r) => {
                threshold::keeps(u128::from_be_bytes(trace_id.to_bytes()), r)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_from_env_values() {
        assert_eq!(
            HeadSampler::from_env_values(None, None),
            HeadSampler::AlwaysOn
        );
        assert_eq!(
            HeadSampler::from_env_values(Some("parentbased_always_off"), None),
            HeadSampler::AlwaysOff
        );
        assert_eq!(
            HeadSampler::from_env_values(Some("traceidratio"), Some("0.25")),
            HeadSampler::TraceIdRatio(0.25)
        );
        let s = HeadSampler::TraceIdRatio(0.25);
        let kept = (0..40_000u128)
            .filter(|i| {
                s.should_sample(TraceId::from(
                    i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835),
                ))
            })
            .count();
        assert!((9_000..11_000).contains(&kept), "kept {kept} of 40000");
    }
}
