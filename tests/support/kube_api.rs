//! A scripted Kubernetes API server over loopback HTTP/1.1 that speaks the real list/watch
//! protocol for pods (and answers ReplicaSet gets), so the agent's production code path
//! (`kube`'s client and watcher, through a kubeconfig file) runs against it:
//!
//! - `GET /api/v1/pods?fieldSelector=spec.nodeName=N` lists (`PodList`, `metadata.resourceVersion`),
//!   the field selector applied by the server;
//! - `…&watch=true&resourceVersion=R` streams JSON watch events (chunked, one per line):
//!   the events after `R`, then live ones; `BOOKMARK` events on [`KubeApi::bookmark`];
//!   an `ERROR` event with a 410 `Expired` Status when `R` is older than the compaction point
//!   ([`KubeApi::compact`]); the stream is cut by [`KubeApi::drop_watches`];
//! - every pod request answers 403 (a `Forbidden` Status) while [`KubeApi::set_forbidden`];
//! - `GET /apis/apps/v1/namespaces/NS/replicasets/NAME` answers the ReplicaSets added with
//!   [`KubeApi::add_replicaset`], else 404;
//! - `GET /apis/inference.networking.k8s.io/v1/inferencepools` lists and watches the
//!   InferencePools of every namespace ([`KubeApi::apply_pool`], [`KubeApi::delete_pool`]) the
//!   same way (one resourceVersion sequence for both kinds, as etcd keeps), once the CRD is
//!   installed ([`KubeApi::install_pool_crd`]; before that 404, as a cluster without it answers),
//!   403 while [`KubeApi::set_pools_forbidden`].
//!
//! It counts lists and watches so tests can assert a relist happened.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;

/// The pods resource.
const PODS: &str = "pods";
/// The InferencePools resource.
const POOLS: &str = "inferencepools";
/// The path of InferencePools (all namespaces).
pub const POOLS_PATH: &str = "/apis/inference.networking.k8s.io/v1/inferencepools";

/// One watch event as stored: its resource, resourceVersion, type and object.
#[derive(Debug, Clone)]
struct Ev {
    /// `pods`, `inferencepools`, or `*` (an ERROR for every watch).
    res: &'static str,
    rv: u64,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// Pods by `namespace/name`.
    pods: BTreeMap<String, Value>,
    /// InferencePools by `namespace/name`.
    pools: BTreeMap<String, Value>,
    history: Vec<Ev>,
    /// Watches asking for a resourceVersion below this get 410 Gone.
    compacted: u64,
    replicasets: BTreeMap<String, Value>,
}

/// Counters of what clients asked.
#[derive(Debug, Default)]
pub struct Counts {
    pub lists: AtomicU64,
    pub watches: AtomicU64,
    pub gone: AtomicU64,
    pub forbidden: AtomicU64,
    pub replicaset_gets: AtomicU64,
    /// InferencePool requests of any kind (lists, watches, refused ones).
    pub pool_requests: AtomicU64,
}

