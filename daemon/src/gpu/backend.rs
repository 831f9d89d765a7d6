//! The seam between the sampler and the GPU library: [`GpuBackend`], with two
//! implementations, [`super::nvml::NvmlBackend`] (the real NVML through `nvml-wrapper`) and
//! [`super::fake::FakeBackend`] (scripted, for tests and the benchmark).
//!
//! Every call maps one NVML function; units are NVML's (percent, milliwatts, millijoules,
//! MHz, KB/s) and the sampler converts them to the OpenTelemetry hardware conventions' base
//! units (fractions, W, J, Hz, bytes).

/// Why an NVML call failed, reduced to what the sampler acts on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// The NVML library cannot be loaded (`libnvidia-ml.so.1` missing): GPU metrics are off.
    #[error("NVML library not available: {0}")]
    NoLibrary(String),
    /// The library loaded but the driver is not (yet) usable (`NVML_ERROR_DRIVER_NOT_LOADED`,
    /// `NVML_ERROR_UNINITIALIZED` after a driver reload): discovery is retried.
    #[error("NVIDIA driver not usable: {0}")]
    Driver(String),
    /// `NVML_ERROR_NOT_SUPPORTED`: this device does not offer this field (e.g. utilization of
    /// a GPU in MIG mode). The field is absent, never 0.
    #[error("not supported on this device")]
    NotSupported,
    /// The library lacks the function this call needs (a driver older than the call): the
    /// field is absent, like [`GpuError::NotSupported`], with the function named.
    #[error("the NVML library has no {0} (a driver older than this call)")]
    MissingFunction(String),
    /// `NVML_ERROR_NOT_FOUND`: nothing to report (e.g. process utilization on an idle GPU).
    #[error("not found")]
    NotFound,
    /// `NVML_ERROR_GPU_IS_LOST`: the GPU fell off the bus or is otherwise inaccessible.
    #[error("GPU is lost")]
    GpuLost,
    /// Any other NVML error, with NVML's message.
    #[error("{0}")]
    Other(String),
}

/// Identity of one GPU (or one MIG instance), read once at discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// NVML index of the physical GPU (a MIG instance carries its parent's).
    pub index: u32,
    /// `GPU-…` or `MIG-…` UUID: `hw.id`.
    pub uuid: String,
    /// Product name (`NVIDIA H200`): `hw.name` / `hw.model`.
    pub name: String,
    /// PCI bus id (`00000000:17:00.0`).
    pub pci_bus_id: String,
    /// MIG mode of a physical GPU (`Some(true)` when on), `None` when NVML cannot tell.
    pub mig_enabled: Option<bool>,
    /// For a MIG instance: its profile (`1g.5gb`) and the parent's UUID (`hw.parent`).
    pub mig: Option<MigInstance>,
}

/// A MIG instance's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInstance {
    /// Profile name as NVML prints it in the device name, e.g. `1g.5gb`.
    pub profile: String,
    /// UUID of the physical GPU.
    pub parent_uuid: String,
    /// Position among the parent's MIG devices.
    pub mig_index: u32,
}

/// Which device a call is about: a physical GPU by NVML index, or one of its MIG instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceRef {
    pub index: u32,
    pub mig_index: Option<u32>,
}

/// `nvmlDeviceGetUtilizationRates`, in percent over NVML's last sample period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utilization {
    /// Time one or more kernels ran.
    pub gpu_pct: u32,
    /// Time device memory was read or written.
    pub memory_pct: u32,
}

/// `nvmlDeviceGetMemoryInfo`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    pub used: u64,
    pub total: u64,
}

/// Clock domains read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockKind {
    Sm,
    Memory,
}

/// PCIe direction, from the GPU's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcieDirection {
    Transmit,
    Receive,
}

/// ECC error class (`hw.errors` `error.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EccKind {
    Corrected,
    Uncorrected,
}

/// A process holding GPU memory (`nvmlDeviceGetComputeRunningProcesses`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    /// Bytes, `None` where NVML cannot tell.
    pub used_bytes: Option<u64>,
}

/// One per-process utilization sample (`nvmlDeviceGetProcessUtilization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessUtilization {
    pub pid: u32,
    /// CPU timestamp of the sample, µs since the Unix epoch.
    pub timestamp_us: u64,
    /// SM utilization, percent.
    pub sm_pct: u32,
    /// Frame buffer utilization, percent.
    pub memory_pct: u32,
}

