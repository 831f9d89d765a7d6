//! Pressure stall information (PSI, Linux ≥ 4.20): `/proc/pressure/{cpu,memory,io}`.
//!
//! Each file holds a `some` line (and, for memory and io, and cpu since 5.13, a `full` line):
//! `some avg10=1.23 avg60=0.50 avg300=0.10 total=123456`: the share of wall time (in percent,
//! over 10 s, 60 s, 300 s) in which at least one task (`some`) or every non-idle task (`full`)
//! stalled on the resource, and the total stall time in µs. Source: the kernel's
//! `Documentation/accounting/psi.rst`.

use std::path::Path;

/// One line of a PSI file.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PsiLine {
    /// avg10 as a share 0..1 (the file's percent ÷ 100).
    pub avg10: f64,
    pub avg60: f64,
    /// Total stall time, µs.
    pub total_us: u64,
}

/// One PSI file: `some` and, where the kernel writes it, `full`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Psi {
    pub some: Option<PsiLine>,
    pub full: Option<PsiLine>,
}

/// Parses a PSI file's text; lines that are not `some`/`full` with `avg10=` are skipped.
/// `None` when neither line is found.
pub fn parse(text: &str) -> Option<Psi> {
    let mut out = Psi::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let kind = words.next();
        let mut l = PsiLine::default();
        let mut seen = false;
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                continue;
            };
            match k {
                "avg10" => {
                    if let Ok(x) = v.parse::<f64>() {
                        l.avg10 = x / 100.0;
                        seen = true;
                    }
                }
                "avg60" => l.avg60 = v.parse::<f64>().map_or(0.0, |x| x / 100.0),
                "total" => l.total_us = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        if !seen {
            continue;
        }
        match kind {
            Some("some") => out.some = Some(l),
            Some("full") => out.full = Some(l),
            _ => {}
        }
    }
    (out.some.is_some() || out.full.is_some()).then_some(out)
}

/// The node's pressure: each resource `None` when its file cannot be read (no PSI in the
/// kernel, `psi=0`, another mount): absent, never 0.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct NodePressure {
    pub cpu: Option<Psi>,
    pub memory: Option<Psi>,
    pub io: Option<Psi>,
}

/// Reads `<proc_root>/pressure/{cpu,memory,io}`.
pub fn read(proc_root: &Path) -> NodePressure {
    let one = |name: &str| {
        std::fs::read_to_string(proc_root.join("pressure").join(name))
            .ok()
            .and_then(|t| parse(&t))
    };
    NodePressure {
        cpu: one("cpu"),
        memory: one("memory"),
        io: one("io"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_some_and_full_lines() {
        let p = parse(
            "some avg10=12.50 avg60=3.00 avg300=0.50 total=123456\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=42\n",
        )
        .unwrap();
        let some = p.some.unwrap();
        assert!((some.avg10 - 0.125).abs() < 1e-12 && (some.avg60 - 0.03).abs() < 1e-12);
        assert_eq!(some.total_us, 123_456);
        assert_eq!(p.full.unwrap().total_us, 42);
        // cpu before 5.13: no full line.
        let p = parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").unwrap();
        assert!(p.full.is_none() && p.some.unwrap().avg10 == 0.0);
        assert_eq!(parse(""), None);
        assert_eq!(parse("garbage\n"), None);
    }

    #[test]
    fn an_unreadable_root_is_absent_not_zero() {
        let p = read(Path::new("/nonexistent-proc-root"));
        assert_eq!(p, NodePressure::default());
        assert!(p.cpu.is_none() && p.memory.is_none() && p.io.is_none());
    }
}
