//! Scraping `/metrics` as Prometheus does (OpenMetrics preferred) and reading its exemplars.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The `Accept` header Prometheus 2.42 sends on every scrape.
pub const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `GET path` with an `Accept` header: (status, `Content-Type`, body). The admin server
/// answers `Connection: close` requests with a plain body.
pub fn get_accept(addr: SocketAddr, path: &str, accept: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    (code, ctype, body.to_owned())
}

/// One exemplar of an OpenMetrics sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Exemplar {
    /// The sample's name (`…_bucket`).
    pub metric: String,
    /// The sample's `le` label, if any.
    pub le: Option<String>,
    pub trace_id: String,
    pub span_id: String,
    pub value: f64,
    pub timestamp: f64,
}

/// Every exemplar of an OpenMetrics text: `name{…,le="x"} n # {trace_id="…",span_id="…"} v ts`.
pub fn exemplars(text: &str) -> Vec<Exemplar> {
    let label = |set: &str, name: &str| -> Option<String> {
        let start = set.find(&format!("{name}=\""))? + name.len() + 2;
        let end = set[start..].find('"')? + start;
        Some(set[start..end].to_owned())
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (sample, ex) = l.split_once(" # ")?;
            let metric = sample.split(['{', ' ']).next()?.to_owned();
            let (set, rest) = ex.strip_prefix('{')?.split_once('}')?;
            let mut nums = rest.split_whitespace().map(|v| v.parse::<f64>());
            Some(Exemplar {
                metric,
                le: label(sample, "le"),
                trace_id: label(set, "trace_id")?,
                span_id: label(set, "span_id")?,
                value: nums.next()?.ok()?,
                timestamp: nums.next()?.ok()?,
            })
        })
        .collect()
}
