//! Loads and attaches the probes with aya, writes the port filter, and drains the ring buffer
//! on its own OS thread (`lmperf-net`).
//!
//! Each probe is attached on its own, as a BTF tracepoint or, when the kernel refuses that, as
//! a classic tracepoint (`[net] programs`); the ones refused both ways are listed with the
//! reasons and the others run. Only when none attaches are the probes off.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use aya::programs::{BtfTracePoint, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader};

use super::event::{AF_INET6, RawEvent};
use super::metrics::NetInstruments;
use super::state::{Mode, NetState, ProbeStatus};
use crate::config::NetPrograms;

/// The compiled kernel programs (empty when `build.rs` found no clang).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lmperf_net.bpf.o"));
/// Why the object is empty, or `built`.
pub const BUILD_NOTE: &str = env!("LMPERF_EBPF_BUILD");

/// One probe: its BTF tracepoint program and the classic tracepoint twin tried when the
/// kernel refuses the first (`[net] programs = "auto"`).
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub btf_program: &'static str,
    /// The BTF tracepoint (`tp_btf/<name>`).
    pub btf_tracepoint: &'static str,
    pub btf_attach: &'static str,
    pub tp_program: &'static str,
    /// The classic tracepoint's category and name (`tracepoint/<category>/<name>`).
    pub tp_category: &'static str,
    pub tp_name: &'static str,
    pub tp_attach: &'static str,
}

/// The probes, each tried as a BTF tracepoint, then as a classic one.
pub const PROBES: [Probe; 3] = [
    Probe {
        btf_program: "lmperf_tcp_probe",
        btf_tracepoint: "tcp_probe",
        btf_attach: "tp_btf/tcp_probe",
        tp_program: "lmperf_tcp_probe_tp",
        tp_category: "tcp",
        tp_name: "tcp_probe",
        tp_attach: "tracepoint/tcp/tcp_probe",
    },
    Probe {
        btf_program: "lmperf_set_state",
        btf_tracepoint: "inet_sock_set_state",
        btf_attach: "tp_btf/inet_sock_set_state",
        tp_program: "lmperf_set_state_tp",
        tp_category: "sock",
        tp_name: "inet_sock_set_state",
        tp_attach: "tracepoint/sock/inet_sock_set_state",
    },
    Probe {
        btf_program: "lmperf_retransmit",
        btf_tracepoint: "tcp_retransmit_skb",
        btf_attach: "tp_btf/tcp_retransmit_skb",
        tp_program: "lmperf_retransmit_tp",
        tp_category: "tcp",
        tp_name: "tcp_retransmit_skb",
        tp_attach: "tracepoint/tcp/tcp_retransmit_skb",
    },
];

/// The longest an event waits in the ring buffer when no span asks for it (metrics freshness;
/// spans and the diagnosis drain what is waiting before they read, and a batch of
/// [`WAKEUP_EVENTS`] wakes the reader sooner). Each poll is a thread wake-up: at 100 ms they
/// were 7 % of the agent's wake-ups for nothing the exports (every 10 s or more) could see.
pub const POLL: Duration = Duration::from_secs(1);
/// Events waiting at which the kernel wakes the reader (`LMPERF_WAKEUP_BYTES` in the C).
pub const WAKEUP_EVENTS: usize = 64;

