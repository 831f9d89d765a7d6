//! The sampling loop: discovery, one tick per interval, faults.
//!
//! Each tick reads every field of every tracked device. A field that answers
//! `NOT_SUPPORTED` is absent from the sample (never 0) and is warned about once per device
//! and field; `NOT_FOUND` is an empty answer; `GPU_IS_LOST` marks the device lost (its
//! series stop, an event is logged and published) and discovery is retried every
//! `rediscover` until it comes back, without a restart. A driver that goes away (calls
//! answering uninitialized / driver not loaded) loses every device the same way. No NVML
//! library at all turns GPU monitoring off for the agent's life, logged once.
//!
//! [`spawn`] runs the loop on its own OS thread: NVML calls block, and a slow one delays
//! only the next GPU sample, never a canary.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use super::backend::*;
use super::procs::{self, ProcInfo};
use super::state::{DeviceEntry, DeviceSample, GpuState, Mode, ProcessSample, Snapshot};

/// Field names, as warned about and listed in `/api/v1/status` `unsupported_fields`.
pub const FIELDS: &[&str] = &[
    "gpu.utilization",
    "gpu.memory_copy_utilization",
    "gpu.memory",
    "gpu.power",
    "gpu.power_limit",
    "gpu.energy",
    "gpu.temperature",
    "gpu.clock.sm",
    "gpu.clock.memory",
    "gpu.throttle",
    "gpu.pcie.throughput",
    "gpu.pcie.replays",
    "gpu.ecc",
    "gpu.processes",
    "gpu.process.utilization",
];

/// How long a process's last SM utilization sample stands in for a tick that got none: NVML
/// samples processes on its own period (hundreds of ms), so a short `gpu.interval` often falls
/// between two samples (`NOT_FOUND`), which would make the series flicker.
pub const PROCESS_UTILIZATION_HOLD: Duration = Duration::from_secs(3);

/// Default gap between discovery attempts while the driver is unusable or a GPU is lost.
pub const DEFAULT_REDISCOVER: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Tracked {
    info: DeviceInfo,
    dref: DeviceRef,
    lost: bool,
    unsupported: Vec<&'static str>,
    /// `last_seen_us` for the next process utilization call.
    last_seen_us: u64,
    /// Each process's newest SM utilization sample: (its timestamp, µs since the epoch; percent).
    last_sm: HashMap<u32, (u64, u32)>,
    pcie_tx: f64,
    pcie_rx: f64,
    /// When the PCIe throughput was last read: the next reading counts for the time since
    /// (a slow or hung tick, skipped ticks), not for one interval.
    pcie_at: Option<Instant>,
    sample: Option<DeviceSample>,
}

/// Why sampling a device stopped.
enum Stop {
    Lost,
    Driver(String),
}

