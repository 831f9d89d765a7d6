//! The model server's cgroup: CPU throttling (CFS quota) and memory, cgroup v2 and v1.
//!
//! Found from the target's process (`/proc/PID/cgroup`, plain host) or its pod uid
//! (Kubernetes: the `kubepods` hierarchy under a read-only hostPath `/sys/fs/cgroup`). Files
//! (kernel `Documentation/admin-guide/cgroup-v2.rst`, v1 `cgroup-v1/{cpu,memory}.rst`):
//! - v2: `cpu.stat` `nr_periods`, `nr_throttled`, `throttled_usec`; `memory.current`,
//!   `memory.max` (`max`: no limit), `memory.events` `oom_kill`;
//! - v1: `cpu,cpuacct/cpu.stat` (or `cpu/`) `nr_periods`, `nr_throttled`, `throttled_time` (ns);
//!   `memory/memory.usage_in_bytes`, `memory.limit_in_bytes` (a page-rounded 2⁶³: no limit),
//!   `memory.oom_control` `oom_kill` (kernel ≥ 4.13).
//!
//! Every value is `None` when its file cannot be read: absent, never 0.

use std::path::{Path, PathBuf};

/// Where a process's (or pod's) cgroup lives, per controller; absolute paths.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CgroupDirs {
    /// The cgroup v2 directory (unified hierarchy).
    pub unified: Option<PathBuf>,
    /// The v1 `cpu` controller's directory.
    pub cpu_v1: Option<PathBuf>,
    /// The v1 `memory` controller's directory.
    pub memory_v1: Option<PathBuf>,
}

impl CgroupDirs {
    pub fn is_empty(&self) -> bool {
        self.unified.is_none() && self.cpu_v1.is_none() && self.memory_v1.is_none()
    }
}

/// The cgroup paths of a `/proc/PID/cgroup` text, resolved under `root` (`/sys/fs/cgroup`):
/// `0::/p` → `root/p` (or `root/unified/p` on a hybrid host; a v2 directory, one that holds
/// `cgroup.controllers`); `N:cpu,cpuacct:/p` →
/// `root/cpu,cpuacct/p` (or `root/cpu/p`); `N:memory:/p` → `root/memory/p`. Only
/// directories that exist are kept.
pub fn dirs_of(cgroup: &str, root: &Path) -> CgroupDirs {
    let mut out = CgroupDirs::default();
    let rel = |p: &str| p.trim_start_matches('/').to_owned();
    let first_dir = |cands: Vec<PathBuf>| cands.into_iter().find(|p| p.is_dir());
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let p = rel(path);
        if ctrls.is_empty() {
            // A v2 cgroup directory holds `cgroup.controllers`; on a hybrid host `root` itself
            // is a tmpfs of v1 hierarchies and the v2 one is mounted at `root/unified`.
            out.unified = [root.join(&p), root.join("unified").join(&p)]
                .into_iter()
                .find(|d| d.join("cgroup.controllers").is_file());
            continue;
        }
        let ctrls: Vec<&str> = ctrls.split(',').collect();
        if ctrls.contains(&"cpu") {
            out.cpu_v1 = first_dir(vec![
                root.join(ctrls.join(",")).join(&p),
                root.join("cpu,cpuacct").join(&p),
                root.join("cpu").join(&p),
            ]);
        }
        if ctrls.contains(&"memory") {
            out.memory_v1 = first_dir(vec![root.join("memory").join(&p)]);
        }
    }
    out
}

/// The cgroup of process `pid` (`<proc_root>/PID/cgroup`) under `root`.
pub fn dirs_of_pid(proc_root: &Path, pid: u32, root: &Path) -> CgroupDirs {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup"))
        .map(|t| dirs_of(&t, root))
        .unwrap_or_default()
}

/// Whether a cgroup directory name is the pod's: `pod<uid>` (cgroupfs driver) or
/// `kubepods-<qos>-pod<uid with _>.slice` (systemd driver).
pub fn is_pod_dir(name: &str, pod_uid: &str) -> bool {
    if pod_uid.is_empty() {
        return false;
    }
    let under = pod_uid.replace('-', "_");
    name == format!("pod{pod_uid}")
        || name.ends_with(&format!("-pod{under}.slice"))
        || name.ends_with(&format!("-pod{pod_uid}.slice"))
}

/// Directories looked at below a hierarchy root when searching for a pod (bounded).
const MAX_SEARCH_DIRS: usize = 20_000;

