//! Numbers as people read them, shared by `report.html`, `compare.html` and the terminal
//! summary of `lmperf run`: three significant digits, a time unit chosen per value (`0.155 ms`,
//! `16.6 ms`, `1.24 s`) or per column, thousands separators (`12,345 tok/s`).

/// Significant digits of every shown measurement.
pub const SIG: usize = 3;

/// `v` with `sig` significant digits; a value of `10^sig` or more is shown whole (digits are
/// never dropped from the integer part), with thousands separators: `0.000155`, `16.6`,
/// `1,235` (of 1234.6), `0` (of 0). Non-finite values: `–`, `∞`, `-∞`.
pub fn sig(v: f64, sig: usize) -> String {
    if v.is_nan() {
        return "–".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "∞" } else { "-∞" }.to_owned();
    }
    if v == 0.0 {
        return "0".to_owned();
    }
    let sig = sig.max(1) as i32;
    let mag = v.abs().log10().floor() as i32;
    let mut decimals = (sig - 1 - mag).max(0);
    // 9.996 at three digits rounds up to 10.00: one decimal fewer keeps three digits.
    let rounded: f64 = format!("{:.*}", decimals as usize, v).parse().unwrap_or(v);
    if rounded != 0.0 && rounded.abs().log10().floor() as i32 > mag && decimals > 0 {
        decimals -= 1;
    }
    fixed(v, decimals as usize)
}

/// `v` with at most `digits` significant digits, trailing zeros dropped (hover text):
/// `644.434` of 644.4344600000001, `5` of 5.0000, `7.99043` of 7.9904335060000005.
pub fn exact(v: f64, digits: usize) -> String {
    let s = sig(v, digits);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// `v` with [`SIG`] significant digits (see [`sig`]).
pub fn number(v: f64) -> String {
    sig(v, SIG)
}

/// `v` with exactly `decimals` decimals and thousands separators in its integer part:
/// `fixed(12345.678, 1)` is `12,345.7`.
pub fn fixed(v: f64, decimals: usize) -> String {
    if !v.is_finite() {
        return sig(v, 1);
    }
    let s = format!("{:.*}", decimals, v);
    let (sign, body) = match s.strip_prefix('-') {
        // "-0.00" is shown as "0.00".
        Some(b) if b.bytes().any(|c| c.is_ascii_digit() && c != b'0') => ("-", b),
        Some(b) => ("", b),
        None => ("", s.as_str()),
    };
    let (int, frac) = body
        .split_once('.')
        .map_or((body, None), |(i, f)| (i, Some(f)));
    let mut out = String::with_capacity(s.len() + int.len() / 3);
    out.push_str(sign);
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if let Some(f) = frac {
        out.push('.');
        out.push_str(f);
    }
    out
}

/// A count with thousands separators: `12,345`.
pub fn count(n: u64) -> String {
    fixed(n as f64, 0)
}

/// A rate with its unit: `rate(12345.6, "tok/s")` is `12,346 tok/s`, `rate(4.256, "req/s")`
/// is `4.26 req/s`.
pub fn rate(v: f64, unit: &str) -> String {
    format!("{} {unit}", number(v))
}

/// A unit of time for showing values held in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    Us,
    Ms,
    S,
}

impl TimeUnit {
    /// The unit of one value of `ms` milliseconds: µs below 0.01 ms (but 0 is `0 ms`), s from
    /// 1,000 ms, else ms (so `0.155 ms`, `16.6 ms`, `1.24 s`).
    pub fn of_ms(ms: f64) -> Self {
        let a = ms.abs();
        if a >= 1000.0 {
            Self::S
        } else if a > 0.0 && a < 0.01 {
            Self::Us
        } else {
            Self::Ms
        }
    }

    /// One unit for a column or an axis of values in milliseconds: that of the largest
    /// magnitude (ms when there is no finite value).
    pub fn for_values(ms: impl IntoIterator<Item = f64>) -> Self {
        let top = ms
            .into_iter()
            .filter(|v| v.is_finite())
            .map(f64::abs)
            .fold(0.0, f64::max);
        if top == 0.0 {
            Self::Ms
        } else {
            Self::of_ms(top)
        }
    }

