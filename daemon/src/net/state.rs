//! What the probes saw, for the span attributes and `/api/v1/status`.
//!
//! A bounded history of recent client-side events (newest last, at most [`HISTORY`]) with
//! their wall-clock time, converted from the kernel's CLOCK_MONOTONIC when drained.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use serde::Serialize;

use super::event::Kind;
use super::filter::{PortFilter, Side};
use crate::telemetry::names;

/// Client-side events kept for span matching (about 56 bytes each).
pub const HISTORY: usize = 16_384;

/// Whether the probes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Not yet loaded.
    Starting,
    /// At least one probe attached.
    On,
    /// Refused or not built: `reason` says why.
    Off,
    /// `[net] enabled = false`.
    Disabled,
}

/// One probe as loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeStatus {
    /// The program (`lmperf_tcp_probe`, ...).
    pub program: &'static str,
    /// How it attaches (`tp_btf/tcp_probe`, ...).
    pub attach: &'static str,
    pub live: bool,
    /// Why not live.
    pub error: Option<String>,
}

/// One event of a client socket (the canary's side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub at: SystemTime,
    pub server: SocketAddr,
    pub local: SocketAddr,
    pub kind: Kind,
}

/// The `net` section of `/api/v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetStatus {
    /// on | off | disabled | starting.
    pub mode: Mode,
    /// Why the probes are off (or some of them), when they are.
    pub reason: Option<String>,
    /// Ports reported by the kernel filter (the targets', those started after load too).
    pub ports: Vec<u16>,
    /// Why a target port added after start is not in the kernel filter (an older kernel
    /// refusing the map update without a capability); absent when every one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports_refused: Option<String>,
    pub probes: Vec<ProbeStatus>,
    /// Events received since start, by kind.
    pub events: EventCounts,
    /// Events the kernel dropped because the ring buffer was full.
    pub dropped: u64,
    /// Where the spans' `lmperf.net.*` attributes come from: `ebpf` while the probes are on,
    /// else `tcp_info` (the agent's own sockets, `getsockopt(TCP_INFO)`).
    pub source: &'static str,
    /// Spans given a TCP_INFO reading.
    pub tcp_info_samples: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EventCounts {
    pub rtt: u64,
    pub connect: u64,
    pub retransmit: u64,
}

#[derive(Debug)]
struct Inner {
    mode: Mode,
    reason: Option<String>,
    probes: Vec<ProbeStatus>,
    history: VecDeque<Sample>,
}

/// Drains the probes' waiting events into the state (set by the loader).
pub type DrainFn = Box<dyn Fn(&NetState) + Send + Sync>;
/// Sets one port's bit in the kernel's `lmperf_ports` map (through the map fd held since load);
/// the error's text when the kernel refuses.
pub type PortWriteFn = Box<dyn Fn(u16) -> Result<(), String> + Send + Sync>;

struct PortWriter(PortWriteFn);

impl std::fmt::Debug for PortWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PortWriter")
    }
}

struct Drainer(DrainFn);

impl std::fmt::Debug for Drainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Drainer")
    }
}

/// Shared state of the probes.
#[derive(Debug)]
pub struct NetState {
    drainer: std::sync::OnceLock<Drainer>,
    /// The target ports: those of the start, and of targets started later ([`Self::follow_ports`]).
    filter: std::sync::RwLock<PortFilter>,
    port_writer: std::sync::OnceLock<PortWriter>,
    /// Ports the kernel refused to add after start, with the reason (said once).
    ports_refused: Mutex<Option<String>>,
    inner: Mutex<Inner>,
    pub rtt_events: AtomicU64,
    pub connect_events: AtomicU64,
    pub retransmit_events: AtomicU64,
    pub dropped: AtomicU64,
    /// Spans given a TCP_INFO reading (the fallback while the probes are not on).
    pub tcp_info_samples: AtomicU64,
}

/// Attributes of one request: what the kernel saw on client sockets to `server_port` between
/// `from` and `to`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestNet {
    pub srtt_min: Option<Duration>,
    pub srtt_max: Option<Duration>,
    pub rtt_samples: u64,
    pub retransmits: u64,
    pub connect: Option<Duration>,
}

