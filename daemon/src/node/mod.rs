//! CPU and memory contention of the node and of each model server (issue 28): the agent-layer
//! readers of `/proc` and `/sys` whose values the diagnosis receives (the engine does no IO).
//!
//! - [`psi`]: node pressure, `/proc/pressure/{cpu,memory,io}` (PSI `some`/`full` avg10, total).
//! - [`cgroup`]: per model server, its cgroup's CFS throttling and memory (v2 and v1), found
//!   from the target's process (plain host: the process listening on the target's port) or its
//!   pod uid (Kubernetes: `TargetConfig.k8s`, a read-only hostPath `/sys/fs/cgroup`).
//! - [`cpu_wait`]: per model server, the seconds per second its threads waited for a CPU and
//!   its own CPU use (its threads' `schedstat`, or its cgroup's `cpu.pressure`): the server's
//!   view of a busy node, which the node's PSI loses once other work keeps it near 100 %.
//! - [`NodeSampler`]: one [`NodeSample`] a call (the agent: every second), with the agent's own
//!   CPU use so the diagnosis never blames the node for the agent.
//!
//! Everything unreadable is absent (`None`), never 0: no PSI in the kernel, no cgroup found, a
//! file the agent may not read.

pub mod cgroup;
pub mod cpu_wait;
pub mod psi;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::gpu::procs::listening_sockets;

/// Where a target's model server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTarget {
    pub name: String,
    /// The port it serves (found in `/proc` on a plain host).
    pub port: u16,
    /// The pod uid (Kubernetes); its cgroup is found by it.
    pub pod_uid: Option<String>,
}

/// The node targets of the agent's configured targets: a pod's by its uid; a plain host's by
/// the process listening on its port, only when the target is on this host (a loopback
/// address or `localhost`); a remote target gets none (its cgroup is not here).
pub fn targets_of(targets: &[crate::config::TargetConfig]) -> Vec<NodeTarget> {
    targets
        .iter()
        .filter_map(|t| {
            let pod_uid = t
                .k8s
                .as_ref()
                .map(|k| k.pod_uid.clone())
                .filter(|u| !u.is_empty());
            let local = t.host == "localhost"
                || t.host
                    .trim_matches(['[', ']'])
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            (pod_uid.is_some() || local).then(|| NodeTarget {
                name: t.name.clone(),
                port: t.port,
                pod_uid,
            })
        })
        .collect()
}

/// One target's cgroup values of a sample.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TargetContention {
    /// Share of CFS periods throttled since the previous sample (0..1).
    pub cpu_throttled_share: Option<f64>,
    /// `memory.current` ÷ `memory.max` (0..1); `None` without a limit.
    pub memory_usage_ratio: Option<f64>,
    /// OOM kills since the previous sample.
    pub oom_kills: Option<u64>,
    /// Seconds per second the server's threads waited for a CPU since the previous sample
    /// ([`cpu_wait`]).
    pub cpu_wait_s_per_s: Option<f64>,
    /// The server's CPU use since the previous sample, cores ([`cpu_wait`]).
    pub cpu_cores: Option<f64>,
}

/// One sample of the node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeSample {
    /// PSI `some` avg10 shares (0..1).
    pub cpu_some: Option<f64>,
    pub memory_some: Option<f64>,
    pub memory_full: Option<f64>,
    pub io_some: Option<f64>,
    /// The agent's own CPU use since the previous sample, cores.
    pub agent_cpu_cores: Option<f64>,
    pub targets: Vec<(String, TargetContention)>,
}

/// How often a target whose cgroup was not found is looked up again.
const RETRY: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Tracked {
    target: NodeTarget,
    dirs: cgroup::CgroupDirs,
    looked_up: Option<Instant>,
    prev: Option<cgroup::CgroupReading>,
    /// A plain host's server process and its `/proc/PID/cgroup` text when last resolved: a
    /// process moved to another cgroup (`systemd-run`, `cgclassify`, a runtime's update) is
    /// followed at the next sample.
    pid: Option<(u32, String)>,
}

