//! The real backend: NVML through `nvml-wrapper`, which loads `libnvidia-ml.so.1` at run
//! time (`dlopen`), so the agent builds and starts on machines without an NVIDIA driver.
//!
//! XID events come from an NVML event set waited on by a small thread per initialization
//! (`lmperf-gpu-xid`, 500 ms waits), which queues them for [`GpuBackend::poll_xids`].

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

use super::backend::*;

/// XIDs queued between two polls at most; more are dropped (the counter undercounts).
const XID_QUEUE: usize = 256;

/// NVML's error, reduced to what the sampler acts on.
pub fn map_err(e: NvmlError) -> GpuError {
    match e {
        NvmlError::LibloadingError(e) => GpuError::NoLibrary(e.to_string()),
        // One function missing from an old driver: that field is absent, the function named.
        NvmlError::FailedToLoadSymbol(why) => GpuError::MissingFunction(missing_symbol(&why)),
        NvmlError::NotSupported | NvmlError::FunctionNotFound => GpuError::NotSupported,
        NvmlError::NotFound => GpuError::NotFound,
        NvmlError::GpuLost => GpuError::GpuLost,
        // nvml-wrapper's text for this one blames the caller ("not first initialized with
        // `Nvml::init()`"); after a successful init it means the driver went away or reloaded.
        NvmlError::Uninitialized => GpuError::Driver(
            "NVML answered UNINITIALIZED (the driver went away or was reloaded)".into(),
        ),
        e @ (NvmlError::DriverNotLoaded
        | NvmlError::LibraryNotFound
        | NvmlError::LibRmVersionMismatch) => GpuError::Driver(e.to_string()),
        e => GpuError::Other(e.to_string()),
    }
}

/// The function name in libloading's `dlsym` message (`…: undefined symbol: nvmlX`), else
/// the message.
fn missing_symbol(why: &str) -> String {
    why.rsplit_once("undefined symbol: ")
        .map_or(why, |(_, s)| s.trim())
        .to_owned()
}

/// `nvmlDeviceGetCurrentClocksThrottleReasons`, or its successor
/// `nvmlDeviceGetCurrentClocksEventReasons` (same bits) on a driver that dropped the old name:
/// nvml-wrapper 0.13 calls only the old one.
fn throttle_reasons(dev: &nvml_wrapper::Device<'_>) -> Result<u64, NvmlError> {
    match dev.current_throttle_reasons() {
        Ok(r) => Ok(r.bits()),
        Err(NvmlError::FailedToLoadSymbol(why)) => {
            let Ok(f) = dev
                .nvml()
                .lib()
                .nvmlDeviceGetCurrentClocksEventReasons
                .as_ref()
            else {
                return Err(NvmlError::FailedToLoadSymbol(why));
            };
            let mut bits: u64 = 0;
            // SAFETY: the handle is valid while `dev` borrows its `Nvml`; `bits` outlives the call.
            nvml_wrapper::error::nvml_try(unsafe { f(dev.handle(), &raw mut bits) })?;
            Ok(bits)
        }
        Err(e) => Err(e),
    }
}

