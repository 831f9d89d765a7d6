//! The sections of `lmperf ctl status` read from the status document (`status_json`, the
//! `/api/v1/status` JSON): Kubernetes discovery, the kubelet's pod-resources reader and config
//! reloads, so the text says what the admin HTTP says.

use std::fmt::Write;

use serde_json::Value;

/// The `discovery`, `pod-resources` and `config reload` lines of the status document
/// `status_json`; empty when it cannot be read (an older agent).
pub fn format(status_json: &str) -> String {
    let Ok(doc) = serde_json::from_str::<Value>(status_json) else {
        return String::new();
    };
    let mut o = String::new();
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let d = &doc["discovery"];
    if d.is_object() {
        let _ = writeln!(
            o,
            "discovery: {} via {}  node={}  {}  pods={} targets={} lists={} errors={}",
            text(&d["kind"]),
            text(&d["source"]),
            text(&d["node"]),
            text(&d["state"]),
            text(&d["pods"]),
            text(&d["targets"]),
            text(&d["lists"]),
            text(&d["errors"]),
        );
        let _ = writeln!(o, "  source: {}", text(&d["source_reason"]));
        if let Some(s) = d["selector"].as_str() {
            let _ = writeln!(o, "  selector: {s}");
        }
        if let Some(e) = d["error"].as_str() {
            let _ = writeln!(o, "  error: {e}");
        }
        for (pod, why) in d["bad_pods"].as_object().into_iter().flatten() {
            let _ = writeln!(o, "  skipped pod {pod}: {}", text(why));
        }
        if d["changes_dropped"].as_u64().is_some_and(|n| n > 0) {
            let _ = writeln!(o, "  changes dropped: {}", text(&d["changes_dropped"]));
        }
    } else if doc.is_object() {
        o.push_str("discovery: off\n");
    }
    let p = &doc["gpu"]["pod_resources"];
    if p.is_object() {
        let _ = writeln!(
            o,
            "pod-resources: {}{}  socket={}  pods={} lists={}",
            text(&p["state"]),
            p["reason"]
                .as_str()
                .map_or(String::new(), |r| format!(" ({r})")),
            text(&p["socket"]),
            text(&p["pods"]),
            text(&p["lists"]),
        );
    }
    let r = &doc["config_reload"];
    if r.is_object() {
        let restart: Vec<String> = r["needs_restart"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        let _ = writeln!(
            o,
            "config reload: attempts={} failures={} last={}  needs restart: {}",
            text(&r["attempts"]),
            text(&r["failures"]),
            match r["last_ok"].as_bool() {
                Some(true) => "ok",
                Some(false) => "refused",
                None => "-",
            },
            if restart.is_empty() {
                "-".to_owned()
            } else {
                restart.join(",")
            }
        );
        if let Some(e) = r["last_error"].as_str() {
            let _ = writeln!(o, "  refused: {e}");
        }
    }
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn discovery_pod_resources_and_reload_as_the_status_says() {
        let doc = serde_json::json!({
            "discovery": {"kind": "kubernetes", "source": "apiserver",
                "source_reason": "source = auto: no kubelet Pods API socket", "node": "node-1",
                "selector": null, "state": "failing",
                "error": "403 Forbidden (API server https://10.96.0.1/)", "errors": 3, "lists": 1,
                "pods": 6, "targets": 4, "bad_pods": {"llm/x": "lmperf.dev/port = \"a\": a port"},
                "changes_dropped": 0, "last_event_unix_s": null},
            "gpu": {"pod_resources": {"socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
                "state": "unavailable", "reason": "no socket", "lists": 2, "pods": 0}},
            "config_reload": {"attempts": 2, "failures": 1, "last_ok": false,
                "last_error": "target[0].rate = -1: positive", "needs_restart": ["gpu", "log_format"]}
        });
        let text = super::format(&doc.to_string());
        assert_eq!(
            text,
            "discovery: kubernetes via apiserver  node=node-1  failing  pods=6 targets=4 lists=1 errors=3\n  \
             source: source = auto: no kubelet Pods API socket\n  \
             error: 403 Forbidden (API server https://10.96.0.1/)\n  \
             skipped pod llm/x: lmperf.dev/port = \"a\": a port\n\
             pod-resources: unavailable (no socket)  socket=/var/lib/kubelet/pod-resources/kubelet.sock  pods=0 lists=2\n\
             config reload: attempts=2 failures=1 last=refused  needs restart: gpu,log_format\n  \
             refused: target[0].rate = -1: positive\n"
        );
        let off = super::format(
            r#"{"config_reload": {"attempts": 0, "failures": 0, "last_ok": null, "needs_restart": []}}"#,
        );
        assert_eq!(
            off,
            "discovery: off\nconfig reload: attempts=0 failures=0 last=-  needs restart: -\n"
        );
        assert_eq!(super::format("not json"), "");
    }
}
