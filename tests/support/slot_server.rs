//! A scripted model server of known capacity: `k` completions at a time, each holding its
//! slot for a fixed service time (capacity `k / service` req/s). Used by the capacity search
//! and several-endpoint tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// A server that serves `k` completions at a time: a request waits for a slot, gets its first
/// token at once, holds the slot for `service`, then ends (4 tokens). `/tokenize` counts
/// words; anything else is 404. HTTP/1.1, one request per connection read (keep-alive).
/// Returns its URL and the log of how long each request held its slot (the service time as
/// served: the timer adds a little to `service`).
pub async fn k_slot_server(k: usize, service: Duration) -> (String, Arc<Mutex<Vec<Duration>>>) {
    k_slot_server_with(k, service, SlotExtras::default()).await
}

/// What a [`k_slot_server_with`] does beyond [`k_slot_server`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SlotExtras {
    /// Each `/tokenize` answers after this (a slow server-side tokenizer).
    pub tokenize_delay: Duration,
    /// `/metrics` answers llama.cpp's gauges: `llamacpp:requests_processing` (requests
    /// holding a slot) and `llamacpp:requests_deferred` (requests waiting for one).
    pub metrics: bool,
}

/// [`k_slot_server`] with `extras`.
pub async fn k_slot_server_with(
    k: usize,
    service: Duration,
    extras: SlotExtras,
) -> (String, Arc<Mutex<Vec<Duration>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let slots = Arc::new(Semaphore::new(k));
    let held: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let log = held.clone();
    // Requests at the server: (holding a slot, waiting for one).
    let busy: Arc<(AtomicUsize, AtomicUsize)> = Arc::default();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let (slots, held, busy) = (slots.clone(), held.clone(), busy.clone());
            tokio::spawn(async move {
                let _ = sock.set_nodelay(true);
                let mut buf = Vec::new();
                loop {
                    // One request: headers, then content-length bytes.
                    let (head_end, len) = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
                            let len = head
                                .lines()
                                .find_map(|l| {
                                    l.strip_prefix("content-length:")
                                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                                })
                                .unwrap_or(0);
                            break (i + 4, len);
                        }
                        let mut chunk = [0u8; 16384];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    while buf.len() < head_end + len {
                        let mut chunk = [0u8; 16384];
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                    let body: Value = serde_json::from_slice(&buf[head_end..head_end + len])
                        .unwrap_or(Value::Null);
                    buf.drain(..head_end + len);
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    if path == "/metrics" && extras.metrics {
                        let b = format!(
                            "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {}\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred {}\n",
                            busy.0.load(Ordering::SeqCst),
                            busy.1.load(Ordering::SeqCst)
                        );
                        let _ = sock.write_all(format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{b}", b.len()).as_bytes()).await;
                        continue;
                    }
                    if path == "/tokenize" {
                        tokio::time::sleep(extras.tokenize_delay).await;
                        let n = body["content"]
                            .as_str()
                            .map_or(0, |s| s.split_whitespace().count());
                        let b = serde_json::json!({ "tokens": vec![1; n] }).to_string();
                        let _ = sock.write_all(format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}", b.len()).as_bytes()).await;
                        continue;
                    }
                    if !path.ends_with("/completions") {
                        let _ = sock
                            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        continue;
                    }
                    busy.1.fetch_add(1, Ordering::SeqCst);
                    let permit = slots.clone().acquire_owned().await;
                    busy.1.fetch_sub(1, Ordering::SeqCst);
                    let Ok(permit) = permit else {
                        return;
                    };
                    busy.0.fetch_add(1, Ordering::SeqCst);
                    let got = Instant::now();
                    let chunk = |s: &str| {
                        let d = format!("data: {s}\n\n");
                        format!("{:x}\r\n{d}\r\n", d.len())
                    };
                    let tok = r#"{"choices":[{"index":0,"text":"w "}]}"#;
                    let first = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{}",
                        chunk(tok)
                    );
                    if sock.write_all(first.as_bytes()).await.is_err() {
                        busy.0.fetch_sub(1, Ordering::SeqCst);
                        return;
                    }
                    tokio::time::sleep(service).await;
                    held.lock().unwrap().push(got.elapsed());
                    busy.0.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                    let rest = format!(
                        "{}{}{}{}{}0\r\n\r\n",
                        chunk(tok),
                        chunk(tok),
                        chunk(tok),
                        chunk(
                            r#"{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4}}"#
                        ),
                        chunk("[DONE]")
                    );
                    if sock.write_all(rest.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), log)
}