/// `nvmlMemory_t` (nvml.h), for `nvmlDeviceGetMemoryInfo` on drivers without `_v2`.
#[repr(C)]
#[derive(Default)]
struct MemoryV1 {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlDeviceGetMemoryInfo_v2`, or the v1 call where the library has no `_v2` (drivers
/// before R510): nvml-wrapper 0.13 calls only `_v2`, which would lose VRAM on those nodes.
fn memory_info(dev: &nvml_wrapper::Device<'_>) -> Result<(u64, u64), NvmlError> {
    match dev.memory_info() {
        Ok(m) => Ok((m.used, m.total)),
        Err(NvmlError::FailedToLoadSymbol(why)) => {
            let Ok(v1) = dev.nvml().lib().nvmlDeviceGetMemoryInfo.as_ref() else {
                return Err(NvmlError::FailedToLoadSymbol(why));
            };
            let mut m = MemoryV1::default();
            // SAFETY: the handle is valid while `dev` borrows its `Nvml`; `m` has
            // nvmlMemory_t's layout (three unsigned long long) and outlives the call.
            nvml_wrapper::error::nvml_try(unsafe { v1(dev.handle(), (&raw mut m).cast()) })?;
            Ok((m.used, m.total))
        }
        Err(e) => Err(e),
    }
}

/// XIDs waiting for [`GpuBackend::poll_xids`]. One queue for the backend's life: the thread
/// of an old initialization may still deliver an event after a rediscovery started a new one.
#[derive(Debug, Default)]
struct XidQueue {
    events: Mutex<Vec<XidEvent>>,
}

/// [`GpuBackend`] over NVML.
#[derive(Debug)]
pub struct NvmlBackend {
    lib_path: Option<OsString>,
    nvml: Option<Arc<Nvml>>,
    xids: Arc<XidQueue>,
    /// Stops the XID thread of the current initialization.
    xid_stop: Option<Arc<AtomicBool>>,
}

impl NvmlBackend {
    /// A backend loading `lib_path`, or `libnvidia-ml.so.1` from the loader's path.
    pub fn new(lib_path: Option<OsString>) -> Self {
        Self {
            lib_path,
            nvml: None,
            xids: Arc::default(),
            xid_stop: None,
        }
    }

    fn nvml(&self) -> Result<&Nvml, GpuError> {
        self.nvml
            .as_deref()
            .ok_or_else(|| GpuError::Driver("NVML not initialized".into()))
    }

    fn with<T>(
        &self,
        d: DeviceRef,
        f: impl FnOnce(&nvml_wrapper::Device<'_>) -> Result<T, NvmlError>,
    ) -> Result<T, GpuError> {
        let nvml = self.nvml()?;
        let dev = nvml.device_by_index(d.index).map_err(map_err)?;
        match d.mig_index {
            None => f(&dev).map_err(map_err),
            Some(m) => {
                let mig = dev.mig_device_by_index(m).map_err(map_err)?;
                f(&mig).map_err(map_err)
            }
        }
    }
}

/// One event set with every GPU that takes XID events, and each registered handle's UUID,
/// read now: a GPU that raises XID 79 (fallen off the bus) no longer answers its UUID. `None`
/// when no GPU registers.
fn register_xids(nvml: &Nvml) -> Option<(nvml_wrapper::event::EventSet<'_>, Vec<(usize, String)>)> {
    let mut candidates: Vec<u32> = (0..nvml.device_count().ok()?).collect();
    'retry: loop {
        let mut set = nvml.create_event_set().ok()?;
        let mut uuids = Vec::new();
        for k in 0..candidates.len() {
            let Ok(dev) = nvml.device_by_index(candidates[k]) else {
                candidates.remove(k);
                continue 'retry;
            };
            // SAFETY: the handle is only kept to compare with events' handles.
            let handle = unsafe { dev.handle() } as usize;
            let uuid = dev.uuid().unwrap_or_default();
            match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => {
                    set = s;
                    uuids.push((handle, uuid));
                }
                // nvml-wrapper frees the whole set when one registration fails, the GPUs
                // registered before with it: start over without this GPU.
                Err(_) => {
                    candidates.remove(k);
                    continue 'retry;
                }
            }
        }
        return (!uuids.is_empty()).then_some((set, uuids));
    }
}

fn start_xid_thread(nvml: Arc<Nvml>, q: Arc<XidQueue>, stop: Arc<AtomicBool>) {
    // nvml-wrapper frees an event set in `Drop` with `expect`: without nvmlEventSetFree that
    // would panic, so no event set is made.
    if let Err(e) = nvml.lib().nvmlEventSetFree.as_ref() {
        tracing::warn!(error = %e, "The NVML library has no nvmlEventSetFree; XID events are not counted.");
        return;
    }
    let spawned = std::thread::Builder::new().name("lmperf-gpu-xid".into()).spawn(move || {
        let Some((set, uuids)) = register_xids(&nvml) else {
            tracing::debug!("No GPU supports XID events; XID counting is off.");
            return;
        };
        let mut wait_failed = false;
        while !stop.load(Ordering::Relaxed) {
            match set.wait(500) {
                Ok(ev) => {
                    let code = match ev.event_data {
                        Some(XidError::Value(v)) => v,
                        _ => 0,
                    };
                    // SAFETY: the handle is only compared, never dereferenced.
                    let handle = unsafe { ev.device.handle() } as usize;
                    let known = uuids.iter().find(|(h, _)| *h == handle).map(|(_, u)| u.clone());
                    let uuid = known.or_else(|| ev.device.uuid().ok()).unwrap_or_default();
                    let mut g = q.events.lock().unwrap_or_else(|p| p.into_inner());
                    if g.len() < XID_QUEUE {
                        g.push(XidEvent { uuid, code });
                    }
                }
                Err(NvmlError::Timeout) => {}
                // A failed wait (a GPU lost, the driver gone, a transient error) would end XID
                // counting until the next rediscovery, which only a lost GPU brings: retry each
                // second instead; a rediscovery's shutdown stops this thread.
                Err(e) => {
                    if !wait_failed {
                        tracing::warn!(error = %e, "Waiting for XID events failed; retrying every second.");
                        wait_failed = true;
                    }
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "Cannot start the XID event thread; XID events are not counted.");
    }
}

impl GpuBackend for NvmlBackend {
    fn init(&mut self) -> Result<String, GpuError> {
        let mut b = Nvml::builder();
        if let Some(p) = &self.lib_path {
            b.lib_path(p);
        }
        let nvml = b.init().map_err(map_err)?;
        // nvml-wrapper's `Drop` calls nvmlShutdown with `expect`: a library without it would
        // panic the sampler thread at the first rediscovery. Refuse it (and never drop it).
        if let Err(e) = nvml.lib().nvmlShutdown.as_ref() {
            let why = format!(
                "{} is not a usable NVML library: it has no nvmlShutdown ({e})",
                self.lib_path
                    .as_deref()
                    .unwrap_or("libnvidia-ml.so.1".as_ref())
                    .to_string_lossy()
            );
            std::mem::forget(nvml);
            return Err(GpuError::NoLibrary(why));
        }
        let nvml = Arc::new(nvml);
        let version = nvml.sys_driver_version().map_err(map_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        start_xid_thread(nvml.clone(), self.xids.clone(), stop.clone());
        self.nvml = Some(nvml);
        self.xid_stop = Some(stop);
        Ok(version)
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.xid_stop.take() {
            stop.store(true, Ordering::Relaxed);
        }
        // nvmlShutdown runs when the XID thread also lets go (≤ 500 ms).
        self.nvml = None;
    }

    fn device_count(&mut self) -> Result<u32, GpuError> {
        self.nvml()?.device_count().map_err(map_err)
    }

    fn devices_at(&mut self, index: u32) -> Result<Vec<DeviceInfo>, GpuError> {
        let nvml = self.nvml()?;
        let dev = nvml.device_by_index(index).map_err(map_err)?;
        let uuid = dev.uuid().map_err(map_err)?;
        let name = dev.name().map_err(map_err)?;
        let pci_bus_id = dev.pci_info().map(|p| p.bus_id).unwrap_or_default();
        let mig_enabled = dev.mig_mode().ok().map(|m| m.current == 1);
        let mut out = vec![DeviceInfo {
            index,
            uuid: uuid.clone(),
            name,
            pci_bus_id: pci_bus_id.clone(),
            mig_enabled,
            mig: None,
        }];
        if mig_enabled == Some(true) {
            let n = dev.mig_device_count().map_err(map_err)?;
            for m in 0..n {
                // Slots without an instance answer NOT_FOUND.
                let Ok(mig) = dev.mig_device_by_index(m) else {
                    continue;
                };
                let Ok(mig_uuid) = mig.uuid() else { continue };
                let mig_name = mig.name().unwrap_or_default();
                let profile = mig_name
                    .split_once("MIG ")
                    .map_or_else(|| mig_name.clone(), |(_, p)| p.trim().to_owned());
                out.push(DeviceInfo {
                    index,
                    uuid: mig_uuid,
                    name: mig_name,
                    pci_bus_id: pci_bus_id.clone(),
                    mig_enabled: None,
                    mig: Some(MigInstance {
                        profile,
                        parent_uuid: uuid.clone(),
                        mig_index: m,
                    }),
                });
            }
        }
        Ok(out)
    }

    fn utilization(&mut self, d: DeviceRef) -> Result<Utilization, GpuError> {
        self.with(d, |x| x.utilization_rates())
            .map(|u| Utilization {
                gpu_pct: u.gpu,
                memory_pct: u.memory,
            })
    }
    fn memory(&mut self, d: DeviceRef) -> Result<MemoryInfo, GpuError> {
        self.with(d, memory_info)
            .map(|(used, total)| MemoryInfo { used, total })
    }
    fn power_mw(&mut self, d: DeviceRef) -> Result<u32, GpuError> {
        self.with(d, |x| x.power_usage())
    }
    fn power_limit_mw(&mut self, d: DeviceRef) -> Result<u32, GpuError> {
        self.with(d, |x| x.enforced_power_limit())
    }
    fn energy_mj(&mut self, d: DeviceRef) -> Result<u64, GpuError> {
        self.with(d, |x| x.total_energy_consumption())
    }
    fn temperature_c(&mut self, d: DeviceRef) -> Result<u32, GpuError> {
        self.with(d, |x| x.temperature(TemperatureSensor::Gpu))
    }
    fn clock_mhz(&mut self, d: DeviceRef, kind: ClockKind) -> Result<u32, GpuError> {
        let c = match kind {
            ClockKind::Sm => Clock::SM,
            ClockKind::Memory => Clock::Memory,
        };
        self.with(d, |x| x.clock_info(c))
    }
    fn throttle_reasons(&mut self, d: DeviceRef) -> Result<u64, GpuError> {
        self.with(d, throttle_reasons)
    }
    fn pcie_kb_per_s(&mut self, d: DeviceRef, dir: PcieDirection) -> Result<u32, GpuError> {
        let c = match dir {
            PcieDirection::Transmit => PcieUtilCounter::Send,
            PcieDirection::Receive => PcieUtilCounter::Receive,
        };
        self.with(d, |x| x.pcie_throughput(c))
    }
    fn pcie_replays(&mut self, d: DeviceRef) -> Result<u64, GpuError> {
        self.with(d, |x| x.pcie_replay_counter()).map(u64::from)
    }
    fn ecc_errors(&mut self, d: DeviceRef, kind: EccKind) -> Result<u64, GpuError> {
        let k = match kind {
            EccKind::Corrected => MemoryError::Corrected,
            EccKind::Uncorrected => MemoryError::Uncorrected,
        };
        self.with(d, |x| x.total_ecc_errors(k, EccCounter::Volatile))
    }
    fn processes(&mut self, d: DeviceRef) -> Result<Vec<GpuProcess>, GpuError> {
        self.with(d, |x| x.running_compute_processes()).map(|v| {
            v.into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect()
        })
    }
    fn process_utilization(
        &mut self,
        d: DeviceRef,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessUtilization>, GpuError> {
        self.with(d, |x| x.process_utilization_stats(last_seen_us))
            .map(|v| {
                v.into_iter()
                    .map(|s| ProcessUtilization {
                        pid: s.pid,
                        timestamp_us: s.timestamp,
                        sm_pct: s.sm_util,
                        memory_pct: s.mem_util,
                    })
                    .collect()
            })
    }
    fn poll_xids(&mut self) -> Result<Vec<XidEvent>, GpuError> {
        Ok(std::mem::take(
            &mut *self.xids.events.lock().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        self.shutdown();
    }
}
