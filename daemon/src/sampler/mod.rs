//! Which spans are kept. Metrics never depend on this: they count every request.
//!
//! - [`adaptive`]: the default, a per-target tail sampler decided when a canary ends.
//! - [`head`]: `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, which replace the adaptive
//!   sampler when set.
//! - [`in_flight`]: canaries in flight as lower bounds of their latency, for spike mode.
//! - [`threshold`]: the `ot=th:` tracestate encoding of a sampling probability.

pub mod adaptive;
pub mod head;
pub mod in_flight;
pub mod threshold;
