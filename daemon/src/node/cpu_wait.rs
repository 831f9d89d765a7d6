//! A model server's CPU wait (issue 28): the seconds per second its threads spent runnable but
//! not running, and its own CPU use, read each sample and turned into rates.
//!
//! The node's PSI says whether *some* task on the node waited for a CPU; on a node already busy
//! with other work it sits near 100 % and cannot rise when a neighbour starts spinning. What the
//! server suffers is its own threads' wait. Three sources, the first that reads:
//!
//! - [`Source::Pids`] (a plain host, the server's process known): the sum over the process, its
//!   descendants (`/proc/PID/task/TID/children`) and all their threads of
//!   `/proc/PID/task/TID/schedstat`: `<time on a CPU ns> <run_delay ns> <timeslices>`
//!   (the kernel's `Documentation/scheduler/sched-stats.rst`; readable without capabilities).
//!   Preferred to the cgroup's PSI: a plain host's cgroup may be a session scope shared with
//!   the very neighbour that spins, whose waits would count as the server's.
//! - [`Source::CgroupV2`] (a pod on cgroup v2): the pod cgroup's `cpu.pressure` `some` total
//!   (µs) and its `cpu.stat` `usage_usec`. `some` counts wall time in which at least one of its
//!   tasks waited: a lower bound of the threads' summed wait.
//! - [`Source::CgroupV1`] (a pod on cgroup v1, no PSI per cgroup): the threads listed in the
//!   `tasks` files of its `cpu` cgroup and the cgroups below, each `/proc/TID/schedstat`.
//!
//! CFS-throttled time counts as run delay too (a throttled cgroup's threads stay runnable): the
//! diagnosis tells the two apart by the cgroup's throttling. Counters are per thread: a thread
//! that ended drops out, one that started counts from 0. Unreadable is absent (`None`), never 0.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where a server's CPU wait is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The server's process (and its descendants), by pid.
    Pids(Vec<u32>),
    /// A cgroup v2 directory (`cpu.pressure`, `cpu.stat`).
    CgroupV2(PathBuf),
    /// A cgroup v1 `cpu` directory (its and its children's `tasks`).
    CgroupV1(PathBuf),
}

/// One rate of a server's CPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuWait {
    /// Seconds its threads waited for a CPU, per second (may exceed 1).
    pub wait_s_per_s: f64,
    /// Its CPU use, cores; `None` when the source does not say.
    pub cpu_cores: Option<f64>,
}

/// Processes of a server's tree followed, at most (a vLLM: an API server, an engine core and a
/// worker per GPU).
const MAX_PROCS: usize = 256;
/// Threads read a sample, at most.
const MAX_THREADS: usize = 8192;
/// Levels of a cgroup v1 tree below the pod's directory walked for `tasks` (pod → container).
const MAX_V1_DEPTH: usize = 3;

/// One reading of a source.
#[derive(Debug, Clone, PartialEq)]
enum Reading {
    /// Per thread id: (time on a CPU ns, run_delay ns).
    Threads(HashMap<u32, (u64, u64)>),
    /// A cgroup's `some` total and its CPU usage, µs.
    Cgroup { wait_us: u64, usage_us: Option<u64> },
}

/// Keeps the previous reading of one server for the rates.
#[derive(Debug, Default)]
pub struct CpuWaitMeter {
    prev: Option<(Instant, Source, Reading)>,
}

impl CpuWaitMeter {
    /// The rate since the previous sample of the same source at monotonic `now`; `None` at the
    /// first sample, after a change of source, or when nothing could be read.
    pub fn sample(&mut self, proc_root: &Path, source: &Source, now: Instant) -> Option<CpuWait> {
        let Some(cur) = read(proc_root, source) else {
            self.prev = None;
            return None;
        };
        let prev = self.prev.replace((now, source.clone(), cur.clone()));
        let (at, was, before) = prev?;
        if was != *source {
            return None;
        }
        let dt = now.checked_duration_since(at)?.as_secs_f64();
        if dt <= 0.0 {
            return None;
        }
        match (&before, &cur) {
            (Reading::Threads(b), Reading::Threads(c)) => {
                let (mut run_ns, mut wait_ns) = (0u64, 0u64);
                for (tid, &(run, wait)) in c {
                    let (r0, w0) = b.get(tid).copied().unwrap_or((0, 0));
                    // A counter that went back is a new thread with a reused id: from 0.
                    run_ns += if run >= r0 { run - r0 } else { run };
                    wait_ns += if wait >= w0 { wait - w0 } else { wait };
                }
                Some(CpuWait {
                    wait_s_per_s: wait_ns as f64 / 1e9 / dt,
                    cpu_cores: Some(run_ns as f64 / 1e9 / dt),
                })
            }
            (
                Reading::Cgroup {
                    wait_us: w0,
                    usage_us: u0,
                },
                Reading::Cgroup {
                    wait_us: w1,
                    usage_us: u1,
                },
            ) => {
                // A counter that went back: a new cgroup of the same path.
                let wait = w1.checked_sub(*w0)?;
                Some(CpuWait {
                    wait_s_per_s: wait as f64 / 1e6 / dt,
                    cpu_cores: match (u0, u1) {
                        (Some(a), Some(b)) => b.checked_sub(*a).map(|u| u as f64 / 1e6 / dt),
                        _ => None,
                    },
                })
            }
            _ => None,
        }
    }
}

