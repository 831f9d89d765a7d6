//! Where each request of `lmperf run` goes: which LoRA adapter it names as its `model`
//! (`--lora-modules`, `--lora-assignment`, vLLM's `bench serve` flags) and which endpoint
//! serves it (`--target` repeated, `--endpoint-policy`, AIPerf's multiple `--url`); and the
//! canary probes sent alongside the load (`--probe-rate`).
//!
//! The adapter of request `i` is a pure function of the seed and `i` (the same run names the
//! same adapters, whatever order the requests finish in). The endpoint is picked as the
//! request is dispatched: round-robin in dispatch order, or the endpoint with the fewest
//! requests in flight (ties: the first listed).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::TargetConfig;

/// How requests are spread over adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// Request `i` names adapter `i mod n`.
    RoundRobin,
    /// Each request draws an adapter by weight, seeded by `--seed` and its index.
    Random,
}

/// `--lora-modules` with their assignment.
#[derive(Debug, Clone, PartialEq)]
pub struct Lora {
    /// Adapter names, sent as each request's `model`; at least one.
    pub adapters: Vec<String>,
    /// Relative weights of `Random` (one per adapter, positive); equal without `--lora-weights`.
    pub weights: Vec<f64>,
    pub assignment: Assignment,
}

/// splitmix64: a well-mixed 64-bit value of `x` (Vigna).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Lora {
    /// Checks names and weights; the error names the flag and value.
    pub fn new(
        adapters: Vec<String>,
        weights: Vec<f64>,
        assignment: Assignment,
    ) -> Result<Self, String> {
        if let Some(a) = adapters.iter().find(|a| a.trim().is_empty()) {
            return Err(format!(
                "--lora-modules {a:?}: an adapter name is not empty"
            ));
        }
        let weights = if weights.is_empty() {
            vec![1.0; adapters.len()]
        } else if weights.len() != adapters.len() {
            return Err(format!(
                "--lora-weights: {} weights for {} adapters (one per --lora-modules name)",
                weights.len(),
                adapters.len()
            ));
        } else if let Some(w) = weights.iter().find(|w| !(w.is_finite() && **w > 0.0)) {
            return Err(format!("--lora-weights {w}: a positive number"));
        } else {
            weights
        };
        Ok(Self {
            adapters,
            weights,
            assignment,
        })
    }

    /// The adapter request `index` names (`seed`: `--seed`).
    pub fn adapter_for(&self, seed: u64, index: usize) -> &str {
        let n = self.adapters.len();
        let k = match self.assignment {
            Assignment::RoundRobin => index % n.max(1),
            Assignment::Random => {
                let total: f64 = self.weights.iter().sum();
                // 53 random bits: a uniform draw in [0, total).
                let u = (mix(seed ^ mix(index as u64 ^ 0x4C6F_5241)) >> 11) as f64
                    / (1u64 << 53) as f64
                    * total;
                let mut acc = 0.0;
                self.weights
                    .iter()
                    .position(|w| {
                        acc += w;
                        u < acc
                    })
                    .unwrap_or(n.saturating_sub(1))
            }
        };
        self.adapters.get(k).map_or("", String::as_str)
    }
}

/// How requests are spread over several endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EndpointPolicy {
    /// In dispatch order: the first request to the first endpoint, the next to the second, ….
    #[default]
    RoundRobin,
    /// The endpoint with the fewest requests in flight (ties: the first listed).
    LeastOutstanding,
}

/// What `lmperf run` spreads and adds beside the benchmark's own schedule.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Traffic {
    /// `--lora-modules`; `None`: every request names the model.
    pub lora: Option<Lora>,
    /// Endpoints beyond `RunSpec::target` (`--target` given more than once), same settings.
    pub more_endpoints: Vec<TargetConfig>,
    pub endpoint_policy: EndpointPolicy,
    /// `--probe-rate`: canary probes per second sent alongside each measured benchmark.
    pub probe_rate: Option<f64>,
}

/// The endpoints of one benchmark with their requests in flight.
#[derive(Debug)]
pub struct Endpoints {
    targets: Vec<Arc<TargetConfig>>,
    policy: EndpointPolicy,
    in_flight: Vec<AtomicUsize>,
    next: AtomicUsize,
}

