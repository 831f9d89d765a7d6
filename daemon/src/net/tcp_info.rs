//! The fallback when the probes are not on: the kernel's `TCP_INFO` of the agent's own
//! connection to a target, read with `getsockopt` (no capability needed).
//!
//! The connection is the one that carried the request: its local and remote addresses come
//! from the HTTP client (hyper's `HttpInfo`); the socket is found among the process's file
//! descriptors (`/proc/self/fd`) by that exact pair. One reading at the end of the request
//! (the connection is then back in the keep-alive pool; a connection the server closed has
//! none).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// What `TCP_INFO` says of a connection at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpInfo {
    /// Smoothed RTT (`tcpi_rtt`, the kernel's srtt).
    pub srtt: Duration,
    /// RTT variation (`tcpi_rttvar`).
    pub rttvar: Duration,
    /// Segments retransmitted since the connection opened (`tcpi_total_retrans`).
    pub total_retrans: u32,
}

fn unmapped(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(a, |v4| SocketAddr::new(IpAddr::V4(v4), a.port())),
        IpAddr::V4(_) => a,
    }
}

fn sockaddr(fd: i32, peer: bool) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data; zeroed is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = (&raw mut ss).cast::<libc::sockaddr>();
    // SAFETY: ss and len are valid for writing; a non-socket fd fails with ENOTSOCK.
    let rc = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    if rc != 0 {
        return None;
    }
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in for AF_INET.
            let a: libc::sockaddr_in = unsafe { *(&raw const ss).cast() };
            Some(SocketAddr::new(
                IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes()),
                u16::from_be(a.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 for AF_INET6.
            let a: libc::sockaddr_in6 = unsafe { *(&raw const ss).cast() };
            Some(unmapped(SocketAddr::new(
                IpAddr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
            )))
        }
        _ => None,
    }
}

/// `TCP_INFO` of the socket `fd`.
///
/// # Errors
/// The `getsockopt` error (`ENOTSOCK`, `EOPNOTSUPP` for a non-TCP socket, ...).
pub fn read(fd: i32) -> io::Result<TcpInfo> {
    // SAFETY: tcp_info is plain data; zeroed is valid.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: ti and len are valid for writing; the kernel writes at most len bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut ti).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpInfo {
        srtt: Duration::from_micros(u64::from(ti.tcpi_rtt)),
        rttvar: Duration::from_micros(u64::from(ti.tcpi_rttvar)),
        total_retrans: ti.tcpi_total_retrans,
    })
}

/// `TCP_INFO` of this process's TCP socket from `local` to `remote`, if it is still open.
pub fn own_connection(local: SocketAddr, remote: SocketAddr) -> Option<TcpInfo> {
    let (local, remote) = (unmapped(local), unmapped(remote));
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|&fd| sockaddr(fd, false) == Some(local) && sockaddr(fd, true) == Some(remote))
        .and_then(|fd| read(fd).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn finds_its_own_loopback_connection_and_reads_its_rtt() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        for _ in 0..5 {
            c.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            s.write_all(b"y").unwrap();
            c.read_exact(&mut b).unwrap();
        }
        let info = own_connection(c.local_addr().unwrap(), c.peer_addr().unwrap())
            .expect("the client socket");
        assert!(
            info.srtt > Duration::ZERO && info.srtt < Duration::from_millis(50),
            "{info:?}"
        );
        assert_eq!(info.total_retrans, 0);
        // The server's end is the reverse pair; an unknown pair is none.
        assert!(own_connection(s.local_addr().unwrap(), s.peer_addr().unwrap()).is_some());
        assert_eq!(
            own_connection(c.local_addr().unwrap(), "127.0.0.1:1".parse().unwrap()),
            None
        );
        drop(c);
        assert!(read(0).is_err(), "stdin is no TCP socket");
    }
}
