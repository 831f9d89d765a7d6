//! A gRPC channel over one unix-socket connection the caller has made (the kubelet's
//! node-local APIs: pod-resources, pods). The caller connects, so its connect errors keep
//! their io kind (missing socket, permission denied); tonic is handed that one connection, and
//! a broken connection fails the calls rather than being redialled (the caller reconnects).

use std::sync::{Arc, Mutex};

/// A channel whose only connection is `stream`.
///
/// # Errors
/// tonic cannot set up the HTTP/2 connection over it.
pub async fn channel(
    stream: tokio::net::UnixStream,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let slot = Arc::new(Mutex::new(Some(stream)));
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let s = slot.lock().ok().and_then(|mut g| g.take());
            async move {
                s.map(hyper_util::rt::TokioIo::new).ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotConnected, "connection used")
                })
            }
        }))
        .await
}
