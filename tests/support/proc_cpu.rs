//! A process's CPU time as Linux counts it, for the cost benchmarks.

use std::time::Duration;

/// User + system CPU time of process `pid` (`/proc/PID/stat` fields 14 and 15, in clock ticks
/// of 10 ms); zero when the process is gone or the file unreadable.
pub fn cpu_of(pid: u32) -> Duration {
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}
