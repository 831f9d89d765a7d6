//! This node's pods from the API server as a list-then-watch that starts over from a fresh
//! list after any error, as client-go's reflector does (`ListAndWatch` returns on a watch
//! error and `Run` calls it again after a backoff).
//!
//! `kube`'s watcher with its own backoff would retry only the watch after, say, an RBAC 403
//! on it: a watch that then starts gives no event at all until a pod changes or a bookmark
//! comes (about a minute on a real API server), so nothing could say that discovery had
//! recovered. A fresh list answers at once (`Init` … `InitDone`), and its cost is this node's
//! pods only (the field selector). The wait before each new list is `kube`'s default backoff
//! (0.8 s doubling to 30 s, up to twice that with its jitter, as client-go's), reset by a
//! completed list.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, DefaultBackoff};

/// What the stream holds between items.
struct Relist {
    api: Api<Pod>,
    config: watcher::Config,
    /// The API server's URL, named in every error.
    url: String,
    /// The watcher in use; `None` after an error (the next item lists again).
    current: Option<BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>>,
    backoff: DefaultBackoff,
    /// The wait before the next list, set by an error.
    wait: Option<Duration>,
}

/// The pod events of `api` under `config`, an error as the sentence the status says (from
/// `describe`, with the API server `url` appended); after each error the watch is dropped and
/// a new list starts after the backoff. Never ends. (`apiserver::PodEvents`, named here
/// without importing the module above.)
pub(super) fn pod_events(
    api: Api<Pod>,
    config: watcher::Config,
    url: String,
    describe: fn(&watcher::Error) -> String,
) -> BoxStream<'static, Result<watcher::Event<Pod>, String>> {
    let state = Relist {
        api,
        config,
        url,
        current: None,
        backoff: DefaultBackoff::default(),
        wait: None,
    };
    futures_util::stream::unfold(state, move |mut s| async move {
        if let Some(wait) = s.wait.take() {
            tokio::time::sleep(wait).await;
        }
        loop {
            let (api, config) = (s.api.clone(), s.config.clone());
            let inner = s
                .current
                .get_or_insert_with(|| watcher::watcher(api, config).boxed());
            match inner.next().await {
                Some(Ok(event)) => {
                    if matches!(event, watcher::Event::InitDone) {
                        s.backoff.reset();
                    }
                    return Some((Ok(event), s));
                }
                Some(Err(e)) => {
                    s.current = None;
                    s.wait = s.backoff.next();
                    let text = format!("{} (API server {})", describe(&e), s.url);
                    return Some((Err(text), s));
                }
                // A watcher does not end; were it to, list again.
                None => s.current = None,
            }
        }
    })
    .boxed()
}
