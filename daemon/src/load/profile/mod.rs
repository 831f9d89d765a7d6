//! Load profiles (`--profile FILE`): a YAML file with three independent dimensions, read
//! strictly (an unknown key or a bad value is one line naming the key and the value):
//!
//! ```yaml
//! profile: burst-llm-eval
//! prompt_length: {distribution: lognormal, mu: 1200, sigma: 0.8}   # uniform, normal, zipf, fixed
//! concurrency:   {ramp: exponential, base: 4, step: 3s, max: 64}    # linear, sawtooth, fixed
//! token_rate:    {mode: constant, target: 256/s, jitter: 15%}       # bursty, adaptive
//! ```
//!
//! `prompt_length` lognormal `mu` is the median in tokens (the log-space μ is `ln(mu)`).
//! `concurrency`: `fixed` keeps `base`; `linear` adds `base` every `step`; `exponential`
//! doubles every `step` from `base`; `sawtooth` goes `base`, 2·`base`, … up to `max`, then
//! back to `base`; all capped by `max` (default 1024). `token_rate` is the output-token rate
//! asked of the server (see [`scheduler`]). The scheduler is a pure module: [`scheduler`].

pub mod scheduler;
pub mod watch;

use std::time::Duration;

use yaml_serde::Value;

use crate::load::workload::LengthDist;

/// `prompt_length`, `concurrency`, `token_rate` of a profile; a dimension left out keeps the
/// run's flags (`--seq-lengths`, `--batch-sizes`, `--request-rate`).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub prompt_length: Option<LengthDist>,
    pub concurrency: Option<ConcurrencyShape>,
    pub token_rate: Option<TokenRate>,
}

/// How the concurrency limit moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencyShape {
    pub ramp: ConcurrencyRamp,
    pub base: u32,
    pub step: Duration,
    pub max: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConcurrencyRamp {
    Fixed,
    Linear,
    Exponential,
    Sawtooth,
}

/// The output-token rate asked of the server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TokenRate {
    /// Arrivals so that the requested output tokens per second follow `target` (each gap
    /// scaled by a uniform factor in `1 ± jitter`).
    Constant { target: f64, jitter: f64 },
    /// On/off periods of `period` each: twice the `target` while on, none while off (same mean).
    Bursty { target: f64, period: Duration },
    /// From `target`, raised by `increase` (a fraction) every `step` while the per-stream
    /// decode rate (1/TPOT) stays above `floor` tokens/s.
    Adaptive {
        target: f64,
        increase: f64,
        step: Duration,
        floor: f64,
    },
}

/// A profile that cannot be used: one line naming the file, key and value (`FILE: cannot
/// read: …` and `FILE: YAML error at line L column C: …` for the file as a whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ProfileError {
    pub file: String,
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            file,
            key,
            value,
            reason,
        } = self;
        match key.as_str() {
            "(file)" => write!(f, "{file}: cannot read: {reason}"),
            "(document)" => write!(f, "{file}: YAML error{value}: {reason}"),
            _ => write!(f, "{file}: {key} = {value}: {reason}"),
        }
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".into(),
        other => serde_json::to_string(other).unwrap_or_else(|_| "?".into()),
    }
}

struct Map<'a> {
    file: &'a str,
    path: String,
    map: &'a yaml_serde::Mapping,
}

impl<'a> Map<'a> {
    fn err(&self, key: &str, v: &Value, reason: impl Into<String>) -> ProfileError {
        ProfileError {
            file: self.file.to_owned(),
            key: if self.path.is_empty() {
                key.to_owned()
            } else {
                format!("{}.{key}", self.path)
            },
            value: show(v),
            reason: reason.into(),
        }
    }

