//! Discovery's Kubernetes API client, found as `kube::Config::infer()` finds it (a kubeconfig:
//! `KUBECONFIG` or `~/.kube/config`, else the in-cluster service account), with errors that
//! say which source failed and why, and the API server's URL, which every later error of the
//! watch names.

use kube::Client;
use kube::config::{InClusterError, KubeConfigOptions, KubeconfigError};

/// A client and where it points.
pub struct Connected {
    pub client: Client,
    /// The API server's URL (`cluster_url`), e.g. `https://10.96.0.1/`.
    pub url: String,
    /// `kubeconfig` | `in-cluster`.
    pub source: &'static str,
}

/// Builds the client.
///
/// # Errors
/// One line naming both sources and why each failed (a kubeconfig path that cannot be read, no
/// in-cluster environment), or the URL whose client could not be built.
pub async fn connect() -> Result<Connected, String> {
    let (mut config, source) =
        match kube::Config::from_kubeconfig(&KubeConfigOptions::default()).await {
            Ok(c) => (c, "kubeconfig"),
            Err(k) => match kube::Config::incluster() {
                Ok(c) => (c, "in-cluster"),
                Err(i) => {
                    return Err(format!(
                        "no Kubernetes API server: kubeconfig: {}; in-cluster: {}",
                        kubeconfig_error(&k),
                        in_cluster_error(&i)
                    ));
                }
            },
        };
    config.apply_debug_overrides();
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config)
        .map_err(|e| format!("Kubernetes client for API server {url}: {}", chain(&e)))?;
    Ok(Connected {
        client,
        url,
        source,
    })
}

/// A kubeconfig error in one line, the path shown once (kube's own text quotes it twice).
pub fn kubeconfig_error(e: &KubeconfigError) -> String {
    match e {
        KubeconfigError::ReadConfig(io, path) => {
            format!("cannot read {}: {io}", path.display())
        }
        other => chain(other),
    }
}

fn in_cluster_error(e: &InClusterError) -> String {
    match e {
        InClusterError::ReadEnvironmentVariable(_) => {
            "KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT not set (not in a pod)".to_owned()
        }
        other => chain(other),
    }
}

/// An error and its sources, `: `-joined, each said once (kube's and hyper's errors often
/// repeat their source in their own text, or hide it: "client error (Connect)").
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_path_is_quoted_once() {
        let e = KubeconfigError::ReadConfig(
            std::io::Error::from(std::io::ErrorKind::NotFound),
            "/etc/kube/config".into(),
        );
        let text = kubeconfig_error(&e);
        assert_eq!(text, "cannot read /etc/kube/config: entity not found");
        assert!(
            !e.to_string().starts_with("cannot"),
            "kube's own text differs: {e}"
        );
    }

    #[test]
    fn the_chain_says_each_source_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        ));
        assert_eq!(
            chain(&e),
            "client error (Connect): Connection refused (os error 111)"
        );
    }
}
