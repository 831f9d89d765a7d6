//! GPU memory during `lmperf run`: the peak VRAM of each benchmark, its VRAM efficiency, and
//! the `--fail-on vram_pct>N` gate (the seed's deployment blocker: a model that fits at
//! concurrency 1 and runs out of memory at 8).
//!
//! The run starts the agent's own NVML sampler ([`crate::gpu`]) on its thread and polls the
//! latest snapshot at half the sampling interval; a benchmark's peak is the highest value seen
//! between its first send and its last end. Without a driver (no `libnvidia-ml.so.1`, no GPU)
//! the run goes on and `summary.json` says why there are no GPU figures.
//!
//! Each new snapshot during a benchmark is also kept as the diagnosis's GPU signals
//! ([`crate::diagnosis_live::gpu_signals`]) for `gpu_samples.jsonl` ([`GpuSampleRow`]), which
//! `lmperf analyze RUN_DIR` feeds to the engine as the agent feeds it live.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::gpu::fake::FakeHandle;
use crate::gpu::sampler::{self, GpuMonitor};
use crate::gpu::state::{GpuState, Mode, Snapshot};

/// Sampling interval of the run's NVML sampler.
pub const RUN_GPU_INTERVAL: Duration = Duration::from_millis(200);

/// Where the run reads GPU memory from.
#[derive(Debug, Clone, Default)]
pub enum GpuSource {
    /// No GPU figures (`--gpu off`).
    Off,
    /// NVML, from this library path or `libnvidia-ml.so.1` on the loader's path (`--gpu auto`).
    #[default]
    Nvml,
    /// NVML from this library path (`--nvml-library`).
    NvmlAt(PathBuf),
    /// A scripted NVML (tests).
    Fake(FakeHandle),
}

/// One benchmark's GPU memory figures in `summary.json`. Bytes are summed over every GPU the
/// sampler sees on the node (a model sharded over several GPUs uses all of them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VramStats {
    /// Highest sum of used bytes over all GPUs at one sample.
    pub peak_used_bytes: u64,
    /// Sum of the GPUs' total bytes.
    pub total_bytes: u64,
    /// Highest used / total of any one GPU at one sample, percent (what `vram_pct` gates).
    pub peak_used_pct: f64,
    /// Output tokens per second per GB (10^9 bytes) of peak used VRAM: how much generation a
    /// gigabyte buys at this concurrency. `None` with no output or no memory in use.
    pub efficiency_tok_s_per_gb: Option<f64>,
    /// Samples the peak was taken over.
    pub samples: u64,
}

/// The `gpu` section of `summary.json`: whether GPU figures exist and, if not, why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuRunStatus {
    /// `on`, `off`, `disabled`, `discovering`.
    pub mode: Mode,
    pub reason: Option<String>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Peak {
    used: u64,
    total: u64,
    pct: f64,
    samples: u64,
}

impl Peak {
    fn add(&mut self, snap: &Snapshot) {
        let mut used = 0u64;
        let mut total = 0u64;
        let mut seen = false;
        for s in snap
            .devices
            .iter()
            .filter(|d| !d.lost)
            .filter_map(|d| d.sample.as_ref())
        {
            let (Some(u), Some(t)) = (s.memory_used, s.memory_total) else {
                continue;
            };
            seen = true;
            used = used.saturating_add(u);
            total = total.saturating_add(t);
            if let Some(f) = s.memory_utilization() {
                self.pct = self.pct.max(f * 100.0);
            }
        }
        if seen {
            self.used = self.used.max(used);
            self.total = self.total.max(total);
            self.samples += 1;
        }
    }
}

/// One GPU sample of a benchmark, a line of `gpu_samples.jsonl`: the diagnosis's node-wide GPU
/// signals (names of [`crate::diagnosis::signal::Signal`]: `gpu_sm_clock` Hz, `gpu_throttle`
/// 0/1, `gpu_memory_utilization` 0..1, `gpu_foreign_processes`, `gpu_fault` new faults since the
/// previous sample) at `t_ms` from the benchmark's start, as `requests.jsonl`'s offsets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSampleRow {
    pub schema_version: u32,
    pub benchmark: String,
    pub t_ms: f64,
    pub signals: BTreeMap<String, f64>,
}

/// The file of [`GpuSampleRow`]s in a run directory (absent without GPU samples).
pub const GPU_SAMPLES_FILE: &str = "gpu_samples.jsonl";

