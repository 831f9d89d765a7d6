//! Inference server signals: the model server's own Prometheus page and info routes, scraped
//! per target, normalized into the `lmperf.server.*` vocabulary, kept for spans, status,
//! metrics, `lmperf run` and the diagnosis.
//!
//! `parse` (text format) → `normalize` (kind, common names) → `interval` (rates, histogram
//! deltas, `quantile`) are pure; `identity` reads the info routes' JSON; `state` holds what
//! the scrapers publish.

/// The scrape settings, validated in `config/` (their old path kept).
pub use crate::config::scrape as config;
pub mod state;

// The pure modules (crate `lmperf-server-page`), under their old paths.
pub use lmperf_server_page::{identity, interval, normalize, parse, quantile};

pub use identity::{Change, ChangeKind, Identity};
pub use interval::{LatencyStats, ServerSample};
pub use normalize::{Reading, ServerKind};
pub use state::{ServerEvent, ServerState, TargetServer};

#[cfg(test)]
mod tests;

pub mod metrics;
pub mod scrape;

use std::sync::Arc;

use opentelemetry::KeyValue;

use crate::config::TargetConfig;
use crate::telemetry::names as n;

/// Running scrapers; [`Monitor::stop`] ends them.
#[derive(Debug)]
pub struct Monitor {
    stop: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Monitor {
    /// Stops every scraper (a scrape in progress is dropped).
    pub async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = tokio::time::timeout(std::time::Duration::from_millis(200), t).await;
        }
    }
}

/// Starts one scraper per target with `server_metrics` on (on the current tokio runtime) and
/// registers the `lmperf.server.*` instruments on `meter` when given.
pub fn start(
    targets: &[TargetConfig],
    meter: Option<&opentelemetry::metrics::Meter>,
) -> (Arc<ServerState>, Monitor) {
    let client = scrape::Scraper::client();
    let state = ServerState::default();
    for t in targets {
        let off = if !t.server.enabled {
            Some("server_metrics = off".to_owned())
        } else if let Err(e) = &client {
            Some(format!("no HTTP client: {e}"))
        } else {
            None
        };
        state.targets.push(Arc::new(TargetServer::new(
            &t.name,
            Some(t.server.metrics_url.to_string()),
            off,
        )));
    }
    let state = Arc::new(state);
    if let Some(m) = meter {
        metrics::register(m, state.clone());
        metrics::register_router_picks(m, &state);
        metrics::register_picker_pool(m, &state);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    if let Ok(client) = client {
        for (t, ts) in targets.iter().zip(state.targets.snapshot()) {
            if t.server.enabled {
                tasks.push(tokio::spawn(
                    scrape::Scraper::new(t, ts.clone(), client.clone()).run(stop.clone()),
                ));
            }
        }
    }
    (state, Monitor { stop, tasks })
}

/// The span attributes of a canary sent at `sent` to `target`: the server's state at the
/// latest scrape before the send, and that scrape's age.
pub fn span_attributes(target: &TargetServer, sent: std::time::SystemTime) -> Vec<KeyValue> {
    let Some((s, age)) = target.at(sent) else {
        return Vec::new();
    };
    let mut a = Vec::with_capacity(4);
    if let Some(v) = s.requests_waiting {
        a.push(KeyValue::new(n::LMPERF_SERVER_REQUESTS_WAITING, v));
    }
    if let Some(v) = s.requests_running {
        a.push(KeyValue::new(n::LMPERF_SERVER_REQUESTS_RUNNING, v));
    }
    if let Some(v) = s.kv_cache_usage {
        a.push(KeyValue::new(n::LMPERF_SERVER_KV_CACHE_USAGE, v));
    }
    a.push(KeyValue::new(
        n::LMPERF_SERVER_SCRAPE_AGE,
        age.as_secs_f64(),
    ));
    a
}

/// The span events of the server changes no canary span has carried yet.
pub fn span_events(target: &TargetServer) -> Vec<opentelemetry::trace::Event> {
    target
        .take_pending()
        .into_iter()
        .map(|e| {
            let attrs = vec![
                KeyValue::new(n::LMPERF_SERVER_CHANGE_KIND, e.kind.as_str()),
                KeyValue::new(n::LMPERF_SERVER_CHANGE_OLD, e.old.unwrap_or_default()),
                KeyValue::new(n::LMPERF_SERVER_CHANGE_NEW, e.new.unwrap_or_default()),
            ];
            opentelemetry::trace::Event::new(n::EVENT_SERVER_CHANGE, e.at, attrs, 0)
        })
        .collect()
}

#[cfg(test)]
mod bad_inputs;
