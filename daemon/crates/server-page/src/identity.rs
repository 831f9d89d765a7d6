//! Who the server is: kind, version, model and model revision, from its info routes (vLLM
//! `GET /version`, TGI `GET /info`, llama.cpp `GET /props`, SGLang `GET /get_server_info`,
//! everyone's `GET /v1/models`), and the [`Change`]s between two identities. Pure: the scraper
//! fetches, these functions read the JSON bodies.

use serde::Serialize;
use serde_json::Value;

use super::normalize::ServerKind;

/// What the info routes said. A field no route gave is `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Identity {
    pub version: Option<String>,
    /// The served model id (`/v1/models` `data[0].id`, TGI `model_id`, llama.cpp `model_alias`).
    pub model: Option<String>,
    /// What the model id points at: `/v1/models` `root`, TGI `model_sha`, llama.cpp `model_path`.
    pub model_revision: Option<String>,
}

/// The info route of a server kind, if it has one.
pub fn info_path(kind: ServerKind) -> Option<&'static str> {
    match kind {
        ServerKind::Vllm => Some("/version"),
        ServerKind::Tgi => Some("/info"),
        ServerKind::LlamaCpp => Some("/props"),
        ServerKind::Sglang => Some("/get_server_info"),
        // Dynamo's frontend has no version route; `/v1/models` names the model.
        ServerKind::Dynamo | ServerKind::Unknown => None,
    }
}

fn string(v: &Value, key: &str) -> Option<String> {
    match v.get(key)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Reads the body of `kind`'s [`info_path`] into `id` (fields it lacks are left as they are).
pub fn read_info(kind: ServerKind, body: &[u8], id: &mut Identity) {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    match kind {
        ServerKind::Vllm => id.version = string(&v, "version").or(id.version.take()),
        ServerKind::Tgi => {
            id.version = string(&v, "version").or(id.version.take());
            id.model = string(&v, "model_id").or(id.model.take());
            id.model_revision = string(&v, "model_sha").or(id.model_revision.take());
        }
        ServerKind::LlamaCpp => {
            id.version = string(&v, "build_info").or(id.version.take());
            id.model = string(&v, "model_alias").or(id.model.take());
            id.model_revision = string(&v, "model_path").or(id.model_revision.take());
        }
        ServerKind::Sglang => {
            id.version = string(&v, "version").or(id.version.take());
            id.model = string(&v, "served_model_name")
                .or_else(|| string(&v, "model_path"))
                .or(id.model.take());
            id.model_revision = string(&v, "model_path").or(id.model_revision.take());
        }
        ServerKind::Dynamo | ServerKind::Unknown => {}
    }
}

/// Reads an OpenAI `/v1/models` body: the first model's `id` and `root` (vLLM's path or
/// repository). These win over the info route's model, which some servers fill differently.
pub fn read_models(body: &[u8], id: &mut Identity) {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let Some(first) = v
        .get("data")
        .and_then(|d| d.as_array())
        .and_then(|a| a.first())
    else {
        return;
    };
    if let Some(m) = string(first, "id") {
        id.model = Some(m);
    }
    if let Some(r) = string(first, "root") {
        id.model_revision = Some(r);
    }
}

/// What changed between two looks at a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Version,
    Model,
    ModelRevision,
    /// A counter went backwards or `process_start_time_seconds` moved.
    Restart,
    /// The metrics page now says another server kind.
    Kind,
    /// The pod was replaced by one with another image or other arguments (Kubernetes
    /// discovery: `crate::discovery::lifecycle`).
    Rollout,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Version => "version",
            Self::Model => "model",
            Self::ModelRevision => "model_revision",
            Self::Restart => "restart",
            Self::Kind => "kind",
            Self::Rollout => "rollout",
        }
    }
}

/// One change of the server, with the values before and after.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub kind: ChangeKind,
    pub old: Option<String>,
    pub new: Option<String>,
}

/// The changes from `old` to `new`. A field that became unknown is not a change (a route that
/// failed once says nothing about the server).
pub fn diff(old: &Identity, new: &Identity) -> Vec<Change> {
    let mut out = Vec::new();
    let mut check = |kind: ChangeKind, a: &Option<String>, b: &Option<String>| {
        if let (Some(x), Some(y)) = (a, b)
            && x != y
        {
            out.push(Change {
                kind,
                old: Some(x.clone()),
                new: Some(y.clone()),
            });
        }
    };
    check(ChangeKind::Version, &old.version, &new.version);
    check(ChangeKind::Model, &old.model, &new.model);
    check(
        ChangeKind::ModelRevision,
        &old.model_revision,
        &new.model_revision,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_servers_info() {
        let mut id = Identity::default();
        read_info(ServerKind::LlamaCpp, br#"{"model_alias":"gemma-3-270m","model_path":"/m/g.gguf","build_info":"b6000-abc","total_slots":2}"#, &mut id);
        assert_eq!(
            id,
            Identity {
                version: Some("b6000-abc".into()),
                model: Some("gemma-3-270m".into()),
                model_revision: Some("/m/g.gguf".into())
            }
        );
        let mut id = Identity::default();
        read_info(ServerKind::Tgi, br#"{"model_id":"bigscience/bloom-560m","model_sha":"4f4b","version":"2.4.1","sha":"x"}"#, &mut id);
        assert_eq!(
            (
                id.version.as_deref(),
                id.model.as_deref(),
                id.model_revision.as_deref()
            ),
            (Some("2.4.1"), Some("bigscience/bloom-560m"), Some("4f4b"))
        );
        let mut id = Identity::default();
        read_info(ServerKind::Vllm, br#"{"version":"0.11.0"}"#, &mut id);
        read_models(br#"{"object":"list","data":[{"id":"llama-3","created":1,"root":"meta-llama/Llama-3.1-8B"}]}"#, &mut id);
        assert_eq!(
            (
                id.version.as_deref(),
                id.model.as_deref(),
                id.model_revision.as_deref()
            ),
            (
                Some("0.11.0"),
                Some("llama-3"),
                Some("meta-llama/Llama-3.1-8B")
            )
        );
        read_info(ServerKind::Vllm, b"<html>", &mut id);
        assert_eq!(
            id.version.as_deref(),
            Some("0.11.0"),
            "a bad body keeps what was known"
        );
    }

    #[test]
    fn diff_ignores_unknowns() {
        let a = Identity {
            version: Some("1".into()),
            model: Some("a".into()),
            model_revision: None,
        };
        let b = Identity {
            version: None,
            model: Some("b".into()),
            model_revision: Some("r".into()),
        };
        assert_eq!(
            diff(&a, &b),
            vec![Change {
                kind: ChangeKind::Model,
                old: Some("a".into()),
                new: Some("b".into())
            }]
        );
    }
}
