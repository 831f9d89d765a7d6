//! A scripted NVML for tests and the sampling benchmark: devices with fixed values, and
//! switches for each fault (no library, a field `NOT_SUPPORTED`, process utilization
//! `NOT_FOUND`, a GPU lost, a driver reload). A [`FakeHandle`] changes the script while the
//! sampler runs.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use super::backend::*;

/// One scripted GPU (or MIG instance).
#[derive(Debug, Clone)]
pub struct FakeDevice {
    pub info: DeviceInfo,
    pub utilization: Utilization,
    pub memory: MemoryInfo,
    pub power_mw: u32,
    pub power_limit_mw: u32,
    pub energy_mj: u64,
    pub temperature_c: u32,
    pub sm_clock_mhz: u32,
    pub mem_clock_mhz: u32,
    pub throttle: u64,
    pub pcie_tx_kb_s: u32,
    pub pcie_rx_kb_s: u32,
    pub pcie_replays: u64,
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
    pub processes: Vec<GpuProcess>,
    /// Process utilization samples; empty means NVML answers `NOT_FOUND` (what a real idle
    /// GPU does, nvml-wrapper#56).
    pub process_utilization: Vec<ProcessUtilization>,
    /// Field names (as in [`super::sampler::FIELDS`]) that answer `NOT_SUPPORTED`.
    pub unsupported: HashSet<&'static str>,
}

impl FakeDevice {
    /// A busy H200-like GPU with index `index`.
    pub fn h200(index: u32) -> Self {
        Self {
            info: DeviceInfo {
                index,
                uuid: format!("GPU-00000000-0000-0000-0000-00000000000{index}"),
                name: "NVIDIA H200".into(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x17 + index),
                mig_enabled: Some(false),
                mig: None,
            },
            utilization: Utilization {
                gpu_pct: 87,
                memory_pct: 40,
            },
            memory: MemoryInfo {
                used: 71 << 30,
                total: 141 << 30,
            },
            power_mw: 512_000,
            power_limit_mw: 700_000,
            energy_mj: 1_000_000,
            temperature_c: 61,
            sm_clock_mhz: 1980,
            mem_clock_mhz: 2619,
            throttle: 0,
            pcie_tx_kb_s: 1000,
            pcie_rx_kb_s: 2000,
            pcie_replays: 0,
            ecc_corrected: 0,
            ecc_uncorrected: 0,
            processes: Vec::new(),
            process_utilization: Vec::new(),
            unsupported: HashSet::new(),
        }
    }
}

/// The whole script.
#[derive(Debug, Default)]
pub struct FakeNvml {
    /// `Some(reason)`: `init` fails as if `libnvidia-ml.so.1` were missing.
    pub no_library: Option<String>,
    /// Every call fails with a driver error while set (a driver being reloaded).
    pub driver_down: bool,
    pub driver_version: String,
    /// Physical GPUs, each followed by its MIG instances (`info.mig` set).
    pub devices: Vec<FakeDevice>,
    /// UUIDs whose calls answer `GPU_IS_LOST`.
    pub lost: HashSet<String>,
    /// XIDs delivered at the next poll.
    pub pending_xids: Vec<XidEvent>,
    /// Every `last_seen_us` passed to `process_utilization`, in call order.
    pub process_util_calls: Vec<u64>,
    /// Calls of `init`.
    pub inits: u32,
    initialized: bool,
}

/// Shared access to a [`FakeNvml`] script.
#[derive(Debug, Clone, Default)]
pub struct FakeHandle(Arc<Mutex<FakeNvml>>);

impl FakeHandle {
    /// A script with `n` H200-like GPUs and driver `550.54.14`.
    pub fn with_gpus(n: u32) -> Self {
        let f = FakeNvml {
            driver_version: "550.54.14".into(),
            devices: (0..n).map(FakeDevice::h200).collect(),
            ..FakeNvml::default()
        };
        Self(Arc::new(Mutex::new(f)))
    }

    /// Locks the script (a poisoned lock is taken over: the fake is test-only state).
    pub fn lock(&self) -> MutexGuard<'_, FakeNvml> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A backend reading this script.
    pub fn backend(&self) -> FakeBackend {
        FakeBackend(self.clone())
    }
}

/// [`GpuBackend`] over a [`FakeHandle`].
#[derive(Debug, Clone)]
pub struct FakeBackend(pub FakeHandle);

impl FakeNvml {
    fn device(&self, d: DeviceRef, field: &'static str) -> Result<&FakeDevice, GpuError> {
        if self.driver_down {
            return Err(GpuError::Driver("Uninitialized".into()));
        }
        if !self.initialized {
            return Err(GpuError::Driver("NVML not initialized".into()));
        }
        let dev = self
            .devices
            .iter()
            .find(|f| {
                f.info.index == d.index && f.info.mig.as_ref().map(|m| m.mig_index) == d.mig_index
            })
            .ok_or_else(|| GpuError::Other(format!("no device {d:?}")))?;
        let physical = self
            .devices
            .iter()
            .find(|f| f.info.index == d.index && f.info.mig.is_none());
        if self.lost.contains(&dev.info.uuid)
            || physical.is_some_and(|p| self.lost.contains(&p.info.uuid))
        {
            return Err(GpuError::GpuLost);
        }
        if dev.unsupported.contains(field) {
            return Err(GpuError::NotSupported);
        }
        Ok(dev)
    }
}