/// The pod's directory in the hierarchy rooted at `root` (a `kubepods` tree at most 4 levels
/// down: `kubepods[.slice]/<qos>/pod…`), `None` when not found.
fn find_pod(root: &Path, pod_uid: &str) -> Option<PathBuf> {
    let mut frontier = vec![(root.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = frontier.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > MAX_SEARCH_DIRS {
                return None;
            }
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if is_pod_dir(name, pod_uid) {
                return Some(e.path());
            }
            // Only the kubepods tree (below a top-level `kubepods*` directory or slice) is
            // walked, whole, to 4 levels.
            let enter = if depth == 0 {
                name.starts_with("kubepods") || name.ends_with(".slice")
            } else {
                true
            };
            if depth < 4 && enter {
                frontier.push((e.path(), depth + 1));
            }
        }
    }
    None
}

/// The pod's cgroup directories under `root` (`/sys/fs/cgroup`), by its uid.
pub fn dirs_of_pod(root: &Path, pod_uid: &str) -> CgroupDirs {
    let unified_root = if root.join("cgroup.controllers").is_file() {
        Some(root.to_path_buf())
    } else {
        Some(root.join("unified")).filter(|p| p.join("cgroup.controllers").is_file())
    };
    CgroupDirs {
        unified: unified_root.and_then(|r| find_pod(&r, pod_uid)),
        cpu_v1: ["cpu,cpuacct", "cpu"]
            .iter()
            .map(|c| root.join(c))
            .find(|p| p.is_dir())
            .and_then(|r| find_pod(&r, pod_uid)),
        memory_v1: Some(root.join("memory"))
            .filter(|p| p.is_dir())
            .and_then(|r| find_pod(&r, pod_uid)),
    }
}

/// CFS bandwidth counters of a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuStat {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    /// Time throttled, µs (v1's `throttled_time` is ns, converted).
    pub throttled_us: u64,
}

/// Parses a `cpu.stat` (v2 `throttled_usec`, v1 `throttled_time` in ns); `None` without
/// `nr_periods` (no CFS bandwidth accounting).
pub fn parse_cpu_stat(text: &str) -> Option<CpuStat> {
    let mut s = CpuStat::default();
    let mut periods = false;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(' ') else {
            continue;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            continue;
        };
        match k {
            "nr_periods" => {
                s.nr_periods = v;
                periods = true;
            }
            "nr_throttled" => s.nr_throttled = v,
            "throttled_usec" => s.throttled_us = v,
            "throttled_time" => s.throttled_us = v / 1000,
            _ => {}
        }
    }
    periods.then_some(s)
}

/// The value of `key` in a flat keyed file (`memory.events`, `memory.oom_control`).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A v1 `limit_in_bytes` at or above this is "no limit" (the kernel writes 2⁶³ rounded down
/// to a page).
const V1_UNLIMITED: u64 = 1 << 62;

/// One reading of a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupReading {
    pub cpu: Option<CpuStat>,
    pub memory_bytes: Option<u64>,
    /// `None` without a limit, or unreadable.
    pub memory_limit_bytes: Option<u64>,
    /// OOM kills in the cgroup since it was created.
    pub oom_kills: Option<u64>,
}

/// Reads the cgroup at `dirs`: v2 where there is a unified directory, v1 otherwise.
pub fn read(dirs: &CgroupDirs) -> CgroupReading {
    let text = |d: &Option<PathBuf>, f: &str| {
        d.as_ref()
            .and_then(|d| std::fs::read_to_string(d.join(f)).ok())
    };
    let num = |t: Option<String>| t.and_then(|t| t.trim().parse::<u64>().ok());
    let mut r = CgroupReading::default();
    if dirs.unified.is_some() {
        r.cpu = text(&dirs.unified, "cpu.stat").and_then(|t| parse_cpu_stat(&t));
        r.memory_bytes = num(text(&dirs.unified, "memory.current"));
        r.memory_limit_bytes = num(text(&dirs.unified, "memory.max"));
        r.oom_kills = text(&dirs.unified, "memory.events").and_then(|t| keyed(&t, "oom_kill"));
    }
    if r.cpu.is_none() {
        r.cpu = text(&dirs.cpu_v1, "cpu.stat").and_then(|t| parse_cpu_stat(&t));
    }
    if r.memory_bytes.is_none() {
        r.memory_bytes = num(text(&dirs.memory_v1, "memory.usage_in_bytes"));
        r.memory_limit_bytes =
            num(text(&dirs.memory_v1, "memory.limit_in_bytes")).filter(|&l| l < V1_UNLIMITED);
        r.oom_kills =
            text(&dirs.memory_v1, "memory.oom_control").and_then(|t| keyed(&t, "oom_kill"));
    }
    r
}

