//! Reading what the agent's `/api/v1/status` says of its targets (the discovery tests), and
//! how many canaries a scripted server got.

use serde_json::Value;

use crate::scripted::ScriptedServer;

/// Requests to `s` on a `…/completions` path: the canaries it got.
pub fn completions(s: &ScriptedServer) -> usize {
    s.requests()
        .iter()
        .filter(|r| r.path.ends_with("/completions"))
        .count()
}

/// The agent status's target names, sorted.
pub fn target_names(s: &Value) -> Vec<String> {
    let mut v: Vec<String> = s["targets"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The agent status's target `name` (`Null` when absent).
pub fn target<'a>(s: &'a Value, name: &str) -> &'a Value {
    s["targets"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The server changes of kind `kind` the agent status lists for target `name`.
pub fn changes(s: &Value, name: &str, kind: &str) -> Vec<Value> {
    s["server"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["target"] == name))
        .and_then(|t| t["changes"].as_array())
        .map(|c| c.iter().filter(|c| c["kind"] == kind).cloned().collect())
        .unwrap_or_default()
}