impl GpuBackend for FakeBackend {
    fn init(&mut self) -> Result<String, GpuError> {
        let mut f = self.0.lock();
        f.inits += 1;
        if let Some(r) = &f.no_library {
            return Err(GpuError::NoLibrary(r.clone()));
        }
        if f.driver_down {
            return Err(GpuError::Driver("Driver Not Loaded".into()));
        }
        f.initialized = true;
        Ok(f.driver_version.clone())
    }
    fn shutdown(&mut self) {
        self.0.lock().initialized = false;
    }
    fn device_count(&mut self) -> Result<u32, GpuError> {
        let f = self.0.lock();
        if !f.initialized {
            return Err(GpuError::Driver("NVML not initialized".into()));
        }
        Ok(f.devices.iter().filter(|d| d.info.mig.is_none()).count() as u32)
    }
    fn devices_at(&mut self, index: u32) -> Result<Vec<DeviceInfo>, GpuError> {
        let f = self.0.lock();
        f.device(
            DeviceRef {
                index,
                mig_index: None,
            },
            "identity",
        )?;
        Ok(f.devices
            .iter()
            .filter(|d| d.info.index == index)
            .map(|d| d.info.clone())
            .collect())
    }
    fn utilization(&mut self, d: DeviceRef) -> Result<Utilization, GpuError> {
        self.0
            .lock()
            .device(d, "gpu.utilization")
            .map(|x| x.utilization)
    }
    fn memory(&mut self, d: DeviceRef) -> Result<MemoryInfo, GpuError> {
        self.0.lock().device(d, "gpu.memory").map(|x| x.memory)
    }
    fn power_mw(&mut self, d: DeviceRef) -> Result<u32, GpuError> {
        self.0.lock().device(d, "gpu.power").map(|x| x.power_mw)
    }
    fn power_limit_mw(&mut self, d: DeviceRef) -> Result<u32, GpuError> {
        self.0
            .lock()
            .device(d, "gpu.power_limit")
            .map(|x| x.power_limit_mw)
    }
    fn energy_mj(&mut self, d: DeviceRef) -> Result<u64, GpuError> {
        self.0.lock().device(d, "gpu.energy").map(|x| x.energy_mj)
    }
    fn temperature_c(&mut self, d: DeviceRef) -> Result<u32, GpuError> {
        self.0
            .lock()
            .device(d, "gpu.temperature")
            .map(|x| x.temperature_c)
    }
    fn clock_mhz(&mut self, d: DeviceRef, kind: ClockKind) -> Result<u32, GpuError> {
        let f = self.0.lock();
        match kind {
            ClockKind::Sm => f.device(d, "gpu.clock.sm").map(|x| x.sm_clock_mhz),
            ClockKind::Memory => f.device(d, "gpu.clock.memory").map(|x| x.mem_clock_mhz),
        }
    }
    fn throttle_reasons(&mut self, d: DeviceRef) -> Result<u64, GpuError> {
        self.0.lock().device(d, "gpu.throttle").map(|x| x.throttle)
    }
    fn pcie_kb_per_s(&mut self, d: DeviceRef, dir: PcieDirection) -> Result<u32, GpuError> {
        let f = self.0.lock();
        let x = f.device(d, "gpu.pcie.throughput")?;
        Ok(match dir {
            PcieDirection::Transmit => x.pcie_tx_kb_s,
            PcieDirection::Receive => x.pcie_rx_kb_s,
        })
    }
    fn pcie_replays(&mut self, d: DeviceRef) -> Result<u64, GpuError> {
        self.0
            .lock()
            .device(d, "gpu.pcie.replays")
            .map(|x| x.pcie_replays)
    }
    fn ecc_errors(&mut self, d: DeviceRef, kind: EccKind) -> Result<u64, GpuError> {
        let f = self.0.lock();
        let x = f.device(d, "gpu.ecc")?;
        Ok(match kind {
            EccKind::Corrected => x.ecc_corrected,
            EccKind::Uncorrected => x.ecc_uncorrected,
        })
    }
    fn processes(&mut self, d: DeviceRef) -> Result<Vec<GpuProcess>, GpuError> {
        self.0
            .lock()
            .device(d, "gpu.processes")
            .map(|x| x.processes.clone())
    }
    fn process_utilization(
        &mut self,
        d: DeviceRef,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessUtilization>, GpuError> {
        let mut f = self.0.lock();
        f.process_util_calls.push(last_seen_us);
        let x = f.device(d, "gpu.process.utilization")?;
        let fresh: Vec<ProcessUtilization> = x
            .process_utilization
            .iter()
            .filter(|s| s.timestamp_us > last_seen_us)
            .copied()
            .collect();
        if fresh.is_empty() {
            Err(GpuError::NotFound)
        } else {
            Ok(fresh)
        }
    }
    fn poll_xids(&mut self) -> Result<Vec<XidEvent>, GpuError> {
        Ok(std::mem::take(&mut self.0.lock().pending_xids))
    }
}
