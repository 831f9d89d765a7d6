//! A loopback HTTP/1.1 proxy's two halves, for tests that stand between a client and a real
//! server (refusing some paths, answering some requests itself): one request read from a
//! connection, and one request forwarded upstream with the answer copied back.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

/// One request as the proxy read it.
pub struct Request {
    /// The request line and headers, each with its CRLF, without `Connection:`.
    pub head: Vec<String>,
    pub body: Vec<u8>,
    /// The request line's path (`""` if it has none).
    pub path: String,
}

/// Reads one request (head and a `Content-Length` body) from `conn`; `None` when the
/// connection ends or breaks first.
pub fn read_request(conn: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut head = Vec::new();
    let mut content_length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            content_length = v.trim().parse().unwrap_or(0);
        }
        if !lower.starts_with("connection:") {
            head.push(line);
        }
    }
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body).ok()?;
    let path = head
        .first()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("")
        .to_owned();
    Some(Request { head, body, path })
}

/// Sends `req` to `127.0.0.1:upstream` (`Connection: close`) and copies the answer to
/// `client`; an unreachable upstream closes the client's connection unanswered.
pub fn forward(req: &Request, upstream: u16, client: &mut TcpStream) {
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let request = req.head.concat() + "Connection: close\r\n\r\n";
    if up
        .write_all(request.as_bytes())
        .and_then(|()| up.write_all(&req.body))
        .is_ok()
    {
        let _ = std::io::copy(&mut up, client);
    }
}