/// Samples the node and the targets' cgroups; keeps the previous readings for the deltas.
#[derive(Debug)]
pub struct NodeSampler {
    proc_root: PathBuf,
    cgroup_root: PathBuf,
    targets: Vec<Tracked>,
    prev_self: Option<(Instant, f64)>,
    clk_tck: f64,
    /// One meter per source: targets served by one process or cgroup read it once a sample.
    meters: HashMap<cpu_wait::Source, cpu_wait::CpuWaitMeter>,
}

impl NodeSampler {
    /// For `targets`, reading `proc_root` (`/proc`) and `cgroup_root` (`/sys/fs/cgroup`).
    pub fn new(proc_root: &Path, cgroup_root: &Path, targets: Vec<NodeTarget>) -> Self {
        // SAFETY: sysconf has no preconditions; a negative answer falls back to 100 Hz.
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Self {
            proc_root: proc_root.to_path_buf(),
            cgroup_root: cgroup_root.to_path_buf(),
            targets: targets
                .into_iter()
                .map(|target| Tracked {
                    target,
                    dirs: cgroup::CgroupDirs::default(),
                    looked_up: None,
                    prev: None,
                    pid: None,
                })
                .collect(),
            prev_self: None,
            clk_tck: if tck > 0 { tck as f64 } else { 100.0 },
            meters: HashMap::new(),
        }
    }

    /// Seeds the plain-host targets' server processes found by [`pids_of`] (while the agent
    /// held its capabilities): their cgroups are resolved from `/proc/PID/cgroup`, readable
    /// without capabilities, and followed from then on. A target whose process is gone is
    /// looked up again by its port (which finds only processes the agent may still inspect).
    pub fn with_pids(mut self, pids: &[(String, u32)]) -> Self {
        for (name, pid) in pids {
            let Some(t) = self.targets.iter_mut().find(|t| {
                t.target.name == *name && t.target.pod_uid.as_deref().is_none_or(str::is_empty)
            }) else {
                continue;
            };
            if let Ok(text) =
                std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup"))
            {
                t.dirs = cgroup::dirs_of(&text, &self.cgroup_root);
                t.pid = Some((*pid, text));
            }
        }
        self
    }

