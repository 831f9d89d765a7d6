//! `[discovery]`: targets found at run time beside the static `[[target]]` tables.
//!
//! ```toml
//! [discovery.kubernetes]
//! enabled = true                 # off by default (the Helm chart turns it on)
//! # node_name = "gpu-node-7"     # default: the K8S_NODE_NAME environment variable
//! # selector = "app.kubernetes.io/name=vllm"   # pods matching it are targets too
//! inference_pools = false        # InferencePool objects (inference.networking.k8s.io/v1) name target pods too
//! source = "auto"                # auto | apiserver | kubelet
//! # kubelet_pods_api_dir = "/var/lib/kubelet/pods-api"   # the kubelet Pods API's socket dir
//! ```

use super::raw::{RawCanary, RawDiscovery};
use super::{ConfigError, Env, Secret, TargetConfig};

/// The environment variable the chart sets from `spec.nodeName` (downward API).
pub const NODE_NAME_ENV: &str = "K8S_NODE_NAME";
/// Where the kubelet serves its node-local Pods API (KEP-4188), the default of
/// `kubelet_pods_api_dir`; the socket is `kubelet.sock` in it.
pub const DEFAULT_KUBELET_PODS_API_DIR: &str = "/var/lib/kubelet/pods-api";

/// Where pods are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSource {
    /// The kubelet's Pods API where its socket is present, else the API server.
    Auto,
    /// The API server (list + watch with a `spec.nodeName` field selector).
    ApiServer,
    /// The kubelet's node-local Pods API only.
    Kubelet,
}

impl PodSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::ApiServer => "apiserver",
            Self::Kubelet => "kubelet",
        }
    }
}

/// Validated `[discovery.kubernetes]`.
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesDiscovery {
    pub enabled: bool,
    /// This node's name: only its pods are targets. Empty when discovery is off.
    pub node_name: String,
    /// Pods matching this label selector are targets (beside the opt-in annotation).
    pub selector: Option<super::selector::LabelSelector>,
    /// Pods that Gateway API Inference Extension `InferencePool` objects select are targets
    /// too, at each of the pool's target ports (after the annotation and the selector).
    pub inference_pools: bool,
    pub source: PodSource,
    /// The directory of the kubelet's Pods API socket (`source = auto | kubelet`).
    pub kubelet_pods_api_dir: std::path::PathBuf,
}

/// Validated `[discovery]`.
#[derive(Debug, Clone)]
pub struct DiscoveryConfig {
    pub kubernetes: KubernetesDiscovery,
    /// What a discovered target starts from: `[canary]` and the command line's canary flags.
    pub template: TargetTemplate,
}

/// The canary settings a discovered target starts from (`[canary]` merged with the command
/// line), checked at load: a bad default is a start-up error, not one per pod.
#[derive(Debug, Clone)]
pub struct TargetTemplate {
    defaults: RawCanary,
    /// The API key the defaults name, read once at load (`api_key_env` / `api_key_file`).
    api_key: Option<Secret>,
}

impl TargetTemplate {
    /// Checks `defaults` as a target would take them.
    ///
    /// # Errors
    /// [`ConfigError`] naming the `canary.*` field.
    pub fn new(defaults: RawCanary, env: &dyn Env) -> Result<Self, ConfigError> {
        let probe = super::validate_target(
            "canary",
            RawCanary {
                url: Some("http://127.0.0.1:8000".into()),
                ..defaults.clone()
            },
            env,
        )?;
        Ok(Self {
            defaults,
            api_key: probe.api_key,
        })
    }

    /// A target from `overrides` (a discovered pod's URL, name and annotations) over the
    /// defaults. `field` names the source in errors (`pod ns/name`).
    ///
    /// # Errors
    /// [`ConfigError`] naming the field and value (e.g. a `rate` of 0).
    pub fn target(&self, field: &str, overrides: RawCanary) -> Result<TargetConfig, ConfigError> {
        struct NoEnv;
        impl Env for NoEnv {
            fn var(&self, _: &str) -> Option<String> {
                None
            }
        }
        let merged = RawCanary {
            api_key_env: None,
            api_key_file: None,
            ..overrides.or(&self.defaults)
        };
        let mut t = super::validate_target(field, merged, &NoEnv)?;
        t.api_key = self.api_key.clone();
        Ok(t)
    }
}

impl DiscoveryConfig {
    /// Whether any discovery runs (then `[[target]]` may be empty).
    pub fn enabled(&self) -> bool {
        self.kubernetes.enabled
    }
}