/// Parses a `schedstat` line: (time on a CPU ns, run_delay ns).
pub fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace();
    let run = f.next()?.parse().ok()?;
    let wait = f.next()?.parse().ok()?;
    Some((run, wait))
}

fn read(proc_root: &Path, source: &Source) -> Option<Reading> {
    match source {
        Source::Pids(pids) => {
            let mut threads = HashMap::new();
            for pid in tree(proc_root, pids) {
                let Ok(rd) = std::fs::read_dir(proc_root.join(pid.to_string()).join("task")) else {
                    continue;
                };
                for e in rd.flatten() {
                    if threads.len() >= MAX_THREADS {
                        break;
                    }
                    let Some(tid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())
                    else {
                        continue;
                    };
                    if let Some(v) = std::fs::read_to_string(e.path().join("schedstat"))
                        .ok()
                        .and_then(|t| parse_schedstat(&t))
                    {
                        threads.insert(tid, v);
                    }
                }
            }
            (!threads.is_empty()).then_some(Reading::Threads(threads))
        }
        Source::CgroupV2(dir) => {
            let wait_us = std::fs::read_to_string(dir.join("cpu.pressure"))
                .ok()
                .and_then(|t| super::psi::parse(&t))
                .and_then(|p| p.some)?
                .total_us;
            let usage_us = std::fs::read_to_string(dir.join("cpu.stat"))
                .ok()
                .and_then(|t| super::cgroup::keyed(&t, "usage_usec"));
            Some(Reading::Cgroup { wait_us, usage_us })
        }
        Source::CgroupV1(dir) => {
            let mut threads = HashMap::new();
            let mut frontier = vec![(dir.clone(), 0usize)];
            while let Some((d, depth)) = frontier.pop() {
                if let Ok(text) = std::fs::read_to_string(d.join("tasks")) {
                    for tid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                        if threads.len() >= MAX_THREADS {
                            break;
                        }
                        if let Some(v) = std::fs::read_to_string(
                            proc_root.join(tid.to_string()).join("schedstat"),
                        )
                        .ok()
                        .and_then(|t| parse_schedstat(&t))
                        {
                            threads.insert(tid, v);
                        }
                    }
                }
                if depth < MAX_V1_DEPTH
                    && let Ok(rd) = std::fs::read_dir(&d)
                {
                    frontier.extend(
                        rd.flatten()
                            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                            .map(|e| (e.path(), depth + 1)),
                    );
                }
            }
            (!threads.is_empty()).then_some(Reading::Threads(threads))
        }
    }
}

