//! Who a GPU process is: `/proc/PID/comm`, `/proc/PID/cmdline` and the container id in
//! `/proc/PID/cgroup`, so a user sees "vllm on GPU 0 holds 71 GB"; and whether it is a
//! target's model server ([`serves_port`]). A PID not visible here (another PID namespace,
//! gone) gives empty fields, never an error.

use std::collections::HashMap;
use std::path::Path;

/// Bytes of the command line kept.
pub const MAX_COMMAND: usize = 256;

/// What `/proc` says about a process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcInfo {
    /// `/proc/PID/comm` (`process.executable.name`).
    pub executable: Option<String>,
    /// `/proc/PID/cmdline`, NUL-separated arguments joined by spaces, at most [`MAX_COMMAND`] bytes.
    pub command: Option<String>,
    /// `container.id`: the 64-hex id of a Docker/containerd/CRI-O cgroup path.
    pub container_id: Option<String>,
}

/// Reads process `pid` under `proc_root` (normally `/proc`).
pub fn read(proc_root: &Path, pid: u32) -> ProcInfo {
    let dir = proc_root.join(pid.to_string());
    let executable = std::fs::read_to_string(dir.join("comm"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    let command = std::fs::read(dir.join("cmdline"))
        .ok()
        .and_then(|b| command_line(&b));
    let container_id = std::fs::read_to_string(dir.join("cgroup"))
        .ok()
        .and_then(|t| container_id(&t));
    ProcInfo {
        executable,
        command,
        container_id,
    }
}

/// Parents looked at above a GPU process for the listening socket (vLLM's API server is the
/// parent or grandparent of its GPU workers).
pub const MAX_ANCESTORS: usize = 8;

/// The port of `ports` that process `pid` serves: the TCP port a listening socket held by it,
/// or by one of its [`MAX_ANCESTORS`] nearest ancestors, is bound to, as that process's own
/// network namespace shows it (`/proc/PID/net/tcp` and `tcp6`, state `0A` LISTEN, matched to
/// `/proc/PID/fd` links `socket:[INODE]`). Where `fd` cannot be read (another user's process:
/// the agent has dropped its capabilities), a listening socket in the process's network
/// namespace owned by the process's uid (`/proc/PID/status` `Uid`) counts. The local address
/// is not compared: a server in a pod listens on `0.0.0.0:8000` while the agent reaches it at
/// the pod's IP. `None` when no such socket is found or `/proc` cannot be read there (another
/// PID namespace, gone).
pub fn serves_port(proc_root: &Path, pid: u32, ports: &[u16]) -> Option<u16> {
    if ports.is_empty() {
        return None;
    }
    let mut p = pid;
    for _ in 0..=MAX_ANCESTORS {
        if let Some(port) = listens_on(proc_root, p, ports) {
            return Some(port);
        }
        p = parent(proc_root, p).filter(|pp| *pp > 1)?;
    }
    None
}

/// A port of `ports` that a listening socket held by `pid` itself is bound to.
fn listens_on(proc_root: &Path, pid: u32, ports: &[u16]) -> Option<u16> {
    let dir = proc_root.join(pid.to_string());
    let mut listening: HashMap<u64, (u16, u32)> = HashMap::new();
    for table in ["net/tcp", "net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(dir.join(table)) {
            listening
                .extend(listening_sockets(&text).filter(|(_, (port, _))| ports.contains(port)));
        }
    }
    if listening.is_empty() {
        return None;
    }
    match std::fs::read_dir(dir.join("fd")) {
        Ok(fds) => fds.flatten().find_map(|e| {
            let link = std::fs::read_link(e.path()).ok()?;
            let inode: u64 = link
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()?;
            listening.get(&inode).map(|(port, _)| *port)
        }),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let uid = uid(proc_root, pid)?;
            listening
                .values()
                .find(|(_, owner)| *owner == uid)
                .map(|(port, _)| *port)
        }
        Err(_) => None,
    }
}

/// The real uid of `pid` (`/proc/PID/status` `Uid:` first value).
fn uid(proc_root: &Path, pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `(inode, (local port, owner uid))` of the LISTEN sockets of a `/proc/net/tcp` or `tcp6`
/// table (`sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode`,
/// addresses `HEXIP:HEXPORT`, state `0A`).
pub fn listening_sockets(table: &str) -> impl Iterator<Item = (u64, (u16, u32))> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(3) != Some(&"0A") {
            return None;
        }
        let port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
        let uid = f.get(7)?.parse().ok()?;
        let inode = f.get(9)?.parse().ok()?;
        Some((inode, (port, uid)))
    })
}