/// Validates `[discovery]`.
///
/// # Errors
/// [`ConfigError`] naming the field: a bad `source` or `selector`, no node name with
/// discovery on.
pub fn validate(
    raw: RawDiscovery,
    template: TargetTemplate,
    env: &dyn Env,
) -> Result<DiscoveryConfig, ConfigError> {
    let k = raw.kubernetes;
    let enabled = k.enabled.unwrap_or(false);
    let source = match k.source.as_deref() {
        None | Some("auto") => PodSource::Auto,
        Some("apiserver") => PodSource::ApiServer,
        Some("kubelet") => PodSource::Kubelet,
        Some(other) => {
            return Err(ConfigError::invalid(
                "discovery.kubernetes.source",
                other,
                "one of auto, apiserver, kubelet",
            ));
        }
    };
    let selector = match k.selector.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => Some(
            super::selector::LabelSelector::parse(text)
                .map_err(|why| ConfigError::invalid("discovery.kubernetes.selector", text, why))?,
        ),
    };
    let node_name = match k.node_name.filter(|n| !n.trim().is_empty()) {
        Some(n) => n.trim().to_owned(),
        None => env.var(NODE_NAME_ENV).unwrap_or_default(),
    };
    if enabled && node_name.is_empty() {
        return Err(ConfigError::invalid(
            "discovery.kubernetes.node_name",
            "",
            format!(
                "missing: set it or the {NODE_NAME_ENV} environment variable (the chart sets it from spec.nodeName)"
            ),
        ));
    }
    Ok(DiscoveryConfig {
        kubernetes: KubernetesDiscovery {
            enabled,
            node_name,
            selector,
            inference_pools: k.inference_pools.unwrap_or(false),
            source,
            kubelet_pods_api_dir: k
                .kubelet_pods_api_dir
                .filter(|d| !d.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_KUBELET_PODS_API_DIR.to_owned())
                .into(),
        },
        template,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct E(Option<&'static str>);
    impl Env for E {
        fn var(&self, key: &str) -> Option<String> {
            (key == NODE_NAME_ENV)
                .then_some(self.0)
                .flatten()
                .map(Into::into)
        }
    }

    fn tmpl() -> TargetTemplate {
        TargetTemplate::new(RawCanary::default(), &E(None)).unwrap()
    }

    #[test]
    fn a_pod_target_takes_the_defaults_and_its_own_values() {
        let t = TargetTemplate::new(
            RawCanary {
                max_tokens: Some(7),
                interval: Some(std::time::Duration::from_secs(2)),
                ..RawCanary::default()
            },
            &E(None),
        )
        .unwrap();
        let c = t
            .target(
                "pod ns/p",
                RawCanary {
                    url: Some("http://10.0.0.7:8000".into()),
                    name: Some("ns/p".into()),
                    rate: Some(0.5),
                    ..RawCanary::default()
                },
            )
            .unwrap();
        assert_eq!(c.name, "ns/p");
        assert_eq!(c.max_tokens, 7);
        assert_eq!(c.port, 8000);
        let e = t
            .target(
                "pod ns/p",
                RawCanary {
                    url: Some("http://10.0.0.7:8000".into()),
                    rate: Some(-1.0),
                    ..RawCanary::default()
                },
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("pod ns/p.rate"), "{e}");
    }

    fn parse(text: &str) -> RawDiscovery {
        #[derive(serde::Deserialize)]
        struct W {
            discovery: RawDiscovery,
        }
        toml::from_str::<W>(text).unwrap().discovery
    }

    #[test]
    fn defaults_off_and_node_from_env() {
        let d = validate(RawDiscovery::default(), tmpl(), &E(None)).unwrap();
        assert!(!d.enabled());
        assert_eq!(d.kubernetes.source, PodSource::Auto);
        let d = validate(
            parse("[discovery.kubernetes]\nenabled = true\n"),
            tmpl(),
            &E(Some("node-7")),
        )
        .unwrap();
        assert!(d.enabled());
        assert_eq!(d.kubernetes.node_name, "node-7");
    }

    #[test]
    fn bad_values_name_the_field() {
        let e = validate(
            parse("[discovery.kubernetes]\nenabled = true\n"),
            tmpl(),
            &E(None),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("discovery.kubernetes.node_name"), "{e}");
        assert!(e.contains("K8S_NODE_NAME"), "{e}");
        let e = validate(
            parse("[discovery.kubernetes]\nsource = \"etcd\"\n"),
            tmpl(),
            &E(None),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("discovery.kubernetes.source") && e.contains("etcd"),
            "{e}"
        );
        let e = validate(
            parse("[discovery.kubernetes]\nselector = \"app in (a\"\n"),
            tmpl(),
            &E(None),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("discovery.kubernetes.selector"), "{e}");
        assert!(
            toml::from_str::<RawDiscovery>("[kubernetes]\nenabeld = true\n").is_err(),
            "unknown keys are refused"
        );
    }
}
