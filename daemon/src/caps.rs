//! Drops every Linux capability once the agent has started.
//!
//! The agent needs capabilities only while starting: CAP_BPF (load programs, create maps)
//! and CAP_PERFMON (attach tracing programs) for the eBPF probes, and CAP_NET_BIND_SERVICE
//! if the admin port is below 1024. Once the probes are attached and the admin listener is
//! bound, nothing needs them: the probes stay attached through the file descriptors the
//! agent holds, the ring buffer is read through its memory map, and map reads on held
//! descriptors need no capability (kernel ≥ 6.5; on older kernels with
//! `kernel.unprivileged_bpf_disabled` set, the drop counter stops updating).
//!
//! [`drop_all`] empties the effective, permitted, inheritable and ambient sets and sets
//! `no_new_privs`, so that not even an `execve` (of a root-owned binary, as uid 0) gives them
//! back.

use std::io;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The effective set of this process (bit N = capability N), from `capget`.
///
/// # Errors
/// The `capget` error (none expected on Linux).
pub fn effective() -> io::Result<u64> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: version 3 takes one header and two data structs, both valid for writing.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

/// Empties every capability set of the process (all threads: the sets are per thread, so
/// this must run before other threads are started, or on each of them; see the call site)
/// and sets `no_new_privs`. Returns the effective set before the drop.
///
/// # Errors
/// The failing system call (`prctl` or `capset`) and its error.
pub fn drop_all() -> io::Result<u64> {
    let before = effective()?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::other(format!(
            "prctl(PR_SET_NO_NEW_PRIVS): {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: as above; EINVAL on kernels without ambient capabilities is ignored.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    let hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: version 3 takes one header and two data structs, both valid for reading.
    if unsafe { libc::syscall(libc::SYS_capset, &hdr, data.as_ptr()) } != 0 {
        return Err(io::Error::other(format!(
            "capset: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(before)
}
