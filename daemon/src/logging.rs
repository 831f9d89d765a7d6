//! The process's log lines on stderr: text (default) or one JSON object per line.
//!
//! JSON lines carry `timestamp` (RFC 3339, UTC), `level`, `message` and the event's fields
//! at the top level (no nesting), which Loki's `json` stage, Fluent Bit's `json` parser and
//! the OpenTelemetry Collector's filelog receiver read without configuration. Lines about a
//! request or a diagnosis carry `trace_id` and `span_id` (W3C hex) as fields, so a log line
//! joins its trace.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::log_format::LogFormat;

/// The filter when `RUST_LOG` is not set: `info`, with the exporters' own HTTP/gRPC stacks at
/// `warn` so that telemetry does not log about itself.
pub const DEFAULT_FILTER: &str = "info,hyper=warn,h2=warn,tonic=warn,reqwest=warn,opentelemetry=warn,opentelemetry_sdk=warn,opentelemetry_otlp=warn";

/// Installs the global subscriber (stderr; `RUST_LOG` filters). Does nothing when one is set.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}