/// Writes `gpu_samples.jsonl` into `dir` (nothing when `rows` is empty).
///
/// # Errors
/// The file cannot be written.
pub fn write_samples(dir: &std::path::Path, rows: &[GpuSampleRow]) -> std::io::Result<()> {
    super::write_jsonl(&dir.join(GPU_SAMPLES_FILE), rows)
}

/// Snapshots kept for `gpu_samples.jsonl` at most (5 a second: over 2 days of benchmarks).
const MAX_GPU_ROWS: usize = 1 << 20;

/// Snapshots taken since the benchmark started, as (time, signals).
type Pending = Vec<(SystemTime, BTreeMap<String, f64>)>;

/// The run's GPU memory watch: the sampler thread and a poller that keeps the peak since the
/// last [`VramWatch::reset`] and the samples for `gpu_samples.jsonl`.
pub struct VramWatch {
    state: Arc<GpuState>,
    monitor: Option<GpuMonitor>,
    peak: Arc<Mutex<Peak>>,
    poll: Option<tokio::task::JoinHandle<()>>,
    /// The benchmark's start (its [`VramWatch::reset`]) and the snapshots since.
    pending: Arc<Mutex<(Option<SystemTime>, Pending)>>,
    rows: Mutex<Vec<GpuSampleRow>>,
}

