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
//!
//! Cost (issue 28's agent budget): a thread's counters are one file each, so a server of many
//! threads is read less often: every [`read_interval`] (1 s up to [`THREADS_PER_S`] threads, at
//! most [`MAX_READ_INTERVAL`]), and the rate of the last read is repeated in between (it is the
//! mean over that interval). A process tree is walked again every [`TREE_INTERVAL`]; threads of
//! a process the walk adds count from their first reading (their past wait is not this
//! interval's).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where a server's CPU wait is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
/// Threads whose counters are read each second at most, per source: a server of more threads
/// is read every [`read_interval`].
pub const THREADS_PER_S: usize = 128;
/// The longest interval between two reads of a source of many threads.
pub const MAX_READ_INTERVAL: Duration = Duration::from_secs(5);
/// How often a process tree is walked again for new descendants.
pub const TREE_INTERVAL: Duration = Duration::from_secs(10);

/// A sampler's tick may come this much early: a read is due when this close to its interval.
const TICK_SLACK: Duration = Duration::from_millis(250);

/// How often a source of `threads` threads is read: 1 s up to [`THREADS_PER_S`] threads, one
/// second more for each further [`THREADS_PER_S`], at most [`MAX_READ_INTERVAL`]. A cgroup v2
/// source (two files) is read every second.
pub fn read_interval(threads: usize) -> Duration {
    let secs = threads.div_ceil(THREADS_PER_S).max(1) as u64;
    Duration::from_secs(secs).min(MAX_READ_INTERVAL)
}

/// One thread's counters, ns, and the process it was read under (0 for a cgroup's threads).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Thread {
    pid: u32,
    run_ns: u64,
    wait_ns: u64,
}

/// One reading of a source.
#[derive(Debug, Clone, PartialEq)]
enum Reading {
    /// Per thread id; with the processes read (a `Pids` source's tree, empty for a cgroup's).
    Threads {
        threads: HashMap<u32, Thread>,
        procs: Vec<u32>,
    },
    /// A cgroup's `some` total and its CPU usage, µs.
    Cgroup { wait_us: u64, usage_us: Option<u64> },
}

impl Reading {
    fn threads(&self) -> usize {
        match self {
            Reading::Threads { threads, .. } => threads.len(),
            Reading::Cgroup { .. } => 0,
        }
    }
}

/// A `Pids` source's process tree as last walked.
#[derive(Debug)]
struct Tree {
    at: Instant,
    roots: Vec<u32>,
    procs: Vec<u32>,
}

/// Keeps the previous reading of one server for the rates.
#[derive(Debug, Default)]
pub struct CpuWaitMeter {
    prev: Option<(Instant, Source, Reading)>,
    tree: Option<Tree>,
    /// The rate of the last read, repeated until the next.
    last: Option<CpuWait>,
}

impl CpuWaitMeter {
    /// The rate since the previous read of the same source at monotonic `now`; between reads
    /// (a source of many threads, [`read_interval`]) the last read's rate. `None` at the first
    /// sample, after a change of source, or when nothing could be read.
    pub fn sample(&mut self, proc_root: &Path, source: &Source, now: Instant) -> Option<CpuWait> {
        if let Some((at, was, before)) = &self.prev
            && was == source
            && now.saturating_duration_since(*at) + TICK_SLACK < read_interval(before.threads())
        {
            return self.last;
        }
        let cur = match source {
            Source::Pids(roots) => {
                let fresh = self.tree.as_ref().is_some_and(|t| {
                    t.roots == *roots && now.saturating_duration_since(t.at) < TREE_INTERVAL
                });
                if !fresh {
                    self.tree = Some(Tree {
                        at: now,
                        roots: roots.clone(),
                        procs: tree(proc_root, roots),
                    });
                }
                self.tree
                    .as_ref()
                    .and_then(|t| read_procs(proc_root, &t.procs))
            }
            other => read(proc_root, other),
        };
        let Some(cur) = cur else {
            self.prev = None;
            self.tree = None;
            self.last = None;
            return None;
        };
        let prev = self.prev.replace((now, source.clone(), cur));
        self.last = match (&prev, &self.prev) {
            (Some((at, was, before)), Some((_, _, cur))) if was == source => {
                rate(before, cur, now.checked_duration_since(*at))
            }
            _ => None,
        };
        self.last
    }
}

