//! A fast fixed-reply stream server for client benchmarks (`tests/benches/client_peers.rs`):
//! loopback only, its own OS thread (one single-threaded tokio runtime, like one nginx
//! worker), HTTP/1.1 keep-alive. `POST …/chat/completions` (and `…/completions`) always gets
//! the same SSE reply: `tokens` chat chunks, a usage chunk and `[DONE]`, sent with a
//! `content-length` (like nginx `return 200`); with zero delays the whole reply is one write.
//! `GET …/models` lists the model `bench`; `GET …/health` is 200; anything else is 404.
//!
//! For every request it records when it had the whole request (arrival) and when the write
//! holding the first chunk returned (first chunk), so a client's TTFT can be compared with
//! the server's own timing and its arrivals with the requested schedule.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The reply's shape and timing.
#[derive(Debug, Clone, Copy)]
pub struct StreamConfig {
    /// Content chunks per reply (one token each).
    pub tokens: usize,
    /// Delay from arrival to the first chunk (tokio timer: 1 ms resolution, 0 = none).
    pub first_delay: Duration,
    /// Delay between chunks (0 = the whole reply in one write).
    pub gap: Duration,
    /// `prompt_tokens` reported in the usage chunk.
    pub prompt_tokens: u64,
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            tokens: 16,
            first_delay: Duration::ZERO,
            gap: Duration::ZERO,
            prompt_tokens: 128,
        }
    }
}

/// What kind of request the server saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A (chat) completion: answered with the stream.
    Completion,
    /// Models, health, or a 404.
    Other,
}

/// The server's record of one request (times on this process's monotonic clock).
#[derive(Debug, Clone, Copy)]
pub struct Served {
    pub kind: Kind,
    /// The whole request (head and body) was read.
    pub arrived: Instant,
    /// The write that holds the first chunk returned.
    pub first_chunk: Instant,
    /// The last write returned.
    pub done: Instant,
    /// Every byte of the reply was written.
    pub complete: bool,
}

impl Served {
    /// The server's own time to first token: arrival to the first chunk's write.
    pub fn ttft(&self) -> Duration {
        self.first_chunk.saturating_duration_since(self.arrived)
    }
}