/// The sampler; [`Sampler::tick`] is one sampling step (tests and the benchmark drive it
/// directly with their own clock).
pub struct Sampler<B: GpuBackend> {
    backend: B,
    state: Arc<GpuState>,
    interval: Duration,
    rediscover: Duration,
    initialized: bool,
    driver_version: String,
    devices: Vec<Tracked>,
    /// (hw.id, field) pairs already warned about.
    warned: HashSet<(String, &'static str)>,
    /// Field warnings logged.
    warnings: u64,
    /// Discovery due at this time (`None`: not needed).
    discover_at: Option<Instant>,
    /// A discovery failure was already logged in this streak.
    discovery_warned: bool,
    xid_counts: BTreeMap<(String, u64), u64>,
    lost_total: u64,
    /// NVML indexes that answered `GPU_IS_LOST` at the last discovery (never identified, so
    /// not tracked): discovery is retried while there are any.
    skipped_lost: BTreeSet<u32>,
    /// Per pid: what `/proc` says and whether it serves a target's port (read once per pid,
    /// again when the ports change).
    procs: HashMap<u32, (ProcInfo, bool)>,
    /// The target ports the cache was read with.
    server_ports: Vec<u16>,
    proc_root: PathBuf,
}

/// Microseconds since the Unix epoch.
fn unix_us(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl<B: GpuBackend> Sampler<B> {
    /// A sampler publishing to `state`, first discovery at the first tick.
    pub fn new(backend: B, state: Arc<GpuState>, rediscover: Duration) -> Self {
        let interval = state.interval();
        Self {
            backend,
            state,
            interval,
            rediscover,
            initialized: false,
            driver_version: String::new(),
            devices: Vec::new(),
            warned: HashSet::new(),
            warnings: 0,
            discover_at: Some(Instant::now()),
            discovery_warned: false,
            xid_counts: BTreeMap::new(),
            lost_total: 0,
            skipped_lost: BTreeSet::new(),
            procs: HashMap::new(),
            server_ports: Vec::new(),
            proc_root: PathBuf::from("/proc"),
        }
    }

    /// Reads processes from `root` instead of `/proc` (tests).
    pub fn with_proc_root(mut self, root: PathBuf) -> Self {
        self.proc_root = root;
        self
    }

    /// The (hw.id, field) pairs warned about as unsupported or failing, sorted.
    pub fn warned(&self) -> Vec<(String, &'static str)> {
        let mut v: Vec<_> = self.warned.iter().cloned().collect();
        v.sort();
        v
    }

    /// Field warnings logged so far (each (hw.id, field) at most once).
    pub fn warnings(&self) -> u64 {
        self.warnings
    }

    /// The backend (tests inspect the fake).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// One step at monotonic `now` and wall time `wall`: discovery when due, then a sample of
    /// every tracked device, published to the state. Returns false once monitoring is off
    /// for good (no NVML library).
    pub fn tick(&mut self, now: Instant, wall: SystemTime) -> bool {
        if self.state.mode() == Mode::Off {
            return false;
        }
        let started = Instant::now();
        if self.discover_at.is_some_and(|at| now >= at) && !self.discover(now, wall) {
            return false;
        }
        if self.initialized {
            self.sample_all(now, wall);
        }
        let snap = Snapshot {
            at: Some(wall),
            driver_version: self.driver_version.clone(),
            devices: self
                .devices
                .iter()
                .map(|t| DeviceEntry {
                    info: t.info.clone(),
                    lost: t.lost,
                    unsupported: t.unsupported.clone(),
                    sample: t.sample.clone(),
                })
                .collect(),
            xid_counts: self.xid_counts.clone(),
            lost_total: self.lost_total,
        };
        self.state.publish(snap, started.elapsed());
        true
    }

    /// (Re)initializes the library and enumerates devices. False when there is no library.
    fn discover(&mut self, now: Instant, wall: SystemTime) -> bool {
        if self.initialized {
            self.backend.shutdown();
            self.initialized = false;
        }
        let found = match self.backend.init() {
            Err(GpuError::NoLibrary(why)) => {
                let reason = format!("no NVIDIA driver: {why}");
                tracing::info!(reason = %reason, "GPU metrics are off: the NVML library (libnvidia-ml.so.1) cannot be loaded; everything else works.");
                self.state.set_mode(Mode::Off, Some(reason));
                self.discover_at = None;
                return false;
            }
            Err(e) => Err(e),
            Ok(version) => {
                self.driver_version = version;
                self.enumerate()
            }
        };
        match found {
            Ok(found) => {
                self.initialized = true;
                self.discovery_warned = false;
                self.merge(found, wall);
                // A GPU lost before it was ever identified is retried too.
                let any_lost = self.devices.iter().any(|d| d.lost) || !self.skipped_lost.is_empty();
                self.discover_at = any_lost.then(|| now + self.rediscover);
                let on = self.devices.iter().filter(|d| !d.lost).count();
                if on > 0 {
                    self.state.set_mode(Mode::On, None);
                } else {
                    self.state.set_mode(
                        Mode::Discovering,
                        Some("no GPU found; retrying discovery".into()),
                    );
                    self.discover_at = Some(now + self.rediscover);
                }
            }
            Err(e) => {
                let reason = format!(
                    "NVML discovery failed: {e}; retrying every {}",
                    humantime::format_duration(self.rediscover)
                );
                if !self.discovery_warned {
                    tracing::warn!(error = %e, "GPU discovery failed; retrying.");
                    self.discovery_warned = true;
                }
                self.backend.shutdown();
                self.initialized = false;
                for d in &mut self.devices {
                    d.lost = true;
                    d.sample = None;
                }
                self.state.set_mode(Mode::Discovering, Some(reason));
                self.discover_at = Some(now + self.rediscover);
            }
        }
        true
    }

    fn enumerate(&mut self) -> Result<Vec<DeviceInfo>, GpuError> {
        let count = self.backend.device_count()?;
        let mut found = Vec::new();
        let mut skipped = BTreeSet::new();
        for i in 0..count {
            match self.backend.devices_at(i) {
                Ok(v) => found.extend(v),
                // A lost GPU is skipped: the others are monitored, it is retried (warned once
                // per streak: rediscovery runs every few seconds).
                Err(GpuError::GpuLost) => {
                    if !self.skipped_lost.contains(&i) {
                        tracing::warn!(index = i, "GPU is lost at discovery; retrying later.");
                    }
                    skipped.insert(i);
                }
                Err(e) => return Err(e),
            }
        }
        self.skipped_lost = skipped;
        Ok(found)
    }

    /// Replaces the tracked set with `found`, keeping lost devices that did not come back.
    fn merge(&mut self, found: Vec<DeviceInfo>, wall: SystemTime) {
        let mut old: HashMap<String, Tracked> = self
            .devices
            .drain(..)
            .map(|t| (t.info.uuid.clone(), t))
            .collect();
        for info in found {
            let dref = DeviceRef {
                index: info.index,
                mig_index: info.mig.as_ref().map(|m| m.mig_index),
            };
            match old.remove(&info.uuid) {
                Some(mut t) => {
                    if t.lost {
                        tracing::info!(hw_id = %info.uuid, index = info.index, "GPU recovered; its metrics resume.");
                        self.state.event(
                            wall,
                            "recovered",
                            Some(&info.uuid),
                            format!("GPU {} is back", info.index),
                        );
                    }
                    if t.lost {
                        // The time it was lost is not PCIe traffic.
                        t.pcie_at = None;
                    }
                    t.lost = false;
                    t.dref = dref;
                    t.info = info;
                    self.devices.push(t);
                }
                None => {
                    tracing::info!(hw_id = %info.uuid, name = %info.name, index = info.index, mig = ?info.mig.as_ref().map(|m| &m.profile), "GPU found.");
                    self.devices.push(Tracked {
                        info,
                        dref,
                        lost: false,
                        unsupported: Vec::new(),
                        last_seen_us: 0,
                        last_sm: HashMap::new(),
                        pcie_tx: 0.0,
                        pcie_rx: 0.0,
                        pcie_at: None,
                        sample: None,
                    });
                }
            }
        }
        // Lost devices not found again stay listed as lost.
        self.devices.extend(old.into_values().filter(|t| t.lost));
    }

    fn sample_all(&mut self, now: Instant, wall: SystemTime) {
        let mut pids_seen = HashSet::new();
        for i in 0..self.devices.len() {
            if self.devices[i].lost {
                continue;
            }
            match self.sample_one(i, now, wall, &mut pids_seen) {
                Ok(s) => self.devices[i].sample = Some(s),
                Err(Stop::Lost) => {
                    let d = &mut self.devices[i];
                    d.lost = true;
                    d.sample = None;
                    self.lost_total += 1;
                    tracing::warn!(hw_id = %d.info.uuid, index = d.info.index, "GPU is lost (GPU_IS_LOST): its metrics stop; retrying discovery.");
                    self.state.event(
                        wall,
                        "lost",
                        Some(&d.info.uuid),
                        format!("GPU {} answered GPU_IS_LOST", d.info.index),
                    );
                    self.discover_at.get_or_insert(now + self.rediscover);
                }
                Err(Stop::Driver(why)) => {
                    tracing::warn!(error = %why, "NVIDIA driver went away: every GPU's metrics stop; retrying discovery.");
                    self.state
                        .event(wall, "driver_unavailable", None, why.clone());
                    for d in &mut self.devices {
                        if !d.lost {
                            self.lost_total += 1;
                        }
                        d.lost = true;
                        d.sample = None;
                    }
                    self.state.set_mode(
                        Mode::Discovering,
                        Some(format!("NVIDIA driver unavailable: {why}")),
                    );
                    self.discover_at = Some(now + self.rediscover);
                    break;
                }
            }
        }
        self.procs.retain(|pid, _| pids_seen.contains(pid));
        match self.backend.poll_xids() {
            Ok(xids) if !xids.is_empty() => {
                let codes: Vec<(String, u64)> =
                    xids.iter().map(|x| (x.uuid.clone(), x.code)).collect();
                for x in xids {
                    tracing::warn!(hw_id = %x.uuid, xid = x.code, "GPU XID error.");
                    self.state
                        .event(wall, "xid", Some(&x.uuid), format!("XID {}", x.code));
                    *self.xid_counts.entry((x.uuid, x.code)).or_default() += 1;
                }
                self.state.xids(wall, &codes);
            }
            Ok(_) => {}
            Err(e) => self.warn_once("events", "xid", &e),
        }
    }

    fn warn_once(&mut self, hw_id: &str, field: &'static str, e: &GpuError) {
        if self.warned.insert((hw_id.to_owned(), field)) {
            self.warnings += 1;
            match e {
                GpuError::NotSupported => tracing::warn!(
                    hw_id,
                    field,
                    "GPU field not supported by this device; it is not exported (warned once)."
                ),
                GpuError::MissingFunction(f) => {
                    tracing::warn!(hw_id, field, function = %f, "The NVML library lacks the function for this GPU field (driver too old); it is not exported (warned once).")
                }
                _ => {
                    tracing::warn!(hw_id, field, error = %e, "Reading a GPU field failed; it is not exported while it fails (warned once).")
                }
            }
        }
    }

    /// A value, or `None` for a field NVML does not give; `Err` stops the device.
    fn field<T>(
        &mut self,
        i: usize,
        field: &'static str,
        r: Result<T, GpuError>,
    ) -> Result<Option<T>, Stop> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(GpuError::NotFound) => Ok(None),
            Err(GpuError::GpuLost) => Err(Stop::Lost),
            Err(GpuError::Driver(why) | GpuError::NoLibrary(why)) => Err(Stop::Driver(why)),
            Err(e) => {
                if matches!(e, GpuError::NotSupported | GpuError::MissingFunction(_))
                    && !self.devices[i].unsupported.contains(&field)
                {
                    self.devices[i].unsupported.push(field);
                }
                let id = self.devices[i].info.uuid.clone();
                self.warn_once(&id, field, &e);
                Ok(None)
            }
        }
    }

