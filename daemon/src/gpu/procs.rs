//! Who a GPU process is: `/proc/PID/comm`, `/proc/PID/cmdline` and the container id in
//! `/proc/PID/cgroup`, so a user sees "vllm on GPU 0 holds 71 GB". A PID not visible here
//! (another PID namespace, gone) gives empty fields, never an error.

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
    let executable = std::fs::read_to_string(dir.join("comm")).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    let command = std::fs::read(dir.join("cmdline")).ok().and_then(|b| command_line(&b));
    let container_id = std::fs::read_to_string(dir.join("cgroup")).ok().and_then(|t| container_id(&t));
    ProcInfo { executable, command, container_id }
}

/// `a\0b\0` → `a b`, cut at [`MAX_COMMAND`] bytes on a character boundary.
pub fn command_line(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let mut s = text.split('\0').filter(|a| !a.is_empty()).collect::<Vec<_>>().join(" ");
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
mod tests {
    use super::*;

    const ID: &str = "3f1c2a9b8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170f6e5d4c";

    #[test]
    fn container_id_from_docker_k8s_and_cgroup_v1() {
        assert_eq!(container_id(&format!("0::/system.slice/docker-{ID}.scope\n")).as_deref(), Some(ID));
        assert_eq!(
            container_id(&format!("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope\n")).as_deref(),
            Some(ID)
        );
        assert_eq!(container_id(&format!("12:memory:/docker/{ID}\n11:cpu:/docker/{ID}\n")).as_deref(), Some(ID));
        assert_eq!(container_id("0::/user.slice/user-1000.slice/session-3.scope\n"), None);
    }

    #[test]
    fn command_line_joins_and_bounds() {
        assert_eq!(command_line(b"python3\0-m\0vllm.entrypoints.openai.api_server\0").as_deref(), Some("python3 -m vllm.entrypoints.openai.api_server"));
        assert_eq!(command_line(b""), None);
        let long = "é".repeat(200);
        let c = command_line(long.as_bytes()).unwrap();
        assert!(c.len() <= MAX_COMMAND && c.chars().all(|ch| ch == 'é'));
    }

    #[test]
    fn reads_this_process() {
        let me = read(Path::new("/proc"), std::process::id());
        assert!(me.command.is_some() && me.executable.is_some(), "{me:?}");
        assert_eq!(read(Path::new("/proc"), u32::MAX), ProcInfo::default());
    }
}