impl NetState {
    pub fn new(filter: PortFilter) -> Self {
        Self {
            drainer: std::sync::OnceLock::new(),
            filter: std::sync::RwLock::new(filter),
            port_writer: std::sync::OnceLock::new(),
            ports_refused: Mutex::new(None),
            inner: Mutex::new(Inner {
                mode: Mode::Starting,
                reason: None,
                probes: Vec::new(),
                history: VecDeque::new(),
            }),
            rtt_events: AtomicU64::new(0),
            connect_events: AtomicU64::new(0),
            retransmit_events: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            tcp_info_samples: AtomicU64::new(0),
        }
    }

    /// The target ports the probes report now.
    pub fn ports(&self) -> Vec<u16> {
        self.filter
            .read()
            .map(|f| f.ports().collect())
            .unwrap_or_default()
    }

    /// The reporting socket's side and the server's address, `None` when neither port is a
    /// target's ([`PortFilter::classify`]).
    pub fn classify(&self, local: SocketAddr, remote: SocketAddr) -> Option<(Side, SocketAddr)> {
        self.filter.read().ok()?.classify(local, remote)
    }

    /// Sets how [`Self::follow_ports`] reaches the kernel's port map (once, at load).
    pub fn set_port_writer(&self, f: PortWriteFn) {
        let _ = self.port_writer.set(PortWriter(f));
    }

    /// The probes follow the running targets: each port not reported yet is added to the
    /// user-space filter and, while the probes are on, to the kernel's map through the fd
    /// held since load (no capability needed on Linux >= 6.5; an older kernel's refusal is
    /// said once in the status and the log, and that port's spans keep TCP_INFO). Ports are
    /// never removed (a port may serve several targets; a stale bit only lets a few events
    /// through that no target claims).
    pub fn follow_ports(&self, ports: impl IntoIterator<Item = u16>) {
        let new: Vec<u16> = match self.filter.write() {
            Ok(mut f) => ports.into_iter().filter(|p| f.insert(*p)).collect(),
            Err(_) => return,
        };
        let Some(w) = self.port_writer.get() else {
            return;
        };
        for p in new {
            match (w.0)(p) {
                Ok(()) => tracing::info!(port = p, "eBPF probes follow a new target port."),
                Err(e) => {
                    let text = format!("port {p} not added to the kernel filter after start: {e}");
                    if let Ok(mut r) = self.ports_refused.lock() {
                        if r.is_none() {
                            tracing::warn!(error = %text, "eBPF probes cannot follow a new target port (its spans keep TCP_INFO).");
                        }
                        *r = Some(text);
                    }
                }
            }
        }
    }

    /// Sets how [`Self::drain_now`] reaches the ring buffer (once; later calls are ignored).
    pub fn set_drainer(&self, f: DrainFn) {
        let _ = self.drainer.set(Drainer(f));
    }

    /// Moves the events waiting in the ring buffer into the history (the kernel wakes the
    /// probe thread only for batches, so a request's last events may still wait there).
    pub fn drain_now(&self) {
        if let Some(d) = self.drainer.get() {
            (d.0)(self);
        }
    }

    pub fn set_mode(&self, mode: Mode, reason: Option<String>) {
        if let Ok(mut g) = self.inner.lock() {
            g.mode = mode;
            g.reason = reason;
        }
    }

    pub fn mode(&self) -> Mode {
        self.inner.lock().map_or(Mode::Off, |g| g.mode)
    }

    pub fn set_probes(&self, probes: Vec<ProbeStatus>) {
        if let Ok(mut g) = self.inner.lock() {
            g.probes = probes;
        }
    }

