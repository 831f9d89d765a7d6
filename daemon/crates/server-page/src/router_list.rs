//! The workers a router lists itself: `GET /list_workers`, served by vllm-router 0.1.17 (its
//! `routers/http` handler; checked on a live router: `{"urls":["http://127.0.0.1:18101",…]}`)
//! as by SGLang's router, whose code it was adapted from.

/// Why a `/list_workers` answer gave no workers.
#[derive(Debug, thiserror::Error)]
pub enum ListWorkersError {
    #[error("not JSON of the shape {{\"urls\": [\"http://…\", …]}}: {0}")]
    Shape(#[from] serde_json::Error),
    #[error("worker {0:?} in \"urls\" is not an http(s) URL")]
    NotUrl(String),
}

#[derive(serde::Deserialize)]
struct Listed {
    urls: Vec<String>,
}

/// The workers' URLs of a `/list_workers` body, in its order (an empty list is a router with no
/// worker now).
///
/// # Errors
/// The body is not `{"urls": [...]}` of strings, or a URL is not http(s).
pub fn list_workers(body: &[u8]) -> Result<Vec<String>, ListWorkersError> {
    let l: Listed = serde_json::from_slice(body)?;
    if let Some(bad) = l
        .urls
        .iter()
        .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
    {
        return Err(ListWorkersError::NotUrl(bad.clone()));
    }
    Ok(l.urls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_router_list_and_bad_bodies() {
        let body = br#"{"urls":["http://127.0.0.1:18101","http://127.0.0.1:18102"]}"#;
        assert_eq!(
            list_workers(body).expect("list"),
            ["http://127.0.0.1:18101", "http://127.0.0.1:18102"]
        );
        let e = list_workers(b"{\"workers\":[]}").unwrap_err().to_string();
        assert!(e.contains("\"urls\""), "{e}");
        let e = list_workers(br#"{"urls":["grpc://w:1"]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("grpc://w:1"), "{e}");
    }
}
