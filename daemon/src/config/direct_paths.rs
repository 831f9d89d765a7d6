//! `direct_workers`, `direct_pool`, `direct_interval`, `direct_paths`: the workers behind a
//! router target, each sent low-rate canaries of the target's shape straight, not through the
//! router (`canary::direct`), so that the routed canaries can be compared with them (how much
//! the router adds: `lmperf_path_overhead_seconds`). The workers are the list given, else the
//! pods of the `direct_pool` InferencePool that discovery found (`namespace/name`: an llm-d
//! gateway's pool; this node's pods, as the agent discovers them), else those the router lists
//! itself (`GET /list_workers`, as vllm-router and SGLang's router serve it), else
//! those the routed replies name by URL ([`worker_url`]). On by
//! default for `kind = "router"` targets; `direct_paths = false` turns it off.

use std::time::Duration;

use url::Url;

use super::ConfigError;
use super::raw::RawCanary;

/// Each worker's direct canary interval by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Bounds of `direct_interval`.
const INTERVAL_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(600));
/// The most workers `direct_workers` may list.
const MAX_WORKERS: usize = 64;

/// The direct canaries of one router target.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectPaths {
    /// `direct_paths` (default true; acts on router targets only).
    pub enabled: bool,
    /// `direct_workers`: each worker's base URL; empty: the pool's pods, else ask the router
    /// (`/list_workers`).
    pub workers: Vec<Url>,
    /// `direct_pool`: the InferencePool whose discovered pods are the workers.
    pub pool: Option<PoolRef>,
    /// Each worker gets one direct canary per this (1 s to 10 min; default 5 s).
    pub interval: Duration,
}

impl Default for DirectPaths {
    fn default() -> Self {
        Self {
            enabled: true,
            workers: Vec::new(),
            pool: None,
            interval: DEFAULT_INTERVAL,
        }
    }
}

/// An InferencePool by namespace and name (`direct_pool = "namespace/name"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRef {
    pub namespace: String,
    pub name: String,
}

/// `direct_pool`'s `namespace/name`, each part a Kubernetes name (lowercase letters, digits,
/// `-` and `.`, 1 to 253 characters).
fn pool_ref(field: &str, v: &str) -> Result<PoolRef, ConfigError> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    match v.split_once('/') {
        Some((ns, name)) if name_ok(ns) && name_ok(name) => Ok(PoolRef {
            namespace: ns.to_owned(),
            name: name.to_owned(),
        }),
        _ => Err(ConfigError::invalid(
            format!("{field}.direct_pool"),
            v,
            "namespace/name of an InferencePool (lowercase names)",
        )),
    }
}

/// The direct paths of target `field` as written.
///
/// # Errors
/// A worker URL that does not parse or is not http(s), more than 64 workers, a pool that is
/// not `namespace/name`, an interval outside 1 s to 10 min, each naming the field and value.
pub fn validate(field: &str, t: &RawCanary) -> Result<DirectPaths, ConfigError> {
    let interval = t.direct_interval.unwrap_or(DEFAULT_INTERVAL);
    if interval < INTERVAL_RANGE.0 || interval > INTERVAL_RANGE.1 {
        return Err(ConfigError::invalid(
            format!("{field}.direct_interval"),
            humantime::format_duration(interval),
            "between 1s and 10m",
        ));
    }
    let listed = t.direct_workers.as_deref().unwrap_or_default();
    if listed.len() > MAX_WORKERS {
        return Err(ConfigError::invalid(
            format!("{field}.direct_workers"),
            listed.len(),
            "at most 64 workers",
        ));
    }
    let mut workers = Vec::with_capacity(listed.len());
    for (i, w) in listed.iter().enumerate() {
        let f = format!("{field}.direct_workers[{i}]");
        let u = Url::parse(w).map_err(|e| ConfigError::invalid(&f, w, e.to_string()))?;
        if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
            return Err(ConfigError::invalid(&f, w, "an http(s) URL with a host"));
        }
        workers.push(base_url(u));
    }
    let pool = match &t.direct_pool {
        Some(p) => Some(pool_ref(field, p)?),
        None => None,
    };
    Ok(DirectPaths {
        enabled: t.direct_paths.unwrap_or(true),
        workers,
        pool,
        interval,
    })
}

