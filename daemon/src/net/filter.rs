//! Which flows matter and which end of each is the server.
//!
//! The kernel reports a socket when its local or remote port is one of the targets' ports
//! (map `lmperf_ports`); here the same set decides the roles: when the remote port is a
//! target port, the socket is a client's (such as the canary's) and the remote end is the
//! server; else the local port is one, and the socket is the server's end.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

/// Which end of the connection the reporting socket is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}

/// The target ports to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFilter {
    ports: BTreeSet<u16>,
}

impl PortFilter {
    pub fn new(ports: impl IntoIterator<Item = u16>) -> Self {
        Self {
            ports: ports.into_iter().filter(|p| *p != 0).collect(),
        }
    }

    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports.iter().copied()
    }

    /// Adds `port` (a target started after load); true when it is new.
    pub fn insert(&mut self, port: u16) -> bool {
        port != 0 && self.ports.insert(port)
    }

    /// The reporting socket's side and the server's address, or `None` when neither port is
    /// a target's.
    pub fn classify(&self, local: SocketAddr, remote: SocketAddr) -> Option<(Side, SocketAddr)> {
        if self.ports.contains(&remote.port()) {
            Some((Side::Client, remote))
        } else if self.ports.contains(&local.port()) {
            Some((Side::Server, local))
        } else {
            None
        }
    }
}

/// Bounds the `server.address` values of the metrics: the first [`Self::MAX`] addresses are
/// kept, later ones become [`Self::OTHER`].
#[derive(Debug, Default)]
pub struct AddressCap {
    seen: BTreeSet<IpAddr>,
}

impl AddressCap {
    pub const MAX: usize = 32;
    pub const OTHER: &'static str = "_other";

    pub fn label(&mut self, ip: IpAddr) -> String {
        if self.seen.contains(&ip) || self.seen.len() < Self::MAX {
            self.seen.insert(ip);
            ip.to_string()
        } else {
            Self::OTHER.to_owned()
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
    fn the_end_on_a_target_port_is_the_server() {
        let f = PortFilter::new([8000, 0]);
        assert_eq!(f.ports().collect::<Vec<_>>(), vec![8000]);
        assert_eq!(
            f.classify(a("10.0.0.1:40000"), a("10.0.0.2:8000")),
            Some((Side::Client, a("10.0.0.2:8000")))
        );
        assert_eq!(
            f.classify(a("10.0.0.2:8000"), a("10.0.0.1:40000")),
            Some((Side::Server, a("10.0.0.2:8000")))
        );
        assert_eq!(f.classify(a("10.0.0.1:40000"), a("10.0.0.2:9000")), None);
    }

    #[test]
    fn addresses_beyond_the_cap_are_other() {
        let mut cap = AddressCap::default();
        for i in 0..AddressCap::MAX {
            assert_eq!(
                cap.label(IpAddr::from([10, 0, 0, i as u8])),
                format!("10.0.0.{i}")
            );
        }
        assert_eq!(cap.label(IpAddr::from([10, 0, 1, 0])), AddressCap::OTHER);
        assert_eq!(cap.label(IpAddr::from([10, 0, 0, 3])), "10.0.0.3");
    }
}
