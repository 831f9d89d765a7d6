//! `cargo xtask diagnose-eval` runs this: the diagnosis engine over the synthetic corpus and
//! the recorded episodes of `tests/fixtures/episodes/` (or the directories given), and the
//! table per cause (AC@1, AC@3, Avg@5, median time to `root_confirmed`, control diagnoses).
//!
//! Arguments: `[--per-magnitude N] [--controls N] [--no-synthetic] [--write-synthetic DIR]
//! [--json FILE] [--explain NAME] [--timeline NAME] [-v] [DIR...]`. `--explain NAME` prints the
//! episode's first `root_confirmed` evaluation (else its last one that left idle) as JSON;
//! `--timeline NAME` its target's state and top three causes at every evaluation where they
//! changed, seconds from the injection; `--max-score CAUSE` the highest score CAUSE reached in
//! each episode (at any evaluation, any target) and the episode's own cause.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use lmperf::analyze::episode::{Episode, Outcome, replay};
use lmperf::analyze::{eval, synth};
use lmperf::diagnosis::EngineConfig;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("diagnose-eval: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let mut per_magnitude = 2;
    let mut controls = 2;
    let mut synthetic = true;
    let mut write: Option<PathBuf> = None;
    let mut json: Option<PathBuf> = None;
    let mut verbose = false;
    let mut explain: Option<String> = None;
    let mut timeline: Option<String> = None;
    let mut max_score: Option<String> = None;
    let mut dirs = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> anyhow::Result<u64> {
            let v = args
                .next()
                .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))?;
            v.parse()
                .map_err(|_| anyhow::anyhow!("{name} = {v:?}: not a count"))
        };
        match a.as_str() {
            "--per-magnitude" => per_magnitude = num("--per-magnitude")?,
            "--controls" => controls = num("--controls")?,
            "--no-synthetic" => synthetic = false,
            "--write-synthetic" => write = args.next().map(PathBuf::from),
            "--json" => json = args.next().map(PathBuf::from),
            "-v" | "--verbose" => verbose = true,
            "--explain" => explain = args.next(),
            "--timeline" => timeline = args.next(),
            "--max-score" => max_score = args.next(),
            d if !d.starts_with('-') => dirs.push(PathBuf::from(d)),
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let mut episodes = Vec::new();
    if synthetic {
        episodes.extend(synth::corpus(per_magnitude, controls));
    }
    if let Some(dir) = &write {
        std::fs::create_dir_all(dir)?;
        for e in &episodes {
            std::fs::write(dir.join(format!("{}.json", e.name)), serde_json::to_vec(e)?)?;
        }
        println!("wrote {} episodes to {}", episodes.len(), dir.display());
    }
    for d in &dirs {
        let found = Episode::load_dir(d)?;
        println!("{}: {} recorded episodes", d.display(), found.len());
        episodes.extend(found);
    }
    if let Some(cause) = &max_score {
        for e in &episodes {
            let mut best = 0.0_f64;
            lmperf::analyze::episode::replay_with(e, EngineConfig::default(), |_, d| {
                for t in &d.targets {
                    for c in t.causes.iter().filter(|c| c.cause.as_str() == cause) {
                        best = best.max(c.score);
                    }
                }
            });
            println!(
                "{:<48} {:<20} {cause} max {best:.2}",
                e.name,
                e.cause.map_or("control", |c| c.as_str())
            );
        }
        return Ok(());
    }
    if let Some(name) = &timeline {
        let e = episodes
            .iter()
            .find(|e| &e.name == name)
            .ok_or_else(|| anyhow::anyhow!("--timeline {name:?}: no such episode"))?;
        let onset = e.onset_unix_s().unwrap_or(e.start_unix_s);
        let mut last = String::new();
        println!("{name}: seconds from the injection, state, top three (roots)");
        lmperf::analyze::episode::replay_with(e, EngineConfig::default(), |off, d| {
            for t in d.targets.iter().filter(|t| t.target == e.target) {
                let top: Vec<String> = t
                    .causes
                    .iter()
                    .take(3)
                    .map(|c| format!("{} {:.2}", c.cause.as_str(), c.score))
                    .collect();
                let roots: Vec<&str> = t.roots.iter().map(|c| c.as_str()).collect();
                let line = format!(
                    "{:<15} {}{}",
                    t.state.as_str(),
                    top.join(", "),
                    if roots.is_empty() {
                        String::new()
                    } else {
                        format!("  (roots: {})", roots.join(" → "))
                    }
                );
                if line != last {
                    println!("{:+5.0} s  {line}", e.start_unix_s + off - onset);
                    last = line;
                }
            }
        });
        return Ok(());
    }
    if let Some(name) = &explain {
        let e = episodes
            .iter()
            .find(|e| &e.name == name)
            .ok_or_else(|| anyhow::anyhow!("--explain {name:?}: no such episode"))?;
        let mut shown: Option<(f64, lmperf::diagnosis::TargetDiagnosis)> = None;
        lmperf::analyze::episode::replay_with(e, EngineConfig::default(), |off, d| {
            for t in &d.targets {
                let confirmed = shown
                    .as_ref()
                    .is_some_and(|s| s.1.state == lmperf::diagnosis::State::RootConfirmed);
                if !confirmed && t.state != lmperf::diagnosis::State::Idle {
                    shown = Some((off, t.clone()));
                }
            }
        });
        match shown {
            Some((off, t)) => println!(
                "{name} at +{off:.0} s:\n{}",
                serde_json::to_string_pretty(&t)?
            ),
            None => println!("{name}: idle throughout"),
        }
        return Ok(());
    }
    let started = Instant::now();
    let outcomes: Vec<Outcome> = episodes
        .iter()
        .map(|e| replay(e, EngineConfig::default()))
        .collect();
    let elapsed = started.elapsed();
    if verbose {
        for o in &outcomes {
            let ranking: Vec<&str> = o.ranking.iter().map(|c| c.as_str()).collect();
            println!(
                "{:<34} rank {:<4} ttd {:<6} onset err {:<6} ranking {}",
                o.name,
                o.rank().map_or("-".to_owned(), |r| r.to_string()),
                o.time_to_confirmed_s
                    .map_or("-".to_owned(), |t| format!("{t:.0}")),
                o.onset_error_s
                    .map_or("-".to_owned(), |t| format!("{t:+.0}")),
                ranking.join(",")
            );
        }
    }
    let report = eval::report(&outcomes);
    println!(
        "{} episodes replayed in {:.2} s ({:.0} ms each)\n",
        outcomes.len(),
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / outcomes.len().max(1) as f64
    );
    // The development and holdout halves (eval::split: per cause, by the FNV-1a of the name).
    let halves = eval::split(&outcomes, |o| (o.name.as_str(), o.cause));
    let half = |h: eval::Half| -> Vec<Outcome> {
        outcomes
            .iter()
            .zip(&halves)
            .filter(|(_, x)| **x == h)
            .map(|(o, _)| o.clone())
            .collect()
    };
    let (dev, hold) = (half(eval::Half::Development), half(eval::Half::Holdout));
    let dev_report = eval::report(&dev);
    let hold_report = eval::report(&hold);
    println!("== development half: {} episodes ==", dev.len());
    print!("{}", eval::table(&dev_report));
    println!("\n== holdout half: {} episodes ==", hold.len());
    print!("{}", eval::table(&hold_report));
    println!("\n== whole corpus: {} episodes ==", outcomes.len());
    print!("{}", eval::table(&report));
    // Issue 28's held-back checks.
    println!("\n== held-back checks ==");
    for (name, h) in [("development", &dev), ("holdout", &hold)] {
        print!("{name}: {}", eval::onset_lines(h));
    }
    let delayed: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.cause == Some(lmperf::diagnosis::Cause::Network))
        .filter(|o| o.name.starts_with("network-40ms-"))
        .collect();
    for o in &delayed {
        let half = outcomes
            .iter()
            .zip(&halves)
            .find(|(x, _)| x.name == o.name)
            .map_or("-", |(_, h)| match h {
                eval::Half::Development => "development",
                eval::Half::Holdout => "holdout",
            });
        println!(
            "+40 ms network ({half}): {} rank {} confirmed after {} {}",
            o.name,
            o.rank().map_or("-".to_owned(), |r| r.to_string()),
            o.time_to_confirmed_s
                .map_or("never".to_owned(), |t| format!("{t:.0} s")),
            verdict(o.rank() == Some(1) && o.time_to_confirmed_s.is_some_and(|t| t <= 30.0))
        );
    }
    print!("{}", eval::held_back_summary(&outcomes));
    let warned: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.warning_evaluations > 0)
        .collect();
    println!(
        "early warnings: {} episodes had a `warning` evaluation ({} controls)",
        warned.len(),
        warned.iter().filter(|o| o.cause.is_none()).count()
    );
    for (name, r) in [("development", &dev_report), ("holdout", &hold_report)] {
        println!(
            "{name} targets: AC@1 ≥ 0.85 {} ({:.2}), AC@3 ≥ 0.95 {} ({:.2}), median time to diagnosis ≤ 60 s {} ({}), 0 control diagnoses {} ({} of {})",
            verdict(r.total.ac1 >= 0.85),
            r.total.ac1,
            verdict(r.total.ac3 >= 0.95),
            r.total.ac3,
            verdict(
                r.total
                    .median_time_to_confirmed_s
                    .is_some_and(|t| t <= 60.0)
            ),
            r.total
                .median_time_to_confirmed_s
                .map_or("-".to_owned(), |t| format!("{t:.0} s")),
            verdict(r.control_diagnoses == 0),
            r.control_diagnoses,
            r.controls
        );
    }
    if let Some(p) = json {
        std::fs::write(&p, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}
