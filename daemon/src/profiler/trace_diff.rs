//! Two profiling traces compared: per module, kernel and op, the time per step of each and
//! its delta with the delta's share of the base step, top regressions first (the seed's
//! "A/B per-layer latency" view). **Pure**: two [`TraceProfile`]s in, rows out.

use std::collections::BTreeMap;

use serde::Serialize;

use super::trace::{ModuleTime, Stat, TraceProfile};

/// One name (module path, kernel or op) in both traces, per step (µs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffRow {
    pub name: String,
    /// Self time per step (µs) in base and new (0 where the trace lacks the name).
    pub base_us: f64,
    pub new_us: f64,
    /// `new_us − base_us` (µs per step): the ranking key, largest first.
    pub delta_us: f64,
    /// `delta_us ÷` the base's mean step time: the share of the step the change adds
    /// (0.3 = 30 % of a base step); null when the base step time is 0.
    pub share_of_step: Option<f64>,
    /// Time with children per step (µs), base and new (= self for kernels).
    pub base_total_us: f64,
    pub new_total_us: f64,
    /// Calls per step, base and new.
    pub base_calls: f64,
    pub new_calls: f64,
}

/// The two traces side by side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceDiff {
    pub base_steps: u64,
    pub new_steps: u64,
    /// Mean step time (µs) of each.
    pub base_step_us: f64,
    pub new_step_us: f64,
    /// `device` when both traces have kernels (module time = their kernels' time), else
    /// `host` (a CPU trace, or one side without kernels: host time on both sides).
    pub module_time: ModuleTime,
    /// Module scopes (`nn.Module` calls, `record_function` annotations) by path.
    pub modules: Vec<DiffRow>,
    pub kernels: Vec<DiffRow>,
    pub ops: Vec<DiffRow>,
}

impl TraceDiff {
    /// The largest regression: the first module row with a positive delta, else the first
    /// kernel's, else the first op's.
    pub fn top_regression(&self) -> Option<&DiffRow> {
        [&self.modules, &self.kernels, &self.ops]
            .into_iter()
            .find_map(|rows| rows.first().filter(|r| r.delta_us > 0.0))
    }
}

/// Compares `new` against `base`.
pub fn diff(base: &TraceProfile, new: &TraceProfile) -> TraceDiff {
    let module_time =
        if base.module_time == ModuleTime::Device && new.module_time == ModuleTime::Device {
            ModuleTime::Device
        } else {
            ModuleTime::Host
        };
    TraceDiff {
        base_steps: base.steps,
        new_steps: new.steps,
        base_step_us: base.step_us,
        new_step_us: new.step_us,
        module_time,
        modules: rows(&base.modules, &new.modules, base, new),
        kernels: rows(&base.kernels, &new.kernels, base, new),
        ops: rows(&base.ops, &new.ops, base, new),
    }
}

fn rows(
    b: &BTreeMap<String, Stat>,
    n: &BTreeMap<String, Stat>,
    base: &TraceProfile,
    new: &TraceProfile,
) -> Vec<DiffRow> {
    let (bs, ns) = (base.steps.max(1) as f64, new.steps.max(1) as f64);
    let zero = Stat::default();
    let mut out: Vec<DiffRow> = b
        .keys()
        .chain(n.keys().filter(|k| !b.contains_key(*k)))
        .map(|name| {
            let (x, y) = (b.get(name).unwrap_or(&zero), n.get(name).unwrap_or(&zero));
            let delta_us = y.self_us / ns - x.self_us / bs;
            DiffRow {
                name: name.clone(),
                base_us: x.self_us / bs,
                new_us: y.self_us / ns,
                delta_us,
                share_of_step: (base.step_us > 0.0).then(|| delta_us / base.step_us),
                base_total_us: x.total_us / bs,
                new_total_us: y.total_us / ns,
                base_calls: x.count as f64 / bs,
                new_calls: y.count as f64 / ns,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.delta_us
            .total_cmp(&a.delta_us)
            .then_with(|| a.name.cmp(&b.name))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(steps: u64, step_us: f64, modules: &[(&str, f64)]) -> TraceProfile {
        TraceProfile {
            steps,
            step_us,
            kernels: BTreeMap::new(),
            ops: BTreeMap::new(),
            modules: modules
                .iter()
                .map(|(n, us)| {
                    let s = Stat {
                        count: steps,
                        total_us: *us,
                        self_us: *us,
                    };
                    ((*n).to_owned(), s)
                })
                .collect(),
            module_time: ModuleTime::Host,
        }
    }

    #[test]
    fn per_step_deltas_rank_the_regression_first_with_its_share() {
        // Base: 2 steps of 1000 µs; new: 4 steps. Attention_2 goes 100 → 350 µs a step.
        let base = profile(2, 1000.0, &[("A_0", 400.0), ("A_1", 200.0), ("A_2", 200.0)]);
        let new = profile(
            4,
            1250.0,
            &[("A_0", 800.0), ("A_1", 360.0), ("A_2", 1400.0), ("B", 4.0)],
        );
        let d = diff(&base, &new);
        let names: Vec<&str> = d.modules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["A_2", "B", "A_0", "A_1"]);
        let top = d.top_regression().unwrap();
        assert_eq!(
            (top.base_us, top.new_us, top.delta_us),
            (100.0, 350.0, 250.0)
        );
        assert_eq!(top.share_of_step, Some(0.25));
        assert_eq!((top.base_calls, top.new_calls), (1.0, 1.0));
        assert_eq!(d.modules[1].base_us, 0.0);
        assert_eq!(d.modules[3].delta_us, -10.0);
    }

    #[test]
    fn no_regression_no_top() {
        let p = profile(1, 10.0, &[("A", 5.0)]);
        assert!(diff(&p, &p).top_regression().is_none());
    }
}
