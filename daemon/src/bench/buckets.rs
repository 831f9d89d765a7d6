//! Length buckets of `summary.json` (`length_buckets`): the requests of each concurrency (and,
//! with images, of each image size: a vision request's latency depends on its images as much
//! as on its text), pooled over its benchmarks and `--repeat` runs, bucketed by their own
//! lengths, so a run with length distributions, a prompt file or a trace (one benchmark, many
//! lengths) still gets an input × output heatmap and SLO matrix.
//!
//! - Input bucket: the server's `usage.prompt_tokens` when it reported one, else the request's
//!   calibrated `prompt_tokens` (for chat, with its template; [`RequestRow::input_tokens_for_buckets`]).
//! - Output bucket: its achieved `output_tokens` when known (a successful request always has
//!   it: the server's usage, else the counted chunks), else its `output_tokens_target`
//!   (`max_tokens`; failed requests).
//! - Edges: powers of two, bucket `[lo, hi)` with `lo = 2^k`, `hi = 2^(k+1)` holding
//!   `2^k ≤ n < 2^(k+1)`; 0 tokens is the bucket `[0, 1)`.
//!
//! Latencies of a cell use its successful requests only (as the benchmark statistics do),
//! with the percentiles of `summary.json`'s distributions: numpy's linear method over a
//! bounded HDR histogram at 3 significant digits ([`super::accumulator::Accumulator`]; within
//! 0.1 % of the exact value). [`Pool`] is fed one request at a time: its memory grows with the
//! non-empty cells (three histograms each), not with the requests.

use std::collections::BTreeMap;

use serde::Serialize;

use super::accumulator::Accumulator;
use super::{Goodput, RequestRow};

/// The bucketing scheme, as written to `summary.json`.
pub const SCHEME: &str = "powers of two: [2^k, 2^(k+1)), 0 in [0, 1); input by the server's input_tokens when reported, else prompt_tokens; output by output_tokens when known, else output_tokens_target";

/// A half-open bucket of token counts, `[lo, hi)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Bucket {
    pub lo: u64,
    pub hi: u64,
}

impl Bucket {
    /// The power-of-two bucket holding `n` tokens.
    pub fn of(n: u64) -> Self {
        if n == 0 {
            return Self { lo: 0, hi: 1 };
        }
        let lo = 1u64 << n.ilog2();
        Self {
            lo,
            hi: lo.saturating_mul(2),
        }
    }

    /// `[lo,hi)`, as the report labels it.
    pub fn label(&self) -> String {
        format!("[{},{})", self.lo, self.hi)
    }
}

/// One SLO of a cell: its p99 against the `--goodput` threshold.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloCheck {
    /// `ttft`, `tpot` or `e2el`.
    pub slo: &'static str,
    /// p99 of the cell's successful requests, ms; null when none has the metric (e.g. TPOT of
    /// one-token answers).
    pub p99_ms: Option<f64>,
    pub threshold_ms: f64,
    /// `p99_ms ≤ threshold_ms`; null when `p99_ms` is.
    pub pass: Option<bool>,
}

/// One (input bucket, output bucket) cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketCell {
    pub input: Bucket,
    pub output: Bucket,
    /// Requests in the cell (all outcomes).
    pub count: usize,
    /// Successful requests: the latencies below are theirs.
    pub completed: usize,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub tpot_p99_ms: Option<f64>,
    pub e2el_p99_ms: Option<f64>,
    /// The SLO matrix: one entry per SLO set with `--goodput` (empty without).
    pub slo: Vec<SloCheck>,
}

/// The length buckets of one concurrency.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LengthBuckets {
    pub concurrency: usize,
    /// The `WxH` of the images its requests carried (`url` for images given by URL, whose
    /// size lmperf does not know); absent for requests without images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_size: Option<String>,
    /// The bucketing, in words ([`SCHEME`]).
    pub scheme: &'static str,
    /// Benchmarks whose requests are pooled here.
    pub benchmarks: Vec<String>,
    /// Requests pooled (the sum of the cells' `count`).
    pub num_requests: usize,
    /// Non-empty input buckets, ascending (the heatmap's rows).
    pub input_buckets: Vec<Bucket>,
    /// Non-empty output buckets, ascending (the heatmap's columns).
    pub output_buckets: Vec<Bucket>,
    /// Non-empty cells, by input then output bucket.
    pub cells: Vec<BucketCell>,
}

/// The image size a request is grouped by: its synthetic images' `WxH`, `url` for images
/// given by URL, `None` without images (as `images.by_size` of the summary keys them).
fn image_key(r: &RequestRow) -> Option<String> {
    r.images
        .filter(|n| *n > 0)
        .map(|_| r.image_size.clone().unwrap_or_else(|| "url".into()))
}