/// Why the probes are off.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("probes not built into this binary: {0}")]
    NotBuilt(&'static str),
    #[error("kernel BTF unavailable (/sys/kernel/btf/vmlinux; needs CONFIG_DEBUG_INFO_BTF): {0}")]
    Btf(#[source] aya::BtfError),
    #[error("loading the eBPF object failed{hint}: {source}")]
    Load {
        hint: &'static str,
        source: aya::EbpfError,
    },
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("eBPF map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("no probe attached: {0}")]
    NoProbe(String),
    #[error("cannot start the probe thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Keeps the probes attached while its thread runs; `stop` detaches them.
#[derive(Debug)]
pub struct NetMonitor {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl NetMonitor {
    /// A monitor with nothing to stop.
    pub fn none() -> Self {
        Self {
            stop: Arc::new(AtomicBool::new(true)),
            handle: None,
        }
    }

    /// Stops the thread (within one poll interval) and detaches the probes.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle {
            let _ = h.join();
        }
    }
}

fn is_permission(e: &aya::EbpfError) -> bool {
    let text = format!("{e:?}");
    text.contains("PermissionDenied")
        || text.contains("EPERM")
        || text.contains("Operation not permitted")
}

/// One line of an error that may carry a verifier log.
fn short(e: &dyn std::fmt::Display) -> String {
    let s = e.to_string();
    let first = s.split(". Verifier output").next().unwrap_or(&s);
    first.chars().take(300).collect()
}

/// The probes loaded and attached, not yet drained: the privileged part of the start, done
/// before the agent drops its capabilities ([`crate::caps`]).
pub struct Loaded {
    ebpf: Ebpf,
    ring: RingBuf<MapData>,
    drops: PerCpuArray<MapData, u64>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Loaded")
    }
}

/// Loads, attaches and fills the port filter; sets the state's mode to on.
///
/// # Errors
/// [`NetError`] when no probe can run; the agent then runs without them.
pub fn load(state: &NetState, programs: NetPrograms) -> Result<Loaded, NetError> {
    if OBJECT.is_empty() {
        return Err(NetError::NotBuilt(BUILD_NOTE));
    }
    let btf = Btf::from_sys_fs().map_err(NetError::Btf)?;
    let mut ebpf = EbpfLoader::new()
        .btf(Some(&btf))
        .load(OBJECT)
        .map_err(|source| NetError::Load {
            hint: if is_permission(&source) {
                " (needs CAP_BPF and CAP_PERFMON, or root)"
            } else {
                ""
            },
            source,
        })?;
    // A bitmap: bit (port % 64) of entry (port / 64). The map is taken out of `ebpf` and kept
    // (its fd held): targets started later set their bits through it without a capability.
    let mut bits: Array<MapData, u64> = Array::try_from(
        ebpf.take_map("lmperf_ports")
            .ok_or(NetError::MissingMap("lmperf_ports"))?,
    )
    .map_err(|source| NetError::Map {
        name: "lmperf_ports",
        source,
    })?;
    for p in state.ports() {
        set_port_bit(&mut bits, p).map_err(|source| NetError::Map {
            name: "lmperf_ports",
            source,
        })?;
    }
    let probes: Vec<ProbeStatus> = PROBES
        .iter()
        .map(|p| attach_probe(&mut ebpf, p, &btf, programs))
        .collect();
    let failed: Vec<String> = probes
        .iter()
        .filter_map(|p| p.error.as_ref().map(|e| format!("{}: {e}", p.attach)))
        .collect();
    if failed.len() == probes.len() {
        state.set_probes(probes);
        return Err(NetError::NoProbe(failed.join("; ")));
    }
    let ring = RingBuf::try_from(
        ebpf.take_map("lmperf_events")
            .ok_or(NetError::MissingMap("lmperf_events"))?,
    )
    .map_err(|source| NetError::Map {
        name: "lmperf_events",
        source,
    })?;
    let drops: PerCpuArray<MapData, u64> = PerCpuArray::try_from(
        ebpf.take_map("lmperf_drops")
            .ok_or(NetError::MissingMap("lmperf_drops"))?,
    )
    .map_err(|source| NetError::Map {
        name: "lmperf_drops",
        source,
    })?;
    let live: Vec<&str> = probes.iter().filter(|p| p.live).map(|p| p.attach).collect();
    let reason =
        (!failed.is_empty()).then(|| format!("some probes not attached: {}", failed.join("; ")));
    tracing::info!(probes = ?live, ports = ?state.ports(), "eBPF network probes attached.");
    let bits = Mutex::new(bits);
    state.set_port_writer(Box::new(move |p| {
        let mut b = bits
            .lock()
            .map_err(|_| "port map lock poisoned".to_owned())?;
        set_port_bit(&mut b, p).map_err(|e| match std::error::Error::source(&e) {
            Some(s) => format!("{e}: {s}"),
            None => e.to_string(),
        })
    }));
    state.set_probes(probes);
    state.set_mode(Mode::On, reason);
    Ok(Loaded { ebpf, ring, drops })
}

/// Sets `port`'s bit in the `lmperf_ports` bitmap (a read and an update of one word).
fn set_port_bit(bits: &mut Array<MapData, u64>, port: u16) -> Result<(), aya::maps::MapError> {
    let i = u32::from(port / 64);
    let word = bits.get(&i, 0)?;
    bits.set(i, word | (1u64 << (port % 64)), 0)
}

impl Loaded {
    /// Starts draining the ring buffer on the `lmperf-net` thread (needs no capability).
    ///
    /// # Errors
    /// [`NetError::Thread`] when the thread cannot start.
    pub fn spawn(
        self,
        state: Arc<NetState>,
        instruments: NetInstruments,
    ) -> Result<NetMonitor, NetError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let Loaded { ebpf, ring, drops } = self;
        let fd = ring.as_raw_fd();
        let drain = Arc::new(Mutex::new(Drain {
            ring,
            drops,
            instruments,
            last_drops_read: Instant::now(),
        }));
        let on_demand = drain.clone();
        state.set_drainer(Box::new(move |st: &NetState| {
            if let Ok(mut d) = on_demand.lock() {
                d.drain(st);
            }
        }));
        let handle = std::thread::Builder::new()
            .name("lmperf-net".to_owned())
            .spawn(move || drain_loop(ebpf, fd, &drain, &state, &flag))
            .map_err(NetError::Thread)?;
        Ok(NetMonitor {
            stop,
            handle: Some(handle),
        })
    }
}

