//! The report's workload sections: the `--dataset` file (rows used, malformed rows skipped),
//! the shared-prefix cache table (`benchmarks[].prefix_cache`: the server's hit ratio beside
//! the workload's, TTFT first vs later in group) and the image buckets by size
//! (`benchmarks[].images.by_size`). Each is empty when the run has no such figures.

use std::fmt::Write as _;

use crate::bench::Summary;

fn f(v: Option<f64>) -> String {
    v.map_or("–".to_owned(), crate::fmt::number)
}

/// The three sections, in that order.
pub fn section(summary: &Summary) -> String {
    let esc = super::esc;
    let mut h = String::new();
    if let Some(d) = &summary.workload.dataset {
        let _ = write!(
            h,
            r#"<h2>Dataset</h2><p id="dataset" data-rows="{}" data-skipped="{}"><code>{}</code> ({:?}): {} rows used, {} malformed rows skipped</p>"#,
            d.rows,
            d.skipped_rows,
            esc(&d.name),
            d.format,
            d.rows,
            d.skipped_rows
        );
        if !d.bad_rows.is_empty() {
            let _ = write!(
                h,
                "<details><summary>skipped rows (by {})</summary><table><tr><th>{}</th><th>reason</th></tr>",
                d.bad_row_position, d.bad_row_position
            );
            for b in &d.bad_rows {
                let _ = write!(h, "<tr><td>{}</td><td>{}</td></tr>", b.line, esc(&b.reason));
            }
            h.push_str("</table></details>");
        }
    }
    let prefix: Vec<_> = summary
        .benchmarks
        .iter()
        .filter_map(|b| b.prefix_cache.as_ref().map(|p| (b, p)))
        .collect();
    if !prefix.is_empty() {
        h.push_str("<h2>Shared prefixes</h2>");
        if let Some(p) = &summary.workload.shared_prefix {
            let _ = write!(
                h,
                "<p>{} groups of a {}-token prefix; the server's prefix-cache hit ratio (cached prompt tokens in its usage) beside the ratio the workload should produce, and TTFT of each group's first request against the later ones.</p>",
                p.groups, p.len
            );
        }
        h.push_str(r#"<table class="prefix"><tr><th>benchmark</th><th>first</th><th>later</th><th>expected hit ratio</th><th>server hit ratio (usage)</th><th>server hit ratio (/metrics)</th><th>TTFT p50 first (ms)</th><th>TTFT p50 later (ms)</th><th>TTFT p99 first (ms)</th><th>TTFT p99 later (ms)</th></tr>"#);
        for (b, p) in prefix {
            let _ = write!(
                h,
                r#"<tr data-benchmark="{}" data-expected="{}" data-server="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
                esc(&b.benchmark),
                p.expected_hit_ratio.unwrap_or(0.0),
                p.server_hit_ratio.map_or(String::new(), |v| v.to_string()),
                esc(&b.benchmark),
                p.requests_first,
                p.requests_later,
                f(p.expected_hit_ratio),
                f(p.server_hit_ratio),
                f(b.server.as_ref().and_then(|s| s.prefix_hit_ratio)),
                f(p.ttft_first_ms.as_ref().map(|d| d.p50)),
                f(p.ttft_later_ms.as_ref().map(|d| d.p50)),
                f(p.ttft_first_ms.as_ref().map(|d| d.p99)),
                f(p.ttft_later_ms.as_ref().map(|d| d.p99)),
            );
        }
        h.push_str("</table>");
    }
    let images: Vec<_> = summary
        .benchmarks
        .iter()
        .filter_map(|b| b.images.as_ref().map(|i| (b, i)))
        .collect();
    if !images.is_empty() {
        h.push_str("<h2>Images</h2><p>Requests with images, by image size: encoded bytes, and the input tokens the server counted beyond the text.</p>");
        h.push_str(r#"<table class="images"><tr><th>benchmark</th><th>size</th><th>requests</th><th>images</th><th>bytes</th><th>image tokens / image</th><th>TTFT p50 (ms)</th><th>TTFT p99 (ms)</th><th>E2EL p99 (ms)</th></tr>"#);
        for (b, i) in images {
            for (size, s) in &i.by_size {
                let _ = write!(
                    h,
                    r#"<tr data-benchmark="{}" data-size="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
                    esc(&b.benchmark),
                    esc(size),
                    esc(&b.benchmark),
                    esc(size),
                    s.requests,
                    s.images,
                    s.image_bytes,
                    f(s.image_tokens_per_image),
                    f(s.ttft_ms.as_ref().map(|d| d.p50)),
                    f(s.ttft_ms.as_ref().map(|d| d.p99)),
                    f(s.e2el_ms.as_ref().map(|d| d.p99)),
                );
            }
        }
        h.push_str("</table>");
    }
    h
}