/// The output length a request is bucketed by: achieved when known, else the target.
fn output_len(r: &RequestRow) -> u64 {
    r.output_tokens.unwrap_or(u64::from(r.output_tokens_target))
}

/// The running figures of one cell.
#[derive(Debug, Clone, Default)]
struct CellAcc {
    count: usize,
    completed: usize,
    ttft: Accumulator,
    tpot: Accumulator,
    e2el: Accumulator,
}

impl CellAcc {
    fn merge(&mut self, o: &CellAcc) {
        self.count += o.count;
        self.completed += o.completed;
        self.ttft.merge(&o.ttft);
        self.tpot.merge(&o.tpot);
        self.e2el.merge(&o.e2el);
    }

    fn cell(&self, input: Bucket, output: Bucket, slo: Goodput) -> BucketCell {
        let q = |a: &Accumulator, p: f64| (a.count() > 0).then(|| a.quantiles(&[p])[0]);
        let (ttft_p99_ms, tpot_p99_ms, e2el_p99_ms) = (
            q(&self.ttft, 0.99),
            q(&self.tpot, 0.99),
            q(&self.e2el, 0.99),
        );
        let slo = [
            ("ttft", slo.ttft_ms, ttft_p99_ms),
            ("tpot", slo.tpot_ms, tpot_p99_ms),
            ("e2el", slo.e2el_ms, e2el_p99_ms),
        ]
        .into_iter()
        .filter_map(|(name, limit, p99)| {
            limit.map(|l| SloCheck {
                slo: name,
                p99_ms: p99,
                threshold_ms: l,
                pass: p99.map(|v| v <= l),
            })
        })
        .collect();
        BucketCell {
            input,
            output,
            count: self.count,
            completed: self.completed,
            ttft_p50_ms: q(&self.ttft, 0.5),
            ttft_p99_ms,
            tpot_p99_ms,
            e2el_p99_ms,
            slo,
        }
    }
}

/// The requests of one concurrency.
#[derive(Debug, Clone, Default)]
struct Group {
    benchmarks: Vec<String>,
    num_requests: usize,
    cells: BTreeMap<(Bucket, Bucket), CellAcc>,
}

/// `length_buckets` fed one request at a time ([`Pool::push`]), read with [`Pool::finish`].
#[derive(Debug, Clone, Default)]
pub struct Pool {
    groups: BTreeMap<(usize, Option<String>), Group>,
}

impl Pool {
    /// Adds one request to its concurrency's cell.
    pub fn push(&mut self, r: &RequestRow) {
        let g = self
            .groups
            .entry((r.concurrency, image_key(r)))
            .or_default();
        if g.benchmarks.last() != Some(&r.benchmark) && !g.benchmarks.contains(&r.benchmark) {
            g.benchmarks.push(r.benchmark.clone());
        }
        g.num_requests += 1;
        let c = g
            .cells
            .entry((
                Bucket::of(r.input_tokens_for_buckets()),
                Bucket::of(output_len(r)),
            ))
            .or_default();
        c.count += 1;
        if r.outcome != "ok" {
            return;
        }
        c.completed += 1;
        if let Some(v) = r.ttft_ms {
            c.ttft.record(v);
        }
        if let Some(v) = r.tpot_ms {
            c.tpot.record(v);
        }
        c.e2el.record(r.e2el_ms);
    }

    /// Adds every request of `other` (pushed after this pool's).
    pub fn merge(&mut self, other: &Pool) {
        for (key, o) in &other.groups {
            let g = self.groups.entry(key.clone()).or_default();
            for b in &o.benchmarks {
                if !g.benchmarks.contains(b) {
                    g.benchmarks.push(b.clone());
                }
            }
            g.num_requests += o.num_requests;
            for (k, c) in &o.cells {
                g.cells.entry(*k).or_default().merge(c);
            }
        }
    }

    /// The length buckets, one entry per concurrency (ascending; with images, per image size
    /// within it, requests without images first), SLO checks against `slo`.
    pub fn finish(&self, slo: Goodput) -> Vec<LengthBuckets> {
        self.groups
            .iter()
            .map(|((concurrency, image_size), g)| {
                let mut input_buckets: Vec<Bucket> = g.cells.keys().map(|k| k.0).collect();
                let mut output_buckets: Vec<Bucket> = g.cells.keys().map(|k| k.1).collect();
                input_buckets.dedup();
                output_buckets.sort_unstable();
                output_buckets.dedup();
                LengthBuckets {
                    concurrency: *concurrency,
                    image_size: image_size.clone(),
                    scheme: SCHEME,
                    benchmarks: g.benchmarks.clone(),
                    num_requests: g.num_requests,
                    input_buckets,
                    output_buckets,
                    cells: g
                        .cells
                        .iter()
                        .map(|(&(i, o), c)| c.cell(i, o, slo))
                        .collect(),
                }
            })
            .collect()
    }
}