    /// Counts an event and, when the reporting socket is a client's, keeps it for spans.
    pub fn push(
        &self,
        at: SystemTime,
        side: Side,
        server: SocketAddr,
        local: SocketAddr,
        kind: Kind,
    ) {
        let counter = match kind {
            Kind::Rtt { .. } => &self.rtt_events,
            Kind::Connect { .. } => &self.connect_events,
            Kind::Retransmit { .. } => &self.retransmit_events,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if side != Side::Client {
            return;
        }
        if let Ok(mut g) = self.inner.lock() {
            if g.history.len() >= HISTORY {
                g.history.pop_front();
            }
            g.history.push_back(Sample {
                at,
                server,
                local,
                kind,
            });
        }
    }

    /// What client sockets to `server_port` saw between `from` and `to` (inclusive); only the
    /// socket bound to `local` when given (the request's own connection), else every client
    /// of that port on this node during the request.
    pub fn request(
        &self,
        server_port: u16,
        local: Option<SocketAddr>,
        from: SystemTime,
        to: SystemTime,
    ) -> RequestNet {
        let mut r = RequestNet::default();
        let Ok(g) = self.inner.lock() else { return r };
        for s in g.history.iter().rev() {
            if s.at < from {
                break;
            }
            if s.at > to || s.server.port() != server_port || local.is_some_and(|l| l != s.local) {
                continue;
            }
            match s.kind {
                Kind::Rtt { srtt_us } => {
                    let d = Duration::from_micros(srtt_us);
                    r.srtt_min = Some(r.srtt_min.map_or(d, |m| m.min(d)));
                    r.srtt_max = Some(r.srtt_max.map_or(d, |m| m.max(d)));
                    r.rtt_samples += 1;
                }
                Kind::Connect { ns } => r.connect = Some(Duration::from_nanos(ns)),
                Kind::Retransmit { .. } => r.retransmits += 1,
            }
        }
        r
    }

    /// The `lmperf.net.*` span attributes of a request to `server_port` from `from` to `to`
    /// over `conn` (local, remote) when known: the probes' events while they are on, else one
    /// TCP_INFO reading of that connection (nothing when it is closed or unknown).
    pub fn request_attributes(
        &self,
        server_port: u16,
        conn: Option<(SocketAddr, SocketAddr)>,
        from: SystemTime,
        to: SystemTime,
    ) -> Vec<KeyValue> {
        if self.mode() != Mode::On {
            let Some(info) =
                conn.and_then(|(local, remote)| super::tcp_info::own_connection(local, remote))
            else {
                return Vec::new();
            };
            self.tcp_info_samples.fetch_add(1, Ordering::Relaxed);
            return vec![
                KeyValue::new(names::LMPERF_NET_SOURCE, names::NET_SOURCE_TCP_INFO),
                KeyValue::new(names::LMPERF_NET_RTT_SAMPLES, 1),
                KeyValue::new(names::LMPERF_NET_SRTT_MIN, info.srtt.as_secs_f64()),
                KeyValue::new(names::LMPERF_NET_SRTT_MAX, info.srtt.as_secs_f64()),
            ];
        }
        self.drain_now();
        let r = self.request(server_port, conn.map(|c| c.0), from, to);
        let mut a = vec![
            KeyValue::new(names::LMPERF_NET_SOURCE, names::NET_SOURCE_EBPF),
            KeyValue::new(names::LMPERF_NET_RTT_SAMPLES, r.rtt_samples as i64),
            KeyValue::new(names::LMPERF_NET_RETRANSMITS, r.retransmits as i64),
        ];
        if let (Some(min), Some(max)) = (r.srtt_min, r.srtt_max) {
            a.push(KeyValue::new(names::LMPERF_NET_SRTT_MIN, min.as_secs_f64()));
            a.push(KeyValue::new(names::LMPERF_NET_SRTT_MAX, max.as_secs_f64()));
        }
        if let Some(c) = r.connect {
            a.push(KeyValue::new(
                names::LMPERF_NET_CONNECT_DURATION,
                c.as_secs_f64(),
            ));
        }
        a
    }

    /// The kept client-side events, oldest first.
    pub fn recent(&self) -> Vec<Sample> {
        self.drain_now();
        self.inner
            .lock()
            .map(|g| g.history.iter().copied().collect())
            .unwrap_or_default()
    }

    pub fn status(&self) -> NetStatus {
        let (mode, reason, probes) = match self.inner.lock() {
            Ok(g) => (g.mode, g.reason.clone(), g.probes.clone()),
            Err(_) => (
                Mode::Off,
                Some("state lock poisoned".to_owned()),
                Vec::new(),
            ),
        };
        NetStatus {
            mode,
            reason,
            ports: self.ports(),
            ports_refused: self.ports_refused.lock().ok().and_then(|r| r.clone()),
            probes,
            events: EventCounts {
                rtt: self.rtt_events.load(Ordering::Relaxed),
                connect: self.connect_events.load(Ordering::Relaxed),
                retransmit: self.retransmit_events.load(Ordering::Relaxed),
            },
            dropped: self.dropped.load(Ordering::Relaxed),
            source: if mode == Mode::On {
                names::NET_SOURCE_EBPF
            } else {
                names::NET_SOURCE_TCP_INFO
            },
            tcp_info_samples: self.tcp_info_samples.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_request_sees_its_port_and_window_only() {
        let st = NetState::new(PortFilter::new([8000, 9000]));
        st.set_mode(Mode::On, None);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let ms = |n| t0 + Duration::from_millis(n);
        let (srv, other, local) = (a("10.0.0.2:8000"), a("10.0.0.2:9000"), a("10.0.0.1:40000"));
        st.push(ms(0), Side::Client, srv, local, Kind::Rtt { srtt_us: 100 }); // before
        st.push(
            ms(10),
            Side::Client,
            srv,
            local,
            Kind::Connect { ns: 250_000 },
        );
        st.push(ms(11), Side::Client, srv, local, Kind::Rtt { srtt_us: 300 });
        st.push(
            ms(12),
            Side::Client,
            other,
            local,
            Kind::Rtt { srtt_us: 9000 },
        ); // other port
        st.push(ms(13), Side::Server, srv, local, Kind::Rtt { srtt_us: 7 }); // server side: not kept
        st.push(ms(14), Side::Client, srv, local, Kind::Rtt { srtt_us: 200 });
        st.push(
            ms(15),
            Side::Client,
            srv,
            local,
            Kind::Retransmit { total: 1 },
        );
        st.push(ms(30), Side::Client, srv, local, Kind::Rtt { srtt_us: 1 }); // after
        let r = st.request(8000, None, ms(5), ms(20));
        assert_eq!(
            r,
            RequestNet {
                srtt_min: Some(Duration::from_micros(200)),
                srtt_max: Some(Duration::from_micros(300)),
                rtt_samples: 2,
                retransmits: 1,
                connect: Some(Duration::from_micros(250)),
            }
        );
        assert_eq!(
            st.status().events,
            EventCounts {
                rtt: 6,
                connect: 1,
                retransmit: 1
            }
        );
        assert_eq!(st.status().source, names::NET_SOURCE_EBPF);
        let other_local = a("10.0.0.1:40001");
        st.push(
            ms(16),
            Side::Client,
            srv,
            other_local,
            Kind::Rtt { srtt_us: 5 },
        ); // another client socket
        assert_eq!(
            st.request(8000, Some(local), ms(5), ms(20)),
            r,
            "the request's own socket only"
        );
        assert_eq!(
            st.request(8000, None, ms(5), ms(20)).srtt_min,
            Some(Duration::from_micros(5))
        );
        let attrs = st.request_attributes(8000, Some((local, srv)), ms(5), ms(20));
        assert!(
            attrs
                .iter()
                .any(|kv| kv.key.as_str() == names::LMPERF_NET_CONNECT_DURATION
                    && kv.value == opentelemetry::Value::F64(0.00025))
        );
        st.set_mode(Mode::Off, Some("x".into()));
        assert!(
            st.request_attributes(8000, Some((local, srv)), ms(5), ms(20))
                .is_empty(),
            "off, and no such socket for TCP_INFO"
        );
        assert_eq!(st.status().source, names::NET_SOURCE_TCP_INFO);
    }

    #[test]
    fn history_is_bounded() {
        let st = NetState::new(PortFilter::new([8000]));
        let t0 = SystemTime::UNIX_EPOCH;
        for i in 0..(HISTORY as u64 + 10) {
            st.push(
                t0 + Duration::from_micros(i),
                Side::Client,
                a("10.0.0.2:8000"),
                a("10.0.0.1:1"),
                Kind::Rtt { srtt_us: i },
            );
        }
        let r = st.request(8000, None, t0, t0 + Duration::from_secs(1));
        assert_eq!(r.rtt_samples, HISTORY as u64);
        assert_eq!(r.srtt_min, Some(Duration::from_micros(10)));
    }
}
