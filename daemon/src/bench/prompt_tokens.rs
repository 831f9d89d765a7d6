//! The run's `prompt_tokens_mismatch`: requests whose server-reported input tokens differ
//! from the prompt tokens counted with the chat template ([`crate::load::chat_template`]).

use super::Summary;

/// `summary` with its `prompt_tokens_mismatch` summed over the benchmarks; with `progress`, a
/// warning on stderr when it is not 0.
pub fn checked(mut summary: Summary, progress: bool) -> Summary {
    summary.prompt_tokens_mismatch = summary
        .benchmarks
        .iter()
        .map(|b| b.prompt_tokens_mismatch)
        .sum();
    if progress && summary.prompt_tokens_mismatch > 0 {
        let source = serde_json::to_value(summary.prompt_tokens_source)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        eprintln!(
            "lmperf run: warning: {} request(s) whose server-reported input tokens differ from prompt_tokens by more than 1 (prompt_tokens_source {source}); length buckets use the server's counts",
            summary.prompt_tokens_mismatch
        );
    }
    summary
}

#[cfg(test)]
mod tests {
    use crate::bench::{Goodput, RequestRow, aggregate, buckets};

    /// A request is a mismatch when the server's count is more than one token (BOS) away from
    /// `prompt_tokens`; heatmaps bucket it by the server's count when there is one.
    #[test]
    fn mismatch_and_buckets_use_the_servers_count() {
        let row = |prompt: u32, server: Option<u64>| RequestRow {
            benchmark: "c1_in32".into(),
            concurrency: 1,
            prompt_tokens: prompt,
            input_tokens: server,
            output_tokens: Some(4),
            outcome: "ok",
            ..RequestRow::default()
        };
        let rows = [
            row(32, Some(33)),
            row(32, Some(32)),
            row(32, Some(31)),
            row(32, Some(56)),
            row(32, Some(30)),
            row(32, None),
            row(100, None),
        ];
        assert_eq!(
            rows.iter()
                .map(RequestRow::prompt_tokens_mismatch)
                .collect::<Vec<_>>(),
            [false, false, false, true, true, false, false]
        );
        assert_eq!(
            rows.iter()
                .map(RequestRow::input_tokens_for_buckets)
                .collect::<Vec<_>>(),
            [33, 32, 31, 56, 30, 32, 100]
        );
        let mut s = aggregate::Summarizer::new(Goodput::default());
        rows.iter().for_each(|r| s.push(r));
        let shape = aggregate::BenchShape {
            name: "c1_in32",
            concurrency: 1,
            input_len: 32,
            output_len: Some(4),
            request_rate: None,
        };
        assert_eq!(s.finish(shape).prompt_tokens_mismatch, 2);
        let b = &buckets::by_concurrency(&rows, Goodput::default())[0];
        let counts: Vec<(u64, usize)> = b.cells.iter().map(|c| (c.input.lo, c.count)).collect();
        assert_eq!(
            counts,
            [(16, 2), (32, 4), (64, 1)],
            "31 and 30 by the server: [16,32); 33, 32, 56, and 32 without usage: [32,64); 100 without usage: [64,128)"
        );
    }
}