/// The length buckets of `rows`, one entry per concurrency (ascending), SLO checks against
/// `slo` ([`Pool`] fed every row).
pub fn by_concurrency(rows: &[RequestRow], slo: Goodput) -> Vec<LengthBuckets> {
    let mut p = Pool::default();
    rows.iter().for_each(|r| p.push(r));
    p.finish(slo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::SCHEMA_VERSION;

    fn row(
        prompt: u32,
        out: Option<u64>,
        target: u32,
        ttft: f64,
        tpot: Option<f64>,
        e2el: f64,
        ok: bool,
    ) -> RequestRow {
        RequestRow {
            schema_version: SCHEMA_VERSION,
            benchmark: "c4_in_dist".into(),
            index: 0,
            repeat: 0,
            concurrency: 4,
            concurrency_limit: 4,
            scheduled_ms: 0.0,
            dispatch_delay_ms: 0.0,
            send_ms: 0.0,
            ttft_ms: ok.then_some(ttft),
            ttft_from_schedule_ms: ok.then_some(ttft),
            time_to_first_content_ms: None,
            itl_ms: Vec::new(),
            tpot_ms: tpot,
            e2el_ms: e2el,
            e2el_from_schedule_ms: e2el,
            prompt_tokens: prompt,
            prompt_tokens_target: prompt,
            output_tokens_target: target,
            turn: 0,
            input_tokens: None,
            output_tokens: out,
            usage_source: None,
            finish_reasons: Vec::new(),
            outcome: if ok { "ok" } else { "error" },
            error_type: (!ok).then(|| "http_500".into()),
            http_status: None,
            retries: 0,
            ..RequestRow::default()
        }
    }

    #[test]
    fn bucket_edges_are_powers_of_two() {
        for (n, lo, hi) in [
            (0, 0, 1),
            (1, 1, 2),
            (2, 2, 4),
            (3, 2, 4),
            (127, 64, 128),
            (128, 128, 256),
            (255, 128, 256),
            (600, 512, 1024),
        ] {
            assert_eq!(Bucket::of(n), Bucket { lo, hi }, "{n}");
        }
        assert_eq!(Bucket::of(100).label(), "[64,128)");
    }

    /// Within the histograms' precision (0.1 %) of numpy's linear percentile; the ends exact.
    fn near(got: Option<f64>, want: f64) -> bool {
        got.is_some_and(|g| (g - want).abs() <= 1e-3 * want.abs())
    }

    #[test]
    fn rows_bucket_by_their_own_lengths_with_percentiles_to_three_digits() {
        let mut rows = Vec::new();
        // Cell ([16,32), [8,16)): 20 successful requests, TTFT 1..=20 ms, TPOT 0.5..=10,
        // E2EL 101..=120; prompts 16..=31, achieved 8..=15 tokens of a 64-token target.
        for i in 0..20u32 {
            let f = f64::from(i + 1);
            rows.push(row(
                16 + i % 16,
                Some(8 + u64::from(i % 8)),
                64,
                f,
                Some(f / 2.0),
                100.0 + f,
                true,
            ));
        }
        // Same cell: a failure, bucketed by its target (10 tokens): counted, no latency.
        rows.push(row(20, None, 10, 0.0, None, 999.0, false));
        // Cell ([512,1024), [64,128)): two requests, one without TPOT.
        rows.push(row(600, Some(100), 100, 40.0, Some(3.0), 300.0, true));
        rows.push(row(512, Some(64), 100, 60.0, None, 500.0, true));
        // Another concurrency: its own entry.
        let mut other = row(5, Some(1), 1, 1.0, None, 2.0, true);
        other.concurrency = 1;
        other.benchmark = "c1_in_dist".into();
        rows.push(other);

        let slo = Goodput {
            ttft_ms: Some(19.0),
            tpot_ms: Some(5.0),
            e2el_ms: None,
        };
        let b = by_concurrency(&rows, slo);
        assert_eq!(
            b.iter()
                .map(|g| (g.concurrency, g.num_requests))
                .collect::<Vec<_>>(),
            [(1, 1), (4, 23)]
        );
        let g = &b[1];
        assert_eq!(g.benchmarks, ["c4_in_dist"]);
        assert_eq!(
            g.input_buckets,
            [Bucket { lo: 16, hi: 32 }, Bucket { lo: 512, hi: 1024 }]
        );
        assert_eq!(
            g.output_buckets,
            [Bucket { lo: 8, hi: 16 }, Bucket { lo: 64, hi: 128 }]
        );
        assert_eq!(g.cells.len(), 2);
        assert_eq!(
            g.cells.iter().map(|c| c.count).sum::<usize>(),
            g.num_requests
        );

        let c = &g.cells[0];
        assert_eq!(
            (c.input, c.output, c.count, c.completed),
            (Bucket { lo: 16, hi: 32 }, Bucket { lo: 8, hi: 16 }, 21, 20)
        );
        // numpy.percentile(range(1, 21), [50, 99]) = 10.5, 19.81.
        assert!(near(c.ttft_p50_ms, 10.5), "{:?}", c.ttft_p50_ms);
        assert!(near(c.ttft_p99_ms, 19.81), "{:?}", c.ttft_p99_ms);
        assert!(near(c.tpot_p99_ms, 9.905), "{:?}", c.tpot_p99_ms);
        assert!(
            near(c.e2el_p99_ms, 119.81),
            "the failure's 999 ms is left out: {:?}",
            c.e2el_p99_ms
        );
        assert_eq!(
            c.slo
                .iter()
                .map(|s| (s.slo, s.threshold_ms, s.pass))
                .collect::<Vec<_>>(),
            [("ttft", 19.0, Some(false)), ("tpot", 5.0, Some(false))]
        );
        assert_eq!(c.slo[0].p99_ms, c.ttft_p99_ms);

        let c = &g.cells[1];
        assert_eq!((c.count, c.completed), (2, 2));
        // Two values: p50 = 50, p99 = 40 + 0.99 × 20 = 59.8; TPOT of the one that has it.
        assert_eq!(
            c.ttft_p50_ms,
            Some(50.0),
            "the mean of the exact min and max"
        );
        assert!((c.ttft_p99_ms.unwrap() - 59.8).abs() < 1e-12);
        assert_eq!(c.tpot_p99_ms, Some(3.0));
        assert!((c.e2el_p99_ms.unwrap() - 498.0).abs() < 1e-12);
        assert_eq!(
            c.slo.iter().map(|s| (s.slo, s.pass)).collect::<Vec<_>>(),
            [("ttft", Some(false)), ("tpot", Some(true))]
        );

        // A cell of failures only: counted, no latency, SLOs undecided; no SLO, no checks.
        let b = by_concurrency(
            &[row(40, None, 3, 0.0, None, 5.0, false)],
            Goodput {
                ttft_ms: Some(1.0),
                ..Goodput::default()
            },
        );
        let c = &b[0].cells[0];
        assert_eq!(
            (c.input, c.output, c.count, c.completed, c.ttft_p99_ms),
            (
                Bucket { lo: 32, hi: 64 },
                Bucket { lo: 2, hi: 4 },
                1,
                0,
                None
            )
        );
        assert_eq!(
            c.slo,
            [SloCheck {
                slo: "ttft",
                p99_ms: None,
                threshold_ms: 1.0,
                pass: None
            }]
        );
        assert!(
            by_concurrency(&rows, Goodput::default())
                .iter()
                .all(|g| g.cells.iter().all(|c| c.slo.is_empty()))
        );
        // A benchmark's pool merged into the run's gives what one pool of every row gives.
        let (mut a, mut b) = (Pool::default(), Pool::default());
        rows[..7].iter().for_each(|r| a.push(r));
        rows[7..].iter().for_each(|r| b.push(r));
        a.merge(&b);
        assert_eq!(a.finish(slo), by_concurrency(&rows, slo));
    }

    #[test]
    fn requests_with_images_get_a_heatmap_per_image_size() {
        let row = |concurrency: usize, images: Option<(u32, &str)>, ttft: f64| RequestRow {
            concurrency,
            benchmark: format!("c{concurrency}"),
            outcome: "ok",
            prompt_tokens: 100,
            output_tokens: Some(10),
            ttft_ms: Some(ttft),
            e2el_ms: ttft + 50.0,
            images: images.map(|i| i.0),
            image_size: images.map(|i| i.1.to_owned()),
            ..RequestRow::default()
        };
        let rows = [
            row(2, None, 10.0),
            row(2, Some((1, "64x64")), 40.0),
            row(2, Some((2, "512x512")), 300.0),
            row(2, Some((1, "64x64")), 60.0),
            row(4, None, 20.0),
        ];
        let got = by_concurrency(&rows, Goodput::default());
        let groups: Vec<(usize, Option<&str>, usize)> = got
            .iter()
            .map(|g| (g.concurrency, g.image_size.as_deref(), g.num_requests))
            .collect();
        assert_eq!(
            groups,
            [
                (2, None, 1),
                (2, Some("512x512"), 1),
                (2, Some("64x64"), 2),
                (4, None, 1)
            ]
        );
        let small = &got[2].cells[0];
        assert_eq!(
            (small.count, small.ttft_p99_ms.map(f64::round)),
            (2, Some(60.0))
        );
        // Without images, nothing changes in summary.json: no `image_size` key.
        let json = serde_json::to_value(&got[0]).unwrap();
        assert!(json.get("image_size").is_none(), "{json}");
        assert_eq!(
            serde_json::to_value(&got[1]).unwrap()["image_size"],
            "512x512"
        );
    }
}
