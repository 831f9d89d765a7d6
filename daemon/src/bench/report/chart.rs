//! SVG charts of the HTML reports: nice linear ticks (never a repeated label), a log axis when
//! the values span more than two decades, one time unit per axis, every point with its exact
//! value in an SVG `<title>`, phase bands, and the plotted data as a table below the picture.

use std::fmt::Write as _;

use super::esc;
use crate::fmt::{TimeUnit, fixed, number};

/// Colors of the series, in order.
pub const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];
/// Height of every chart, px.
const H: f64 = 280.0;
/// Default width, px.
pub const WIDTH: f64 = 560.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 22.0;
const BOTTOM: f64 = 44.0;
/// Lines with at most this many points show a marker on each.
const MARKED_POINTS: usize = 32;
/// Dots of a [`Mark::Points`] series are drawn fainter above this many.
const FEW_POINTS: usize = 200;
/// Hover markers of a line: at most this many (evenly spread).
const LINE_VERTICES: usize = 400;
/// Rows of the data table per series: at most this many (evenly spread).
const TABLE_ROWS: usize = 300;
/// Above this ratio of the largest to the smallest value (two decades), an axis is logarithmic.
const LOG_SPAN: f64 = 100.0;

/// What an axis measures.
#[derive(Debug, Clone, PartialEq)]
pub enum Quantity {
    /// Milliseconds, shown in µs, ms or s (one unit per axis, from its largest value).
    TimeMs,
    /// Anything else, with this unit shown after the label (none when empty).
    Unit(String),
}

/// One axis: its label, what it measures, whether a linear axis starts at zero, and whether it
/// may be logarithmic (when every value is positive and they span more than two decades).
#[derive(Debug, Clone)]
pub struct Axis {
    pub label: String,
    pub quantity: Quantity,
    pub from_zero: bool,
    pub allow_log: bool,
}

impl Axis {
    /// A time axis (values in ms) that may become logarithmic.
    pub fn time(label: &str) -> Self {
        Self {
            label: label.to_owned(),
            quantity: Quantity::TimeMs,
            from_zero: true,
            allow_log: true,
        }
    }

    /// A linear axis of `unit` (`""`: none).
    pub fn linear(label: &str, unit: &str, from_zero: bool) -> Self {
        Self {
            label: label.to_owned(),
            quantity: Quantity::Unit(unit.to_owned()),
            from_zero,
            allow_log: false,
        }
    }
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A line; a visible marker on each point when few, else invisible hover markers.
    Line,
    /// Faint dots (raw values under summary lines).
    Points,
    /// A dashed vertical line at the first point's x (a marker: max rate, revision).
    Vertical,
}

/// A named series; `titles`, when not empty, replace the default hover text of each point.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub mark: Mark,
    pub color: Option<&'static str>,
    pub titles: Vec<String>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>, mark: Mark) -> Self {
        Self {
            name: name.into(),
            points,
            mark,
            color: None,
            titles: Vec::new(),
        }
    }
}

/// A shaded stretch of the x axis (a benchmark, a ramp step), labelled at its top.
#[derive(Debug, Clone)]
pub struct Band {
    pub from: f64,
    pub to: f64,
    pub label: String,
}

/// The table under a chart.
#[derive(Debug, Clone)]
pub enum Table {
    /// The plotted points.
    Points,
    /// This HTML instead (e.g. summary.json's percentiles under a CDF).
    Html(String),
}

/// A chart; [`Chart::html`] draws it.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x: Axis,
    pub y: Axis,
    pub series: Vec<Series>,
    pub bands: Vec<Band>,
    pub width: f64,
    pub table: Table,
}

/// An axis fitted to its values: range in display units, ticks, scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
    /// Data units per display unit (ms per µs/ms/s on a time axis; 1 otherwise).
    pub per: f64,
    /// The unit shown (`ms`, `tok/s`, or empty).
    pub unit: String,
    /// Tick positions in display units and their labels.
    pub ticks: Vec<(f64, String)>,
}

