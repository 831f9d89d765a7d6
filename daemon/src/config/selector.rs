//! Label selectors as `kubectl -l` writes them (`app=vllm,tier!=canary`,
//! `env in (prod,staging)`, `gpu`, `!spot`), parsed into `kube`'s [`Selector`] and matched by it.
//! Pure.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, Selector, SelectorExt};

/// A parsed label selector and its text (for logs and the status).
#[derive(Debug, Clone, PartialEq)]
pub struct LabelSelector {
    pub text: String,
    selector: Selector,
}

impl LabelSelector {
    /// Parses `text`, the `kubectl -l` syntax: comma-separated requirements, each `k=v`,
    /// `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` or `!k`.
    ///
    /// # Errors
    /// A sentence naming the requirement that does not parse.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut exprs = Vec::new();
        for req in split_top(text)? {
            let req = req.trim();
            if req.is_empty() {
                return Err("an empty requirement (two commas, or a trailing comma)".into());
            }
            exprs.push(requirement(req)?);
        }
        Ok(Self {
            text: text.trim().to_owned(),
            selector: exprs.into_iter().collect(),
        })
    }

    /// A selector from `kube`'s type (e.g. an InferencePool's `selector`).
    pub fn from_selector(selector: Selector) -> Self {
        Self {
            text: selector.to_string(),
            selector,
        }
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }
}

/// Splits on commas outside parentheses.
fn split_top(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unbalanced ')' at byte {i}"));
                }
            }
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '(' (a set is written `key in (a,b)`)".into());
    }
    out.push(&text[start..]);
    Ok(out)
}

fn key(k: &str, req: &str) -> Result<String, String> {
    let k = k.trim();
    let ok = !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(k.to_owned())
    } else {
        Err(format!("`{req}`: `{k}` is not a label key"))
    }
}

fn value(v: &str, req: &str) -> Result<String, String> {
    let v = v.trim();
    let ok = v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(v.to_owned())
    } else {
        Err(format!("`{req}`: `{v}` is not a label value"))
    }
}

fn set(rest: &str, req: &str) -> Result<BTreeSet<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("`{req}`: a set is written `(a,b)`"))?;
    inner.split(',').map(|v| value(v, req)).collect()
}

fn requirement(req: &str) -> Result<Expression, String> {
    if let Some(k) = req.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key(k, req)?));
    }
    if let Some((k, v)) = req.split_once("!=") {
        return Ok(Expression::NotEqual(key(k, req)?, value(v, req)?));
    }
    if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
        return Ok(Expression::Equal(key(k, req)?, value(v, req)?));
    }
    let words: Vec<&str> = req.splitn(2, char::is_whitespace).collect();
    if let [k, rest] = words[..] {
        let rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("notin") {
            return Ok(Expression::NotIn(key(k, req)?, set(r, req)?));
        }
        if let Some(r) = rest.strip_prefix("in") {
            return Ok(Expression::In(key(k, req)?, set(r, req)?));
        }
        return Err(format!(
            "`{req}`: expected `=`, `!=`, `in (…)` or `notin (…)`"
        ));
    }
    Ok(Expression::Exists(key(req, req)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn kubectl_syntax_matches_like_the_api_server() {
        let s = LabelSelector::parse(
            "app.kubernetes.io/name=vllm, tier!=batch,env in (prod, staging),gpu,!spot",
        )
        .unwrap();
        let yes = labels(&[
            ("app.kubernetes.io/name", "vllm"),
            ("env", "prod"),
            ("gpu", "h100"),
        ]);
        assert!(s.matches(&yes));
        let mut spot = yes.clone();
        spot.insert("spot".into(), "true".into());
        assert!(!s.matches(&spot));
        let mut batch = yes.clone();
        batch.insert("tier".into(), "batch".into());
        assert!(!s.matches(&batch));
        let mut dev = yes.clone();
        dev.insert("env".into(), "dev".into());
        assert!(!s.matches(&dev));
        let n = LabelSelector::parse("env notin (dev),app==x").unwrap();
        assert!(n.matches(&labels(&[("app", "x")])));
        assert!(!n.matches(&labels(&[("app", "x"), ("env", "dev")])));
    }

    #[test]
    fn bad_selectors_say_which_requirement() {
        for (text, says) in [
            ("app in (a", "unbalanced"),
            ("app=x,,b=y", "empty requirement"),
            ("app in a,b", "a set is written"),
            ("app=has space", "not a label value"),
            ("app ~ x", "expected"),
        ] {
            let e = LabelSelector::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
