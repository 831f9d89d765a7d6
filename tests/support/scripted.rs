//! A scripted HTTP/1.1 server over real loopback TCP: it answers each request with a
//! scripted reply whose body frames are written at their `t_ms` after the request arrived
//! (chunked transfer encoding, flushed per frame), as `../shared/cases/README.md` describes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// One body frame: `bytes` written at `at` after the request arrived.
#[derive(Debug, Clone)]
pub struct Frame {
    pub at: Duration,
    pub bytes: Vec<u8>,
}

/// What the server does with one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A status, extra headers, and frames; `cut` closes the connection after the frames
    /// without ending the chunked body (a stream cut mid-way).
    Stream {
        status: u16,
        content_type: String,
        frames: Vec<Frame>,
        cut: bool,
    },
    /// Read the request, then close the connection without a byte of response.
    CloseWithoutResponse,
    /// Read the request and never answer (until the client gives up).
    Hang,
    /// A status with exactly these headers (no `Content-Type` added) and frames as the body,
    /// chunked: a case request's own `response_headers` (`../shared/cases/README.md`).
    WithHeaders {
        status: u16,
        headers: Vec<(String, String)>,
        frames: Vec<Frame>,
    },
}

impl Reply {
    pub fn sse(frames: Vec<Frame>) -> Self {
        Reply::Stream {
            status: 200,
            content_type: "text/event-stream".into(),
            frames,
            cut: false,
        }
    }
    pub fn json(status: u16, body: &str) -> Self {
        Reply::Stream {
            status,
            content_type: "application/json".into(),
            frames: vec![Frame {
                at: Duration::ZERO,
                bytes: body.as_bytes().to_vec(),
            }],
            cut: false,
        }
    }
}

/// A request as the server received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Index of the connection it came on (0, 1, …).
    pub connection: usize,
    /// Index of the request on that connection.
    pub on_connection: usize,
    /// When the whole request had been read: the instant the frames' `at` count from.
    pub arrived: std::time::Instant,
    /// Each body frame written so far: its `at`, and the instant its write and flush
    /// returned (the server's own send time; filled while the reply is written).
    pub written: Arc<Mutex<Vec<(Duration, std::time::Instant)>>>,
}

