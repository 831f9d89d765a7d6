//! Where `lmperf run`'s request rows go as they finish, in memory that does not grow with the
//! run's length: each row is written to `requests.jsonl` at once (buffered), added to the
//! bounded `length_buckets` histograms ([`super::buckets::Pool`]) and offered to a fixed-size
//! uniform sample of its benchmark for `report.html`, then dropped.
//!
//! - **Order.** [`Reorder`] puts a benchmark's rows back in `(index, turn)` order (the order
//!   of `requests.jsonl` since the first release) while they finish out of order, holding at
//!   most [`REORDER_CAP`] finished rows: when more finished while an earlier request is still
//!   in flight (a request that takes as long as [`REORDER_CAP`] later ones), the held rows are
//!   written and that request's rows follow when it ends, out of order.
//! - **Whole benchmarks.** [`RunRows::begin`] / [`RunRows::commit`] bracket a benchmark;
//!   [`RunRows::rollback`] (Ctrl-C during it) cuts `requests.jsonl` back to where it began
//!   and forgets its buckets and sample, so the files hold only completed benchmarks.
//! - **Report sample.** Up to [`REPORT_SAMPLE`] rows per benchmark, a uniform sample of its
//!   rows (Vitter's algorithm R, seeded), kept whole and in file order.
//! - **Errors.** A failed write does not stop the measurement: the first error is kept, no
//!   more is written, and [`RunRows::finish`] returns it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Seek as _, Write as _};
use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

use super::buckets::{LengthBuckets, Pool};
use super::{Goodput, RequestRow};

/// Finished rows a benchmark may hold back to keep `requests.jsonl` in order.
pub const REORDER_CAP: usize = 8192;
/// Rows per benchmark kept for `report.html`'s charts.
pub const REPORT_SAMPLE: usize = 2000;

/// Puts one benchmark's rows back in index order (a request's turns come together).
#[derive(Debug, Default)]
pub struct Reorder {
    next: usize,
    held: BTreeMap<usize, Vec<RequestRow>>,
    held_rows: usize,
}

impl Reorder {
    /// The rows of request `index` (empty: the index was never sent); passes on, in order,
    /// every row that no earlier request holds back.
    pub fn push(&mut self, index: usize, rows: Vec<RequestRow>, out: &mut dyn FnMut(RequestRow)) {
        if index < self.next {
            rows.into_iter().for_each(&mut *out);
            return;
        }
        self.held_rows += rows.len();
        self.held.insert(index, rows);
        loop {
            while let Some(rows) = self.held.remove(&self.next) {
                self.held_rows -= rows.len();
                self.next += 1;
                rows.into_iter().for_each(&mut *out);
            }
            if self.held_rows <= REORDER_CAP {
                break;
            }
            // Too many held behind a request still in flight: let them go past it.
            let Some((i, rows)) = self.held.pop_first() else {
                break;
            };
            self.held_rows -= rows.len();
            self.next = i + 1;
            rows.into_iter().for_each(&mut *out);
        }
    }

    /// Passes on every row still held, in index order.
    pub fn finish(self, out: &mut dyn FnMut(RequestRow)) {
        self.held.into_values().flatten().for_each(out);
    }
}

/// A benchmark's uniform sample of rows (algorithm R).
#[derive(Debug)]
struct Sample {
    seen: u64,
    rows: Vec<RequestRow>,
}

/// The rows of a whole run: `requests.jsonl`, `length_buckets`, the report's sample.
#[derive(Debug)]
pub struct RunRows {
    path: PathBuf,
    file: Option<BufWriter<File>>,
    /// Bytes written so far (buffered included), and where the running benchmark began.
    written: u64,
    began_at: u64,
    error: Option<std::io::Error>,
    buckets: Pool,
    pending_buckets: Pool,
    sample: Vec<RequestRow>,
    pending_sample: Sample,
    rng: SmallRng,
}