/// The rate between two readings of one source `dt` apart.
fn rate(before: &Reading, cur: &Reading, dt: Option<Duration>) -> Option<CpuWait> {
    let dt = dt?.as_secs_f64();
    if dt <= 0.0 {
        return None;
    }
    match (before, cur) {
        (
            Reading::Threads {
                threads: b,
                procs: p0,
            },
            Reading::Threads { threads: c, .. },
        ) => {
            let (mut run_ns, mut wait_ns) = (0u64, 0u64);
            for (tid, t) in c {
                let (r0, w0) = match b.get(tid) {
                    Some(p) => (p.run_ns, p.wait_ns),
                    // A process the tree walk added since: its past is not this interval's.
                    None if t.pid != 0 && !p0.contains(&t.pid) => (t.run_ns, t.wait_ns),
                    // A thread that started since.
                    None => (0, 0),
                };
                // A counter that went back is a new thread with a reused id: from 0.
                run_ns += if t.run_ns >= r0 {
                    t.run_ns - r0
                } else {
                    t.run_ns
                };
                wait_ns += if t.wait_ns >= w0 {
                    t.wait_ns - w0
                } else {
                    t.wait_ns
                };
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

/// Parses a `schedstat` line: (time on a CPU ns, run_delay ns).
pub fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace();
    let run = f.next()?.parse().ok()?;
    let wait = f.next()?.parse().ok()?;
    Some((run, wait))
}

/// The threads of processes `procs` (`/proc/PID/task/TID/schedstat`), at most [`MAX_THREADS`].
fn read_procs(proc_root: &Path, procs: &[u32]) -> Option<Reading> {
    let mut threads = HashMap::new();
    for &pid in procs {
        let Ok(rd) = std::fs::read_dir(proc_root.join(pid.to_string()).join("task")) else {
            continue;
        };
        for e in rd.flatten() {
            if threads.len() >= MAX_THREADS {
                break;
            }
            let Some(tid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((run_ns, wait_ns)) = std::fs::read_to_string(e.path().join("schedstat"))
                .ok()
                .and_then(|t| parse_schedstat(&t))
            {
                threads.insert(
                    tid,
                    Thread {
                        pid,
                        run_ns,
                        wait_ns,
                    },
                );
            }
        }
    }
    (!threads.is_empty()).then(|| Reading::Threads {
        threads,
        procs: procs.to_vec(),
    })
}

/// A cgroup source's reading.
fn read(proc_root: &Path, source: &Source) -> Option<Reading> {
    match source {
        Source::Pids(pids) => read_procs(proc_root, &tree(proc_root, pids)),
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
                        if let Some((run_ns, wait_ns)) = std::fs::read_to_string(
                            proc_root.join(tid.to_string()).join("schedstat"),
                        )
                        .ok()
                        .and_then(|t| parse_schedstat(&t))
                        {
                            threads.insert(
                                tid,
                                Thread {
                                    pid: 0,
                                    run_ns,
                                    wait_ns,
                                },
                            );
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
            (!threads.is_empty()).then_some(Reading::Threads {
                threads,
                procs: Vec::new(),
            })
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
    fn a_server_of_many_threads_is_read_less_often_and_its_rate_held_between() {
        assert_eq!(read_interval(0), Duration::from_secs(1));
        assert_eq!(read_interval(THREADS_PER_S), Duration::from_secs(1));
        assert_eq!(read_interval(THREADS_PER_S + 1), Duration::from_secs(2));
        assert_eq!(read_interval(100 * THREADS_PER_S), MAX_READ_INTERVAL);
        let tmp = std::env::temp_dir().join(format!("lmperf-cpuwait-many-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let proc_root = tmp.join("proc");
        // 300 threads: read every 3 s.
        let n = 300u32;
        let all = |run_ns: u64, wait_ns: u64| {
            for tid in 0..n {
                thread(&proc_root, 10, 10 + tid, run_ns, wait_ns);
            }
        };
        all(0, 0);
        let (src, t0) = (Source::Pids(vec![10]), Instant::now());
        let mut m = CpuWaitMeter::default();
        assert_eq!(m.sample(&proc_root, &src, t0), None);
        // Each thread has waited 30 ms and run 3 ms.
        all(3_000_000, 30_000_000);
        for s in [1, 2] {
            assert_eq!(
                m.sample(&proc_root, &src, t0 + Duration::from_secs(s)),
                None,
                "not read before its interval"
            );
        }
        // A tick a little early still reads.
        let w = m
            .sample(&proc_root, &src, t0 + Duration::from_millis(2_900))
            .unwrap();
        // 300 threads × 30 ms over 2.9 s.
        assert!((w.wait_s_per_s - 9.0 / 2.9).abs() < 1e-9, "{w:?}");
        assert!((w.cpu_cores.unwrap() - 0.9 / 2.9).abs() < 1e-9, "{w:?}");
        // Between reads: the last rate, unchanged by what the files say now.
        all(4_000_000, 90_000_000);
        assert_eq!(
            m.sample(&proc_root, &src, t0 + Duration::from_millis(3_900)),
            Some(w)
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn a_child_the_tree_walk_finds_later_counts_from_its_first_reading() {
        let tmp = std::env::temp_dir().join(format!("lmperf-cpuwait-child-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let proc_root = tmp.join("proc");
        thread(&proc_root, 10, 10, 0, 0);
        let (src, t0) = (Source::Pids(vec![10]), Instant::now());
        let mut m = CpuWaitMeter::default();
        assert_eq!(m.sample(&proc_root, &src, t0), None);
        // A child with 50 s of past wait appears; the walk finds it at the next tree interval.
        thread(&proc_root, 20, 20, 1_000_000_000, 50_000_000_000);
        std::fs::write(proc_root.join("10/task/10/children"), "20\n").unwrap();
        let at = t0 + TREE_INTERVAL;
        thread(&proc_root, 10, 10, 0, 1_000_000_000);
        let w = m.sample(&proc_root, &src, at).unwrap();
        let dt = TREE_INTERVAL.as_secs_f64();
        assert!((w.wait_s_per_s - 1.0 / dt).abs() < 1e-9, "{w:?}");
        // From then on its wait counts.
        thread(&proc_root, 20, 20, 1_000_000_000, 52_000_000_000);
        let w = m
            .sample(&proc_root, &src, at + Duration::from_secs(1))
            .unwrap();
        assert!((w.wait_s_per_s - 2.0).abs() < 1e-9, "{w:?}");
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
