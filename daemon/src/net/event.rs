//! The one Rust mirror of `struct lmperf_event` (`ebpf/src/lmperf_net.h`).
//!
//! **API Boundary** (kernel/user ABI): the const asserts below fail the build when this
//! layout and the C header disagree on size or on any offset.

use std::mem::{offset_of, size_of};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `LMPERF_EV_*`.
pub const EV_RTT: u8 = 1;
pub const EV_CONNECT: u8 = 2;
pub const EV_RETRANS: u8 = 3;
/// `LMPERF_AF_*` (Linux `AF_INET`, `AF_INET6`).
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// `struct lmperf_event`, as the kernel writes it (native endianness).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC, nanoseconds.
    pub ts_ns: u64,
    /// RTT: srtt in µs; connect: ns; retransmit: the socket's total retransmits.
    pub value: u64,
    /// Local address, network order; IPv4 in the first 4 bytes.
    pub saddr: [u8; 16],
    /// Remote address, network order.
    pub daddr: [u8; 16],
    /// Local port, host order.
    pub sport: u16,
    /// Remote port, host order.
    pub dport: u16,
    pub family: u16,
    pub kind: u8,
    /// TCP state of the socket when the event fired (`TCP_ESTABLISHED` = 1, ...).
    pub state: u8,
}

const _: () = {
    assert!(size_of::<RawEvent>() == 56);
    assert!(offset_of!(RawEvent, ts_ns) == 0);
    assert!(offset_of!(RawEvent, value) == 8);
    assert!(offset_of!(RawEvent, saddr) == 16);
    assert!(offset_of!(RawEvent, daddr) == 32);
    assert!(offset_of!(RawEvent, sport) == 48);
    assert!(offset_of!(RawEvent, dport) == 50);
    assert!(offset_of!(RawEvent, family) == 52);
    assert!(offset_of!(RawEvent, kind) == 54);
    assert!(offset_of!(RawEvent, state) == 55);
};

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_ne_bytes(a)
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

fn addr16(b: &[u8], off: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    a
}

impl RawEvent {
    /// Reads one ring buffer record; `None` when it is shorter than the struct.
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() < size_of::<Self>() {
            return None;
        }
        Some(Self {
            ts_ns: u64_at(b, offset_of!(Self, ts_ns)),
            value: u64_at(b, offset_of!(Self, value)),
            saddr: addr16(b, offset_of!(Self, saddr)),
            daddr: addr16(b, offset_of!(Self, daddr)),
            sport: u16_at(b, offset_of!(Self, sport)),
            dport: u16_at(b, offset_of!(Self, dport)),
            family: u16_at(b, offset_of!(Self, family)),
            kind: b[offset_of!(Self, kind)],
            state: b[offset_of!(Self, state)],
        })
    }

    fn ip(&self, a: [u8; 16]) -> IpAddr {
        if self.family == AF_INET6 {
            let v6 = Ipv6Addr::from(a);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        } else {
            IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))
        }
    }

    /// The socket's own address and port.
    pub fn local(&self) -> SocketAddr {
        SocketAddr::new(self.ip(self.saddr), self.sport)
    }

    /// The peer's address and port.
    pub fn remote(&self) -> SocketAddr {
        SocketAddr::new(self.ip(self.daddr), self.dport)
    }

    /// What the event measured, in its unit.
    pub fn kind(&self) -> Option<Kind> {
        match self.kind {
            EV_RTT => Some(Kind::Rtt {
                srtt_us: self.value,
            }),
            EV_CONNECT => Some(Kind::Connect { ns: self.value }),
            EV_RETRANS => Some(Kind::Retransmit { total: self.value }),
            _ => None,
        }
    }
}

/// A decoded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Smoothed RTT of the socket after a received segment, microseconds.
    Rtt { srtt_us: u64 },
    /// SYN_SENT → ESTABLISHED, nanoseconds.
    Connect { ns: u64 },
    /// A segment was retransmitted; `total` is the socket's count so far.
    Retransmit { total: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_an_ipv4_event_as_the_kernel_lays_it_out() {
        let mut b = vec![0u8; 56];
        b[0..8].copy_from_slice(&123u64.to_ne_bytes());
        b[8..16].copy_from_slice(&250u64.to_ne_bytes());
        b[16..20].copy_from_slice(&[127, 0, 0, 1]);
        b[32..36].copy_from_slice(&[10, 0, 0, 2]);
        b[48..50].copy_from_slice(&40000u16.to_ne_bytes());
        b[50..52].copy_from_slice(&8000u16.to_ne_bytes());
        b[52..54].copy_from_slice(&AF_INET.to_ne_bytes());
        b[54] = EV_RTT;
        b[55] = 1;
        let e = RawEvent::parse(&b).unwrap();
        assert_eq!(e.ts_ns, 123);
        assert_eq!(e.local(), "127.0.0.1:40000".parse().unwrap());
        assert_eq!(e.remote(), "10.0.0.2:8000".parse().unwrap());
        assert_eq!(e.kind(), Some(Kind::Rtt { srtt_us: 250 }));
        assert_eq!(RawEvent::parse(&b[..55]), None);
    }

    #[test]
    fn ipv4_mapped_ipv6_reads_as_ipv4() {
        let mut b = vec![0u8; 56];
        b[16 + 10] = 0xff;
        b[16 + 11] = 0xff;
        b[16 + 12..16 + 16].copy_from_slice(&[127, 0, 0, 1]);
        b[52..54].copy_from_slice(&AF_INET6.to_ne_bytes());
        b[54] = EV_CONNECT;
        let e = RawEvent::parse(&b).unwrap();
        assert_eq!(e.local().ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(e.remote().ip(), IpAddr::V6(Ipv6Addr::UNSPECIFIED));
    }
}