impl RunRows {
    /// Rows written to `dir/requests.jsonl` (created with the first row, or by
    /// [`RunRows::finish`] when there is none); the report sample drawn from `seed`.
    pub fn new(dir: &Path, seed: u64) -> Self {
        Self {
            path: dir.join("requests.jsonl"),
            file: None,
            written: 0,
            began_at: 0,
            error: None,
            buckets: Pool::default(),
            pending_buckets: Pool::default(),
            sample: Vec::new(),
            pending_sample: Sample {
                seen: 0,
                rows: Vec::new(),
            },
            rng: SmallRng::seed_from_u64(seed ^ 0x5EED_0F0F_5A4D_9E11),
        }
    }

    /// A benchmark starts: what follows until [`RunRows::commit`] is its.
    pub fn begin(&mut self) {
        self.began_at = self.written;
        self.pending_buckets = Pool::default();
        self.pending_sample = Sample {
            seen: 0,
            rows: Vec::new(),
        };
    }

    /// One finished row of the running benchmark, in file order.
    pub fn push(&mut self, row: RequestRow) {
        self.write(&row);
        // A probe (`--probe-rate`) is in the file, not in the benchmark's buckets or sample.
        if row.probe {
            return;
        }
        self.pending_buckets.push(&row);
        let s = &mut self.pending_sample;
        s.seen += 1;
        if s.rows.len() < REPORT_SAMPLE {
            s.rows.push(row);
        } else {
            let j = self.rng.random_range(0..s.seen);
            if let Some(slot) = usize::try_from(j).ok().and_then(|j| s.rows.get_mut(j)) {
                *slot = row;
            }
        }
    }

    fn write(&mut self, row: &RequestRow) {
        if self.error.is_some() {
            return;
        }
        let mut line = match serde_json::to_vec(row) {
            Ok(l) => l,
            Err(e) => return self.error = Some(std::io::Error::other(e)),
        };
        line.push(b'\n');
        let result = match &mut self.file {
            Some(f) => f.write_all(&line),
            None => File::create(&self.path).and_then(|f| {
                let mut f = BufWriter::with_capacity(1 << 16, f);
                f.write_all(&line)?;
                self.file = Some(f);
                Ok(())
            }),
        };
        match result {
            Ok(()) => self.written += line.len() as u64,
            Err(e) => self.error = Some(e),
        }
    }

    /// The running benchmark completed: its buckets and sample join the run's.
    pub fn commit(&mut self) {
        self.buckets
            .merge(&std::mem::take(&mut self.pending_buckets));
        let mut rows = std::mem::take(&mut self.pending_sample.rows);
        rows.sort_by_key(|r| (r.repeat, r.index, r.turn));
        self.sample.extend(rows);
        self.pending_sample.seen = 0;
    }

    /// The running benchmark was interrupted: `requests.jsonl` is cut back to where it began
    /// and its buckets and sample are forgotten.
    pub fn rollback(&mut self) {
        self.pending_buckets = Pool::default();
        self.pending_sample = Sample {
            seen: 0,
            rows: Vec::new(),
        };
        if self.written == self.began_at {
            return;
        }
        self.written = self.began_at;
        let Some(f) = &mut self.file else { return };
        let cut = f
            .flush()
            .and_then(|()| f.get_mut().set_len(self.began_at))
            .and_then(|()| {
                f.get_mut()
                    .seek(std::io::SeekFrom::Start(self.began_at))
                    .map(drop)
            });
        if let Err(e) = cut {
            self.error.get_or_insert(e);
        }
    }