impl Scale {
    /// Fits `axis` to `values` (data units; non-finite ones ignored); `None` without a value.
    pub fn fit(axis: &Axis, values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        let (per, unit) = match &axis.quantity {
            Quantity::TimeMs => {
                let u = TimeUnit::for_values(values.iter().copied());
                (u.ms(), u.symbol().to_owned())
            }
            Quantity::Unit(u) => (1.0, u.clone()),
        };
        let d: Vec<f64> = values.iter().map(|v| v / per).collect();
        let min = d.iter().copied().reduce(f64::min)?;
        let max = d.iter().copied().reduce(f64::max)?;
        if axis.allow_log && min > 0.0 && max / min > LOG_SPAN {
            let (lo, hi) = log_ticks(min, max);
            let stride = ((hi - lo) as usize).div_ceil(6).max(1);
            let ticks = (lo..=hi)
                .step_by(stride)
                .map(|e| (10f64.powi(e), fixed(10f64.powi(e), (-e).max(0) as usize)))
                .collect();
            return Some(Self {
                lo: 10f64.powi(lo),
                hi: 10f64.powi(hi),
                log: true,
                per,
                unit,
                ticks,
            });
        }
        let (mut lo, mut hi) = (min, max);
        if axis.from_zero {
            lo = lo.min(0.0);
            hi = hi.max(0.0);
        }
        if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
            // One value: it alone is the tick, in the middle.
            let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.5 };
            let label = if lo.fract() == 0.0 {
                fixed(lo, 0)
            } else {
                number(lo)
            };
            return Some(Self {
                lo: lo - pad,
                hi: lo + pad,
                log: false,
                per,
                unit,
                ticks: vec![(lo, label)],
            });
        }
        let (lo, hi, mut ticks) = linear_ticks(lo, hi);
        // Integer data (concurrency, counts): integer ticks only.
        if d.iter().all(|v| v.fract() == 0.0)
            && ticks.iter().filter(|t| t.0.fract() == 0.0).count() >= 2
        {
            ticks.retain(|t| t.0.fract() == 0.0);
            ticks.iter_mut().for_each(|t| t.1 = fixed(t.0, 0));
        }
        Some(Self {
            lo,
            hi,
            log: false,
            per,
            unit,
            ticks,
        })
    }

    /// Position of display value `d` along the axis, 0 (lo) to 1 (hi).
    fn at(&self, d: f64) -> f64 {
        if self.log {
            (d.max(f64::MIN_POSITIVE).log10() - self.lo.log10())
                / (self.hi.log10() - self.lo.log10())
        } else {
            (d - self.lo) / (self.hi - self.lo)
        }
    }

    /// `label (unit)`.
    fn title(&self, label: &str) -> String {
        if self.unit.is_empty() {
            label.to_owned()
        } else {
            format!("{label} ({})", self.unit)
        }
    }

    /// A data value shown in the axis unit, three significant digits.
    pub fn show(&self, v: f64) -> String {
        let d = v / self.per;
        // Integer data (concurrency, counts) without decimals.
        if d.fract() == 0.0 && d.abs() < 1e15 {
            fixed(d, 0)
        } else {
            number(d)
        }
    }

    /// The exact data value with its unit (hover text): `16.6253 ms`.
    fn exact(&self, v: f64) -> String {
        let u = if self.unit.is_empty() {
            String::new()
        } else {
            format!(" {}", self.unit)
        };
        format!("{}{u}", super::fmt::exact(v / self.per, 6))
    }
}

/// Decades `[lo, hi]` (powers of ten) holding `min..=max`, both positive.
fn log_ticks(min: f64, max: f64) -> (i32, i32) {
    let lo = min.log10().floor() as i32;
    let mut hi = max.log10().ceil() as i32;
    if hi <= lo {
        hi = lo + 1;
    }
    (lo, hi)
}

/// Nice linear ticks (steps of 1, 2 or 5 × 10ᵏ, about five) covering `lo..=hi` (`lo < hi`):
/// the rounded range and the labelled ticks, each label with the decimals its step needs, so
/// no two are the same.
pub fn linear_ticks(lo: f64, hi: f64) -> (f64, f64, Vec<(f64, String)>) {
    let raw = (hi - lo) / 5.0;
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let step = p * if m < 1.5 {
        1.0
    } else if m < 3.5 {
        2.0
    } else if m < 7.5 {
        5.0
    } else {
        10.0
    };
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let (k0, k1) = ((lo / step).floor() as i64, (hi / step).ceil() as i64);
    let ticks = (k0..=k1)
        .map(|k| k as f64 * step)
        .map(|t| (t, fixed(t, decimals)))
        .collect();
    (k0 as f64 * step, k1 as f64 * step, ticks)
}

/// Up to `n` of `items`, evenly spread, first and last kept.
pub fn spread<T: Clone>(items: &[T], n: usize) -> Vec<T> {
    if items.len() <= n || n < 2 {
        return items.to_vec();
    }
    (0..n)
        .map(|i| items[i * (items.len() - 1) / (n - 1)].clone())
        .collect()
}

