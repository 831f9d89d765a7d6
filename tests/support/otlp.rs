//! Reading what `fake-opentelemetry-collector` received (its attributes are `Debug` strings of
//! the OTLP `AnyValue`).

use std::collections::BTreeMap;

/// `Some(AnyValue { value: Some(StringValue("chat")) })` → `chat`; `IntValue(16)` → `16`.
pub fn value(debug: &str) -> String {
    let s = debug.trim();
    let s = s
        .strip_prefix("Some(AnyValue { value: Some(")
        .and_then(|r| r.strip_suffix(") })"))
        .unwrap_or(s);
    let inner = s
        .split_once('(')
        .map(|(_, r)| r.strip_suffix(')').unwrap_or(r))
        .unwrap_or(s);
    inner.trim_matches('"').to_owned()
}

/// Attribute map with plain values.
pub fn attrs(raw: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    raw.iter().map(|(k, v)| (k.clone(), value(v))).collect()
}
