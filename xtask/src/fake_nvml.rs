//! `cargo xtask fake-nvml DIR [--omit SYMBOL]...`: builds the scripted NVML of
//! `tests/support/fake_nvml/` into `DIR/libnvidia-ml.so.1` with the system `cc` (through its
//! `build.sh`, the one build the tests use too). `--omit` leaves a symbol out of the exports,
//! to play a driver older than that call.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};

pub fn run(args: &[String]) -> Result<()> {
    let mut dir: Option<PathBuf> = None;
    let mut omit = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--omit" => match it.next() {
                Some(s) if s.starts_with("nvml") => omit.push(s.clone()),
                other => bail!("--omit takes an NVML function name (nvml…), got {other:?}"),
            },
            s if s.starts_with('-') => {
                bail!("unknown option {s:?} (fake-nvml DIR [--omit SYMBOL]...)")
            }
            s if dir.is_none() => dir = Some(PathBuf::from(s)),
            s => bail!("one output directory only, got a second: {s:?}"),
        }
    }
    let Some(dir) = dir else {
        bail!("usage: cargo xtask fake-nvml DIR [--omit SYMBOL]...")
    };
    let mut cmd = Command::new("sh");
    cmd.arg(crate::root().join("tests/support/fake_nvml/build.sh"))
        .arg(&dir)
        .args(&omit);
    crate::step("build the scripted libnvidia-ml.so.1", cmd)?;
    println!("{}", dir.join("libnvidia-ml.so.1").display());
    println!(
        "run with LMPERF_FAKE_NVML_SCRIPT=<script.json> (format: tests/support/fake_nvml/README.md)"
    );
    Ok(())
}