/// A request's hold on its endpoint: one in flight until dropped.
#[derive(Debug)]
pub struct Hold {
    pub target: Arc<TargetConfig>,
    /// The endpoint's base URL when there are several (`RequestRow::endpoint`), else `None`.
    pub label: Option<String>,
    endpoints: Arc<Endpoints>,
    index: usize,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(c) = self.endpoints.in_flight.get(self.index) {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Endpoints {
    /// `first` then `more` (at least `first`).
    pub fn new(first: &TargetConfig, more: &[TargetConfig], policy: EndpointPolicy) -> Arc<Self> {
        let targets: Vec<Arc<TargetConfig>> = std::iter::once(first)
            .chain(more)
            .map(|t| Arc::new(t.clone()))
            .collect();
        Arc::new(Self {
            in_flight: targets.iter().map(|_| AtomicUsize::new(0)).collect(),
            targets,
            policy,
            next: AtomicUsize::new(0),
        })
    }

    /// Whether there is more than one endpoint.
    pub fn several(&self) -> bool {
        self.targets.len() > 1
    }

    /// Picks the endpoint of the next request and counts it in flight until the hold drops.
    pub fn pick(self: &Arc<Self>) -> Hold {
        let n = self.targets.len();
        let index = match self.policy {
            EndpointPolicy::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n,
            EndpointPolicy::LeastOutstanding => (0..n)
                .min_by_key(|&i| (self.in_flight[i].load(Ordering::Relaxed), i))
                .unwrap_or(0),
        };
        self.in_flight[index].fetch_add(1, Ordering::Relaxed);
        let target = self.targets[index].clone();
        Hold {
            label: self.several().then(|| target.base_url.to_string()),
            target,
            endpoints: self.clone(),
            index,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lora(a: Assignment, weights: Vec<f64>) -> Lora {
        Lora::new(vec!["a".into(), "b".into(), "c".into()], weights, a).unwrap()
    }

    #[test]
    fn round_robin_cycles_and_random_is_seeded_and_weighted() {
        let rr = lora(Assignment::RoundRobin, vec![]);
        let names: Vec<&str> = (0..6).map(|i| rr.adapter_for(7, i)).collect();
        assert_eq!(names, ["a", "b", "c", "a", "b", "c"]);
        let r = lora(Assignment::Random, vec![8.0, 1.0, 1.0]);
        let draw = |seed| {
            (0..2000)
                .map(|i| r.adapter_for(seed, i))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1), "same seed, same adapters");
        assert_ne!(draw(1), draw(2));
        let a = draw(1).iter().filter(|n| **n == "a").count();
        // 80 % expected: 1600 ± 4.5 σ (σ ≈ 17.9).
        assert!((1520..=1680).contains(&a), "{a}");
        assert!(Lora::new(vec!["a".into()], vec![1.0, 2.0], Assignment::Random).is_err());
        assert!(Lora::new(vec!["a".into()], vec![0.0], Assignment::Random).is_err());
        assert!(Lora::new(vec![" ".into()], vec![], Assignment::Random).is_err());
    }

    struct NoEnv;
    impl crate::config::Env for NoEnv {
        fn var(&self, _: &str) -> Option<String> {
            None
        }
    }

    fn target(port: u16) -> TargetConfig {
        let o = crate::config::Overrides {
            targets: vec![format!("http://127.0.0.1:{port}")],
            ..crate::config::Overrides::default()
        };
        crate::config::load(o, &NoEnv).unwrap().targets.remove(0)
    }

    #[test]
    fn endpoints_round_robin_and_least_outstanding() {
        let e = Endpoints::new(&target(1), &[target(2)], EndpointPolicy::RoundRobin);
        let ports: Vec<u16> = (0..4).map(|_| e.pick().target.port).collect();
        assert_eq!(ports, [1, 2, 1, 2]);
        let e = Endpoints::new(&target(1), &[target(2)], EndpointPolicy::LeastOutstanding);
        let held = e.pick();
        assert_eq!(held.target.port, 1);
        assert_eq!(held.label.as_deref(), Some("http://127.0.0.1:1/"));
        // 1 holds one: 2 is less loaded, then both hold one: the first again.
        let second = e.pick();
        assert_eq!(second.target.port, 2);
        assert_eq!(e.pick().target.port, 1);
        drop(held);
        drop(second);
        let one = Endpoints::new(&target(1), &[], EndpointPolicy::RoundRobin);
        assert_eq!(one.pick().label, None);
    }
}
