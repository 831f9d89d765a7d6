//! A benchmark's figures of the shared-prefix and image workloads, fed row by row beside the
//! [`super::aggregate::Summarizer`]: the server's prefix-cache hit ratio (from its usage's
//! cached prompt tokens) beside the ratio the workload should produce, TTFT of the first
//! request of each prefix group against the later ones, and the images sent (count, encoded
//! bytes, the input tokens the server counted beyond the text) by image size.

use std::collections::BTreeMap;

use serde::Serialize;

use super::RequestRow;
use super::accumulator::Accumulator;
use super::stats::Distribution;

/// `benchmarks[].prefix_cache`: a shared-prefix benchmark's cache figures, over its
/// successful requests.
#[derive(Debug, Clone, Serialize)]
pub struct PrefixCacheStats {
    /// Requests that were the first of their group (the prefix not seen before).
    pub requests_first: usize,
    /// Requests after the first of their group.
    pub requests_later: usize,
    /// What the workload should produce: the later requests' prefix tokens over all input
    /// tokens (the server's count where it gave one, else `prompt_tokens`).
    pub expected_hit_ratio: Option<f64>,
    pub expected_cached_tokens: u64,
    /// What the server reports: its cached prompt tokens over its input tokens, over the
    /// requests whose usage carried a cached count (null when none did).
    pub server_hit_ratio: Option<f64>,
    pub server_cached_tokens: Option<u64>,
    /// Requests whose usage carried a cached count.
    pub server_reported: usize,
    /// Server-cached tokens of the later requests only, against what they should be.
    pub server_cached_tokens_later: Option<u64>,
    pub ttft_first_ms: Option<Distribution>,
    pub ttft_later_ms: Option<Distribution>,
}

/// `benchmarks[].images.by_size[WxH]`.
#[derive(Debug, Clone, Serialize)]
pub struct ImageSizeBucket {
    pub requests: usize,
    pub images: u64,
    /// Encoded bytes of the images (before base64).
    pub image_bytes: u64,
    /// Input tokens the server counted beyond the text (`input_tokens − prompt_tokens`,
    /// summed over the requests whose usage gave a count).
    pub image_tokens: Option<u64>,
    /// `image_tokens` per image.
    pub image_tokens_per_image: Option<f64>,
    pub ttft_ms: Option<Distribution>,
    pub e2el_ms: Option<Distribution>,
}

/// `benchmarks[].images`: requests with images, by image size (`WxH`; `url` for images
/// given by URL in a dataset).
#[derive(Debug, Clone, Serialize)]
pub struct ImageStats {
    pub requests: usize,
    pub images: u64,
    pub image_bytes: u64,
    pub by_size: BTreeMap<String, ImageSizeBucket>,
}

#[derive(Debug, Clone, Default)]
struct SizeAcc {
    requests: usize,
    images: u64,
    bytes: u64,
    tokens: Option<u64>,
    tokens_images: u64,
    ttft: Accumulator,
    e2el: Accumulator,
}

/// Feeds the two blocks; both stay null in a benchmark without such requests.
#[derive(Debug, Clone, Default)]
pub struct WorkloadStats {
    first: usize,
    later: usize,
    expected: u64,
    input: u64,
    server_cached: u64,
    server_input: u64,
    server_reported: usize,
    server_cached_later: Option<u64>,
    ttft_first: Accumulator,
    ttft_later: Accumulator,
    sizes: BTreeMap<String, SizeAcc>,
}

impl WorkloadStats {
    /// Adds one request (only successful ones count).
    pub fn push(&mut self, r: &RequestRow) {
        if r.outcome != "ok" {
            return;
        }
        if let (Some(first), Some(shared)) = (r.prefix_first, r.prefix_shared_tokens) {
            let input = r.input_tokens_for_buckets();
            self.input += input;
            if first {
                self.first += 1;
            } else {
                self.later += 1;
                self.expected += u64::from(shared);
            }
            if let Some(c) = r.cached_input_tokens {
                self.server_reported += 1;
                self.server_cached += c;
                self.server_input += input;
                if !first {
                    *self.server_cached_later.get_or_insert(0) += c;
                }
            }
            if let Some(t) = r.ttft_ms {
                if first {
                    self.ttft_first.record(t);
                } else {
                    self.ttft_later.record(t);
                }
            }
        }
        if let Some(n) = r.images.filter(|n| *n > 0) {
            let s = self
                .sizes
                .entry(r.image_size.clone().unwrap_or_else(|| "url".into()))
                .or_default();
            s.requests += 1;
            s.images += u64::from(n);
            s.bytes += r.image_bytes.unwrap_or(0);
            if let Some(t) = r.image_tokens() {
                *s.tokens.get_or_insert(0) += t;
                s.tokens_images += u64::from(n);
            }
            if let Some(t) = r.ttft_ms {
                s.ttft.record(t);
            }
            s.e2el.record(r.e2el_ms);
        }
    }