/// `pids` and their descendants (`/proc/PID/task/TID/children`, Linux ≥ 3.5 with
/// `CONFIG_PROC_CHILDREN`; without it, `pids` alone), at most [`MAX_PROCS`].
fn tree(proc_root: &Path, pids: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    let mut frontier: Vec<u32> = pids.to_vec();
    while let Some(pid) = frontier.pop() {
        if out.len() >= MAX_PROCS || out.contains(&pid) {
            continue;
        }
        out.push(pid);
        let Ok(rd) = std::fs::read_dir(proc_root.join(pid.to_string()).join("task")) else {
            continue;
        };
        for e in rd.flatten() {
            if let Ok(text) = std::fs::read_to_string(e.path().join("children")) {
                frontier.extend(
                    text.split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn thread(proc_root: &Path, pid: u32, tid: u32, run_ns: u64, wait_ns: u64) {
        let d = proc_root.join(format!("{pid}/task/{tid}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("schedstat"), format!("{run_ns} {wait_ns} 42\n")).unwrap();
    }

    #[test]
    fn a_process_trees_threads_wait_summed_as_a_rate() {
        let tmp = std::env::temp_dir().join(format!("lmperf-cpuwait-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let proc_root = tmp.join("proc");
        // The server 10 (threads 10, 11) and its child 20 (thread 20).
        thread(&proc_root, 10, 10, 1_000_000_000, 100_000_000);
        thread(&proc_root, 10, 11, 500_000_000, 0);
        thread(&proc_root, 20, 20, 0, 0);
        std::fs::write(proc_root.join("10/task/10/children"), "20\n").unwrap();
        let src = Source::Pids(vec![10]);
        let mut m = CpuWaitMeter::default();
        let t0 = Instant::now();
        assert_eq!(m.sample(&proc_root, &src, t0), None, "no rate at the first");
        // 2 s later: 0.6 s more on a CPU, 1.5 s more waiting (thread 11 ended, 12 started).
        thread(&proc_root, 10, 10, 1_400_000_000, 900_000_000);
        std::fs::remove_dir_all(proc_root.join("10/task/11")).unwrap();
        thread(&proc_root, 10, 12, 100_000_000, 200_000_000);
        thread(&proc_root, 20, 20, 100_000_000, 500_000_000);
        let w = m
            .sample(&proc_root, &src, t0 + Duration::from_secs(2))
            .unwrap();
        assert!((w.wait_s_per_s - 0.75).abs() < 1e-9, "{w:?}");
        assert!((w.cpu_cores.unwrap() - 0.3).abs() < 1e-9, "{w:?}");
        // A changed source starts over; a gone process is absent, not 0.
        assert_eq!(
            m.sample(
                &proc_root,
                &Source::Pids(vec![20]),
                t0 + Duration::from_secs(3)
            ),
            None
        );
        std::fs::remove_dir_all(&proc_root).unwrap();
        assert_eq!(
            m.sample(&proc_root, &src, t0 + Duration::from_secs(4)),
            None
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn a_v2_cgroups_pressure_and_a_v1_cgroups_threads() {
        let tmp = std::env::temp_dir().join(format!("lmperf-cpuwait-cg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let (proc_root, v2, v1) = (tmp.join("proc"), tmp.join("v2/pod"), tmp.join("v1/pod"));
        std::fs::create_dir_all(&v2).unwrap();
        let write_v2 = |wait_us: u64, usage_us: u64| {
            std::fs::write(
                v2.join("cpu.pressure"),
                format!("some avg10=1.00 avg60=0.50 avg300=0.10 total={wait_us}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
            )
            .unwrap();
            std::fs::write(
                v2.join("cpu.stat"),
                format!("usage_usec {usage_us}\nuser_usec 0\nsystem_usec 0\n"),
            )
            .unwrap();
        };
        let t0 = Instant::now();
        let src = Source::CgroupV2(v2.clone());
        let mut m = CpuWaitMeter::default();
        write_v2(1_000_000, 5_000_000);
        assert_eq!(m.sample(&proc_root, &src, t0), None);
        write_v2(1_400_000, 5_800_000);
        let w = m
            .sample(&proc_root, &src, t0 + Duration::from_secs(1))
            .unwrap();
        assert!((w.wait_s_per_s - 0.4).abs() < 1e-9 && (w.cpu_cores.unwrap() - 0.8).abs() < 1e-9);
        // No cpu.pressure (a kernel without PSI): absent.
        std::fs::remove_file(v2.join("cpu.pressure")).unwrap();
        assert_eq!(
            m.sample(&proc_root, &src, t0 + Duration::from_secs(2)),
            None
        );
        // v1: the pod's container cgroup lists threads 7 and 8.
        std::fs::create_dir_all(v1.join("ctr")).unwrap();
        std::fs::write(v1.join("tasks"), "").unwrap();
        std::fs::write(v1.join("ctr/tasks"), "7\n8\n").unwrap();
        let one = |tid: u32, run: u64, wait: u64| {
            std::fs::create_dir_all(proc_root.join(tid.to_string())).unwrap();
            std::fs::write(
                proc_root.join(format!("{tid}/schedstat")),
                format!("{run} {wait} 1\n"),
            )
            .unwrap();
        };
        one(7, 0, 0);
        one(8, 0, 0);
        let src = Source::CgroupV1(v1.clone());
        assert_eq!(m.sample(&proc_root, &src, t0), None);
        one(7, 250_000_000, 1_000_000_000);
        one(8, 250_000_000, 1_000_000_000);
        let w = m
            .sample(&proc_root, &src, t0 + Duration::from_secs(1))
            .unwrap();
        assert!((w.wait_s_per_s - 2.0).abs() < 1e-9 && (w.cpu_cores.unwrap() - 0.5).abs() < 1e-9);
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn schedstat_lines() {
        assert_eq!(
            parse_schedstat("233671508 34054146 1059\n"),
            Some((233_671_508, 34_054_146))
        );
        assert_eq!(parse_schedstat("garbage"), None);
        assert_eq!(parse_schedstat(""), None);
    }
}
