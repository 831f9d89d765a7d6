//! Incremental Server-Sent Events parser (WHATWG HTML, "Server-sent events", §9.2.6
//! "Interpreting an event stream").
//!
//! Bytes go in as they arrive from the socket; complete events come out. It does no IO and
//! reads no clock: the caller stamps each event with the arrival time of the bytes that
//! completed it.
//!
//! Handled: `\n`, `\r\n` and `\r` line ends (also split across reads), comment lines
//! (`: keep-alive`), multi-line `data:` fields, fields other than `data` (ignored), a last
//! event without its blank line at end of stream. An event larger than the configured limit is
//! an error, so a hostile stream cannot grow memory without bound.

/// One dispatched SSE event: its `data` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub data: String,
}

/// The stream broke the parser's limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("SSE event of more than {limit} bytes")]
    EventTooLarge { limit: usize },
}

/// Incremental parser. Feed it with [`SseParser::push`], then [`SseParser::finish`] at end of
/// stream.
#[derive(Debug)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// `data` of the event being built.
    data: String,
    has_data: bool,
    /// The previous byte was `\r`: a following `\n` belongs to the same line end.
    after_cr: bool,
    max_event_bytes: usize,
    /// Number of comment lines seen (keep-alives), for diagnostics.
    pub comments: u64,
}

impl SseParser {
    /// A parser that rejects any event (or line) over `max_event_bytes` bytes.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            after_cr: false,
            max_event_bytes,
            comments: 0,
        }
    }

    /// Parses `bytes`, appending every event they complete to `out`.
    ///
    /// # Errors
    /// [`SseError::EventTooLarge`] when a line or event exceeds the limit; the parser should
    /// then be dropped.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if self.after_cr {
            if let [b'\n', rest @ ..] = bytes {
                bytes = rest;
            }
            self.after_cr = false;
        }
        while !bytes.is_empty() {
            match bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    self.extend_line(&bytes[..i])?;
                    let was_cr = bytes[i] == b'\r';
                    bytes = &bytes[i + 1..];
                    if was_cr {
                        match bytes.first() {
                            Some(b'\n') => bytes = &bytes[1..],
                            None => self.after_cr = true,
                            Some(_) => {}
                        }
                    }
                    self.end_line(out)?;
                }
                None => {
                    self.extend_line(bytes)?;
                    break;
                }
            }
        }
        Ok(())
    }

    /// End of stream: dispatches a pending event that lacked its blank line.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if !self.line.is_empty() {
            self.end_line(out)?;
        }
        self.dispatch(out);
        Ok(())
    }

    fn extend_line(&mut self, part: &[u8]) -> Result<(), SseError> {
        if self.line.len() + part.len() + self.data.len() > self.max_event_bytes {
            return Err(SseError::EventTooLarge { limit: self.max_event_bytes });
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if self.line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        let line = std::mem::take(&mut self.line);
        if line[0] == b':' {
            self.comments += 1;
        } else {
            let (field, value) = match line.iter().position(|&b| b == b':') {
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (&line[..], &[][..]),
            };
            if field == b"data" {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&String::from_utf8_lossy(value));
                self.has_data = true;
            }
        }
        // Reuse the line's allocation.
        self.line = line;
        self.line.clear();
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        if self.has_data {
            out.push(SseEvent { data: std::mem::take(&mut self.data) });
            self.has_data = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &[u8], piece: usize) -> Vec<String> {
        let mut p = SseParser::new(1 << 20);
        let mut out = Vec::new();
        for c in input.chunks(piece) {
            p.push(c, &mut out).unwrap();
        }
        p.finish(&mut out).unwrap();
        out.into_iter().map(|e| e.data).collect()
    }

    #[test]
    fn line_ends_and_splits_give_the_same_events() {
        let lf = b"data: {\"a\":1}\n\n: keep-alive\n\ndata: x\ndata: y\n\nevent: e\ndata: [DONE]\n\n";
        let crlf = b"data: {\"a\":1}\r\n\r\n: keep-alive\r\n\r\ndata: x\r\ndata: y\r\n\r\nevent: e\r\ndata: [DONE]\r\n\r\n";
        let cr = b"data: {\"a\":1}\r\r: keep-alive\r\rdata: x\rdata: y\r\revent: e\rdata: [DONE]\r\r";
        let want = vec!["{\"a\":1}".to_string(), "x\ny".to_string(), "[DONE]".to_string()];
        for input in [&lf[..], &crlf[..], &cr[..]] {
            for piece in [1, 2, 3, 7, input.len()] {
                assert_eq!(parse_in_pieces(input, piece), want, "piece {piece}");
            }
        }
    }

    #[test]
    fn comments_are_counted_not_dispatched() {
        let mut p = SseParser::new(1024);
        let mut out = Vec::new();
        p.push(b": ping\n\n:\n\n", &mut out).unwrap();
        assert!(out.is_empty());
        assert_eq!(p.comments, 2);
    }

    #[test]
    fn last_event_without_blank_line_is_dispatched_at_finish() {
        assert_eq!(parse_in_pieces(b"data: tail", 4), vec!["tail".to_string()]);
        assert_eq!(parse_in_pieces(b"data:nospace\n", 4), vec!["nospace".to_string()]);
    }

    #[test]
    fn oversize_event_is_an_error() {
        let mut p = SseParser::new(16);
        let mut out = Vec::new();
        let err = p.push(b"data: 0123456789abcdefghij", &mut out).unwrap_err();
        assert_eq!(err, SseError::EventTooLarge { limit: 16 });
        // Accumulated across lines too.
        let mut p = SseParser::new(16);
        p.push(b"data: 0123456789\n", &mut out).unwrap();
        assert!(p.push(b"data: 0123456789\n", &mut out).is_err());
    }
}