    /// The `prefix_cache` block (null without shared-prefix requests).
    pub fn prefix_cache(&self) -> Option<PrefixCacheStats> {
        if self.first + self.later == 0 {
            return None;
        }
        let ratio = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
        let reported = self.server_reported > 0;
        Some(PrefixCacheStats {
            requests_first: self.first,
            requests_later: self.later,
            expected_hit_ratio: ratio(self.expected, self.input),
            expected_cached_tokens: self.expected,
            server_hit_ratio: ratio(self.server_cached, self.server_input).filter(|_| reported),
            server_cached_tokens: reported.then_some(self.server_cached),
            server_reported: self.server_reported,
            server_cached_tokens_later: self.server_cached_later,
            ttft_first_ms: self.ttft_first.distribution(),
            ttft_later_ms: self.ttft_later.distribution(),
        })
    }

    /// The `images` block (null without requests that carried images).
    pub fn images(&self) -> Option<ImageStats> {
        if self.sizes.is_empty() {
            return None;
        }
        let by_size: BTreeMap<String, ImageSizeBucket> = self
            .sizes
            .iter()
            .map(|(k, s)| {
                (
                    k.clone(),
                    ImageSizeBucket {
                        requests: s.requests,
                        images: s.images,
                        image_bytes: s.bytes,
                        image_tokens: s.tokens,
                        image_tokens_per_image: s
                            .tokens
                            .filter(|_| s.tokens_images > 0)
                            .map(|t| t as f64 / s.tokens_images as f64),
                        ttft_ms: s.ttft.distribution(),
                        e2el_ms: s.e2el.distribution(),
                    },
                )
            })
            .collect();
        Some(ImageStats {
            requests: by_size.values().map(|b| b.requests).sum(),
            images: by_size.values().map(|b| b.images).sum(),
            image_bytes: by_size.values().map(|b| b.image_bytes).sum(),
            by_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(first: bool, input: u64, cached: u64, ttft: f64) -> RequestRow {
        RequestRow {
            outcome: "ok",
            prompt_tokens: input as u32,
            input_tokens: Some(input),
            cached_input_tokens: Some(cached),
            prefix_first: Some(first),
            prefix_shared_tokens: Some(100),
            ttft_ms: Some(ttft),
            ..RequestRow::default()
        }
    }

    #[test]
    fn expected_and_server_ratios_and_the_ttft_split() {
        let mut s = WorkloadStats::default();
        s.push(&row(true, 150, 2, 90.0));
        s.push(&row(false, 150, 101, 20.0));
        s.push(&row(false, 150, 101, 22.0));
        s.push(&row(true, 150, 2, 95.0));
        let p = s.prefix_cache().unwrap();
        assert_eq!((p.requests_first, p.requests_later), (2, 2));
        assert_eq!(p.expected_cached_tokens, 200);
        assert!((p.expected_hit_ratio.unwrap() - 200.0 / 600.0).abs() < 1e-12);
        assert!((p.server_hit_ratio.unwrap() - 206.0 / 600.0).abs() < 1e-12);
        assert_eq!(p.server_cached_tokens_later, Some(202));
        assert_eq!(p.ttft_first_ms.unwrap().count, 2);
        assert!(s.images().is_none());
    }

    #[test]
    fn image_tokens_by_size() {
        let mut s = WorkloadStats::default();
        let r = RequestRow {
            outcome: "ok",
            prompt_tokens: 20,
            input_tokens: Some(20 + 2 * 256),
            images: Some(2),
            image_bytes: Some(3000),
            image_size: Some("64x64".into()),
            ttft_ms: Some(5.0),
            ..RequestRow::default()
        };
        s.push(&r);
        s.push(&r);
        let i = s.images().unwrap();
        assert_eq!((i.requests, i.images, i.image_bytes), (2, 4, 6000));
        let b = &i.by_size["64x64"];
        assert_eq!(b.image_tokens, Some(1024));
        assert_eq!(b.image_tokens_per_image, Some(256.0));
        assert!(s.prefix_cache().is_none());
    }
}