    fn of(file: &'a str, path: &str, v: &'a Value, allowed: &[&str]) -> Result<Self, ProfileError> {
        let Value::Mapping(map) = v else {
            return Err(ProfileError {
                file: file.to_owned(),
                key: path.to_owned(),
                value: show(v),
                reason: format!("expected a mapping of {}", allowed.join(", ")),
            });
        };
        let me = Self {
            file,
            path: path.to_owned(),
            map,
        };
        for (k, val) in map {
            let name = k.as_str().unwrap_or("");
            if !allowed.contains(&name) {
                return Err(me.err(
                    show(k).trim_matches('"'),
                    val,
                    format!("unknown key (expected {})", allowed.join(", ")),
                ));
            }
        }
        Ok(me)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    fn num(&self, key: &str) -> Result<Option<f64>, ProfileError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.err(key, v, "not a number")),
        }
    }

    fn text(&self, key: &str) -> Result<Option<&'a str>, ProfileError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, v, "not a string")),
        }
    }

    fn duration(&self, key: &str) -> Result<Option<Duration>, ProfileError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                let parsed = match v {
                    Value::String(s) => humantime::parse_duration(s.trim()).ok(),
                    _ => v
                        .as_f64()
                        .filter(|s| s.is_finite() && *s > 0.0)
                        .map(Duration::from_secs_f64),
                };
                parsed
                    .filter(|d| !d.is_zero())
                    .map(Some)
                    .ok_or_else(|| self.err(key, v, "not a positive duration (e.g. 3s, 500ms)"))
            }
        }
    }

    /// `256/s`, `256` (per second).
    fn rate(&self, key: &str) -> Result<f64, ProfileError> {
        let v = self
            .get(key)
            .ok_or_else(|| self.err(key, &Value::Null, "missing"))?;
        let r = match v {
            Value::String(s) => s
                .trim()
                .strip_suffix("/s")
                .unwrap_or(s.trim())
                .trim()
                .parse::<f64>()
                .ok(),
            _ => v.as_f64(),
        };
        r.filter(|r| r.is_finite() && *r > 0.0)
            .ok_or_else(|| self.err(key, v, "not a positive rate (e.g. 256/s)"))
    }

    /// `15%` or `0.15`.
    fn fraction(&self, key: &str, default: f64) -> Result<f64, ProfileError> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        let f = match v {
            Value::String(s) => s
                .trim()
                .strip_suffix('%')
                .and_then(|p| p.trim().parse::<f64>().ok())
                .map(|p| p / 100.0),
            _ => v.as_f64(),
        };
        f.filter(|f| (0.0..1.0).contains(f))
            .ok_or_else(|| self.err(key, v, "a fraction in [0, 1) or a percentage (15%)"))
    }

    fn count(&self, key: &str, default: Option<u32>) -> Result<u32, ProfileError> {
        match self.get(key) {
            None => default.ok_or_else(|| self.err(key, &Value::Null, "missing")),
            Some(v) => v
                .as_u64()
                .filter(|n| *n >= 1 && *n <= 1_000_000)
                .map(|n| n as u32)
                .ok_or_else(|| self.err(key, v, "a whole number ≥ 1")),
        }
    }
}

/// Parses a profile's text; `file` names it in errors.
///
/// # Errors
/// The first unknown key or bad value, as one line.
pub fn parse(file: &str, text: &str) -> Result<Profile, ProfileError> {
    let doc: Value = yaml_serde::from_str(text).map_err(|e| {
        let message = e.to_string().replace('\n', " ");
        // The location goes first; the message without its own " at line …".
        let reason = message
            .find(" at line ")
            .map_or(message.as_str(), |i| &message[..i])
            .to_owned();
        ProfileError {
            file: file.to_owned(),
            key: "(document)".into(),
            value: e.location().map_or(String::new(), |l| {
                format!(" at line {} column {}", l.line(), l.column())
            }),
            reason,
        }
    })?;
    let top = Map::of(
        file,
        "",
        &doc,
        &["profile", "prompt_length", "concurrency", "token_rate"],
    )?;
    let name = top.text("profile")?.unwrap_or("profile").to_owned();
    let prompt_length = match top.get("prompt_length") {
        None => None,
        Some(v) => Some(prompt_length(file, v)?),
    };
    let concurrency = match top.get("concurrency") {
        None => None,
        Some(v) => Some(concurrency(file, v)?),
    };
    let token_rate = match top.get("token_rate") {
        None => None,
        Some(v) => Some(token_rate(file, v)?),
    };
    Ok(Profile {
        name,
        prompt_length,
        concurrency,
        token_rate,
    })
}

/// Reads and parses `path`.
///
/// # Errors
/// An unreadable file, or [`parse`]'s error.
pub fn load(path: &std::path::Path) -> Result<Profile, ProfileError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ProfileError {
        file: file.clone(),
        key: "(file)".into(),
        value: String::new(),
        // "No such file or directory", without " (os error 2)".
        reason: e
            .to_string()
            .split(" (os error")
            .next()
            .unwrap_or_default()
            .to_owned(),
    })?;
    parse(&file, &text)
}

