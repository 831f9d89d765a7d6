//! The CPU hog of `cargo xtask ci --stress`: one spinning process per core at normal priority
//! (nice 0, as the tests), so that a test whose assert depends on a wake-up, a timer or a rate
//! fails on the developer's machine the way it would on a busy CI machine.
//!
//! Each spinner is this xtask binary (`cargo xtask hog-spin`, not listed in the usage): a
//! busy loop that checks about every 50 ms whether its parent is still the xtask that started
//! it, and exits when it is not (the parent killed or stopped without dropping the [`Hog`]),
//! and in any case after [`MAX_SPIN`]. Dropping the [`Hog`] kills and reaps every spinner.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A spinner never outlives this, even if nothing stops it (the longest e2e run is ~15 min).
pub const MAX_SPIN: Duration = Duration::from_secs(60 * 60);

/// The spinning processes, one per core; dropped: killed and reaped.
pub struct Hog {
    children: Vec<Child>,
}

impl Hog {
    /// Starts one spinner per core (`std::thread::available_parallelism`).
    ///
    /// # Errors
    /// This binary's path is unknown, or a spinner cannot be started (those already started
    /// are stopped).
    pub fn start() -> Result<Hog> {
        let exe = xtask_exe()?;
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let mut hog = Hog {
            children: Vec::with_capacity(cores),
        };
        for _ in 0..cores {
            let child = Command::new(&exe)
                .arg("hog-spin")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("cannot start {} hog-spin", exe.display()))?;
            hog.children.push(child);
        }
        println!(
            "==> CPU hog: {cores} spinning processes at nice 0 (pids {})",
            hog.pids().join(" ")
        );
        Ok(hog)
    }

    fn pids(&self) -> Vec<String> {
        self.children.iter().map(|c| c.id().to_string()).collect()
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        println!("==> CPU hog stopped ({} spinners)", self.children.len());
    }
}

/// This xtask binary's path, for starting it again. Once `cargo build --workspace` has rebuilt
/// xtask under a running `cargo xtask ci`, Linux names the running binary `PATH (deleted)`: the
/// new binary, built from the same source, is at `PATH`.
///
/// # Errors
/// The running binary's path cannot be read.
pub fn xtask_exe() -> Result<std::path::PathBuf> {
    let exe = std::env::current_exe().context("the xtask binary's path")?;
    Ok(
        match exe.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
            Some(path) => std::path::PathBuf::from(path),
            None => exe,
        },
    )
}

/// `cargo xtask hog-spin`: spins one core until the parent that started it is gone, or
/// [`MAX_SPIN`] has passed.
///
/// # Errors
/// Any argument (it takes none).
pub fn spin(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("unexpected argument {a:?}: hog-spin takes none");
    }
    let parent = std::os::unix::process::parent_id();
    let started = Instant::now();
    let mut x: u64 = 1;
    loop {
        // ~50 ms of arithmetic between checks on a 2026 core; the exact length is immaterial.
        for _ in 0..20_000_000u32 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
        if std::os::unix::process::parent_id() != parent || started.elapsed() > MAX_SPIN {
            return Ok(());
        }
    }
}