    /// `µs`, `ms` or `s`.
    pub fn symbol(self) -> &'static str {
        match self {
            Self::Us => "µs",
            Self::Ms => "ms",
            Self::S => "s",
        }
    }

    /// Milliseconds in one of this unit.
    pub fn ms(self) -> f64 {
        match self {
            Self::Us => 0.001,
            Self::Ms => 1.0,
            Self::S => 1000.0,
        }
    }

    /// `ms` milliseconds in this unit, [`SIG`] significant digits, without the symbol.
    pub fn show(self, ms: f64) -> String {
        number(ms / self.ms())
    }
}

/// A duration held in milliseconds, in its own unit: `0.155 ms`, `16.6 ms`, `1.24 s`,
/// `4.2 µs`; `–` when not finite.
pub fn duration_ms(ms: f64) -> String {
    if !ms.is_finite() {
        return "–".to_owned();
    }
    let u = TimeUnit::of_ms(ms);
    format!("{} {}", u.show(ms), u.symbol())
}

/// A limit given in milliseconds (an SLO), exactly, in its own unit: `1 ms`, `1.5 s`.
pub fn limit_ms(ms: f64) -> String {
    let u = TimeUnit::of_ms(ms);
    format!("{} {}", ms / u.ms(), u.symbol())
}

/// An optional duration in milliseconds ([`duration_ms`]; `–` for none).
pub fn opt_duration_ms(ms: Option<f64>) -> String {
    ms.map_or_else(|| "–".to_owned(), duration_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_hover_values() {
        assert_eq!(exact(644.4344600000001, 6), "644.434");
        assert_eq!(exact(5.0, 4), "5");
        assert_eq!(exact(7.9904335060000005, 6), "7.99043");
        assert_eq!(exact(4096.0, 6), "4,096");
    }

    #[test]
    fn significant_digits() {
        for (v, want) in [
            (0.155, "0.155"),
            (0.15549, "0.155"),
            (16.64, "16.6"),
            (1.2449, "1.24"),
            (100.0, "100"),
            (9.996, "10.0"),
            (0.09996, "0.100"),
            (999.6, "1,000"),
            (1234.6, "1,235"),
            (12_345_678.0, "12,345,678"),
            (0.000_155_4, "0.000155"),
            (-16.64, "-16.6"),
            (0.0, "0"),
            (f64::NAN, "–"),
        ] {
            assert_eq!(number(v), want, "{v}");
        }
        assert_eq!(sig(2.0 / 3.0, 5), "0.66667");
    }

    #[test]
    fn separators_and_rates() {
        assert_eq!(fixed(12345.678, 1), "12,345.7");
        assert_eq!(fixed(-1234.0, 0), "-1,234");
        assert_eq!(fixed(-0.001, 2), "0.00");
        assert_eq!(fixed(999.0, 0), "999");
        assert_eq!(count(4096), "4,096");
        assert_eq!(rate(12345.6, "tok/s"), "12,346 tok/s");
        assert_eq!(rate(4.256, "req/s"), "4.26 req/s");
    }

    /// The examples: the unit follows the value.
    #[test]
    fn durations_pick_their_unit() {
        assert_eq!(duration_ms(0.155), "0.155 ms");
        assert_eq!(duration_ms(16.62), "16.6 ms");
        assert_eq!(duration_ms(1238.0), "1.24 s");
        assert_eq!(duration_ms(0.0042), "4.20 µs");
        assert_eq!(duration_ms(0.0), "0 ms");
        assert_eq!(duration_ms(75_300.0), "75.3 s");
        assert_eq!(opt_duration_ms(None), "–");
        assert_eq!(
            (limit_ms(1.0), limit_ms(1500.0), limit_ms(7.5)),
            ("1 ms".to_owned(), "1.5 s".to_owned(), "7.5 ms".to_owned())
        );
        assert_eq!(TimeUnit::for_values([0.155, 16.6]), TimeUnit::Ms);
        assert_eq!(TimeUnit::for_values([16.6, 1240.0]), TimeUnit::S);
        assert_eq!(TimeUnit::for_values([0.004, 0.002]), TimeUnit::Us);
        assert_eq!(TimeUnit::for_values([f64::NAN]), TimeUnit::Ms);
        assert_eq!(TimeUnit::S.show(16.6), "0.0166");
    }
}