fn prompt_length(file: &str, v: &Value) -> Result<LengthDist, ProfileError> {
    let m = Map::of(
        file,
        "prompt_length",
        v,
        &[
            "distribution",
            "mu",
            "sigma",
            "mean",
            "std",
            "min",
            "max",
            "value",
            "n",
            "s",
        ],
    )?;
    let kind = m.text("distribution")?.ok_or_else(|| {
        m.err(
            "distribution",
            &Value::Null,
            "missing (lognormal, uniform, normal, zipf, fixed)",
        )
    })?;
    let dist_value = m.get("distribution").cloned().unwrap_or(Value::Null);
    let mut parts: Vec<String> = Vec::new();
    for k in [
        "mu", "sigma", "mean", "std", "min", "max", "value", "n", "s",
    ] {
        if let Some(x) = m.num(k)? {
            // lognormal mu: the median in tokens.
            let x = if kind == "lognormal" && k == "mu" {
                if x <= 0.0 {
                    return Err(m.err(
                        k,
                        m.get(k).unwrap_or(&Value::Null),
                        "the median length in tokens, > 0",
                    ));
                }
                x.ln()
            } else {
                x
            };
            parts.push(format!("{k}={x}"));
        }
    }
    LengthDist::parse("prompt_length", &format!("{kind}:{}", parts.join(","))).map_err(|e| {
        m.err(
            "distribution",
            &dist_value,
            e.trim_start_matches("prompt_length ").to_owned(),
        )
    })
}

fn concurrency(file: &str, v: &Value) -> Result<ConcurrencyShape, ProfileError> {
    let m = Map::of(file, "concurrency", v, &["ramp", "base", "step", "max"])?;
    let ramp_v = m.get("ramp").cloned().unwrap_or(Value::Null);
    let ramp = match m.text("ramp")?.unwrap_or("fixed") {
        "fixed" => ConcurrencyRamp::Fixed,
        "linear" => ConcurrencyRamp::Linear,
        "exponential" => ConcurrencyRamp::Exponential,
        "sawtooth" => ConcurrencyRamp::Sawtooth,
        _ => {
            return Err(m.err(
                "ramp",
                &ramp_v,
                "expected fixed, linear, exponential or sawtooth",
            ));
        }
    };
    let base = m.count("base", None)?;
    let step = m.duration("step")?;
    let step = match (ramp, step) {
        (ConcurrencyRamp::Fixed, s) => s.unwrap_or(Duration::from_secs(1)),
        (_, Some(s)) => s,
        (_, None) => {
            return Err(m.err(
                "step",
                &Value::Null,
                "missing (how often the ramp moves, e.g. 3s)",
            ));
        }
    };
    let max = m.count("max", Some(1024))?;
    if max < base {
        return Err(m.err(
            "max",
            m.get("max").unwrap_or(&Value::Null),
            format!("below base {base}"),
        ));
    }
    Ok(ConcurrencyShape {
        ramp,
        base,
        step,
        max,
    })
}