/// The server; dropped, it stops accepting.
pub struct KubeApi {
    pub addr: std::net::SocketAddr,
    state: Arc<Mutex<State>>,
    live: broadcast::Sender<Option<Ev>>,
    forbidden: Arc<AtomicBool>,
    pools: Arc<PoolsSwitch>,
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

/// Whether the InferencePool CRD is installed, and whether its requests are refused.
#[derive(Debug, Default)]
struct PoolsSwitch {
    installed: AtomicBool,
    forbidden: AtomicBool,
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key(pod: &Value) -> String {
    format!(
        "{}/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
        pod["metadata"]["name"].as_str().unwrap_or_default()
    )
}

fn node_of(pod: &Value) -> &str {
    pod["spec"]["nodeName"].as_str().unwrap_or_default()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
}

/// Query parameters, percent-decoded.
fn query(target: &str) -> BTreeMap<String, String> {
    let q = target.split_once('?').map(|x| x.1).unwrap_or_default();
    q.split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(h, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `spec.nodeName=N` (the only field selector the server knows; others select everything).
fn node_selector(q: &BTreeMap<String, String>) -> Option<String> {
    q.get("fieldSelector")?
        .split(',')
        .find_map(|r| r.strip_prefix("spec.nodeName="))
        .map(str::to_owned)
}

impl KubeApi {
    /// Starts on 127.0.0.1 with no pods.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state: Arc<Mutex<State>> = Arc::default();
        let (live, _) = broadcast::channel(16_384);
        let forbidden = Arc::new(AtomicBool::new(false));
        let pools: Arc<PoolsSwitch> = Arc::default();
        let counts = Arc::new(Counts::default());
        let (st, tx, fb, ps, ct) = (
            state.clone(),
            live.clone(),
            forbidden.clone(),
            pools.clone(),
            counts.clone(),
        );
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                let sw = Switches {
                    forbidden: fb.clone(),
                    pools: ps.clone(),
                };
                tokio::spawn(serve(sock, st.clone(), tx.clone(), sw, ct.clone()));
            }
        });
        Self {
            addr,
            state,
            live,
            forbidden,
            pools,
            counts,
            task,
        }
    }