/// A critical XID error event (`nvmlEventTypeXidCriticalError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// UUID of the GPU it happened on.
    pub uuid: String,
    /// The XID code (e.g. 79: GPU has fallen off the bus); 0 when NVML does not know it.
    pub code: u64,
}

/// Clock throttle reason bits, as NVML defines them (`nvmlClocksThrottleReason*`).
pub mod throttle {
    pub const GPU_IDLE: u64 = 0x1;
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    pub const SW_POWER_CAP: u64 = 0x4;
    pub const HW_SLOWDOWN: u64 = 0x8;
    pub const SYNC_BOOST: u64 = 0x10;
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
    pub const DISPLAY_CLOCK_SETTING: u64 = 0x100;

    /// Reasons that slow a GPU down (idle and clock settings are not slowdowns), with the
    /// names exported in `lmperf.gpu.throttle.reason`.
    pub const SLOWDOWNS: &[(u64, &str)] = &[
        (SW_POWER_CAP, "sw_power_cap"),
        (HW_SLOWDOWN, "hw_slowdown"),
        (SYNC_BOOST, "sync_boost"),
        (SW_THERMAL_SLOWDOWN, "sw_thermal"),
        (HW_THERMAL_SLOWDOWN, "hw_thermal"),
        (HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake"),
    ];

    /// Names of the slowdowns set in `bits`, in [`SLOWDOWNS`] order.
    pub fn names(bits: u64) -> Vec<&'static str> {
        SLOWDOWNS
            .iter()
            .filter(|(b, _)| bits & b != 0)
            .map(|(_, n)| *n)
            .collect()
    }
}

/// What the sampler needs from a GPU library. Calls block (NVML is synchronous); the sampler
/// runs them on its own thread.
pub trait GpuBackend: Send {
    /// Loads and initializes the library; returns the driver version (`hw.driver_version`).
    /// Called again after [`GpuBackend::shutdown`] to rediscover after a lost GPU.
    fn init(&mut self) -> Result<String, GpuError>;
    /// Releases the library (`nvmlShutdown`).
    fn shutdown(&mut self);
    /// Physical GPUs.
    fn device_count(&mut self) -> Result<u32, GpuError>;
    /// The physical GPU `index` and its MIG instances, in that order.
    fn devices_at(&mut self, index: u32) -> Result<Vec<DeviceInfo>, GpuError>;
    fn utilization(&mut self, d: DeviceRef) -> Result<Utilization, GpuError>;
    fn memory(&mut self, d: DeviceRef) -> Result<MemoryInfo, GpuError>;
    /// Milliwatts.
    fn power_mw(&mut self, d: DeviceRef) -> Result<u32, GpuError>;
    /// Enforced power limit, milliwatts.
    fn power_limit_mw(&mut self, d: DeviceRef) -> Result<u32, GpuError>;
    /// Energy since the driver loaded, millijoules.
    fn energy_mj(&mut self, d: DeviceRef) -> Result<u64, GpuError>;
    /// GPU die temperature, °C.
    fn temperature_c(&mut self, d: DeviceRef) -> Result<u32, GpuError>;
    /// MHz.
    fn clock_mhz(&mut self, d: DeviceRef, kind: ClockKind) -> Result<u32, GpuError>;
    /// Current throttle reason bits ([`throttle`]).
    fn throttle_reasons(&mut self, d: DeviceRef) -> Result<u64, GpuError>;
    /// PCIe throughput over NVML's 20 ms window, KB/s.
    fn pcie_kb_per_s(&mut self, d: DeviceRef, dir: PcieDirection) -> Result<u32, GpuError>;
    /// PCIe replay counter.
    fn pcie_replays(&mut self, d: DeviceRef) -> Result<u64, GpuError>;
    /// Volatile ECC error count (since the driver loaded).
    fn ecc_errors(&mut self, d: DeviceRef, kind: EccKind) -> Result<u64, GpuError>;
    /// Compute processes on the device.
    fn processes(&mut self, d: DeviceRef) -> Result<Vec<GpuProcess>, GpuError>;
    /// Per-process utilization samples newer than `last_seen_us` (0: all buffered).
    fn process_utilization(
        &mut self,
        d: DeviceRef,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessUtilization>, GpuError>;
    /// XID events since the last call, without waiting.
    fn poll_xids(&mut self) -> Result<Vec<XidEvent>, GpuError>;
}