fn token_rate(file: &str, v: &Value) -> Result<TokenRate, ProfileError> {
    let m = Map::of(
        file,
        "token_rate",
        v,
        &[
            "mode", "target", "jitter", "period", "increase", "step", "floor",
        ],
    )?;
    let mode_v = m.get("mode").cloned().unwrap_or(Value::Null);
    let target = m.rate("target")?;
    let only = |allowed: &[&str]| -> Result<(), ProfileError> {
        for k in ["jitter", "period", "increase", "step", "floor"] {
            if !allowed.contains(&k)
                && let Some(v) = m.get(k)
            {
                return Err(m.err(k, v, format!("not a key of mode {}", show(&mode_v))));
            }
        }
        Ok(())
    };
    match m.text("mode")?.unwrap_or("constant") {
        "constant" => {
            only(&["jitter"])?;
            Ok(TokenRate::Constant {
                target,
                jitter: m.fraction("jitter", 0.0)?,
            })
        }
        "bursty" => {
            only(&["period"])?;
            Ok(TokenRate::Bursty {
                target,
                period: m.duration("period")?.unwrap_or(Duration::from_secs(5)),
            })
        }
        "adaptive" => {
            only(&["increase", "step", "floor"])?;
            let increase = m.fraction("increase", 0.25)?;
            if increase == 0.0 {
                return Err(m.err(
                    "increase",
                    m.get("increase").unwrap_or(&Value::Null),
                    "must be > 0",
                ));
            }
            let floor = m.num("floor")?.unwrap_or(10.0);
            if floor <= 0.0 {
                return Err(m.err(
                    "floor",
                    m.get("floor").unwrap_or(&Value::Null),
                    "tokens per second per stream, > 0",
                ));
            }
            Ok(TokenRate::Adaptive {
                target,
                increase,
                step: m.duration("step")?.unwrap_or(Duration::from_secs(10)),
                floor,
            })
        }
        _ => Err(m.err("mode", &mode_v, "expected constant, bursty or adaptive")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = "profile: burst-llm-eval\nprompt_length: {distribution: lognormal, mu: 1200, sigma: 0.8}\nconcurrency:   {ramp: exponential, base: 4, step: 3s}\ntoken_rate:    {mode: constant, target: 256/s, jitter: 15%}\n";

    #[test]
    fn file_errors_are_one_plain_line() {
        let e = load(std::path::Path::new("/nonexistent.yaml")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/nonexistent.yaml: cannot read: No such file or directory"
        );
        let e = parse("p.yaml", "profile: x\ntoken_rate: {mode: constant\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.yaml: YAML error at line 3 column 1: "),
            "{e}"
        );
        assert!(
            !e.contains("(document)") && !e.contains(" = …") && e.matches(" at line ").count() == 1,
            "{e}"
        );
    }

    #[test]
    fn the_seed_profile_parses() {
        let p = parse("p.yaml", SEED).unwrap();
        assert_eq!(p.name, "burst-llm-eval");
        let Some(LengthDist::Lognormal { mu, sigma, .. }) = p.prompt_length else {
            panic!("{p:?}")
        };
        assert!((mu - 1200f64.ln()).abs() < 1e-12 && (sigma - 0.8).abs() < 1e-12);
        assert_eq!(
            p.concurrency,
            Some(ConcurrencyShape {
                ramp: ConcurrencyRamp::Exponential,
                base: 4,
                step: Duration::from_secs(3),
                max: 1024
            })
        );
        assert_eq!(
            p.token_rate,
            Some(TokenRate::Constant {
                target: 256.0,
                jitter: 0.15
            })
        );
    }

    #[test]
    fn strict_one_line_errors_name_key_and_value() {
        for (text, want) in [
            (
                "profile: x\nconcurency: {ramp: linear}\n",
                "p.yaml: concurency = {\"ramp\":\"linear\"}: unknown key",
            ),
            (
                "concurrency: {ramp: exponential, base: 4, step: 3s, rampp: 1}\n",
                "p.yaml: concurrency.rampp = 1: unknown key",
            ),
            (
                "concurrency: {ramp: cubic, base: 4, step: 3s}\n",
                "p.yaml: concurrency.ramp = \"cubic\": expected fixed",
            ),
            (
                "concurrency: {ramp: linear, base: 0, step: 3s}\n",
                "p.yaml: concurrency.base = 0: a whole number",
            ),
            (
                "concurrency: {ramp: linear, base: 2, step: soon}\n",
                "p.yaml: concurrency.step = \"soon\": not a positive duration",
            ),
            (
                "token_rate: {mode: constant, target: fast}\n",
                "p.yaml: token_rate.target = \"fast\": not a positive rate",
            ),
            (
                "token_rate: {mode: constant, target: 256/s, jitter: 150%}\n",
                "p.yaml: token_rate.jitter = \"150%\": a fraction",
            ),
            (
                "token_rate: {mode: constant, target: 10, period: 3s}\n",
                "p.yaml: token_rate.period = \"3s\": not a key of mode",
            ),
            (
                "prompt_length: {distribution: lognormal, mu: 1200}\n",
                "p.yaml: prompt_length.distribution = \"lognormal\": ",
            ),
            (
                "prompt_length: {distribution: pareto}\n",
                "p.yaml: prompt_length.distribution = \"pareto\": ",
            ),
        ] {
            let e = parse("p.yaml", text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}