/// Attaches `p` as the configured program types allow: the BTF tracepoint, then (auto) the
/// classic one; the status names the one that runs, or both errors.
fn attach_probe(ebpf: &mut Ebpf, p: &Probe, btf: &Btf, programs: NetPrograms) -> ProbeStatus {
    let btf_error = match programs {
        NetPrograms::Tracepoint => None,
        NetPrograms::Auto | NetPrograms::TpBtf => {
            match attach_btf(ebpf, p.btf_program, p.btf_tracepoint, btf) {
                Ok(()) => {
                    return ProbeStatus {
                        program: p.btf_program,
                        attach: p.btf_attach,
                        live: true,
                        error: None,
                    };
                }
                Err(e) => Some(e),
            }
        }
    };
    if programs == NetPrograms::TpBtf {
        tracing::warn!(probe = p.btf_attach, error = ?btf_error, "eBPF probe not attached.");
        return ProbeStatus {
            program: p.btf_program,
            attach: p.btf_attach,
            live: false,
            error: btf_error,
        };
    }
    match attach_classic(ebpf, p) {
        Ok(()) => {
            if let Some(e) = &btf_error {
                tracing::info!(probe = p.tp_attach, refused = p.btf_attach, error = %e, "eBPF probe attached as a classic tracepoint.");
            }
            ProbeStatus {
                program: p.tp_program,
                attach: p.tp_attach,
                live: true,
                error: None,
            }
        }
        Err(e) => {
            let error = match btf_error {
                Some(b) => format!("{b}; then {}: {e}", p.tp_attach),
                None => e,
            };
            tracing::warn!(probe = p.btf_attach, error = %error, "eBPF probe not attached.");
            ProbeStatus {
                program: p.btf_program,
                attach: if programs == NetPrograms::Tracepoint {
                    p.tp_attach
                } else {
                    p.btf_attach
                },
                live: false,
                error: Some(error),
            }
        }
    }
}

fn attach_classic(ebpf: &mut Ebpf, p: &Probe) -> Result<(), String> {
    let prog: &mut TracePoint = ebpf
        .program_mut(p.tp_program)
        .ok_or_else(|| format!("program {} missing from the object", p.tp_program))?
        .try_into()
        .map_err(|e| short(&e))?;
    prog.load().map_err(|e| short(&e))?;
    prog.attach(p.tp_category, p.tp_name)
        .map_err(|e| short(&e))?;
    Ok(())
}

fn attach_btf(ebpf: &mut Ebpf, program: &str, tracepoint: &str, btf: &Btf) -> Result<(), String> {
    let prog: &mut BtfTracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("program {program} missing from the object"))?
        .try_into()
        .map_err(|e| short(&e))?;
    prog.load(tracepoint, btf).map_err(|e| short(&e))?;
    prog.attach().map_err(|e| short(&e))?;
    Ok(())
}

/// CLOCK_MONOTONIC now, in nanoseconds (the clock of `bpf_ktime_get_ns`).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Waits until `fd` is readable or `timeout` passes.
fn wait_readable(fd: i32, timeout: Duration) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let _ = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) };
}

/// The ring buffer's reader, shared by the probe thread and span building (which drains what
/// is waiting before it reads the history: the kernel wakes the thread only for batches).
struct Drain {
    ring: RingBuf<MapData>,
    drops: PerCpuArray<MapData, u64>,
    instruments: NetInstruments,
    last_drops_read: Instant,
}

impl Drain {
    /// Converts every waiting event into metrics and history.
    fn drain(&mut self, state: &NetState) {
        let (mono, wall) = (monotonic_ns(), SystemTime::now());
        while let Some(item) = self.ring.next() {
            let Some(ev) = RawEvent::parse(&item) else {
                continue;
            };
            drop(item);
            let Some(kind) = ev.kind() else { continue };
            let (local, remote) = (ev.local(), ev.remote());
            let Some((side, server)) = state.classify(local, remote) else {
                continue;
            };
            let at = wall
                .checked_sub(Duration::from_nanos(mono.saturating_sub(ev.ts_ns)))
                .unwrap_or(wall);
            self.instruments
                .record(side, server, ev.family == AF_INET6, kind);
            state.push(at, side, server, local, kind);
        }
        if self.last_drops_read.elapsed() >= Duration::from_secs(1) {
            self.last_drops_read = Instant::now();
            if let Ok(per_cpu) = self.drops.get(&0, 0) {
                state.dropped.store(per_cpu.iter().sum(), Ordering::Relaxed);
            }
        }
    }
}

/// Drains when the kernel wakes it (a batch of [`WAKEUP_EVENTS`] waiting) or every
/// [`POLL`], until `stop`; holds the programs attached (`_ebpf`) until then.
fn drain_loop(_ebpf: Ebpf, fd: i32, drain: &Mutex<Drain>, state: &NetState, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        wait_readable(fd, POLL);
        if let Ok(mut d) = drain.lock() {
            d.drain(state);
        }
    }
}
