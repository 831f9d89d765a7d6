//! Network namespaces the test creates, and a delay link between two of them (as root).
//!
//! `tc netem` is not in every kernel (not in this project's CI kernel: "unknown qdisc"), and a
//! userspace TCP proxy would ACK for the server and hide the delay from the client's kernel.
//! [`DelayLink`] is a real L3 link instead: one TUN device in each of two namespaces, and a
//! forwarder in the test process that holds every IP packet for `one_way` before writing it to
//! the other side. The kernels at both ends see the delay in their TCP RTT.
//!
//! **Definition:** the link adds `one_way` to each direction, so the round trip grows by
//! `2 × one_way` (a link built with `DelayLink::new(10 ms)` is a 20 ms RTT link, as
//! `tc netem delay 20ms` on one end's interface would be). Each packet is held at least
//! `one_way` (a sleep until its deadline at real-time priority; overshoot is the
//! scheduler's, tens of µs).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A named network namespace (`ip netns add`), deleted when dropped.
pub struct Netns {
    pub name: String,
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn enter(name: &str) -> io::Result<()> {
    let f = std::fs::File::open(format!("/run/netns/{name}"))?;
    // SAFETY: a valid namespace fd; setns only changes this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Netns {
    /// Creates `lmperf-PID-N-suffix` with its loopback up. Needs CAP_SYS_ADMIN.
    pub fn create(suffix: &str) -> io::Result<Netns> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "lmperf-{}-{}-{suffix}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        ip(&["netns", "add", &name])?;
        let ns = Netns { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Moves the calling thread into this namespace (sockets it opens and processes and
    /// threads it starts from now on live there).
    pub fn enter(&self) -> io::Result<()> {
        enter(&self.name)
    }

    /// Runs `f` on a new thread inside this namespace and waits for it.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                self.enter().expect("enter the namespace");
                f()
            })
            .join()
            .expect("thread in namespace panicked")
        })
    }

    /// Starts `f` on a new thread inside this namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let name = self.name.clone();
        std::thread::spawn(move || {
            enter(&name).expect("enter the namespace");
            f()
        })
    }

    /// Opens a TUN device `name` (IP packets, no packet-info header) inside this namespace,
    /// brings it up with `addr/24`.
    fn tun(&self, name: &str, addr: Ipv4Addr) -> io::Result<OwnedFd> {
        let fd = self.run(|| -> io::Result<OwnedFd> {
            // SAFETY: plain open of a character device.
            let raw =
                unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            if raw < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: raw is a fresh fd we own.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // SAFETY: ifreq is plain data; zeroed is a valid value.
            let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
            for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
                *d = s as libc::c_char;
            }
            req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
            // SAFETY: TUNSETIFF reads and writes the ifreq we pass.
            if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(fd)
        })?;
        ip(&[
            "-n",
            &self.name,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            name,
        ])?;
        ip(&["-n", &self.name, "link", "set", name, "up"])?;
        Ok(fd)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Two namespaces joined by a TUN link that delays each packet by `one_way` in each direction
/// (see the module's definition). `a` is 10.77.0.1, `b` is 10.77.0.2.
pub struct DelayLink {
    pub a: Netns,
    pub b: Netns,
    pub addr_a: Ipv4Addr,
    pub addr_b: Ipv4Addr,
    /// The delay the link was built with ([`DelayLink::set_one_way`] changes the live one).
    pub one_way: Duration,
    /// The delay each direction adds now, ns.
    delay_ns: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl DelayLink {
    /// Builds the link. Needs root (CAP_SYS_ADMIN for the namespaces, CAP_NET_ADMIN for TUN).
    pub fn new(one_way: Duration) -> io::Result<DelayLink> {
        let (a, b) = (Netns::create("a")?, Netns::create("b")?);
        let (addr_a, addr_b) = (Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 0, 2));
        let tun_a = Arc::new(a.tun("lmtun0", addr_a)?);
        let tun_b = Arc::new(b.tun("lmtun0", addr_b)?);
        let stop = Arc::new(AtomicBool::new(false));
        let delay_ns = Arc::new(AtomicU64::new(one_way.as_nanos() as u64));
        let mut threads = Vec::new();
        for (from, to) in [(tun_a.clone(), tun_b.clone()), (tun_b, tun_a)] {
            let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
            let s = stop.clone();
            let d = delay_ns.clone();
            threads.push(std::thread::spawn(move || read_packets(&from, &tx, &d, &s)));
            let s = stop.clone();
            threads.push(std::thread::spawn(move || write_packets(&to, &rx, &s)));
        }
        Ok(DelayLink {
            a,
            b,
            addr_a,
            addr_b,
            one_way,
            delay_ns,
            stop,
            threads,
        })
    }

    /// Changes the delay of each direction from the next packet on (packets already held keep
    /// theirs, so a packet may overtake an older one when the delay falls).
    pub fn set_one_way(&self, one_way: Duration) {
        self.delay_ns
            .store(one_way.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// Runs the calling thread at a real-time priority (SCHED_FIFO 10, as root), so that a busy
/// machine (parallel builds) does not stretch the delay (the forwarder) or a peer's ACKs (a
/// server whose response carries the ACK); best effort.
pub fn realtime() {
    let p = libc::sched_param { sched_priority: 10 };
    // SAFETY: pid 0 is the calling thread; p is valid for reading.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
}

fn read_packets(
    fd: &OwnedFd,
    tx: &mpsc::Sender<(Instant, Vec<u8>)>,
    delay_ns: &AtomicU64,
    stop: &AtomicBool,
) {
    realtime();
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, 50) } <= 0 {
            continue;
        }
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let delay = Duration::from_nanos(delay_ns.load(Ordering::Relaxed));
        if n > 0
            && tx
                .send((Instant::now() + delay, buf[..n as usize].to_vec()))
                .is_err()
        {
            return;
        }
    }
}

fn write_packets(fd: &OwnedFd, rx: &mpsc::Receiver<(Instant, Vec<u8>)>, stop: &AtomicBool) {
    realtime();
    while !stop.load(Ordering::Relaxed) {
        let Ok((due, packet)) = rx.recv_timeout(Duration::from_millis(50)) else {
            continue;
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        // SAFETY: packet is valid for its length; a TUN write takes one whole IP packet.
        unsafe { libc::write(fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
    }
}

impl Drop for DelayLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
