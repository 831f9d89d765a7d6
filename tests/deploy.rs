//! `deploy/`: the Helm chart, the plain manifests, the collector config and the compose stack
//! (issue 7), checked without a cluster, a helm binary or Docker.
//!
//! The chart is rendered by `deploy/tools/render.py` with Helm's own template engine (Helm v4's
//! Go SDK through the `helm-python-sdk` wheel), and every manifest is checked against the
//! Kubernetes JSON schemas of `kubernetes-validate` (strict, for Kubernetes 1.25 and 1.37);
//! both are pinned in `tests/peers/requirements.txt`. The chart is rendered for its default
//! values and for every `deploy/helm/lmperf/ci/*.yaml`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use lmperf::config::{Env, Overrides, load};
use lmperf_e2e::agent::workspace_root;
use lmperf_e2e::temp;
use serde_json::Value;

fn python() -> PathBuf {
    let py = workspace_root().join(".venv-peers/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run tests/peers/install.sh (cargo xtask ci does)",
        py.display()
    );
    py
}

fn render_py(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(python())
        .arg(workspace_root().join("deploy/tools/render.py"))
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("run render.py");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The chart rendered with `values` files over its defaults and schema-checked: the
/// manifests, or a panic with render.py's errors.
fn render(values: &[PathBuf]) -> Vec<Value> {
    let mut args = vec!["render", "--json", "--validate"];
    let v: Vec<String> = values.iter().map(|p| p.display().to_string()).collect();
    for f in &v {
        args.extend(["-f", f.as_str()]);
    }
    let (ok, stdout, stderr) = render_py(&args);
    assert!(ok, "render {v:?} failed:\n{stderr}");
    let doc: Value = serde_json::from_str(&stdout).expect("render.py JSON");
    assert_eq!(doc["errors"], Value::Array(vec![]), "{v:?}");
    doc["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .map(|m| m["manifest"].clone())
        .collect()
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    let p = path.display().to_string();
    let (ok, stdout, stderr) = render_py(&["yaml2json", &p]);
    assert!(ok, "{p} is not YAML:\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).expect("yaml2json JSON");
    v[&p].as_array().cloned().unwrap_or_default()
}

/// ("default", []) and ("<name>", [ci/<name>.yaml]) for each CI values file.
fn value_sets() -> Vec<(String, Vec<PathBuf>)> {
    let ci = workspace_root().join("deploy/helm/lmperf/ci");
    let mut sets = vec![("default".to_owned(), vec![])];
    let mut files: Vec<PathBuf> = std::fs::read_dir(&ci)
        .expect("ci/")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    for f in files {
        sets.push((
            f.file_stem().expect("stem").to_string_lossy().into_owned(),
            vec![f],
        ));
    }
    assert!(sets.len() >= 3, "{sets:?}");
    sets
}

fn of_kind<'a>(ms: &'a [Value], kind: &str) -> Vec<&'a Value> {
    ms.iter().filter(|m| m["kind"] == kind).collect()
}

fn arr(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

#[test]
fn chart_renders_and_every_manifest_passes_the_kubernetes_schemas() {
    for (name, files) in value_sets() {
        let ms = render(&files);
        let kinds: BTreeSet<&str> = ms.iter().filter_map(|m| m["kind"].as_str()).collect();
        for k in ["DaemonSet", "ConfigMap", "ServiceAccount"] {
            assert!(kinds.contains(k), "{name}: no {k} in {kinds:?}");
        }
        for m in &ms {
            if matches!(
                m["kind"].as_str(),
                Some("ClusterRole" | "ClusterRoleBinding")
            ) {
                assert!(m["metadata"].get("namespace").is_none(), "{name}");
                continue;
            }
            assert_eq!(
                m["metadata"]["namespace"], "lmperf",
                "{name}: {} is namespaced",
                m["kind"]
            );
        }
        // Discovery (on by default): read-only access to pods and replicasets, bound to the
        // agent's ServiceAccount, whose token is mounted only then.
        let discovery = name != "static-values";
        let roles = of_kind(&ms, "ClusterRole");
        let bindings = of_kind(&ms, "ClusterRoleBinding");
        let ds = &of_kind(&ms, "DaemonSet")[0]["spec"]["template"]["spec"];
        assert_eq!(ds["automountServiceAccountToken"], discovery, "{name}");
        if discovery {
            assert_eq!((roles.len(), bindings.len()), (1, 1), "{name}");
            let rules = arr(&roles[0]["rules"]);
            let granted: BTreeSet<(String, String, String)> = rules
                .iter()
                .flat_map(|r| {
                    let groups = arr(&r["apiGroups"]);
                    let resources = arr(&r["resources"]);
                    let verbs = arr(&r["verbs"]);
                    let mut out = Vec::new();
                    for g in &groups {
                        for res in &resources {
                            for v in &verbs {
                                out.push((
                                    g.as_str().unwrap_or("?").to_owned(),
                                    res.as_str().unwrap_or("?").to_owned(),
                                    v.as_str().unwrap_or("?").to_owned(),
                                ));
                            }
                        }
                    }
                    out
                })
                .collect();
            // InferencePools only where discovery.inferencePools is on (full-values).
            let pools = name == "full-values";
            let mut resources = vec![("", "pods"), ("apps", "replicasets")];
            if pools {
                resources.push(("inference.networking.k8s.io", "inferencepools"));
            }
            let want: BTreeSet<(String, String, String)> = resources
                .iter()
                .flat_map(|(g, r)| {
                    ["get", "list", "watch"]
                        .map(|v| ((*g).to_owned(), (*r).to_owned(), v.to_owned()))
                })
                .collect();
            assert_eq!(
                granted, want,
                "{name}: exactly get/list/watch on pods and replicasets (inferencepools: {pools})"
            );
            let b = bindings[0];
            assert_eq!(b["roleRef"]["name"], roles[0]["metadata"]["name"], "{name}");
            assert_eq!(b["subjects"][0]["kind"], "ServiceAccount", "{name}");
            assert_eq!(
                b["subjects"][0]["name"], ds["serviceAccountName"],
                "{name}: bound to the agent's ServiceAccount"
            );
            assert_eq!(b["subjects"][0]["namespace"], "lmperf", "{name}");
        } else {
            assert!(roles.is_empty() && bindings.is_empty(), "{name}");
        }
        if name == "full-values" {
            assert_eq!(of_kind(&ms, "ServiceMonitor").len(), 1, "{name}");
            let dashboards = of_kind(&ms, "ConfigMap")
                .into_iter()
                .filter(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
                .count();
            assert_eq!(dashboards, 2, "{name}: one ConfigMap per dashboard");
            let ds = &of_kind(&ms, "DaemonSet")[0]["spec"]["template"]["spec"];
            assert_eq!(
                ds["runtimeClassName"], "nvidia",
                "{name}: NVML through the NVIDIA runtime"
            );
            assert_eq!(
                ds["nodeSelector"]["nvidia.com/gpu.present"], "true",
                "{name}"
            );
        }
    }
}

/// Least privilege in every values set: never `privileged`, no host namespaces, nothing
/// writable from the host, all capabilities dropped and only CAP_BPF + CAP_PERFMON added
/// back, and only when the eBPF probes are on; non-root otherwise, except with the kubelet's
/// pod-resources socket (NVML on) or Pods API socket (`discovery.kubeletPodsApi`): their
/// directories alone from the host, read-only, and root with no capability (the sockets are
/// writable by root only).
#[test]
fn no_values_set_grants_privilege_or_host_write() {
    for (name, files) in value_sets() {
        let ms = render(&files);
        let ebpf = name.contains("ebpf") || name.contains("full");
        let pod_resources = name == "full-values" || name == "nvml-values";
        // The kubelet's Pods API socket only where discovery.kubeletPodsApi is on (full-values).
        let pods_api = name == "full-values";
        for ds in of_kind(&ms, "DaemonSet") {
            let pod = &ds["spec"]["template"]["spec"];
            for host in ["hostNetwork", "hostPID", "hostIPC"] {
                assert_ne!(pod[host], true, "{name}: {host}");
            }
            assert_eq!(
                pod["automountServiceAccountToken"],
                name != "static-values",
                "{name}: an API token only for discovery"
            );
            let host_paths: Vec<Value> = arr(&pod["volumes"])
                .into_iter()
                .filter(|v| v.get("hostPath").is_some())
                .collect();
            if pod_resources || pods_api {
                let mut want = Vec::new();
                if pod_resources {
                    want.push(serde_json::json!({
                        "name": "pod-resources",
                        "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
                    }));
                }
                if pods_api {
                    want.push(serde_json::json!({
                        "name": "kubelet-pods-api",
                        "hostPath": {"path": "/var/lib/kubelet/pods-api", "type": "DirectoryOrCreate"}
                    }));
                }
                assert_eq!(
                    host_paths, want,
                    "{name}: only the kubelet's pod-resources / pods-api directories"
                );
                for (volume, path) in [
                    ("pod-resources", "/var/lib/kubelet/pod-resources"),
                    ("kubelet-pods-api", "/var/lib/kubelet/pods-api"),
                ] {
                    let mount = arr(&pod["containers"][0]["volumeMounts"])
                        .into_iter()
                        .find(|m| m["name"] == volume);
                    let used = if volume == "pod-resources" {
                        pod_resources
                    } else {
                        pods_api
                    };
                    let Some(mount) = mount else {
                        assert!(!used, "{name}: {volume} not mounted");
                        continue;
                    };
                    assert!(used, "{name}: {volume} mounted unasked");
                    assert_eq!(mount["readOnly"], true, "{name}");
                    assert_eq!(mount["mountPath"], path, "{name}");
                }
            } else {
                assert!(
                    host_paths.is_empty(),
                    "{name}: hostPath volumes {host_paths:?}"
                );
            }
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
                "{name}"
            );
            let containers: Vec<Value> = arr(&pod["containers"])
                .into_iter()
                .chain(arr(&pod["initContainers"]))
                .collect();
            assert!(!containers.is_empty());
            for c in containers {
                let sc = &c["securityContext"];
                let who = format!("{name}: container {}", c["name"]);
                assert_ne!(sc["privileged"], true, "{who}");
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{who}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{who}");
                assert_eq!(
                    sc["capabilities"]["drop"],
                    serde_json::json!(["ALL"]),
                    "{who}"
                );
                let add: Vec<String> = arr(&sc["capabilities"]["add"])
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect();
                for m in arr(&c["volumeMounts"]) {
                    assert_eq!(
                        m["readOnly"], true,
                        "{who}: mount {} must be read-only",
                        m["mountPath"]
                    );
                }
                let run_as = |k: &str| {
                    sc.get(k)
                        .filter(|v| !v.is_null())
                        .unwrap_or(&pod["securityContext"][k])
                        .clone()
                };
                if ebpf {
                    assert_eq!(
                        add,
                        ["BPF", "PERFMON"],
                        "{who}: the eBPF probes get exactly CAP_BPF and CAP_PERFMON"
                    );
                } else if pod_resources || pods_api {
                    assert!(
                        add.is_empty(),
                        "{who}: capabilities {add:?} with the probes off"
                    );
                    assert_eq!(
                        run_as("runAsUser"),
                        0,
                        "{who}: the kubelet's socket needs root"
                    );
                } else {
                    assert!(
                        add.is_empty(),
                        "{who}: capabilities {add:?} with the probes off"
                    );
                    assert_eq!(run_as("runAsNonRoot"), true, "{who}");
                    assert!(
                        run_as("runAsUser").as_u64().is_some_and(|u| u > 0),
                        "{who}: runAsUser {}",
                        run_as("runAsUser")
                    );
                }
            }
        }
    }
    // The values files themselves never spell out a privilege, so an override cannot inherit one.
    let chart = workspace_root().join("deploy/helm/lmperf");
    let mut texts = vec![chart.join("values.yaml")];
    texts.extend(value_sets().into_iter().flat_map(|(_, f)| f));
    for f in texts {
        let t = std::fs::read_to_string(&f).expect("values file");
        for bad in [
            "privileged: true",
            "hostPath",
            "hostNetwork: true",
            "hostPID: true",
            "SYS_ADMIN",
            "allowPrivilegeEscalation: true",
        ] {
            let hit = t
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .any(|l| l.contains(bad));
            assert!(!hit, "{}: {bad}", f.display());
        }
    }
}

#[test]
fn the_chart_refuses_capabilities_beyond_the_ebpf_set() {
    let f = temp::file(
        "sysadmin-values.yaml",
        "ebpf:\n  enabled: true\n  capabilities: [BPF, PERFMON, SYS_ADMIN]\n",
    );
    let (ok, _, stderr) = render_py(&["render", "-f", &f.display().to_string()]);
    assert!(!ok, "SYS_ADMIN was rendered");
    assert!(
        stderr.contains("ebpf.capabilities may hold only BPF and PERFMON, not SYS_ADMIN"),
        "{stderr}"
    );
    // No static target is fine with discovery (the chart's default); without it, refused.
    let f = temp::file("no-targets-values.yaml", "config:\n  targets: []\n");
    let (ok, _, stderr) = render_py(&["render", "-f", &f.display().to_string()]);
    assert!(ok, "{stderr}");
    let f = temp::file(
        "no-targets-no-discovery-values.yaml",
        "config:\n  targets: []\ndiscovery:\n  enabled: false\n",
    );
    let (ok, _, stderr) = render_py(&["render", "-f", &f.display().to_string()]);
    assert!(
        !ok && stderr.contains("config.targets is empty and discovery.enabled is false"),
        "{stderr}"
    );
}

/// The environment of the DaemonSet's container, with downward-API and Secret values filled
/// in as the kubelet would, and `$(VAR)` references expanded.
struct PodEnv(BTreeMap<String, String>);

impl PodEnv {
    fn of(container: &Value) -> Self {
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        for e in arr(&container["env"]) {
            let name = e["name"].as_str().expect("env name").to_owned();
            let value = match (&e["value"], &e["valueFrom"]) {
                (Value::String(v), _) => {
                    let mut v = v.clone();
                    for (k, val) in &env {
                        v = v.replace(&format!("$({k})"), val);
                    }
                    v
                }
                (_, from) if from["fieldRef"]["fieldPath"] == "spec.nodeName" => {
                    "node-a".to_owned()
                }
                (_, from) if from["fieldRef"]["fieldPath"] == "metadata.name" => "lmperf-x1".into(),
                (_, from) if from["fieldRef"]["fieldPath"] == "metadata.namespace" => {
                    "lmperf".into()
                }
                (_, from) if from.get("secretKeyRef").is_some() => "sk-test".into(),
                other => panic!("env {name}: {other:?}"),
            };
            env.insert(name, value);
        }
        PodEnv(env)
    }
}

impl Env for PodEnv {
    fn var(&self, key: &str) -> Option<String> {
        self.0.get(key).cloned().filter(|v| !v.is_empty())
    }
}

/// The ConfigMap's lmperf.toml goes through the agent's own config loader with the pod's env,
/// and the probes, ports and downward-API env agree with it.
#[test]
fn rendered_config_loads_in_the_agent_and_matches_the_pod() {
    for (name, files) in value_sets() {
        let ms = render(&files);
        let cm = of_kind(&ms, "ConfigMap")
            .into_iter()
            .find(|c| c["data"].get("lmperf.toml").is_some())
            .expect("config ConfigMap");
        let toml = cm["data"]["lmperf.toml"].as_str().expect("toml");
        let path = temp::file(&format!("{name}.toml"), toml);
        let ds = of_kind(&ms, "DaemonSet")[0];
        let pod = &ds["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let env = PodEnv::of(c);
        let cfg = load(
            Overrides {
                config: Some(path),
                ..Overrides::default()
            },
            &env,
        )
        .unwrap_or_else(|e| panic!("{name}: the agent rejects the chart's config: {e}\n{toml}"));

        assert_eq!(
            c["args"],
            serde_json::json!(["agent", "--config", "/etc/lmperf/lmperf.toml"]),
            "{name}"
        );
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/etc/lmperf", "{name}");
        assert!(
            cfg.admin_addr.ip().is_unspecified(),
            "{name}: admin on all pod addresses, not {}",
            cfg.admin_addr
        );
        let port = &arr(&c["ports"])
            .into_iter()
            .find(|p| p["name"] == "http-admin")
            .expect("http-admin port")["containerPort"];
        assert_eq!(
            port.as_u64(),
            Some(u64::from(cfg.admin_addr.port())),
            "{name}"
        );
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
        assert_eq!(
            c["livenessProbe"]["httpGet"]["port"], "http-admin",
            "{name}"
        );
        assert!(
            pod["terminationGracePeriodSeconds"]
                .as_u64()
                .is_some_and(|s| s > 10),
            "{name}: the agent needs up to 10 s after SIGTERM"
        );
        assert_eq!(
            env.0.get("K8S_NODE_NAME").map(String::as_str),
            Some("node-a"),
            "{name}"
        );
        assert_eq!(
            env.0.get("K8S_POD_NAME").map(String::as_str),
            Some("lmperf-x1"),
            "{name}"
        );
        let attrs = env
            .0
            .get("OTEL_RESOURCE_ATTRIBUTES")
            .cloned()
            .unwrap_or_default();
        assert!(
            attrs.contains("k8s.namespace.name=lmperf")
                && attrs.contains("k8s.daemonset.name=lmperf"),
            "{name}: {attrs}"
        );
        assert_eq!(cfg.otlp.enabled, name != "no-otlp-values", "{name}");
        // The pod-resources socket the agent reads is in the directory the pod mounts.
        let pod_resources = name == "full-values" || name == "nvml-values";
        assert_eq!(
            cfg.gpu.pod_resources_socket,
            pod_resources.then(|| PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock")),
            "{name}"
        );
        // The control API stays on the pod's loopback: no token, no port of the pod.
        assert!(cfg.control.enabled, "{name}");
        assert!(
            matches!(&cfg.control.listen, lmperf::config::ControlListen::Tcp(a) if a.ip().is_loopback()),
            "{name}: control on {}",
            cfg.control.listen
        );
        assert!(
            arr(&c["ports"]).iter().all(|p| p["name"] == "http-admin"),
            "{name}: only the admin port is exposed: {}",
            c["ports"]
        );
        if cfg.otlp.enabled {
            let endpoint = env
                .0
                .get("OTEL_EXPORTER_OTLP_ENDPOINT")
                .expect("endpoint env");
            assert!(
                cfg.otlp.traces_endpoint.starts_with(endpoint.as_str()),
                "{name}: {} from {endpoint}",
                cfg.otlp.traces_endpoint
            );
        }
        let want_targets = match name.as_str() {
            "full-values" => 2,
            "static-values" => 1,
            _ => 0,
        };
        assert_eq!(cfg.targets.len(), want_targets, "{name}");
        assert_eq!(
            cfg.discovery.kubernetes.enabled,
            name != "static-values",
            "{name}: discovery on by default in the chart"
        );
        if cfg.discovery.kubernetes.enabled {
            assert_eq!(
                cfg.discovery.kubernetes.node_name, "node-a",
                "{name}: the node from K8S_NODE_NAME (downward API)"
            );
        }
        assert_eq!(
            cfg.discovery.kubernetes.inference_pools,
            name == "full-values",
            "{name}: discovery.inferencePools reaches [discovery.kubernetes] inference_pools"
        );
        // The kubelet's Pods API where its socket directory is mounted (full-values), in the
        // directory the pod mounts; the API server alone otherwise.
        if cfg.discovery.kubernetes.enabled {
            use lmperf::config::discovery::PodSource;
            let k = &cfg.discovery.kubernetes;
            if name == "full-values" {
                assert_eq!(k.source, PodSource::Auto, "{name}");
                assert_eq!(
                    k.kubelet_pods_api_dir,
                    PathBuf::from("/var/lib/kubelet/pods-api"),
                    "{name}"
                );
            } else {
                assert_eq!(k.source, PodSource::ApiServer, "{name}");
            }
        }
        if name == "full-values" {
            assert_eq!(
                env.0.get("LMPERF_API_KEY").map(String::as_str),
                Some("sk-test"),
                "{name}: key from the Secret"
            );
            assert!(
                attrs.contains("deployment.environment.name=prod"),
                "{attrs}"
            );
            assert_eq!(
                env.0.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
                Some("all")
            );
            let limits = &c["resources"]["limits"];
            assert!(
                limits.get("nvidia.com/gpu").is_none(),
                "NVML reads the GPUs without taking one"
            );
        }
        // Roll the pods when the config changes.
        assert!(
            ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
                .as_str()
                .is_some_and(|s| s.len() == 64)
        );
    }
}

#[test]
fn plain_manifests_are_the_chart_rendered_with_its_defaults() {
    let (ok, fresh, stderr) = render_py(&["k8s-text"]);
    assert!(ok, "{stderr}");
    let committed = std::fs::read_to_string(workspace_root().join("deploy/k8s/lmperf.yaml"))
        .expect("deploy/k8s/lmperf.yaml");
    assert!(
        committed == fresh,
        "deploy/k8s/lmperf.yaml is stale: run `.venv-peers/bin/python deploy/tools/render.py write-k8s`"
    );
    assert_eq!(
        yaml_docs(&workspace_root().join("deploy/k8s/lmperf.yaml")).len(),
        render(&[]).len()
    );
}

#[test]
fn chart_ships_the_dashboards_of_dashboards_dir() {
    let root = workspace_root();
    let list = |dir: &Path| -> BTreeMap<String, String> {
        std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .map(|p| {
                (
                    p.file_name().expect("name").to_string_lossy().into_owned(),
                    std::fs::read_to_string(&p).expect("read"),
                )
            })
            .collect()
    };
    let shipped = list(&root.join("deploy/helm/lmperf/dashboards"));
    let source = list(&root.join("dashboards"));
    assert_eq!(
        shipped.keys().collect::<Vec<_>>(),
        source.keys().collect::<Vec<_>>(),
        "copy dashboards/*.json to deploy/helm/lmperf/dashboards/ (Helm reads files inside the chart only)"
    );
    for (k, v) in &source {
        assert!(
            shipped[k] == *v,
            "deploy/helm/lmperf/dashboards/{k} differs from dashboards/{k}: copy it"
        );
    }
}

/// The components of opentelemetry-collector-contrib 0.139.0 (the image compose.yaml pins)
/// that a config here may name. Extend the list when a config needs another one that exists.
const CONTRIB_COMPONENTS: &[(&str, &[&str])] = &[
    (
        "receivers",
        &[
            "otlp",
            "prometheus",
            "hostmetrics",
            "kubeletstats",
            "filelog",
        ],
    ),
    (
        "processors",
        &[
            "batch",
            "memory_limiter",
            "tail_sampling",
            "probabilistic_sampler",
            "resource",
            "resourcedetection",
            "attributes",
            "k8sattributes",
            "filter",
            "transform",
        ],
    ),
    (
        "exporters",
        &[
            "otlp",
            "otlphttp",
            "prometheus",
            "prometheusremotewrite",
            "debug",
            "file",
        ],
    ),
    ("extensions", &["health_check", "pprof", "zpages"]),
    ("connectors", &["spanmetrics", "forward"]),
];

#[test]
fn collector_config_names_only_contrib_components_and_keeps_lmperf_spans() {
    let docs = yaml_docs(&workspace_root().join("deploy/otelcol/config.yaml"));
    assert_eq!(docs.len(), 1);
    let cfg = &docs[0];
    let kind_of = |id: &str| id.split('/').next().unwrap_or(id).to_owned();
    let mut defined: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (section, allowed) in CONTRIB_COMPONENTS {
        for id in cfg[*section]
            .as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            assert!(
                allowed.contains(&kind_of(&id).as_str()),
                "{section}.{id} is not a known contrib component"
            );
            defined.entry(section).or_default().insert(id);
        }
    }
    let sections: BTreeSet<&str> = cfg
        .as_object()
        .expect("map")
        .keys()
        .map(String::as_str)
        .collect();
    let known: BTreeSet<&str> = CONTRIB_COMPONENTS
        .iter()
        .map(|(s, _)| *s)
        .chain(["service"])
        .collect();
    assert!(
        sections.is_subset(&known),
        "unknown top-level sections: {sections:?}"
    );

    let pipelines = cfg["service"]["pipelines"]
        .as_object()
        .expect("service.pipelines");
    let mut used: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (name, p) in pipelines {
        assert!(
            matches!(kind_of(name).as_str(), "traces" | "metrics" | "logs"),
            "pipeline {name}"
        );
        for section in ["receivers", "processors", "exporters"] {
            for id in arr(&p[section]).iter().filter_map(|v| v.as_str()) {
                assert!(
                    defined.get(section).is_some_and(|d| d.contains(id)),
                    "pipeline {name} uses undefined {section}.{id}"
                );
                used.entry(section).or_default().insert(id.to_owned());
            }
        }
        let processors: Vec<String> = arr(&p["processors"])
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        if let Some(first) = processors.first() {
            assert_eq!(
                kind_of(first),
                "memory_limiter",
                "pipeline {name}: memory_limiter goes first"
            );
        }
        if kind_of(name) == "traces" {
            assert!(
                p["receivers"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|v| v == "otlp")),
                "traces take OTLP"
            );
            // lmperf has sampled already: nothing may sample its spans again.
            assert!(
                !processors
                    .iter()
                    .any(|p| kind_of(p) == "probabilistic_sampler"),
                "pipeline {name} re-samples lmperf"
            );
            for ts in processors.iter().filter(|p| kind_of(p) == "tail_sampling") {
                let keeps_lmperf = arr(&cfg["processors"][ts]["policies"]).iter().any(|pol| {
                    pol["type"] == "string_attribute"
                        && pol["string_attribute"]["key"] == "service.name"
                        && arr(&pol["string_attribute"]["values"])
                            .iter()
                            .any(|v| v == "lmperf")
                        && pol["string_attribute"]["invert_match"] != true
                });
                assert!(
                    keeps_lmperf,
                    "{ts}: needs a policy that keeps every span of service.name=lmperf"
                );
            }
        }
    }
    for section in ["receivers", "processors", "exporters"] {
        assert_eq!(
            defined.get(section),
            used.get(section),
            "{section}: defined but unused (or the reverse)"
        );
    }
    let exporters: BTreeSet<String> = used["exporters"].iter().map(|e| kind_of(e)).collect();
    assert!(
        exporters.contains("otlp") && exporters.contains("prometheus"),
        "traces to Jaeger/Tempo over OTLP, metrics to Prometheus: {exporters:?}"
    );
}

#[test]
fn compose_stack_is_complete_and_its_files_exist() {
    let dir = workspace_root().join("deploy/compose");
    let compose = &yaml_docs(&dir.join("compose.yaml"))[0];
    let services = compose["services"].as_object().expect("services");
    let names: BTreeSet<&str> = services.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "model-server",
            "lmperf",
            "otel-collector",
            "jaeger",
            "prometheus",
            "grafana"
        ])
    );
    // Every bind mount's source exists (named volumes are declared).
    let named: BTreeSet<String> = compose["volumes"]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    for (svc, s) in services {
        for v in arr(&s["volumes"]) {
            let spec = v.as_str().expect("short volume syntax");
            let src = spec.split(':').next().unwrap_or("");
            if src.starts_with('.') || src.starts_with('/') {
                assert!(dir.join(src).exists(), "{svc}: {src} does not exist");
            } else {
                assert!(named.contains(src), "{svc}: volume {src} not declared");
            }
        }
        for d in arr(&s["depends_on"]) {
            assert!(
                names.contains(d.as_str().unwrap_or("")),
                "{svc} depends on unknown {d}"
            );
        }
    }
    let build = &services["lmperf"]["build"];
    assert!(
        dir.join(build["context"].as_str().expect("context"))
            .join(build["dockerfile"].as_str().expect("dockerfile"))
            .exists()
    );
    // The agent runs as in the chart: read-only, no capabilities, not root.
    let agent = &services["lmperf"];
    assert_eq!(agent["read_only"], true);
    assert_eq!(agent["cap_drop"], serde_json::json!(["ALL"]));
    assert!(
        agent["user"]
            .as_str()
            .is_some_and(|u| !u.starts_with("0") && !u.starts_with("root"))
    );
    for (svc, s) in services {
        assert_ne!(s["privileged"], true, "{svc}");
    }
    // Its config loads in the agent with the compose env, and Prometheus scrapes its port.
    let env = PodEnv(
        agent["environment"]
            .as_object()
            .expect("env map")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
            .collect(),
    );
    let cfg = load(
        Overrides {
            config: Some(dir.join("lmperf.toml")),
            ..Overrides::default()
        },
        &env,
    )
    .expect("compose lmperf.toml");
    assert!(
        cfg.otlp.enabled
            && cfg
                .otlp
                .traces_endpoint
                .starts_with("http://otel-collector:4317")
    );
    assert_eq!(cfg.targets[0].host, "model-server");
    assert_eq!(
        cfg.control.listen.to_string(),
        "127.0.0.1:50051",
        "control API on the container's loopback"
    );
    let prom = &yaml_docs(&dir.join("prometheus.yml"))[0];
    let targets: Vec<String> = arr(&prom["scrape_configs"])
        .iter()
        .flat_map(|j| arr(&j["static_configs"]))
        .flat_map(|s| arr(&s["targets"]))
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    assert!(
        targets.contains(&format!("lmperf:{}", cfg.admin_addr.port())),
        "{targets:?}"
    );
    // Grafana: the dashboards folder is mounted where the provider reads, and the datasources
    // the dashboards' variables pick exist.
    let provider =
        &yaml_docs(&dir.join("grafana/provisioning/dashboards/lmperf.yaml"))[0]["providers"][0];
    let path = provider["options"]["path"].as_str().expect("provider path");
    assert!(arr(&services["grafana"]["volumes"]).iter().any(|v| {
        v.as_str()
            .is_some_and(|v| v.starts_with("../../dashboards:") && v.contains(path))
    }));
    let ds = &yaml_docs(&dir.join("grafana/provisioning/datasources/datasources.yaml"))[0];
    let types: BTreeSet<&str> = ds["datasources"]
        .as_array()
        .expect("datasources")
        .iter()
        .filter_map(|d| d["type"].as_str())
        .collect();
    assert!(
        types.contains("prometheus") && types.contains("jaeger"),
        "{types:?}"
    );
}

/// `helm lint` (Helm's own, through the same SDK) finds nothing above "info" for any values set.
#[test]
fn helm_lint_is_clean_for_every_values_set() {
    for (name, files) in value_sets() {
        let mut args = vec!["lint".to_owned()];
        for f in &files {
            args.extend(["-f".to_owned(), f.display().to_string()]);
        }
        let (ok, stdout, stderr) = render_py(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(ok, "{name}: {stderr}");
        let report: Value = serde_json::from_str(&stdout).expect("lint JSON");
        assert_eq!(report["total_charts_linted"], 1, "{name}: {report}");
        assert_eq!(report["errors"], Value::Array(vec![]), "{name}: {report}");
        // Helm's severities: 1 info, 2 warning, 3 error.
        let bad: Vec<&Value> = report["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["severity"].as_u64().unwrap_or(3) >= 2)
            .collect();
        assert!(bad.is_empty(), "{name}: helm lint: {bad:?}");
    }
}