    /// A kubeconfig file pointing at this server (plain HTTP, a token user).
    pub fn write_kubeconfig(&self, path: &std::path::Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: scripted\n  cluster:\n    server: http://{}\ncontexts:\n- name: scripted\n  context:\n    cluster: scripted\n    user: agent\n    namespace: default\ncurrent-context: scripted\nusers:\n- name: agent\n  user:\n    token: test-token\n",
            self.addr
        );
        std::fs::write(path, text).expect("write kubeconfig");
    }

    fn push(&self, res: &'static str, kind: &'static str, mut object: Value) -> u64 {
        let ev = {
            let mut s = self.state.lock().expect("state");
            s.rv += 1;
            let rv = s.rv;
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
            let k = key(&object);
            let store = if res == POOLS {
                &mut s.pools
            } else {
                &mut s.pods
            };
            if kind == "DELETED" {
                store.remove(&k);
            } else {
                store.insert(k, object.clone());
            }
            let ev = Ev {
                res,
                rv,
                kind,
                object,
            };
            s.history.push(ev.clone());
            ev
        };
        let rv = ev.rv;
        let _ = self.live.send(Some(ev));
        rv
    }

    /// Adds or replaces a pod (ADDED or MODIFIED); returns its resourceVersion.
    pub fn apply(&self, pod: Value) -> u64 {
        let exists = self
            .state
            .lock()
            .expect("state")
            .pods
            .contains_key(&key(&pod));
        self.push(PODS, if exists { "MODIFIED" } else { "ADDED" }, pod)
    }

    /// Adds or replaces an InferencePool (see [`inference_pool`]); returns its resourceVersion.
    pub fn apply_pool(&self, pool: Value) -> u64 {
        let exists = self
            .state
            .lock()
            .expect("state")
            .pools
            .contains_key(&key(&pool));
        self.push(POOLS, if exists { "MODIFIED" } else { "ADDED" }, pool)
    }

    /// Deletes an InferencePool by `namespace/name`.
    pub fn delete_pool(&self, ns_name: &str) -> Option<u64> {
        let pool = self
            .state
            .lock()
            .expect("state")
            .pools
            .get(ns_name)
            .cloned()?;
        Some(self.push(POOLS, "DELETED", pool))
    }

    /// Installs the InferencePool CRD: its requests are served from now on (404 before).
    pub fn install_pool_crd(&self) {
        self.pools.installed.store(true, Ordering::SeqCst);
    }

    /// While true, every InferencePool list and watch answers 403 Forbidden.
    pub fn set_pools_forbidden(&self, on: bool) {
        self.pools.forbidden.store(on, Ordering::SeqCst);
        if on {
            self.drop_watches();
        }
    }

    /// Adds many pods at once (no watcher should be connected yet: one event each otherwise).
    pub fn apply_all(&self, pods: impl IntoIterator<Item = Value>) {
        for p in pods {
            self.apply(p);
        }
    }

    /// Deletes a pod by `namespace/name` (a DELETED event with its last state).
    pub fn delete(&self, ns_name: &str) -> Option<u64> {
        let pod = self
            .state
            .lock()
            .expect("state")
            .pods
            .get(ns_name)
            .cloned()?;
        Some(self.push(PODS, "DELETED", pod))
    }

    /// The pod now, by `namespace/name`.
    pub fn pod(&self, ns_name: &str) -> Option<Value> {
        self.state.lock().expect("state").pods.get(ns_name).cloned()
    }

    /// Sends a BOOKMARK (the current resourceVersion) on every open watch.
    pub fn bookmark(&self) {
        let rv = self.state.lock().expect("state").rv;
        let _ = self.live.send(Some(Ev {
            res: PODS,
            rv,
            kind: "BOOKMARK",
            object: json!({"kind": "Pod", "apiVersion": "v1",
                "metadata": {"resourceVersion": rv.to_string()}}),
        }));
        let _ = self.live.send(Some(Ev {
            res: POOLS,
            rv,
            kind: "BOOKMARK",
            object: json!({"kind": "InferencePool",
                "apiVersion": "inference.networking.k8s.io/v1",
                "metadata": {"resourceVersion": rv.to_string()}}),
        }));
    }

    /// Compacts history: a watch from an older resourceVersion gets 410 Gone; the open
    /// watches are sent that 410 now and cut (as etcd compaction does to a slow watcher).
    pub fn compact(&self) {
        {
            let mut s = self.state.lock().expect("state");
            // etcd compacts up to its current revision: a watch from an older one is gone,
            // one from the list that follows (which answers this revision) is not.
            s.compacted = s.rv;
            s.history.clear();
        }
        let _ = self.live.send(Some(Ev {
            res: "*",
            rv: 0,
            kind: "ERROR",
            object: status(410, "Expired", "too old resource version"),
        }));
    }

    /// Cuts every open watch stream (ends the chunked body): a dropped watch.
    pub fn drop_watches(&self) {
        let _ = self.live.send(None);
    }

    /// While true, every pod list and watch answers 403 Forbidden.
    pub fn set_forbidden(&self, on: bool) {
        self.forbidden.store(on, Ordering::SeqCst);
        if on {
            self.drop_watches();
        }
    }

    /// A ReplicaSet `ns/name` owned by Deployment `deployment`.
    pub fn add_replicaset(&self, ns: &str, name: &str, deployment: &str) {
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": ns, "uid": format!("rs-{name}"),
                "resourceVersion": "1",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                    "name": deployment, "uid": format!("d-{deployment}"), "controller": true}]},
            "spec": {"selector": {}}});
        self.state
            .lock()
            .expect("state")
            .replicasets
            .insert(format!("{ns}/{name}"), rs);
    }
}

async fn read_request(sock: &mut TcpStream) -> Option<(String, String)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let line = head.lines().next()?.to_owned();
            let mut parts = line.split_whitespace();
            return Some((parts.next()?.to_owned(), parts.next()?.to_owned()));
        }
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 64 * 1024 {
            return None;
        }
    }
}