    fn sample_one(
        &mut self,
        i: usize,
        now: Instant,
        wall: SystemTime,
        pids_seen: &mut HashSet<u32>,
    ) -> Result<DeviceSample, Stop> {
        let d = self.devices[i].dref;
        let mut s = DeviceSample::default();
        let r = self.backend.utilization(d);
        if let Err(e @ (GpuError::NotSupported | GpuError::MissingFunction(_))) = &r {
            // One NVML call gives both; both are absent.
            self.field::<()>(i, "gpu.memory_copy_utilization", Err(e.clone()))?;
        }
        if let Some(u) = self.field(i, "gpu.utilization", r)? {
            s.utilization = Some(f64::from(u.gpu_pct.min(100)) / 100.0);
            s.memory_copy_utilization = Some(f64::from(u.memory_pct.min(100)) / 100.0);
        }
        let r = self.backend.memory(d);
        if let Some(m) = self.field(i, "gpu.memory", r)? {
            s.memory_used = Some(m.used);
            s.memory_total = Some(m.total);
        }
        let r = self.backend.power_mw(d);
        s.power_w = self
            .field(i, "gpu.power", r)?
            .map(|mw| f64::from(mw) / 1000.0);
        let r = self.backend.power_limit_mw(d);
        s.power_limit_w = self
            .field(i, "gpu.power_limit", r)?
            .map(|mw| f64::from(mw) / 1000.0);
        let r = self.backend.energy_mj(d);
        s.energy_j = self.field(i, "gpu.energy", r)?.map(|mj| mj as f64 / 1000.0);
        let r = self.backend.temperature_c(d);
        s.temperature_c = self.field(i, "gpu.temperature", r)?.map(f64::from);
        let r = self.backend.clock_mhz(d, ClockKind::Sm);
        s.sm_clock_hz = self
            .field(i, "gpu.clock.sm", r)?
            .map(|m| f64::from(m) * 1e6);
        let r = self.backend.clock_mhz(d, ClockKind::Memory);
        s.memory_clock_hz = self
            .field(i, "gpu.clock.memory", r)?
            .map(|m| f64::from(m) * 1e6);
        let r = self.backend.throttle_reasons(d);
        s.throttle = self.field(i, "gpu.throttle", r)?;
        let r = self.backend.pcie_kb_per_s(d, PcieDirection::Transmit);
        if let Some(tx) = self.field(i, "gpu.pcie.throughput", r)? {
            let r = self.backend.pcie_kb_per_s(d, PcieDirection::Receive);
            if let Some(rx) = self.field(i, "gpu.pcie.throughput", r)? {
                let t = &mut self.devices[i];
                let secs = t
                    .pcie_at
                    .map_or(self.interval, |at| now.saturating_duration_since(at))
                    .as_secs_f64();
                t.pcie_at = Some(now);
                t.pcie_tx += f64::from(tx) * 1024.0 * secs;
                t.pcie_rx += f64::from(rx) * 1024.0 * secs;
                s.pcie_tx_bytes = Some(t.pcie_tx as u64);
                s.pcie_rx_bytes = Some(t.pcie_rx as u64);
            }
        }
        let r = self.backend.pcie_replays(d);
        s.pcie_replays = self.field(i, "gpu.pcie.replays", r)?;
        let r = self.backend.ecc_errors(d, EccKind::Corrected);
        if let Some(c) = self.field(i, "gpu.ecc", r)? {
            let r = self.backend.ecc_errors(d, EccKind::Uncorrected);
            s.ecc_corrected = Some(c);
            s.ecc_uncorrected = self.field(i, "gpu.ecc", r)?;
        }
        let r = self.backend.processes(d);
        let procs = self.field(i, "gpu.processes", r)?.unwrap_or_default();
        // nvml-wrapper#56: on an idle GPU this answers NOT_FOUND; that is an empty sample.
        // The next call passes the time of this one, so it asks only for newer samples.
        let last_seen = self.devices[i].last_seen_us;
        let r = self.backend.process_utilization(d, last_seen);
        let utils = self
            .field(i, "gpu.process.utilization", r)?
            .unwrap_or_default();
        let newest = utils.iter().map(|u| u.timestamp_us).max().unwrap_or(0);
        self.devices[i].last_seen_us = newest.max(unix_us(wall)).max(last_seen);
        let mut sm: HashMap<u32, u32> = HashMap::new();
        for u in &utils {
            let e = sm.entry(u.pid).or_default();
            *e = (*e).max(u.sm_pct);
        }
        let now_us = unix_us(wall);
        let hold_us = PROCESS_UTILIZATION_HOLD.as_micros() as u64;
        let t = &mut self.devices[i];
        for (pid, pct) in &sm {
            let ts = utils
                .iter()
                .filter(|u| u.pid == *pid)
                .map(|u| u.timestamp_us)
                .max()
                .unwrap_or(now_us);
            t.last_sm.insert(*pid, (ts, *pct));
        }
        t.last_sm
            .retain(|pid, _| procs.iter().any(|p| p.pid == *pid));
        for (pid, (ts, pct)) in &t.last_sm {
            if now_us.saturating_sub(*ts) <= hold_us {
                sm.entry(*pid).or_insert(*pct);
            }
        }
        let ports = self.state.server_ports();
        if ports != self.server_ports {
            self.procs.clear();
            self.server_ports = ports;
        }
        for p in procs {
            pids_seen.insert(p.pid);
            let (root, ports) = (&self.proc_root, &self.server_ports);
            let (info, model_server) = self
                .procs
                .entry(p.pid)
                .or_insert_with(|| {
                    (
                        procs::read(root, p.pid),
                        procs::serves_port(root, p.pid, ports).is_some(),
                    )
                })
                .clone();
            s.processes.push(ProcessSample {
                pid: p.pid,
                used_bytes: p.used_bytes,
                sm_utilization: sm.get(&p.pid).map(|v| f64::from((*v).min(100)) / 100.0),
                executable: info.executable,
                command: info.command,
                container_id: info.container_id,
                model_server,
            });
        }
        Ok(s)
    }
}