    /// Nothing completed: `requests.jsonl` is removed (nothing was written before).
    pub fn discard(mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Flushes `requests.jsonl` (an empty file when no row came) and returns the run's
    /// `length_buckets` (SLO checks against `slo`) and the report's sample (by benchmark, in
    /// file order).
    ///
    /// # Errors
    /// The first write that failed.
    pub fn finish(
        mut self,
        slo: Goodput,
    ) -> std::io::Result<(Vec<LengthBuckets>, Vec<RequestRow>)> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        match &mut self.file {
            Some(f) => f.flush()?,
            None => drop(File::create(&self.path)?),
        }
        Ok((self.buckets.finish(slo), self.sample))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(index: usize, turn: u32) -> RequestRow {
        RequestRow {
            benchmark: "b".into(),
            index,
            turn,
            concurrency: 1,
            outcome: "ok",
            e2el_ms: index as f64,
            ..RequestRow::default()
        }
    }

    fn order(pushes: Vec<(usize, Vec<RequestRow>)>) -> Vec<(usize, u32)> {
        let mut got = Vec::new();
        let mut r = Reorder::default();
        for (i, rows) in pushes {
            r.push(i, rows, &mut |x| got.push((x.index, x.turn)));
        }
        r.finish(&mut |x| got.push((x.index, x.turn)));
        got
    }

    #[test]
    fn rows_come_out_in_index_order() {
        // Finished 2, 0, 3, 1 (request 1 with two turns), index 4 never sent.
        let got = order(vec![
            (2, vec![row(2, 0)]),
            (0, vec![row(0, 0)]),
            (3, vec![row(3, 0)]),
            (4, vec![]),
            (1, vec![row(1, 0), row(1, 1)]),
            (5, vec![row(5, 0)]),
        ]);
        assert_eq!(got, [(0, 0), (1, 0), (1, 1), (2, 0), (3, 0), (5, 0)]);
        // A hole never filled: the rest at the end, in order.
        assert_eq!(
            order(vec![(3, vec![row(3, 0)]), (1, vec![row(1, 0)])]),
            [(1, 0), (3, 0)]
        );
    }

    #[test]
    fn a_stalled_request_holds_back_at_most_the_cap() {
        let mut r = Reorder::default();
        let mut got = Vec::new();
        for i in 1..=REORDER_CAP + 1 {
            r.push(i, vec![row(i, 0)], &mut |x| got.push(x.index));
            assert!(r.held_rows <= REORDER_CAP);
        }
        assert_eq!(got.len(), REORDER_CAP + 1, "the cap was passed: all go");
        assert!(got.windows(2).all(|w| w[0] < w[1]));
        r.push(0, vec![row(0, 0)], &mut |x| got.push(x.index));
        assert_eq!(got.last(), Some(&0), "the stalled one follows when it ends");
        r.push(REORDER_CAP + 2, vec![row(REORDER_CAP + 2, 0)], &mut |x| {
            got.push(x.index)
        });
        assert_eq!(got.last(), Some(&(REORDER_CAP + 2)));
    }

    #[test]
    fn interrupted_benchmark_is_cut_from_the_file_buckets_and_sample() {
        let dir = std::env::temp_dir().join(format!("lmperf-rows-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut out = RunRows::new(&dir, 1);
        out.begin();
        (0..3).for_each(|i| out.push(row(i, 0)));
        out.commit();
        out.begin();
        (0..5000).for_each(|i| {
            out.push(RequestRow {
                concurrency: 2,
                ..row(i, 0)
            })
        });
        out.rollback();
        out.begin();
        (0..5000).for_each(|i| {
            out.push(RequestRow {
                benchmark: "c".into(),
                ..row(i, 0)
            })
        });
        out.commit();
        let (buckets, sample) = out.finish(Goodput::default()).unwrap();
        let text = std::fs::read_to_string(dir.join("requests.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 5003);
        assert_eq!(
            (
                lines[2]["benchmark"].as_str(),
                lines[3]["benchmark"].as_str(),
                lines[3]["index"].as_u64()
            ),
            (Some("b"), Some("c"), Some(0))
        );
        assert_eq!(
            buckets
                .iter()
                .map(|g| (g.concurrency, g.num_requests))
                .collect::<Vec<_>>(),
            [(1, 5003)]
        );
        // Sample: all 3 of b, then REPORT_SAMPLE of c's 5000, in file order, spread over it.
        assert_eq!(sample.len(), 3 + REPORT_SAMPLE);
        let c: Vec<usize> = sample
            .iter()
            .filter(|r| r.benchmark == "c")
            .map(|r| r.index)
            .collect();
        assert!(c.windows(2).all(|w| w[0] < w[1]));
        let late = c.iter().filter(|&&i| i >= 2500).count();
        assert!(
            (900..1100).contains(&late),
            "uniform: {late} of {REPORT_SAMPLE} from the second half"
        );
        // Nothing completed: no file.
        let mut out = RunRows::new(&dir, 1);
        out.begin();
        out.push(row(0, 0));
        out.rollback();
        out.discard();
        assert!(!dir.join("requests.jsonl").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