async fn respond(sock: &mut TcpStream, code: u16, body: &Value) -> std::io::Result<()> {
    let text = body.to_string();
    let reason = match code {
        200 => "OK",
        403 => "Forbidden",
        404 => "Not Found",
        410 => "Gone",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        text.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(text.as_bytes()).await?;
    sock.flush().await
}

async fn chunk(sock: &mut TcpStream, line: &str) -> std::io::Result<()> {
    let body = format!("{line}\n");
    sock.write_all(format!("{:x}\r\n{body}\r\n", body.len()).as_bytes())
        .await?;
    sock.flush().await
}

/// What a connection reads of the server's switches.
struct Switches {
    forbidden: Arc<AtomicBool>,
    pools: Arc<PoolsSwitch>,
}

async fn serve(
    mut sock: TcpStream,
    state: Arc<Mutex<State>>,
    live: broadcast::Sender<Option<Ev>>,
    sw: Switches,
    counts: Arc<Counts>,
) {
    while let Some((method, target)) = read_request(&mut sock).await {
        let path = target.split('?').next().unwrap_or_default().to_owned();
        let q = query(&target);
        if method != "GET" {
            let _ = respond(&mut sock, 405, &status(405, "MethodNotAllowed", "GET only")).await;
            continue;
        }
        if let Some(rest) = path.strip_prefix("/apis/apps/v1/namespaces/") {
            counts.replicaset_gets.fetch_add(1, Ordering::Relaxed);
            let mut p = rest.split('/');
            let (ns, kind, name) = (p.next(), p.next(), p.next());
            let rs = match (ns, kind, name) {
                (Some(ns), Some("replicasets"), Some(name)) => state
                    .lock()
                    .expect("state")
                    .replicasets
                    .get(&format!("{ns}/{name}"))
                    .cloned(),
                _ => None,
            };
            let r = match rs {
                Some(rs) => respond(&mut sock, 200, &rs).await,
                None => {
                    respond(
                        &mut sock,
                        404,
                        &status(404, "NotFound", "replicasets not found"),
                    )
                    .await
                }
            };
            if r.is_err() {
                return;
            }
            continue;
        }
        let res = match path.as_str() {
            "/api/v1/pods" => PODS,
            POOLS_PATH => POOLS,
            _ => {
                let _ = respond(&mut sock, 404, &status(404, "NotFound", "not scripted")).await;
                continue;
            }
        };
        if res == POOLS {
            counts.pool_requests.fetch_add(1, Ordering::Relaxed);
            let refused = if !sw.pools.installed.load(Ordering::SeqCst) {
                Some((
                    404,
                    status(
                        404,
                        "NotFound",
                        "the server could not find the requested resource",
                    ),
                ))
            } else if sw.pools.forbidden.load(Ordering::SeqCst) {
                Some((
                    403,
                    status(
                        403,
                        "Forbidden",
                        "inferencepools.inference.networking.k8s.io is forbidden: User \"system:serviceaccount:lmperf:lmperf\" cannot list resource \"inferencepools\" in API group \"inference.networking.k8s.io\" at the cluster scope",
                    ),
                ))
            } else {
                None
            };
            if let Some((code, body)) = refused {
                if respond(&mut sock, code, &body).await.is_err() {
                    return;
                }
                continue;
            }
        }
        if res == PODS && sw.forbidden.load(Ordering::SeqCst) {
            counts.forbidden.fetch_add(1, Ordering::Relaxed);
            let body = status(
                403,
                "Forbidden",
                "pods is forbidden: User \"system:serviceaccount:lmperf:lmperf\" cannot list resource \"pods\" in API group \"\" at the cluster scope",
            );
            if respond(&mut sock, 403, &body).await.is_err() {
                return;
            }
            continue;
        }
        let node = if res == PODS { node_selector(&q) } else { None };
        let selected = |p: &Value| node.as_deref().is_none_or(|n| node_of(p) == n);
        let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
        if !watching {
            if res == PODS {
                counts.lists.fetch_add(1, Ordering::Relaxed);
            }
            let body = {
                let s = state.lock().expect("state");
                let (store, kind, api_version) = if res == POOLS {
                    (
                        &s.pools,
                        "InferencePoolList",
                        "inference.networking.k8s.io/v1",
                    )
                } else {
                    (&s.pods, "PodList", "v1")
                };
                let items: Vec<Value> = store.values().filter(|p| selected(p)).cloned().collect();
                json!({"kind": kind, "apiVersion": api_version,
                    "metadata": {"resourceVersion": s.rv.to_string()}, "items": items})
            };
            if respond(&mut sock, 200, &body).await.is_err() {
                return;
            }
            continue;
        }
        if res == PODS {
            counts.watches.fetch_add(1, Ordering::Relaxed);
        }
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        // Subscribe before reading history, so nothing falls between the two.
        let mut rx = live.subscribe();
        let (replay, gone) = {
            let s = state.lock().expect("state");
            if from < s.compacted {
                (Vec::new(), true)
            } else {
                (
                    s.history
                        .iter()
                        .filter(|e| e.rv > from && e.res == res)
                        .cloned()
                        .collect::<Vec<_>>(),
                    false,
                )
            }
        };
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        if sock.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        if gone {
            if res == PODS {
                counts.gone.fetch_add(1, Ordering::Relaxed);
            }
            let ev = json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")});
            let _ = chunk(&mut sock, &ev.to_string()).await;
            let _ = sock.write_all(b"0\r\n\r\n").await;
            continue;
        }
        let mut last = from;
        for e in replay {
            if selected(&e.object) {
                let ev = json!({"type": e.kind, "object": e.object});
                if chunk(&mut sock, &ev.to_string()).await.is_err() {
                    return;
                }
            }
            last = e.rv;
        }
        let ended = loop {
            match rx.recv().await {
                Ok(Some(e)) if e.res != res && e.res != "*" => {}
                Ok(Some(e)) if e.kind == "ERROR" => {
                    if res == PODS {
                        counts.gone.fetch_add(1, Ordering::Relaxed);
                    }
                    let ev = json!({"type": "ERROR", "object": e.object});
                    let _ = chunk(&mut sock, &ev.to_string()).await;
                    break true;
                }
                Ok(Some(e)) if e.kind == "BOOKMARK" => {
                    if bookmarks {
                        let ev = json!({"type": "BOOKMARK", "object": e.object});
                        if chunk(&mut sock, &ev.to_string()).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Some(e)) => {
                    if e.rv <= last {
                        continue;
                    }
                    last = e.rv;
                    if selected(&e.object) {
                        let ev = json!({"type": e.kind, "object": e.object});
                        if chunk(&mut sock, &ev.to_string()).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(None) => break true,
                Err(broadcast::error::RecvError::Lagged(_)) => break true,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        };
        if ended {
            // End the chunked body and close: the client re-watches.
            let _ = sock.write_all(b"0\r\n\r\n").await;
            let _ = sock.shutdown().await;
            return;
        }
    }
}

/// A pod of `deployment` (through ReplicaSet `<deployment>-<hash>`) on `node`, Ready, at
/// 127.0.0.1:`port`, annotated for canaries when `annotated`.
pub fn pod(
    ns: &str,
    name: &str,
    node: &str,
    deployment: &str,
    port: u16,
    annotated: bool,
    image: &str,
) -> Value {
    let hash = "5c6b8d";
    let mut annotations = json!({});
    if annotated {
        annotations = json!({"lmperf.dev/canary": "true", "lmperf.dev/port": port.to_string(),
            "lmperf.dev/model": "m", "lmperf.dev/rate": "4", "lmperf.dev/metrics-path": "/metrics"});
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
            "labels": {"app": deployment, "pod-template-hash": hash},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("{deployment}-{hash}"), "uid": format!("rs-{deployment}"),
                "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "server", "image": image,
            "args": ["--model", "m"], "ports": [{"containerPort": port, "name": "http"}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "server", "image": image, "imageID": "",
                "ready": true, "restartCount": 0, "started": true}]}
    })
}

/// An InferencePool (`inference.networking.k8s.io/v1`) in `ns` selecting the pods that carry
/// every `match_labels` entry, at `ports`.
pub fn inference_pool(ns: &str, name: &str, match_labels: &[(&str, &str)], ports: &[u16]) -> Value {
    let labels: serde_json::Map<String, Value> = match_labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    let ports: Vec<Value> = ports.iter().map(|p| json!({"number": p})).collect();
    json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": name, "namespace": ns, "uid": format!("pool-{ns}-{name}")},
        "spec": {"selector": {"matchLabels": labels}, "targetPorts": ports,
            "endpointPickerRef": {"name": format!("{name}-epp"), "port": {"number": 9002}}}
    })
}