impl Received {
    /// How late the server wrote its frames, at most: the write's instant less `arrived +
    /// at`, the largest over the frames written so far (zero before any). A loaded machine
    /// wakes the server's timer late, and a time the client measures is late by as much.
    pub fn lateness(&self) -> Duration {
        self.written
            .lock()
            .map(|w| {
                w.iter()
                    .map(|(at, t)| t.saturating_duration_since(self.arrived + *at))
                    .max()
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Chooses the reply for a request.
pub type Script = Arc<dyn Fn(&Received, usize) -> Reply + Send + Sync>;

/// The server; dropped, it stops accepting.
pub struct ScriptedServer {
    pub addr: std::net::SocketAddr,
    pub received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedServer {
    /// Serves `script(request, n)` for the `n`-th request (from 0) on 127.0.0.1.
    pub async fn start(script: Script) -> Self {
        Self::start_with(script, None).await
    }

    /// As [`start`](Self::start); `idle_close` closes a connection that stays idle that long
    /// after a response (a keep-alive timeout, as llama.cpp's 5 s).
    pub async fn start_with(script: Script, idle_close: Option<Duration>) -> Self {
        Self::start_at(([127, 0, 0, 1], 0).into(), script, idle_close).await
    }

    /// As [`start_with`](Self::start_with), listening on `bind` (an address of a network
    /// namespace the test created, for instance).
    pub async fn start_at(
        bind: std::net::SocketAddr,
        script: Script,
        idle_close: Option<Duration>,
    ) -> Self {
        let listener = TcpListener::bind(bind).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let counter = Arc::new(AtomicUsize::new(0));
        let rec = received.clone();
        let task = tokio::spawn(async move {
            let mut conn_id = 0;
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                let (script, rec, counter) = (script.clone(), rec.clone(), counter.clone());
                tokio::spawn(serve_connection(
                    sock, conn_id, script, rec, counter, idle_close,
                ));
                conn_id += 1;
            }
        });
        Self {
            addr,
            received,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().map(|g| g.clone()).unwrap_or_default()
    }
}

async fn read_request(
    sock: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(String, String, Vec<(String, String)>, Vec<u8>)> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let mut lines = head.split("\r\n");
            let mut first = lines.next()?.split_whitespace();
            let method = first.next()?.to_owned();
            let path = first.next()?.to_owned();
            let headers: Vec<(String, String)> = lines
                .filter_map(|l| {
                    l.split_once(':')
                        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                })
                .collect();
            let len = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse::<usize>().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let mut tmp = [0u8; 65536];
                let n = sock.read(&mut tmp).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            let body = buf[end + 4..end + 4 + len].to_vec();
            buf.drain(..end + 4 + len);
            return Some((method, path, headers, body));
        }
        let mut tmp = [0u8; 65536];
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

async fn serve_connection(
    mut sock: TcpStream,
    conn_id: usize,
    script: Script,
    rec: Arc<Mutex<Vec<Received>>>,
    counter: Arc<AtomicUsize>,
    idle_close: Option<Duration>,
) {
    let mut buf = Vec::new();
    let mut on_conn = 0;
    loop {
        let next = read_request(&mut sock, &mut buf);
        let got = match (idle_close, on_conn) {
            (Some(idle), n) if n > 0 => match tokio::time::timeout(idle, next).await {
                Ok(r) => r,
                Err(_) => return, // idle keep-alive timeout: close
            },
            _ => next.await,
        };
        let Some((method, path, headers, body)) = got else {
            return;
        };
        let arrived = Instant::now();
        let req = Received {
            method,
            path,
            headers,
            body,
            connection: conn_id,
            on_connection: on_conn,
            arrived: arrived.into_std(),
            written: Arc::default(),
        };
        let written = req.written.clone();
        on_conn += 1;
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let reply = script(&req, n);
        if let Ok(mut g) = rec.lock() {
            g.push(req);
        }
        match reply {
            Reply::CloseWithoutResponse => return,
            Reply::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            Reply::Stream { .. } | Reply::WithHeaders { .. } => {
                let (status, headers, frames, cut) = match reply {
                    Reply::Stream {
                        status,
                        content_type,
                        frames,
                        cut,
                    } => (
                        status,
                        vec![("Content-Type".to_owned(), content_type)],
                        frames,
                        cut,
                    ),
                    Reply::WithHeaders {
                        status,
                        headers,
                        frames,
                    } => (status, headers, frames, false),
                    _ => return,
                };
                let extra: String = headers
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}\r\n"))
                    .collect();
                let head = format!(
                    "HTTP/1.1 {status} {}\r\n{extra}Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n",
                    reason(status)
                );
                if sock.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for f in frames {
                    tokio::time::sleep_until(arrived + f.at).await;
                    if f.bytes.is_empty() {
                        continue;
                    }
                    let mut chunk = format!("{:x}\r\n", f.bytes.len()).into_bytes();
                    chunk.extend_from_slice(&f.bytes);
                    chunk.extend_from_slice(b"\r\n");
                    if sock.write_all(&chunk).await.is_err() {
                        return;
                    }
                    let _ = sock.flush().await;
                    if let Ok(mut w) = written.lock() {
                        w.push((f.at, std::time::Instant::now()));
                    }
                }
                if cut {
                    return;
                }
                if sock.write_all(b"0\r\n\r\n").await.is_err() {
                    return;
                }
            }
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        429 => "Too Many Requests",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Frames of a `../shared/cases/sse/*.json` request (`frames` array): each frame's `bytes`,
/// or its `bytes_b64` decoded.
pub fn case_frames(frames: &serde_json::Value) -> Vec<Frame> {
    frames
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| Frame {
                    at: Duration::from_secs_f64(f["t_ms"].as_f64().unwrap_or(0.0) / 1000.0),
                    bytes: match f["bytes_b64"].as_str() {
                        Some(b64) => base64_decode(b64)
                            .unwrap_or_else(|| panic!("bytes_b64 {b64:?}: not base64")),
                        None => f["bytes"].as_str().unwrap_or("").as_bytes().to_vec(),
                    },
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Standard base64 (RFC 4648 §4, padding optional); `None` on any other byte.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0u32);
    for c in text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
    {
        acc = (acc << 6) | u32::from(val(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// The reply to one request of a case (`../shared/cases/README.md`): its own `http_status`
/// (else `default_status`) and `response_headers` (then the frames are the body as is), else
/// an SSE stream.
pub fn case_reply(request: &serde_json::Value, default_status: u16) -> Reply {
    let status = request["http_status"]
        .as_u64()
        .map_or(default_status, |s| s as u16);
    let frames = case_frames(&request["frames"]);
    match request["response_headers"].as_object() {
        Some(h) => Reply::WithHeaders {
            status,
            headers: h
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect(),
            frames,
        },
        None => Reply::Stream {
            status,
            content_type: "text/event-stream".into(),
            frames,
            cut: false,
        },
    }
}

/// A server for a whole case: the i-th POST to the case's `endpoint` gets `requests[i]` (a
/// single-stream case is its only request, every time); any other request a 404.
pub async fn case_server(case: &serde_json::Value) -> ScriptedServer {
    let endpoint = case["endpoint"]
        .as_str()
        .unwrap_or("/v1/chat/completions")
        .to_owned();
    let status = case["http_status"].as_u64().map_or(200, |s| s as u16);
    let replies: Vec<Reply> = match case["requests"].as_array() {
        Some(reqs) => reqs.iter().map(|r| case_reply(r, status)).collect(),
        None => vec![case_reply(case, status)],
    };
    let posts = Arc::new(AtomicUsize::new(0));
    ScriptedServer::start(Arc::new(move |req, _| {
        if req.method != "POST" || req.path != endpoint {
            return Reply::json(
                404,
                r#"{"error":{"message":"not found","type":"not_found"}}"#,
            );
        }
        let i = posts.fetch_add(1, Ordering::SeqCst);
        replies
            .get(i.min(replies.len().saturating_sub(1)))
            .cloned()
            .unwrap_or(Reply::CloseWithoutResponse)
    }))
    .await
}

/// An SSE stream of `n` chat tokens, one every `gap`, then finish `stop`, usage and `[DONE]`.
/// `frames` (a [`chat_stream`]) with vLLM's per-request `metrics` on its final usage chunk, as
/// `vllm serve --enable-per-request-metrics` sends them (docs/features/per_request_metrics.md):
/// the server's own TTFT from scheduled (`ttft_ms`) and queue time (`queue_ms`).
pub fn with_vllm_metrics(mut frames: Vec<Frame>, ttft_ms: f64, queue_ms: f64) -> Vec<Frame> {
    if let Some(last) = frames.last_mut() {
        let text = String::from_utf8_lossy(&last.bytes).into_owned();
        let metrics = format!(
            ",\"metrics\":{{\"time_to_first_token_ms\":{ttft_ms},\"generation_time_ms\":4.0,\"queue_time_ms\":{queue_ms},\"mean_itl_ms\":2.0,\"tokens_per_second\":500.0}}"
        );
        last.bytes = text
            .replacen(
                "}\n\ndata: [DONE]",
                &format!("{metrics}}}\n\ndata: [DONE]"),
                1,
            )
            .into_bytes();
    }
    frames
}

pub fn chat_stream(n: usize, first: Duration, gap: Duration, prompt_tokens: u64) -> Vec<Frame> {
    let mut frames = vec![Frame {
        at: first,
        bytes: b"data: {\"id\":\"chatcmpl-s\",\"model\":\"scripted\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n".to_vec(),
    }];
    for i in 0..n {
        let fin = if i + 1 == n { "\"stop\"" } else { "null" };
        frames.push(Frame {
            at: first + gap * i as u32,
            bytes: format!("data: {{\"id\":\"chatcmpl-s\",\"model\":\"scripted\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}},\"finish_reason\":{fin}}}]}}\n\n").into_bytes(),
        });
    }
    let end = first + gap * n.saturating_sub(1) as u32;
    frames.push(Frame {
        at: end,
        bytes: format!("data: {{\"id\":\"chatcmpl-s\",\"model\":\"scripted\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{n},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n", prompt_tokens + n as u64).into_bytes(),
    });
    frames
}
