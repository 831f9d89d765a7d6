//! The report's "Server's own timing" section: per benchmark, the client's TTFT beside the
//! server's (`benchmarks[].server_timing`: vLLM's per-request `metrics`, llama.cpp's
//! `timings`), the server's queue, prefill and decode, and the gap the server did not see
//! (network, client, HTTP front end; the wait for a slot where the server's clock starts at
//! it), beside the server's waiting requests. Empty when no benchmark has the figures.

use std::fmt::Write as _;

use crate::bench::Summary;
use crate::bench::stats::Distribution;

fn pct(d: Option<&Distribution>, p: fn(&Distribution) -> f64) -> String {
    d.map_or("–".to_owned(), |d| crate::fmt::number(p(d)))
}

/// The section, or an empty string.
pub fn section(summary: &Summary) -> String {
    let esc = super::esc;
    let rows: Vec<_> = summary
        .benchmarks
        .iter()
        .filter_map(|b| b.server_timing.as_ref().map(|t| (b, t)))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut h = String::from(
        "<h2>Server's own timing</h2><p>What the server said each request cost on its own clock (vLLM's per-request <code>metrics</code>, llama.cpp's <code>timings</code>), beside the TTFT lmperf measured. The gap is the client's TTFT minus the server's: network, client and the server's HTTP front end (tokenization, routing); where the server's clock starts when a slot takes the request (llama.cpp's <code>timings</code>: no queue figure), it also holds the wait for a free slot, so read it beside the server's waiting requests: a gap that grows with them is queueing, not the network. Milliseconds, p50 / p99; a figure the server did not report is –.</p>",
    );
    h.push_str(r#"<table class="server-timing"><tr><th>benchmark</th><th>source (requests)</th><th>coverage</th><th>client TTFT</th><th>server TTFT</th><th>queue</th><th>prefill</th><th>decode</th><th>gap</th><th>gap holds</th><th>server waiting (mean / max)</th></tr>"#);
    for (b, t) in rows {
        let sources = t
            .requests_by_source
            .iter()
            .map(|(s, n)| format!("{s} ({n})"))
            .collect::<Vec<_>>()
            .join(", ");
        let both =
            |d: Option<&Distribution>| format!("{} / {}", pct(d, |d| d.p50), pct(d, |d| d.p99));
        let holds = if t.gap_holds == crate::bench::server_timing::GAP_WITH_SLOT_WAIT {
            "network, client, front end and the wait for a slot"
        } else {
            "network, client, front end"
        };
        let waiting = b.server.as_ref().map_or("–".to_owned(), |sv| {
            let n = |v: Option<f64>| v.map_or("–".to_owned(), crate::fmt::number);
            format!("{} / {}", n(sv.waiting_mean), n(sv.waiting_max))
        });
        let _ = write!(
            h,
            r#"<tr data-benchmark="{}" data-gap-p50="{}" data-gap-holds="{}"><td>{}</td><td>{}</td><td>{:.0} %</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{holds}</td><td>{waiting}</td></tr>"#,
            esc(&b.benchmark),
            t.client_minus_server_ttft_ms
                .as_ref()
                .map_or(String::new(), |d| d.p50.to_string()),
            t.gap_holds,
            esc(&b.benchmark),
            esc(&sources),
            t.coverage * 100.0,
            both(b.ttft_ms.as_ref()),
            both(t.ttft_ms.as_ref()),
            both(t.queue_ms.as_ref()),
            both(t.prefill_ms.as_ref()),
            both(t.decode_ms.as_ref()),
            both(t.client_minus_server_ttft_ms.as_ref()),
        );
    }
    h.push_str("</table>");
    h
}
