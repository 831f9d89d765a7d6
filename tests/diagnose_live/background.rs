//! The second client of a calm, busy run (issue 28, item 0): ordinary traffic that keeps the
//! real llama.cpp server about half busy without any fault, so that a canary now and then
//! waits behind it, as on a production server at night.
//!
//! Each client is a closed loop with think time: a request of a varied prompt (8–160 words)
//! and answer (8–48 tokens), then an exponential pause whose mean is `think_ratio` × the
//! client's own mean service time so far. A client then holds a slot about
//! 1 / (1 + `think_ratio`) of the time whatever the machine's speed (a fixed request rate
//! would be idle on a fast machine and overloaded on a loaded one). Bounded in time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Background clients (stopped and joined on drop).
pub(super) struct Background {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Requests answered 200, and their service time in µs, over all clients.
    answered: Arc<AtomicU64>,
    service_us: Arc<AtomicU64>,
}

/// A small xorshift generator: the clients' lengths and pauses, reproducible per client.
struct XorShift(u64);

impl XorShift {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + ((hi - lo + 1) as f64 * self.next_f64()) as usize % (hi - lo + 1)
    }

    /// Exponential with mean `mean`.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).max(1e-12).ln()
    }
}

const WORDS: [&str; 16] = [
    "harbour", "lantern", "granite", "seagull", "compass", "tide", "keeper", "storm", "beacon",
    "rope", "anchor", "mist", "shore", "signal", "cliff", "wave",
];

/// A chat request of `words` words (different at every request, so the prompt cache cannot
/// skip the prefill) asking for up to `max_tokens` tokens.
fn body(client: usize, n: usize, words: usize, max_tokens: usize) -> String {
    let mut text = format!("Note {client}-{n}: continue the log of the lighthouse:");
    for k in 0..words {
        text.push(' ');
        text.push_str(WORDS[(k * 5 + n * 3 + client) % WORDS.len()]);
    }
    format!(
        r#"{{"model":"gemma-3-270m","messages":[{{"role":"user","content":"{text}"}}],"max_tokens":{max_tokens},"temperature":0.7}}"#
    )
}

/// What each request of a client is: its prompt's words and answer's tokens (inclusive
/// ranges), and, for a router that hashes sessions (vllm-router's `consistent_hash`), its
/// `X-Session-ID`: a new one at every request, or one for every client and request while `hot`
/// is set (one tenant's traffic, all on the worker its key hashes to).
pub(super) struct Shape {
    pub words: (usize, usize),
    pub tokens: (usize, usize),
    pub hot: Option<Arc<AtomicBool>>,
    /// A fixed mean think time, s, instead of `think_ratio` × the client's mean service time:
    /// the requests keep coming when the server they go to slows (users do not wait for one
    /// another), so a worker given the others' requests queues them.
    pub think_s: Option<f64>,
}

/// The calm run's requests: 8–160 words, 8–48 tokens, no session.
const CALM: Shape = Shape {
    words: (8, 160),
    tokens: (8, 48),
    hot: None,
    think_s: None,
};

impl Background {
    /// `clients` closed loops on `127.0.0.1:port` for at most `max`.
    pub(super) fn start(port: u16, clients: usize, think_ratio: f64, max: Duration) -> Self {
        Self::start_shaped(port, clients, think_ratio, max, CALM)
    }

    /// [`Background::start`] with requests of `shape`.
    pub(super) fn start_shaped(
        port: u16,
        clients: usize,
        think_ratio: f64,
        max: Duration,
        shape: Shape,
    ) -> Self {
        let shape = Arc::new(shape);
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let service_us = Arc::new(AtomicU64::new(0));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let threads = (0..clients)
            .map(|c| {
                let (stop, answered, service_us, shape) = (
                    stop.clone(),
                    answered.clone(),
                    service_us.clone(),
                    shape.clone(),
                );
                std::thread::spawn(move || {
                    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ ((c as u64 + 1) * 0x1000_0001));
                    let (start, mut n, mut mean_s) = (Instant::now(), 0usize, 1.0f64);
                    while !stop.load(Ordering::Relaxed) && start.elapsed() < max {
                        n += 1;
                        let words = rng.between(shape.words.0, shape.words.1);
                        let tokens = rng.between(shape.tokens.0, shape.tokens.1);
                        let req = body(c, n, words, tokens);
                        let session = shape.hot.as_ref().map(|hot| {
                            if hot.load(Ordering::Relaxed) {
                                "X-Session-ID: tenant-hot\r\n".to_owned()
                            } else {
                                format!("X-Session-ID: session-{c}-{n}\r\n")
                            }
                        });
                        let t = Instant::now();
                        if send(addr, &req, session.as_deref().unwrap_or("")) {
                            let s = t.elapsed().as_secs_f64();
                            mean_s = if n == 1 { s } else { 0.9 * mean_s + 0.1 * s };
                            answered.fetch_add(1, Ordering::Relaxed);
                            service_us.fetch_add((s * 1e6) as u64, Ordering::Relaxed);
                        }
                        let mean_pause = shape.think_s.unwrap_or(think_ratio * mean_s);
                        let pause = Duration::from_secs_f64(rng.exp(mean_pause).min(30.0));
                        let until = Instant::now() + pause;
                        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            threads,
            answered,
            service_us,
        }
    }

    /// Requests answered so far and their mean service time, s.
    pub(super) fn answered(&self) -> (u64, f64) {
        let n = self.answered.load(Ordering::Relaxed);
        let us = self.service_us.load(Ordering::Relaxed);
        (
            n,
            if n == 0 {
                0.0
            } else {
                us as f64 / 1e6 / n as f64
            },
        )
    }
}

/// One request with `headers` (each ending in CRLF), read to its end; true when answered 200.
fn send(addr: SocketAddr, body: &str, headers: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        std::thread::sleep(Duration::from_millis(200));
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut sink = Vec::new();
    s.read_to_end(&mut sink).is_ok() && sink.starts_with(b"HTTP/1.1 200")
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