/// The running sampler thread; dropping it (or [`GpuMonitor::stop`]) stops the loop.
#[derive(Debug)]
pub struct GpuMonitor {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GpuMonitor {
    /// A monitor that runs nothing (GPU monitoring disabled).
    pub fn none() -> Self {
        Self {
            stop: None,
            thread: None,
        }
    }

    /// Stops the loop and waits up to `timeout` for the thread (an NVML call in progress is
    /// not interrupted; the thread is then left to end on its own).
    pub fn stop(mut self, timeout: Duration) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + timeout;
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Starts sampling with `backend` every `state.interval()` on a thread named `lmperf-gpu`.
///
/// # Errors
/// When the OS cannot start a thread.
pub fn spawn<B: GpuBackend + 'static>(
    backend: B,
    state: Arc<GpuState>,
    rediscover: Duration,
) -> std::io::Result<GpuMonitor> {
    let (tx, rx) = mpsc::channel::<()>();
    let interval = state.interval();
    let thread = std::thread::Builder::new()
        .name("lmperf-gpu".into())
        .spawn(move || {
            let mut sampler = Sampler::new(backend, state, rediscover);
            let mut next = Instant::now();
            loop {
                if !sampler.tick(Instant::now(), SystemTime::now()) {
                    break;
                }
                // Absolute schedule; after a slow tick, skip the missed ones rather than bunch up.
                next += interval;
                let now = Instant::now();
                if next <= now {
                    next = now + interval;
                }
                match rx.recv_timeout(next - now) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            sampler.backend.shutdown();
        })?;
    Ok(GpuMonitor {
        stop: Some(tx),
        thread: Some(thread),
    })
}