/// The parent pid of `pid` (`/proc/PID/stat`, the field after the state, past the `(comm)`
/// that may hold spaces and parentheses).
fn parent(proc_root: &Path, pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `a\0b\0` → `a b`, cut at [`MAX_COMMAND`] bytes on a character boundary.
pub fn command_line(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let mut s = text
        .split('\0')
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if s.len() > MAX_COMMAND {
        let mut cut = MAX_COMMAND;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    (!s.is_empty()).then_some(s)
}

/// The container id in a `/proc/PID/cgroup` text: the last path segment holding 64 hex
/// digits, with runtime prefixes (`docker-`, `cri-containerd-`, `crio-`) and `.scope` removed.
pub fn container_id(cgroup: &str) -> Option<String> {
    cgroup
        .lines()
        .filter_map(|l| l.rsplit(':').next())
        .flat_map(|path| path.split('/').rev())
        .map(|seg| seg.trim_end_matches(".scope"))
        .map(|seg| seg.rsplit(['-', ':']).next().unwrap_or(seg))
        .find(|seg| seg.len() == 64 && seg.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    const ID: &str = "3f1c2a9b8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170f6e5d4c";

    #[test]
    fn container_id_from_docker_k8s_and_cgroup_v1() {
        assert_eq!(
            container_id(&format!("0::/system.slice/docker-{ID}.scope\n")).as_deref(),
            Some(ID)
        );
        assert_eq!(
            container_id(&format!(
                "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope\n"
            ))
            .as_deref(),
            Some(ID)
        );
        assert_eq!(
            container_id(&format!("12:memory:/docker/{ID}\n11:cpu:/docker/{ID}\n")).as_deref(),
            Some(ID)
        );
        assert_eq!(
            container_id("0::/user.slice/user-1000.slice/session-3.scope\n"),
            None
        );
    }

    #[test]
    fn command_line_joins_and_bounds() {
        assert_eq!(
            command_line(b"python3\0-m\0vllm.entrypoints.openai.api_server\0").as_deref(),
            Some("python3 -m vllm.entrypoints.openai.api_server")
        );
        assert_eq!(command_line(b""), None);
        let long = "é".repeat(200);
        let c = command_line(long.as_bytes()).unwrap();
        assert!(c.len() <= MAX_COMMAND && c.chars().all(|ch| ch == 'é'));
    }

    /// A fake `/proc`: `pid` with parent `ppid`, its `net/tcp` table and fd links.
    pub(crate) fn fake_proc(root: &Path, pid: u32, ppid: u32, tcp: &str, fds: &[&str]) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("net")).unwrap();
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (python3 (x)) S {ppid} {pid} 1 0"),
        )
        .unwrap();
        std::fs::write(dir.join("comm"), "python3\n").unwrap();
        std::fs::write(dir.join("net/tcp"), tcp).unwrap();
        for (i, target) in fds.iter().enumerate() {
            std::os::unix::fs::symlink(target, dir.join("fd").join(i.to_string())).unwrap();
        }
    }

    /// `/proc/net/tcp` with a LISTEN socket on 0.0.0.0:8000 (inode 4242) and an established
    /// connection from port 8000 (inode 4343).
    pub(crate) const TCP_8000: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0\n   1: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0000000000000000 20 4 30 10 -1\n";

    #[test]
    fn a_process_serves_a_port_when_it_or_an_ancestor_listens_there() {
        assert_eq!(
            listening_sockets(TCP_8000).collect::<Vec<_>>(),
            [(4242, (8000, 1000))]
        );
        let root = std::env::temp_dir().join(format!("lmperf-procs-serves-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // 100 listens on 8000 (vLLM's API server); 101 is its GPU worker; 102 a grandchild;
        // 200 only holds a connection from port 8000 (inode 4343), 300 listens on 9000 only.
        fake_proc(&root, 100, 1, TCP_8000, &["/dev/null", "socket:[4242]"]);
        fake_proc(&root, 101, 100, TCP_8000, &["socket:[999]"]);
        fake_proc(&root, 102, 101, TCP_8000, &[]);
        fake_proc(&root, 200, 1, TCP_8000, &["socket:[4343]"]);
        fake_proc(
            &root,
            300,
            1,
            &TCP_8000.replace("1F40 00000000:0000 0A", "2328 00000000:0000 0A"),
            &["socket:[4242]"],
        );
        for (pid, want) in [
            (100, Some(8000)),
            (101, Some(8000)),
            (102, Some(8000)),
            (200, None),
            (300, None),
            (999, None),
        ] {
            assert_eq!(serves_port(&root, pid, &[8000, 8080]), want, "pid {pid}");
        }
        assert_eq!(serves_port(&root, 300, &[9000]), Some(9000));
        assert_eq!(
            serves_port(&root, 100, &[]),
            None,
            "no target ports: none is the server"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn reads_this_process() {
        let me = read(Path::new("/proc"), std::process::id());
        assert!(me.command.is_some() && me.executable.is_some(), "{me:?}");
        assert_eq!(read(Path::new("/proc"), u32::MAX), ProcInfo::default());
    }
}
