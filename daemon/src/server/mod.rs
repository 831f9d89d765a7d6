//! Inference server signals: the model server's own Prometheus page and info routes, scraped
//! per target, normalized into the `lmperf.server.*` vocabulary, kept for spans, status,
//! metrics, `lmperf run` and the diagnosis.
//!
//! `parse` (text format) → `normalize` (kind, common names) → `interval` (rates, histogram
//! deltas, `quantile`) are pure; `identity` reads the info routes' JSON; `state` holds what
//! the scrapers publish.

pub mod identity;
pub mod interval;
pub mod normalize;
pub mod parse;
pub mod quantile;
pub mod state;

pub use identity::{Change, ChangeKind, Identity};
pub use interval::{LatencyStats, ServerSample};
pub use normalize::{Reading, ServerKind};
pub use state::{ServerEvent, ServerState, TargetServer};

#[cfg(test)]
mod tests;