/// A running server; stops when dropped.
pub struct StreamServer {
    pub addr: SocketAddr,
    served: Arc<Mutex<Vec<Served>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StreamServer {
    /// Binds 127.0.0.1 on a free port and serves on a new thread.
    pub fn start(cfg: StreamConfig) -> std::io::Result<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let served = Arc::new(Mutex::new(Vec::with_capacity(1 << 20)));
        let stop = Arc::new(AtomicBool::new(false));
        let (served2, stop2) = (served.clone(), stop.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("stream-server".into())
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    let reply: Arc<Reply> = Arc::new(Reply::new(cfg));
                    while !stop2.load(Ordering::Relaxed) {
                        let accepted =
                            tokio::time::timeout(Duration::from_millis(100), listener.accept())
                                .await;
                        if let Ok(Ok((sock, _))) = accepted {
                            let _ = sock.set_nodelay(true);
                            tokio::spawn(connection(sock, reply.clone(), served2.clone()));
                        }
                    }
                });
            })?;
        Ok(Self {
            addr,
            served,
            stop,
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in the order replies finished.
    pub fn served(&self) -> Vec<Served> {
        self.served.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// How many requests were recorded since the last call, forgetting them (a long run's
    /// records do not pile up).
    pub fn drain_count(&self) -> usize {
        self.served
            .lock()
            .map(|mut v| std::mem::take(&mut *v).len())
            .unwrap_or(0)
    }

    /// Forgets the records (between benchmark steps).
    pub fn clear(&self) {
        if let Ok(mut v) = self.served.lock() {
            v.clear();
        }
    }
}

impl Drop for StreamServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Reply {
    cfg: StreamConfig,
    head: Vec<u8>,
    frames: Vec<Vec<u8>>,
    whole: Vec<u8>,
    models: Vec<u8>,
    health: Vec<u8>,
    not_found: Vec<u8>,
}

impl Reply {
    fn new(cfg: StreamConfig) -> Self {
        let frames = frames(cfg.tokens, cfg.prompt_tokens);
        let len: usize = frames.iter().map(Vec::len).sum();
        let head = format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ncontent-length: {len}\r\n\r\n").into_bytes();
        let mut whole = head.clone();
        frames.iter().for_each(|f| whole.extend_from_slice(f));
        let json = |status: &str, body: &str| {
            format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
        };
        Self {
            cfg,
            head,
            frames,
            whole,
            models: json(
                "200 OK",
                r#"{"object":"list","data":[{"id":"bench","object":"model","created":0,"owned_by":"lmperf"}]}"#,
            ),
            health: json("200 OK", "{}"),
            not_found: json(
                "404 Not Found",
                r#"{"error":{"message":"not found","type":"not_found"}}"#,
            ),
        }
    }
}

/// The SSE events of one reply, as vLLM writes them: a role chunk, `tokens` content chunks
/// (the last with `finish_reason`), a usage chunk, `[DONE]` (with the usage chunk).
fn frames(tokens: usize, prompt_tokens: u64) -> Vec<Vec<u8>> {
    let chunk = |delta: &str, finish: &str| {
        format!("data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n").into_bytes()
    };
    let mut out = vec![chunk(r#"{"role":"assistant","content":""}"#, "null")];
    for i in 0..tokens {
        out.push(chunk(
            &format!(r#"{{"content":"t{i} "}}"#),
            if i + 1 == tokens {
                r#""length""#
            } else {
                "null"
            },
        ));
    }
    out.push(
        format!("data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n", prompt_tokens + tokens as u64)
            .into_bytes(),
    );
    out
}

/// End of the head, the content length and whether the client asked to close, if `buf` holds
/// a whole head.
fn parse_head(buf: &[u8]) -> Option<(usize, usize, bool)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let (mut length, mut close) = (0, false);
    for line in head.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().unwrap_or(0);
        } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close") {
            close = true;
        }
    }
    Some((end, length, close))
}

async fn connection(mut sock: TcpStream, reply: Arc<Reply>, served: Arc<Mutex<Vec<Served>>>) {
    let mut buf: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut chunk = vec![0u8; 16 << 10];
    loop {
        // Read until a whole request (head + body) is buffered.
        let (end, length, close) = loop {
            if let Some((end, length, close)) = parse_head(&buf)
                && buf.len() >= end + length
            {
                break (end, length, close);
            }
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let arrived = Instant::now();
        let line_end = buf.iter().position(|&b| b == b'\r').unwrap_or(0);
        let line = String::from_utf8_lossy(&buf[..line_end]).into_owned();
        buf.drain(..end + length);
        let mut parts = line.split(' ');
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let path = path.split('?').next().unwrap_or("");
        let record = if method == "POST" && path.ends_with("/completions") {
            stream(&mut sock, &reply, arrived).await
        } else {
            let body = if method == "GET" && path.ends_with("/models") {
                &reply.models
            } else if method == "GET" && path.ends_with("/health") {
                &reply.health
            } else {
                &reply.not_found
            };
            let complete = sock.write_all(body).await.is_ok();
            let now = Instant::now();
            Served {
                kind: Kind::Other,
                arrived,
                first_chunk: now,
                done: now,
                complete,
            }
        };
        let complete = record.complete;
        if let Ok(mut v) = served.lock() {
            v.push(record);
        }
        if close || !complete {
            return;
        }
    }
}

async fn stream(sock: &mut TcpStream, reply: &Reply, arrived: Instant) -> Served {
    let cfg = reply.cfg;
    if cfg.first_delay.is_zero() && cfg.gap.is_zero() {
        let complete = sock.write_all(&reply.whole).await.is_ok();
        let now = Instant::now();
        return Served {
            kind: Kind::Completion,
            arrived,
            first_chunk: now,
            done: now,
            complete,
        };
    }
    if !cfg.first_delay.is_zero() {
        tokio::time::sleep_until((arrived + cfg.first_delay).into()).await;
    }
    // The head and the role chunk, then the first content chunk: the first token.
    let mut first = reply.head.clone();
    for f in reply.frames.iter().take(2) {
        first.extend_from_slice(f);
    }
    let mut complete = sock.write_all(&first).await.is_ok();
    let first_chunk = Instant::now();
    let mut next = first_chunk;
    let last = reply.frames.len().saturating_sub(1);
    for (i, f) in reply.frames.iter().enumerate().skip(2) {
        if !complete {
            break;
        }
        // The usage chunk and `[DONE]` follow the last token at once.
        if !cfg.gap.is_zero() && i < last {
            next += cfg.gap;
            tokio::time::sleep_until(next.into()).await;
        }
        complete = sock.write_all(f).await.is_ok();
    }
    Served {
        kind: Kind::Completion,
        arrived,
        first_chunk,
        done: Instant::now(),
        complete,
    }
}