impl Chart {
    /// A chart of `series` with the points table, [`WIDTH`] wide, no bands.
    pub fn new(title: &str, x: Axis, y: Axis, series: Vec<Series>) -> Self {
        Self {
            title: title.to_owned(),
            x,
            y,
            series,
            bands: Vec::new(),
            width: WIDTH,
            table: Table::Points,
        }
    }

    /// The `<figure>`: the SVG, an HTML legend, and the table in a `<details>`.
    pub fn html(&self) -> String {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(self.bands.iter().flat_map(|b| [b.from, b.to]));
        let ys = self
            .series
            .iter()
            .filter(|s| s.mark != Mark::Vertical)
            .flat_map(|s| s.points.iter().map(|p| p.1));
        let (Some(sx), Some(sy)) = (Scale::fit(&self.x, xs), Scale::fit(&self.y, ys)) else {
            return format!(
                r#"<figure class="chart"><figcaption>{}</figcaption><p>no data</p></figure>"#,
                esc(&self.title)
            );
        };
        let w = self.width;
        let (pw, ph) = (w - LEFT - RIGHT, H - TOP - BOTTOM);
        let px = |v: f64| LEFT + sx.at(v / sx.per) * pw;
        let py = |v: f64| TOP + (1.0 - sy.at(v / sy.per)) * ph;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<figure class="chart"><figcaption>{}</figcaption><svg viewBox="0 0 {w} {H}" width="{w}" height="{H}" role="img" aria-label="{}">"#,
            esc(&self.title),
            esc(&self.title)
        );
        // Phase bands under everything, labelled at the top.
        for (i, b) in self.bands.iter().enumerate() {
            let (x0, x1) = (px(b.from), px(b.to));
            let fill = if i % 2 == 0 { "#f2f2f2" } else { "#fafafa" };
            let _ = write!(
                s,
                r#"<rect class="band" x="{x0:.1}" y="{TOP}" width="{:.1}" height="{ph}" fill="{fill}"><title>{}: {} to {}</title></rect>"#,
                (x1 - x0).max(0.5),
                esc(&b.label),
                sx.exact(b.from),
                sx.exact(b.to)
            );
            if i > 0 {
                let _ = write!(
                    s,
                    r##"<line x1="{x0:.1}" y1="{TOP}" x2="{x0:.1}" y2="{}" stroke="#999" stroke-dasharray="3 3"/>"##,
                    TOP + ph
                );
            }
            // A label only where it fits (about 5.5 px a character at 9 px).
            if (x1 - x0) > 5.5 * b.label.chars().count() as f64 {
                let _ = write!(
                    s,
                    r##"<text x="{:.1}" y="{}" font-size="9" fill="#555">{}</text>"##,
                    x0 + 2.0,
                    TOP - 4.0,
                    esc(&b.label)
                );
            }
        }
        // Grid and ticks.
        let _ = write!(
            s,
            r#"<g class="ticks x" data-scale="{}" font-size="10" text-anchor="middle">"#,
            if sx.log { "log" } else { "linear" }
        );
        for (t, label) in &sx.ticks {
            let x = LEFT + sx.at(*t) * pw;
            // A label that would run past the right edge ends at its tick instead.
            let anchor = if x + label.chars().count() as f64 * 3.0 > WIDTH {
                r#" text-anchor="end""#
            } else {
                ""
            };
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{}" stroke="#e4e4e4"/><text x="{x:.1}" y="{}"{anchor}>{label}</text>"##,
                TOP + ph,
                TOP + ph + 14.0
            );
        }
        let _ = write!(
            s,
            r#"</g><g class="ticks y" data-scale="{}" font-size="10" text-anchor="end">"#,
            if sy.log { "log" } else { "linear" }
        );
        for (t, label) in &sy.ticks {
            let y = TOP + (1.0 - sy.at(*t)) * ph;
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}">{label}</text>"##,
                LEFT + pw,
                LEFT - 4.0,
                y + 3.0
            );
        }
        s.push_str("</g>");
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{0}" x2="{1}" y2="{0}" stroke="#444"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{0}" stroke="#444"/>"##,
            TOP + ph,
            LEFT + pw
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            H - 8.0,
            esc(&sx.title(&self.x.label))
        );
        let mid = TOP + ph / 2.0;
        let _ = write!(
            s,
            r#"<text x="12" y="{mid:.1}" font-size="11" transform="rotate(-90 12 {mid:.1})" text-anchor="middle">{}</text>"#,
            esc(&sy.title(&self.y.label))
        );
        // Series: faint points first, then lines and markers on top.
        let mut order: Vec<usize> = (0..self.series.len()).collect();
        order.sort_by_key(|&i| self.series[i].mark != Mark::Points);
        for i in order {
            let se = &self.series[i];
            let c = se.color.unwrap_or(COLORS[i % COLORS.len()]);
            let title = |j: usize, (x, y): (f64, f64)| {
                se.titles.get(j).cloned().unwrap_or_else(|| {
                    format!(
                        "{}: {} = {}, {} = {}",
                        se.name,
                        self.x.label,
                        sx.exact(x),
                        self.y.label,
                        sy.exact(y)
                    )
                })
            };
            let _ = write!(s, r#"<g class="series" data-series="{}">"#, esc(&se.name));
            match se.mark {
                Mark::Points => {
                    // Faint when many; few are seen.
                    let (r, op) = if se.points.len() > FEW_POINTS {
                        (1.8, 0.25)
                    } else {
                        (2.5, 0.5)
                    };
                    for (j, &p) in se.points.iter().enumerate() {
                        let _ = write!(
                            s,
                            r#"<circle cx="{:.1}" cy="{:.1}" r="{r}" fill="{c}" fill-opacity="{op}"><title>{}</title></circle>"#,
                            px(p.0),
                            py(p.1),
                            esc(&title(j, p))
                        );
                    }
                }
                Mark::Vertical => {
                    if let Some(&(x, _)) = se.points.first() {
                        let _ = write!(
                            s,
                            r#"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{1}" stroke="{c}" stroke-width="1.5" stroke-dasharray="5 3"><title>{2}: {3}</title></line><text x="{4:.1}" y="{5}" font-size="9" fill="{c}">{6}</text>"#,
                            px(x),
                            TOP + ph,
                            esc(&se.name),
                            sx.exact(x),
                            px(x) + 3.0,
                            TOP + 10.0 + 10.0 * (i % 3) as f64,
                            esc(&se.name)
                        );
                    }
                }
                Mark::Line => {
                    // A point without a finite y breaks the line (a gap between phases).
                    for run in se
                        .points
                        .split(|p| !p.1.is_finite())
                        .filter(|r| r.len() > 1)
                    {
                        let pts: Vec<String> = spread(run, 2000)
                            .iter()
                            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                            .collect();
                        let _ = write!(
                            s,
                            r#"<polyline fill="none" stroke="{c}" stroke-width="1.6" points="{}"/>"#,
                            pts.join(" ")
                        );
                    }
                    let finite: Vec<usize> = (0..se.points.len())
                        .filter(|&j| se.points[j].1.is_finite())
                        .collect();
                    let shown = finite.len() <= MARKED_POINTS;
                    for j in spread(&finite, LINE_VERTICES) {
                        let p = se.points[j];
                        let (r, op) = if finite.len() == 1 {
                            (4.0, 1.0)
                        } else if shown {
                            (3.0, 1.0)
                        } else {
                            (3.0, 0.0)
                        };
                        let _ = write!(
                            s,
                            r#"<circle cx="{:.1}" cy="{:.1}" r="{r}" fill="{c}" fill-opacity="{op}"><title>{}</title></circle>"#,
                            px(p.0),
                            py(p.1),
                            esc(&title(j, p))
                        );
                    }
                    // A single point is drawn with its value beside it.
                    if let [j] = finite[..] {
                        let (x, y) = se.points[j];
                        let _ = write!(
                            s,
                            r#"<text class="point-value" x="{:.1}" y="{:.1}" font-size="10" fill="{c}">{}</text>"#,
                            px(x) + 6.0,
                            py(y) - 6.0,
                            esc(format!("{} {}", sy.show(y), sy.unit).trim_end())
                        );
                    }
                }
            }
            s.push_str("</g>");
        }
        s.push_str("</svg>");
        // Legend.
        if self.series.len() > 1 || self.series.iter().any(|se| se.mark == Mark::Vertical) {
            s.push_str(r#"<div class="legend" style="font-size:11px;max-width:100%">"#);
            for (i, se) in self.series.iter().enumerate() {
                let c = se.color.unwrap_or(COLORS[i % COLORS.len()]);
                let _ = write!(
                    s,
                    r#"<span style="margin-right:10px"><i style="display:inline-block;width:10px;height:10px;margin-right:3px;background:{c}"></i>{}</span>"#,
                    esc(&se.name)
                );
            }
            s.push_str("</div>");
        }
        // The data, for screen readers and copy-paste.
        let table = match &self.table {
            Table::Html(h) => h.clone(),
            Table::Points => self.points_table(&sx, &sy),
        };
        let _ = write!(
            s,
            "<details><summary>Data</summary>{table}</details></figure>"
        );
        s
    }

    fn points_table(&self, sx: &Scale, sy: &Scale) -> String {
        let mut t = format!(
            r#"<table class="chart-data"><tr><th>series</th><th>{}</th><th>{}</th></tr>"#,
            esc(&sx.title(&self.x.label)),
            esc(&sy.title(&self.y.label))
        );
        for se in &self.series {
            let rows = spread(&se.points, TABLE_ROWS);
            if rows.len() < se.points.len() {
                let _ = write!(
                    t,
                    r#"<tr><td colspan="3">{}: {} of {} points, evenly spread</td></tr>"#,
                    esc(&se.name),
                    rows.len(),
                    se.points.len()
                );
            }
            for &(x, y) in rows
                .iter()
                .filter(|p| p.1.is_finite() || se.mark == Mark::Vertical)
                .take(if se.mark == Mark::Vertical {
                    1
                } else {
                    usize::MAX
                })
            {
                let yc = if se.mark == Mark::Vertical {
                    "<td>–</td>".to_owned()
                } else {
                    format!(r#"<td title="{}">{}</td>"#, sy.exact(y), sy.show(y))
                };
                let _ = write!(
                    t,
                    r#"<tr><td>{}</td><td title="{}">{}</td>{yc}</tr>"#,
                    esc(&se.name),
                    sx.exact(x),
                    sx.show(x)
                );
            }
        }
        t.push_str("</table>");
        t
    }
}

/// A chart of named polylines (`x`, `y` in data units) with its points table; an axis
/// labelled `ms` is a time axis (unit per axis, log when the values span more than two
/// decades), any other label a linear axis; a linear `y` axis starts at zero. A series of two
/// points at one `x` is a vertical marker.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    // A latency x axis (a CDF) spans its values; a y axis starts at zero unless logarithmic.
    let axis = |label: &str, y: bool| {
        if label == "ms" {
            Axis {
                from_zero: y,
                ..Axis::time("latency")
            }
        } else {
            Axis::linear(label, "", y)
        }
    };
    let series = series
        .iter()
        .map(|(name, p)| {
            let mark = if p.len() == 2 && p[0].0 == p[1].0 {
                Mark::Vertical
            } else {
                Mark::Line
            };
            Series::new(name.clone(), p.clone(), mark)
        })
        .collect();
    Chart::new(title, axis(x_label, false), axis(y_label, true), series).html()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(s: &Scale) -> Vec<&str> {
        s.ticks.iter().map(|t| t.1.as_str()).collect()
    }

    /// The issue's axis (one concurrency, 4096): one tick, "4,096", not 4096, 4096, 4097.
    #[test]
    fn one_value_is_one_tick() {
        let s = Scale::fit(&Axis::linear("concurrency", "", false), [4096.0, 4096.0]).unwrap();
        assert_eq!(labels(&s), ["4,096"]);
        assert_eq!(
            labels(&Scale::fit(&Axis::linear("c", "", false), [6.0]).unwrap()),
            ["6"]
        );
        assert_eq!(
            labels(&Scale::fit(&Axis::linear("c", "", false), [0.25]).unwrap()),
            ["0.250"]
        );
        assert!(s.lo < 4096.0 && s.hi > 4096.0 && (s.at(4096.0) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn nice_linear_ticks_never_repeat() {
        let s = Scale::fit(&Axis::linear("c", "", false), [4096.0, 4097.5]).unwrap();
        assert_eq!(
            labels(&s),
            [
                "4,096.0", "4,096.2", "4,096.4", "4,096.6", "4,096.8", "4,097.0", "4,097.2",
                "4,097.4", "4,097.6"
            ]
        );
        // Integer data (concurrency 1 … 4): integer ticks and values, not 1.0 1.5 … / 1.00.
        let s = Scale::fit(&Axis::linear("concurrency", "", false), [1.0, 2.0, 4.0]).unwrap();
        assert_eq!(labels(&s), ["1", "2", "3", "4"]);
        assert_eq!(
            (s.show(4.0), s.show(8.4393)),
            ("4".to_owned(), "8.44".to_owned())
        );
        // Hover text: six significant digits, not the raw float.
        let s = Scale::fit(
            &Axis::linear("tok", "ms", false),
            [644.4344600000001, 700.0],
        )
        .unwrap();
        assert_eq!(s.exact(644.4344600000001), "644.434 ms");
        let s = Scale::fit(&Axis::linear("share", "", true), [0.01, 1.0]).unwrap();
        assert_eq!(labels(&s), ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
        let s = Scale::fit(&Axis::linear("tok/s", "tok/s", true), [12082.0]).unwrap();
        assert_eq!(
            labels(&s),
            [
                "0", "2,000", "4,000", "6,000", "8,000", "10,000", "12,000", "14,000"
            ]
        );
        for (lo, hi) in [
            (0.0, 0.3),
            (1e-4, 3e-4),
            (17.0, 19.5),
            (0.0, 1e9),
            (-3.0, 7.0),
        ] {
            let (a, b, t) = linear_ticks(lo, hi);
            let l: Vec<&String> = t.iter().map(|t| &t.1).collect();
            let mut d = l.clone();
            d.dedup();
            assert_eq!(l, d, "{lo}..{hi}");
            assert!(
                a <= lo && b >= hi && (4..=11).contains(&t.len()),
                "{lo}..{hi}: {t:?}"
            );
        }
    }

    /// A sub-millisecond TPOT is drawn on a sub-millisecond axis, not squeezed at 0 of 0–1 ms;
    /// times from 0.2 ms to 3 s are logarithmic, in seconds.
    #[test]
    fn time_axes_pick_unit_and_scale() {
        let s = Scale::fit(&Axis::time("TPOT"), [0.012, 0.018, 0.031]).unwrap();
        assert_eq!((s.unit.as_str(), s.log), ("ms", false));
        assert_eq!(
            labels(&s),
            [
                "0.000", "0.005", "0.010", "0.015", "0.020", "0.025", "0.030", "0.035"
            ]
        );
        let s = Scale::fit(&Axis::time("E2EL"), [0.2, 5.0, 3000.0]).unwrap();
        assert_eq!((s.unit.as_str(), s.log, s.per), ("s", true, 1000.0));
        assert_eq!(labels(&s), ["0.0001", "0.001", "0.01", "0.1", "1", "10"]);
        let s = Scale::fit(&Axis::time("E2EL"), [0.004, 0.006]).unwrap();
        assert_eq!((s.unit.as_str(), s.show(0.0042)), ("µs", "4.20".to_owned()));
    }

    /// One concurrency: "Output tokens/s vs concurrency" shows its point, in the middle, with
    /// its value beside it and the exact value on hover; the table lists it.
    #[test]
    fn a_single_point_is_drawn_with_its_value() {
        let svg = line_chart(
            "Output tokens/s vs concurrency",
            "concurrency",
            "output tokens/s",
            &[("in 128".into(), vec![(4096.0, 12345.6)])],
        );
        assert!(svg.contains(r#"<circle cx="304.0""#) && svg.contains(r##"r="4" fill="#1f77b4" fill-opacity="1"><title>in 128: concurrency = 4,096, output tokens/s = 12,345.6</title>"##), "{svg}");
        assert!(
            svg.contains(r#"class="point-value""#) && svg.contains(">12,346</text>"),
            "{svg}"
        );
        assert_eq!(svg.matches(">4,096</text>").count(), 1, "{svg}");
        assert!(svg.contains(r#"<td title="12,345.6">12,346</td>"#), "{svg}");
    }

    #[test]
    fn vertical_markers_and_log_latency() {
        let svg = line_chart(
            "x",
            "offered req/s",
            "ms",
            &[
                ("p99".into(), vec![(1.0, 0.5), (2.0, 80.0)]),
                ("max rate".into(), vec![(1.5, 0.0), (1.5, 90.0)]),
            ],
        );
        assert!(
            svg.contains(r#"class="ticks y" data-scale="log""#),
            "0.5 to 80 ms is over two decades: {svg}"
        );
        assert!(
            svg.contains("stroke-dasharray=\"5 3\"><title>max rate: 1.5</title>"),
            "{svg}"
        );
    }

    #[test]
    fn spread_keeps_ends() {
        assert_eq!(spread(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4), [1, 4, 7, 10]);
        assert_eq!(spread(&[1, 2], 4), [1, 2]);
    }
}