fn lock(p: &Mutex<Peak>) -> MutexGuard<'_, Peak> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl VramWatch {
    /// Starts watching from `source`. Never fails the run: without a driver the watch reports
    /// no figures and [`VramWatch::status`] says why.
    pub fn start(source: &GpuSource) -> Self {
        let state = Arc::new(GpuState::new(
            RUN_GPU_INTERVAL,
            if matches!(source, GpuSource::Off) {
                Mode::Disabled
            } else {
                Mode::Starting
            },
        ));
        let spawned = match source {
            GpuSource::Off => {
                state.set_mode(Mode::Disabled, Some("--gpu off".into()));
                None
            }
            GpuSource::Nvml => Some(sampler::spawn(
                crate::gpu::nvml::NvmlBackend::new(None),
                state.clone(),
                sampler::DEFAULT_REDISCOVER,
            )),
            GpuSource::NvmlAt(p) => Some(sampler::spawn(
                crate::gpu::nvml::NvmlBackend::new(Some(p.clone().into_os_string())),
                state.clone(),
                sampler::DEFAULT_REDISCOVER,
            )),
            GpuSource::Fake(h) => Some(sampler::spawn(
                h.backend(),
                state.clone(),
                sampler::DEFAULT_REDISCOVER,
            )),
        };
        let monitor = match spawned {
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                state.set_mode(
                    Mode::Off,
                    Some(format!("cannot start the GPU sampling thread: {e}")),
                );
                None
            }
            None => None,
        };
        let peak = Arc::new(Mutex::new(Peak::default()));
        let pending: Arc<Mutex<(Option<SystemTime>, Pending)>> =
            Arc::new(Mutex::new((None, Vec::new())));
        let poll = monitor.as_ref().map(|_| {
            let (state, peak, pending) = (state.clone(), peak.clone(), pending.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(RUN_GPU_INTERVAL / 2);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut last_at = None;
                let mut faults_before = None;
                loop {
                    tick.tick().await;
                    let snap = state.latest();
                    if let Some(at) = snap.at
                        && snap.at != last_at
                    {
                        last_at = snap.at;
                        lock(&peak).add(&snap);
                        let (signals, faults) = crate::diagnosis_live::gpu_signals(&snap);
                        let mut row: BTreeMap<String, f64> = signals
                            .into_iter()
                            .map(|(s, v)| (s.as_str().to_owned(), v))
                            .collect();
                        let new_faults = faults_before.map_or(0, |b: u64| faults.saturating_sub(b));
                        faults_before = Some(faults);
                        row.insert(
                            crate::diagnosis::signal::Signal::GpuFault
                                .as_str()
                                .to_owned(),
                            new_faults as f64,
                        );
                        let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
                        if p.0.is_some() && p.1.len() < MAX_GPU_ROWS {
                            p.1.push((at, row));
                        }
                    }
                }
            })
        });
        Self {
            state,
            monitor,
            peak,
            poll,
            pending,
            rows: Mutex::new(Vec::new()),
        }
    }

    /// Moves the snapshots since the benchmark's start into `benchmark`'s rows of
    /// `gpu_samples.jsonl`, and ends the benchmark's sampling.
    pub fn take_samples(&self, benchmark: &str) {
        let (start, taken) = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            (p.0.take(), std::mem::take(&mut p.1))
        };
        let Some(start) = start else { return };
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        for (at, signals) in taken {
            let t_ms = at.duration_since(start).unwrap_or_default().as_secs_f64() * 1000.0;
            if rows.len() < MAX_GPU_ROWS {
                rows.push(GpuSampleRow {
                    schema_version: 1,
                    benchmark: benchmark.to_owned(),
                    t_ms,
                    signals,
                });
            }
        }
    }

    /// The rows of `gpu_samples.jsonl` so far.
    pub fn rows(&self) -> Vec<GpuSampleRow> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Starts a new peak (a benchmark's first send), seeded with the latest sample.
    pub fn reset(&self) {
        let mut p = lock(&self.peak);
        *p = Peak::default();
        p.add(&self.state.latest());
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        *pending = (Some(SystemTime::now()), Vec::new());
    }

    /// The peak since [`VramWatch::reset`], with the efficiency for `output_tok_s` output
    /// tokens per second; `None` when no sample with memory figures was taken.
    pub fn take(&self, output_tok_s: f64) -> Option<VramStats> {
        let mut p = *lock(&self.peak);
        // The latest sample too: a benchmark shorter than the poll period still gets one.
        p.add(&self.state.latest());
        (p.samples > 0).then(|| VramStats {
            peak_used_bytes: p.used,
            total_bytes: p.total,
            peak_used_pct: p.pct,
            efficiency_tok_s_per_gb: (p.used > 0 && output_tok_s > 0.0)
                .then(|| output_tok_s / (p.used as f64 / 1e9)),
            samples: p.samples,
        })
    }

    /// Whether GPU figures exist, and why not.
    pub fn status(&self) -> GpuRunStatus {
        let s = self.state.status();
        GpuRunStatus {
            mode: s.mode,
            reason: s.reason,
        }
    }

    /// Stops the sampler thread.
    pub fn stop(mut self) {
        if let Some(p) = self.poll.take() {
            p.abort();
        }
        if let Some(m) = self.monitor.take() {
            m.stop(Duration::from_secs(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeHandle;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn peak_follows_the_fake_gpus_and_resets() {
        let fake = FakeHandle::with_gpus(2);
        let watch = VramWatch::start(&GpuSource::Fake(fake.clone()));
        // The fake H200s start at 71 GiB of 141 GiB each.
        tokio::time::sleep(Duration::from_millis(500)).await;
        watch.reset();
        fake.lock().devices[1].memory.used = 135 << 30;
        tokio::time::sleep(Duration::from_millis(600)).await;
        fake.lock().devices[1].memory.used = 80 << 30;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let s = watch.take(1000.0).expect("samples were taken");
        assert_eq!(s.peak_used_bytes, (71u64 << 30) + (135u64 << 30));
        assert_eq!(s.total_bytes, 2 * (141u64 << 30));
        assert!(
            (s.peak_used_pct - 135.0 / 141.0 * 100.0).abs() < 1e-9,
            "{}",
            s.peak_used_pct
        );
        let eff = s.efficiency_tok_s_per_gb.expect("efficiency");
        assert!((eff - 1000.0 / (s.peak_used_bytes as f64 / 1e9)).abs() < 1e-9);
        assert!(s.samples >= 3, "{} samples", s.samples);
        assert_eq!(watch.status().mode, Mode::On);
        // A new benchmark starts from the current memory, not the old peak.
        watch.reset();
        let s = watch.take(0.0).expect("the latest sample");
        assert_eq!(s.peak_used_bytes, (71u64 << 30) + (80u64 << 30));
        assert_eq!(s.efficiency_tok_s_per_gb, None);
        watch.stop();
    }

    #[tokio::test]
    async fn no_driver_gives_no_figures_and_says_why() {
        let watch = VramWatch::start(&GpuSource::NvmlAt("/nonexistent/libnvidia-ml.so.1".into()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        watch.reset();
        assert_eq!(watch.take(10.0), None);
        let st = watch.status();
        assert_ne!(st.mode, Mode::On);
        assert!(st.reason.is_some_and(|r| !r.is_empty()));
        watch.stop();
        let off = VramWatch::start(&GpuSource::Off);
        assert_eq!(off.status().mode, Mode::Disabled);
        assert_eq!(off.take(1.0), None);
    }
}