/// The share of CFS periods throttled between two readings (0..1); `None` without periods in
/// between or a counter that went back (a new cgroup).
pub fn throttled_share(prev: &CpuStat, cur: &CpuStat) -> Option<f64> {
    let periods = cur.nr_periods.checked_sub(prev.nr_periods)?;
    let throttled = cur.nr_throttled.checked_sub(prev.nr_throttled)?;
    (periods > 0).then(|| (throttled as f64 / periods as f64).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_v2_and_v1() {
        let v2 = parse_cpu_stat(
            "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 50\nnr_throttled 20\nthrottled_usec 123456\n",
        )
        .unwrap();
        assert_eq!(
            v2,
            CpuStat {
                nr_periods: 50,
                nr_throttled: 20,
                throttled_us: 123_456
            }
        );
        let v1 = parse_cpu_stat("nr_periods 10\nnr_throttled 5\nthrottled_time 7000000\n").unwrap();
        assert_eq!(v1.throttled_us, 7000);
        // No CFS quota accounting: no reading (absent, not 0).
        assert_eq!(parse_cpu_stat("usage_usec 5\n"), None);
        let share = throttled_share(
            &CpuStat {
                nr_periods: 100,
                nr_throttled: 10,
                throttled_us: 0,
            },
            &CpuStat {
                nr_periods: 200,
                nr_throttled: 40,
                throttled_us: 0,
            },
        );
        assert_eq!(share, Some(0.3));
        assert_eq!(throttled_share(&v2, &v2), None);
    }

    #[test]
    fn keyed_files_and_pod_dir_names() {
        assert_eq!(
            keyed("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n", "oom_kill"),
            Some(2)
        );
        assert_eq!(keyed("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"), None);
        let uid = "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab";
        assert!(is_pod_dir(&format!("pod{uid}"), uid));
        assert!(is_pod_dir(
            "kubepods-burstable-pod1b2c3d4e_aaaa_bbbb_cccc_0123456789ab.slice",
            uid
        ));
        assert!(!is_pod_dir("pod-other", uid));
        assert!(!is_pod_dir("podx", ""));
    }

    #[test]
    fn dirs_and_readings_from_a_fake_hierarchy() {
        let tmp = std::env::temp_dir().join(format!("lmperf-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        // A v1 host: cpu,cpuacct and memory controllers, a pod under kubepods/burstable.
        let uid = "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab";
        let cpu = tmp.join(format!("cpu,cpuacct/kubepods/burstable/pod{uid}"));
        let mem = tmp.join(format!("memory/kubepods/burstable/pod{uid}"));
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::create_dir_all(&mem).unwrap();
        std::fs::write(
            cpu.join("cpu.stat"),
            "nr_periods 10\nnr_throttled 4\nthrottled_time 5000\n",
        )
        .unwrap();
        std::fs::write(mem.join("memory.usage_in_bytes"), "1000\n").unwrap();
        std::fs::write(mem.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        let d = dirs_of_pod(&tmp, uid);
        assert_eq!(d.cpu_v1.as_deref(), Some(cpu.as_path()));
        assert_eq!(d.memory_v1.as_deref(), Some(mem.as_path()));
        assert_eq!(d.unified, None);
        let r = read(&d);
        assert_eq!(
            r.cpu
                .map(|c| (c.nr_periods, c.nr_throttled, c.throttled_us)),
            Some((10, 4, 5))
        );
        assert_eq!(
            (r.memory_bytes, r.memory_limit_bytes, r.oom_kills),
            (Some(1000), None, Some(1))
        );
        // The same from a process's /proc/PID/cgroup.
        let by_pid = dirs_of(
            &format!(
                "12:memory:/kubepods/burstable/pod{uid}\n4:cpu,cpuacct:/kubepods/burstable/pod{uid}\n"
            ),
            &tmp,
        );
        assert_eq!(by_pid, d);
        // A hybrid host: `root` is the tmpfs of the v1 hierarchies, not a v2 cgroup; the v2
        // one is `root/unified` (it holds `cgroup.controllers`).
        assert_eq!(dirs_of("0::/\n", &tmp).unified, None);
        std::fs::create_dir_all(tmp.join("unified")).unwrap();
        std::fs::write(tmp.join("unified/cgroup.controllers"), "cpu memory\n").unwrap();
        assert_eq!(dirs_of("0::/\n", &tmp).unified, Some(tmp.join("unified/")));
        // Nothing readable: every field absent.
        assert_eq!(read(&CgroupDirs::default()), CgroupReading::default());
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
