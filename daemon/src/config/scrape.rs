//! The per-target scrape settings (`[[target]]` / `[canary]` keys `server_metrics`,
//! `metrics_url`, `metrics_interval`, `metrics_timeout`, `metrics_max_bytes`, `server_kind`),
//! validated into [`ScrapeConfig`].

use std::time::Duration;

use url::Url;

use crate::config::ConfigError;
use crate::config::raw::RawCanary;
use lmperf_server_page::normalize::ServerKind;

/// Default scrape interval (issue 11: 5 s, 1 s..60 s).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Default time a scrape may take, headers and body.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default body cap: a bigger page is not read past this and counted `too_large`.
pub const DEFAULT_MAX_BYTES: usize = 8 << 20;
/// How often the identity routes are re-read (and on every reconnect).
pub const IDENTITY_EVERY: Duration = Duration::from_secs(60);

/// How one target's model server is scraped.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeConfig {
    /// `server_metrics = auto` (default): scrape; `off`: never.
    pub enabled: bool,
    /// Default `<base>/metrics`.
    pub metrics_url: Url,
    pub interval: Duration,
    pub timeout: Duration,
    pub max_bytes: usize,
    /// `server_kind`; `None`: detected from the page's metric prefixes.
    pub kind: Option<ServerKind>,
}

fn invalid(field: String, value: impl std::fmt::Display, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: value.to_string(),
        reason: reason.to_owned(),
    }
}

/// Validates the scrape keys of target `field` (e.g. `target[0]`) with base URL `base`.
///
/// # Errors
/// A [`ConfigError::Invalid`] naming the key and value.
pub fn validate(field: &str, t: &RawCanary, base: &Url) -> Result<ScrapeConfig, ConfigError> {
    let enabled = match t.server_metrics.as_deref() {
        None | Some("auto") | Some("on") => true,
        Some("off") => false,
        Some(other) => {
            return Err(invalid(
                format!("{field}.server_metrics"),
                other,
                "expected auto or off",
            ));
        }
    };
    let metrics_url = match &t.metrics_url {
        Some(u) => {
            Url::parse(u).map_err(|e| invalid(format!("{field}.metrics_url"), u, &e.to_string()))?
        }
        None => base
            .join("metrics")
            .map_err(|e| invalid(format!("{field}.url"), base, &e.to_string()))?,
    };
    if !matches!(metrics_url.scheme(), "http" | "https") {
        return Err(invalid(
            format!("{field}.metrics_url"),
            &metrics_url,
            "expected http or https",
        ));
    }
    let interval = t.metrics_interval.unwrap_or(DEFAULT_INTERVAL);
    if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&interval) {
        return Err(invalid(
            format!("{field}.metrics_interval"),
            humantime::format_duration(interval),
            "between 1s and 60s",
        ));
    }
    let timeout = t.metrics_timeout.unwrap_or(DEFAULT_TIMEOUT.min(interval));
    if timeout.is_zero() || timeout > Duration::from_secs(60) {
        return Err(invalid(
            format!("{field}.metrics_timeout"),
            humantime::format_duration(timeout),
            "between 1ms and 60s",
        ));
    }
    let max_bytes = t.metrics_max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    if !(1024..=(256 << 20)).contains(&max_bytes) {
        return Err(invalid(
            format!("{field}.metrics_max_bytes"),
            max_bytes,
            "between 1024 and 268435456",
        ));
    }
    let kind = match t.server_kind.as_deref() {
        None | Some("auto") => None,
        Some(k) => Some(ServerKind::from_config(k).ok_or_else(|| {
            invalid(
                format!("{field}.server_kind"),
                k,
                "expected auto, vllm, sglang, tgi or llama.cpp",
            )
        })?),
    };
    Ok(ScrapeConfig {
        enabled,
        metrics_url,
        interval,
        timeout,
        max_bytes,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors_name_the_key() {
        let base = Url::parse("http://127.0.0.1:8000/").unwrap();
        let c = validate("target[0]", &RawCanary::default(), &base).unwrap();
        assert_eq!(
            (
                c.enabled,
                c.metrics_url.as_str(),
                c.interval,
                c.timeout,
                c.max_bytes,
                c.kind
            ),
            (
                true,
                "http://127.0.0.1:8000/metrics",
                DEFAULT_INTERVAL,
                DEFAULT_TIMEOUT,
                DEFAULT_MAX_BYTES,
                None
            )
        );
        let raw = RawCanary {
            server_metrics: Some("maybe".into()),
            ..RawCanary::default()
        };
        assert_eq!(
            validate("target[0]", &raw, &base).unwrap_err().to_string(),
            "target[0].server_metrics = \"maybe\": expected auto or off"
        );
        let raw = RawCanary {
            metrics_interval: Some(Duration::from_millis(500)),
            ..RawCanary::default()
        };
        assert!(
            validate("target[1]", &raw, &base)
                .unwrap_err()
                .to_string()
                .starts_with("target[1].metrics_interval = \"500ms\"")
        );
        let raw = RawCanary {
            server_kind: Some("llama.cpp".into()),
            server_metrics: Some("off".into()),
            metrics_url: Some("http://10.0.0.1:9090/m".into()),
            ..RawCanary::default()
        };
        let c = validate("target[0]", &raw, &base).unwrap();
        assert_eq!(
            (c.enabled, c.kind, c.metrics_url.as_str()),
            (false, Some(ServerKind::LlamaCpp), "http://10.0.0.1:9090/m")
        );
    }
}