    /// One sample at monotonic `now`.
    pub fn sample(&mut self, now: Instant) -> NodeSample {
        let p = psi::read(&self.proc_root);
        let mut out = NodeSample {
            cpu_some: p.cpu.and_then(|x| x.some).map(|l| l.avg10),
            memory_some: p.memory.and_then(|x| x.some).map(|l| l.avg10),
            memory_full: p.memory.and_then(|x| x.full).map(|l| l.avg10),
            io_some: p.io.and_then(|x| x.some).map(|l| l.avg10),
            agent_cpu_cores: None,
            targets: Vec::with_capacity(self.targets.len()),
        };
        if let Some(cpu_s) = self_cpu_s(&self.proc_root, self.clk_tck) {
            if let Some((at, prev)) = self.prev_self {
                let dt = now.saturating_duration_since(at).as_secs_f64();
                if dt > 0.0 && cpu_s >= prev {
                    out.agent_cpu_cores = Some((cpu_s - prev) / dt);
                }
            }
            self.prev_self = Some((now, cpu_s));
        }
        let (proc_root, cgroup_root) = (self.proc_root.clone(), self.cgroup_root.clone());
        // Per sample, each source and each cgroup is read once, however many targets share it.
        let mut waits: HashMap<cpu_wait::Source, Option<cpu_wait::CpuWait>> = HashMap::new();
        let mut cgroups: HashMap<cgroup::CgroupDirs, cgroup::CgroupReading> = HashMap::new();
        let mut pid_cgroups: HashMap<u32, Option<String>> = HashMap::new();
        for t in &mut self.targets {
            follow_process(t, &proc_root, &cgroup_root, &mut pid_cgroups);
            if t.dirs.is_empty() && t.looked_up.is_none_or(|at| now.duration_since(at) >= RETRY) {
                t.looked_up = Some(now);
                t.dirs = match &t.target.pod_uid {
                    Some(uid) if !uid.is_empty() => cgroup::dirs_of_pod(&cgroup_root, uid),
                    _ => pid_listening(&proc_root, t.target.port)
                        .and_then(|pid| {
                            let text = std::fs::read_to_string(
                                proc_root.join(pid.to_string()).join("cgroup"),
                            )
                            .ok()?;
                            let dirs = cgroup::dirs_of(&text, &cgroup_root);
                            t.pid = Some((pid, text));
                            Some(dirs)
                        })
                        .unwrap_or_default(),
                };
            }
            let wait = wait_source(t, &proc_root).and_then(|src| {
                *waits.entry(src.clone()).or_insert_with(|| {
                    self.meters
                        .entry(src.clone())
                        .or_default()
                        .sample(&proc_root, &src, now)
                })
            });
            if t.dirs.is_empty() {
                if wait.is_some() {
                    out.targets.push((
                        t.target.name.clone(),
                        TargetContention {
                            cpu_wait_s_per_s: wait.map(|w| w.wait_s_per_s),
                            cpu_cores: wait.and_then(|w| w.cpu_cores),
                            ..TargetContention::default()
                        },
                    ));
                }
                continue;
            }
            let cur = *cgroups
                .entry(t.dirs.clone())
                .or_insert_with(|| cgroup::read(&t.dirs));
            let c = TargetContention {
                cpu_wait_s_per_s: wait.map(|w| w.wait_s_per_s),
                cpu_cores: wait.and_then(|w| w.cpu_cores),
                cpu_throttled_share: match (t.prev.and_then(|p| p.cpu), cur.cpu) {
                    (Some(a), Some(b)) => cgroup::throttled_share(&a, &b),
                    _ => None,
                },
                memory_usage_ratio: match (cur.memory_bytes, cur.memory_limit_bytes) {
                    (Some(m), Some(l)) if l > 0 => Some((m as f64 / l as f64).min(1.0)),
                    _ => None,
                },
                oom_kills: match (t.prev.and_then(|p| p.oom_kills), cur.oom_kills) {
                    (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                    _ => None,
                },
            };
            if cur == cgroup::CgroupReading::default() {
                // The cgroup went away (a restart): look it up again next time.
                t.dirs = cgroup::CgroupDirs::default();
                t.looked_up = None;
            }
            t.prev = Some(cur);
            out.targets.push((t.target.name.clone(), c));
        }
        // A source no target reads any more (a restart, a removed target) is forgotten.
        self.meters.retain(|src, _| waits.contains_key(src));
        out
    }
}

/// Where the CPU wait of a target is read ([`cpu_wait::Source`]): a plain host's known server
/// process (its threads and its children's), else its cgroup v2 directory (`cpu.pressure`),
/// else its cgroup v1 `cpu` directory (a pod's threads); `None` without any.
fn wait_source(t: &Tracked, proc_root: &Path) -> Option<cpu_wait::Source> {
    if let Some((pid, _)) = &t.pid
        && proc_root.join(pid.to_string()).is_dir()
    {
        return Some(cpu_wait::Source::Pids(vec![*pid]));
    }
    if t.target.pod_uid.as_deref().is_none_or(str::is_empty) {
        // A plain host's cgroup without its process may hold the neighbour too.
        return None;
    }
    if let Some(d) = &t.dirs.unified
        && d.join("cpu.pressure").is_file()
    {
        return Some(cpu_wait::Source::CgroupV2(d.clone()));
    }
    t.dirs.cpu_v1.clone().map(cpu_wait::Source::CgroupV1)
}

/// A plain host's server process: when its `/proc/PID/cgroup` changed since the cgroup was
/// resolved (the process was moved), the cgroup is resolved again and its previous reading
/// dropped (another cgroup's counters); when the process is gone, the target is looked up again
/// by its port at the next sample. One small file read a process and sample: `read` holds
/// this sample's readings (`None`: the process is gone), shared by the targets of a process.
fn follow_process(
    t: &mut Tracked,
    proc_root: &Path,
    cgroup_root: &Path,
    read: &mut HashMap<u32, Option<String>>,
) {
    let Some((pid, text)) = &t.pid else {
        return;
    };
    let now = read
        .entry(*pid)
        .or_insert_with(|| {
            std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()
        })
        .clone();
    match now {
        Some(now) if now == *text => {}
        Some(now) => {
            t.dirs = cgroup::dirs_of(&now, cgroup_root);
            t.prev = None;
            t.pid = Some((*pid, now));
        }
        None => {
            t.pid = None;
            t.dirs = cgroup::CgroupDirs::default();
            t.looked_up = None;
            t.prev = None;
        }
    }
}

/// The agent's own CPU time, s (`/proc/self/stat` utime + stime, all threads).
fn self_cpu_s(proc_root: &Path, clk_tck: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(proc_root.join("self/stat")).ok()?;
    parse_stat_cpu_ticks(&stat).map(|t| t as f64 / clk_tck)
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line, in clock ticks. The command
/// (field 2) is in parentheses and may hold spaces: fields are counted after its last `)`.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ")": field 3 (state) is f[0], so field n is f[n - 3].
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The server process of each plain-host target (`pod_uid` none), by its port: (target name,
/// pid). Reading another process's `/proc/PID/fd` needs ptrace access (a root-owned server
/// with capabilities is out of reach of an agent that dropped its own), so the agent calls
/// this before dropping them.
pub fn pids_of(proc_root: &Path, targets: &[NodeTarget]) -> Vec<(String, u32)> {
    targets
        .iter()
        .filter(|t| t.pod_uid.as_deref().is_none_or(str::is_empty))
        .filter_map(|t| Some((t.name.clone(), pid_listening(proc_root, t.port)?)))
        .collect()
}

/// The process holding the LISTEN socket of `port` in the agent's network namespace
/// (`/proc/net/tcp{,6}`, then `/proc/*/fd` links `socket:[inode]`); `None` when not found.
pub fn pid_listening(proc_root: &Path, port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["net/tcp", "net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(proc_root.join(table)) {
            inodes.extend(
                listening_sockets(&text)
                    .filter(|(_, (p, _))| *p == port)
                    .map(|(inode, _)| inode),
            );
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let want: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for e in std::fs::read_dir(proc_root).ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path())
                && want.iter().any(|w| link.as_os_str() == w.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_ticks_after_a_command_with_spaces() {
        let stat =
            "1234 (lm perf) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 100 0 0";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(300));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn a_server_moved_to_another_cgroup_is_followed_and_a_gone_one_looked_up_again() {
        let tmp = std::env::temp_dir().join(format!("lmperf-node-follow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let (proc_root, cg) = (tmp.join("proc"), tmp.join("cgroup"));
        for (dir, throttled) in [("cpu", 0), ("cpu/capped", 40)] {
            std::fs::create_dir_all(cg.join(dir)).unwrap();
            std::fs::write(
                cg.join(dir).join("cpu.stat"),
                format!("nr_periods 100\nnr_throttled {throttled}\nthrottled_time 0\n"),
            )
            .unwrap();
        }
        std::fs::create_dir_all(proc_root.join("77")).unwrap();
        let at_root = "1:cpu:/\n";
        std::fs::write(proc_root.join("77/cgroup"), "1:cpu:/capped\n").unwrap();
        let mut t = Tracked {
            target: NodeTarget {
                name: "t0".into(),
                port: 8000,
                pod_uid: None,
            },
            dirs: cgroup::dirs_of(at_root, &cg),
            looked_up: Some(Instant::now()),
            prev: Some(cgroup::CgroupReading::default()),
            pid: Some((77, at_root.to_owned())),
        };
        assert_eq!(t.dirs.cpu_v1.as_deref(), Some(cg.join("cpu").as_path()));
        // Moved: the new cgroup, its counters from a fresh start.
        follow_process(&mut t, &proc_root, &cg, &mut HashMap::new());
        assert_eq!(
            t.dirs.cpu_v1.as_deref(),
            Some(cg.join("cpu/capped").as_path())
        );
        assert_eq!(t.prev, None);
        assert_eq!(cgroup::read(&t.dirs).cpu.map(|c| c.nr_throttled), Some(40));
        // Unchanged: kept as is.
        t.prev = Some(cgroup::read(&t.dirs));
        follow_process(&mut t, &proc_root, &cg, &mut HashMap::new());
        assert!(t.prev.is_some());
        // Seeded by pid (found while the agent held its capabilities): the cgroup's share of
        // throttled periods from the second sample on.
        // Its one thread's schedstat (time on a CPU, run_delay, ns): the CPU wait as a rate.
        let schedstat = proc_root.join("77/task/77/schedstat");
        std::fs::create_dir_all(schedstat.parent().unwrap()).unwrap();
        std::fs::write(&schedstat, "1000000000 2000000000 10\n").unwrap();
        let mut s = NodeSampler::new(&proc_root, &cg, vec![t.target.clone()])
            .with_pids(&[("t0".to_owned(), 77)]);
        let t1 = Instant::now();
        let a = s.sample(t1);
        assert_eq!(a.targets[0].1.cpu_throttled_share, None);
        assert_eq!(a.targets[0].1.cpu_wait_s_per_s, None);
        std::fs::write(
            cg.join("cpu/capped/cpu.stat"),
            "nr_periods 110\nnr_throttled 45\nthrottled_time 0\n",
        )
        .unwrap();
        std::fs::write(&schedstat, "1250000000 2750000000 20\n").unwrap();
        let b = s.sample(t1 + Duration::from_secs(1));
        assert_eq!(b.targets[0].1.cpu_throttled_share, Some(0.5));
        assert_eq!(b.targets[0].1.cpu_wait_s_per_s, Some(0.75));
        assert_eq!(b.targets[0].1.cpu_cores, Some(0.25));
        // Gone: looked up again by its port at the next sample.
        std::fs::remove_dir_all(proc_root.join("77")).unwrap();
        follow_process(&mut t, &proc_root, &cg, &mut HashMap::new());
        assert!(t.dirs.is_empty() && t.pid.is_none() && t.looked_up.is_none());
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn targets_served_by_one_process_share_one_meter() {
        let tmp = std::env::temp_dir().join(format!("lmperf-node-shared-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let (proc_root, cg) = (tmp.join("proc"), tmp.join("cgroup"));
        let schedstat = proc_root.join("55/task/55/schedstat");
        std::fs::create_dir_all(schedstat.parent().unwrap()).unwrap();
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(proc_root.join("55/cgroup"), "0::/\n").unwrap();
        std::fs::write(&schedstat, "0 0 1\n").unwrap();
        let targets: Vec<NodeTarget> = (0..3)
            .map(|i| NodeTarget {
                name: format!("m{i}"),
                port: 8000,
                pod_uid: None,
            })
            .collect();
        let pids: Vec<(String, u32)> = targets.iter().map(|t| (t.name.clone(), 55)).collect();
        let mut s = NodeSampler::new(&proc_root, &cg, targets).with_pids(&pids);
        let t0 = Instant::now();
        s.sample(t0);
        std::fs::write(&schedstat, "500000000 1500000000 9\n").unwrap();
        let b = s.sample(t0 + Duration::from_secs(1));
        let waits: Vec<Option<f64>> = b.targets.iter().map(|(_, c)| c.cpu_wait_s_per_s).collect();
        assert_eq!(waits, vec![Some(1.5); 3]);
        assert_eq!(s.meters.len(), 1);
        // Moved: every target of the process follows it, from one read of /proc/55/cgroup.
        std::fs::write(proc_root.join("55/cgroup"), "0::/moved\n").unwrap();
        s.sample(t0 + Duration::from_secs(2));
        let seen: Vec<Option<&str>> = s
            .targets
            .iter()
            .map(|t| t.pid.as_ref().map(|(_, text)| text.as_str()))
            .collect();
        assert_eq!(seen, vec![Some("0::/moved\n"); 3]);
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn the_agent_reads_its_own_cpu_and_an_absent_root_gives_nothing() {
        let mut s = NodeSampler::new(Path::new("/proc"), Path::new("/sys/fs/cgroup"), Vec::new());
        let t0 = Instant::now();
        s.sample(t0);
        // Burn a little CPU so the delta is positive.
        let mut x = 0u64;
        for i in 0..3_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        let b = s.sample(t0 + Duration::from_secs(1));
        assert!(b.agent_cpu_cores.is_some_and(|c| c >= 0.0), "{b:?}");
        let mut none = NodeSampler::new(
            Path::new("/nonexistent-proc"),
            Path::new("/nonexistent-cgroup"),
            vec![NodeTarget {
                name: "t".into(),
                port: 1,
                pod_uid: None,
            }],
        );
        let n = none.sample(t0);
        assert_eq!(n, NodeSample::default());
    }
}