/// A target's or a worker's URL as a base the API paths join to: `http://h:p`, `http://h:p/`
/// and `http://h:p/v1` all become `http://h:p/`.
pub fn base_url(mut u: Url) -> Url {
    let path = u
        .path()
        .trim_end_matches('/')
        .trim_end_matches("/v1")
        .to_owned();
    u.set_path(&format!("{path}/"));
    u
}

/// A worker id a router's reply carried, as a direct worker's base URL: `Some` only when it is
/// an http(s) URL with a host (SGLang's gateway names its workers by URL,
/// `x-smg-routed-worker-id`; Dynamo's numeric ids and llm-d's `namespace/pod` names are not
/// addresses).
pub fn worker_url(id: &str) -> Option<Url> {
    let u = Url::parse(id).ok()?;
    (matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()))
        .then(|| base_url(u))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_namespace_and_name() {
        let mut t = RawCanary {
            direct_pool: Some("llm-d/gaie-pool".to_owned()),
            ..RawCanary::default()
        };
        assert_eq!(
            validate("target[1]", &t).map(|d| d.pool).ok().flatten(),
            Some(PoolRef {
                namespace: "llm-d".into(),
                name: "gaie-pool".into()
            })
        );
        for bad in ["gaie-pool", "/p", "ns/", "NS/p", "a/b/c"] {
            t.direct_pool = Some(bad.to_owned());
            let e = validate("target[1]", &t).unwrap_err().to_string();
            assert!(
                e.contains("target[1].direct_pool") && e.contains(bad),
                "{e}"
            );
        }
    }

    #[test]
    fn only_http_urls_are_worker_urls() {
        let got = |id: &str| worker_url(id).map(|u| u.to_string());
        assert_eq!(
            got("http://10.0.0.7:8000").as_deref(),
            Some("http://10.0.0.7:8000/")
        );
        assert_eq!(
            got("https://w.example/v1").as_deref(),
            Some("https://w.example/")
        );
        for id in [
            "7587888160958628",
            "ml/decode-0",
            "10.0.0.7:8000",
            "unix:/x",
            "a→b",
        ] {
            assert_eq!(got(id), None, "{id}");
        }
    }

    #[test]
    fn defaults_list_and_bounds() {
        let mut t = RawCanary::default();
        assert_eq!(validate("target[0]", &t).ok(), Some(DirectPaths::default()));
        t.direct_workers = Some(vec![
            "http://10.0.0.7:8000/v1".to_owned(),
            "http://w2:8000".to_owned(),
        ]);
        t.direct_interval = Some(Duration::from_secs(2));
        t.direct_paths = Some(false);
        let d = validate("target[0]", &t).expect("valid");
        let urls: Vec<&str> = d.workers.iter().map(Url::as_str).collect();
        assert_eq!(urls, ["http://10.0.0.7:8000/", "http://w2:8000/"]);
        assert_eq!((d.enabled, d.interval), (false, Duration::from_secs(2)));
        t.direct_workers = Some(vec!["ftp://w:1".to_owned()]);
        let e = validate("target[0]", &t).unwrap_err().to_string();
        assert!(
            e.contains("target[0].direct_workers[0]") && e.contains("ftp://w:1"),
            "{e}"
        );
        t.direct_workers = None;
        t.direct_interval = Some(Duration::from_millis(100));
        let e = validate("target[0]", &t).unwrap_err().to_string();
        assert!(
            e.contains("target[0].direct_interval") && e.contains("100ms"),
            "{e}"
        );
    }
}
