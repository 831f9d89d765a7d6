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
//!
//! Beyond the standard, for the ways servers report errors in a 200 stream: an event whose
//! `event:` type is `error` is dispatched as [`EventKind::Error`] (also without `data`); an
//! `error:` field line (llama.cpp) is dispatched at once as [`EventKind::ErrorLine`]; lines
//! that are no SSE field but a JSON document (first byte `{`, possibly over several lines)
//! are dispatched as [`EventKind::Bare`] once they parse, or when an SSE field line or the end
//! of the stream follows them.
//!
//! Chunk-boundary invariance: the events and their order depend only on the bytes, never on
//! how they were split into reads.

/// Where a dispatched event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A standard event (any `event:` type but `error`).
    Message,
    /// An event with `event: error`.
    Error,
    /// An `error:` field line; `data` is its value.
    ErrorLine,
    /// Lines that are no SSE field but (start like) a JSON document; `data` is their text.
    Bare,
}

/// One dispatched SSE event: its `data` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub kind: EventKind,
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
    /// The current event has `event: error`.
    event_is_error: bool,
    /// Lines of a bare JSON document not yet dispatched.
    bare: String,
    /// The previous byte was `\r`: a following `\n` belongs to the same line end.
    after_cr: bool,
    max_event_bytes: usize,
    /// Number of comment lines seen (keep-alives), for diagnostics.
    pub comments: u64,
    /// The text after the last `: router-stages ` comment (vllm-router's own clock on the
    /// stream, [`crate::router_stages`]), when one came.
    pub router_stages: Option<String>,
}

impl SseParser {
    /// A parser that rejects any event (or line) over `max_event_bytes` bytes.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            event_is_error: false,
            bare: String::new(),
            after_cr: false,
            max_event_bytes,
            comments: 0,
            router_stages: None,
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
        self.flush_bare(out);
        self.dispatch(out);
        Ok(())
    }

    /// Bytes held for the event being built (line, data, bare JSON), at most the limit.
    pub fn buffered_bytes(&self) -> usize {
        self.line.len() + self.data.len() + self.bare.len()
    }

    fn extend_line(&mut self, part: &[u8]) -> Result<(), SseError> {
        if self.buffered_bytes() + part.len() > self.max_event_bytes {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if self.line.is_empty() {
            // A blank line inside a bare JSON document is part of it.
            if self.bare.is_empty() {
                self.dispatch(out);
            }
            return Ok(());
        }
        let line = std::mem::take(&mut self.line);
        let first = line.iter().copied().find(|b| !b.is_ascii_whitespace());
        if !self.bare.is_empty() || (first == Some(b'{') && !self.has_data) {
            if self.bare.is_empty() || !is_field_line(&line) {
                self.push_bare(&line, out);
                self.line = line;
                self.line.clear();
                return self.within_limit();
            }
            // An SSE field line ends the bare document.
            self.flush_bare(out);
        }
        if line[0] == b':' {
            self.comments += 1;
            if let Some(rest) = line.strip_prefix(b": router-stages ") {
                self.router_stages = Some(String::from_utf8_lossy(rest).into_owned());
            }
        } else {
            let (field, value) = match line.iter().position(|&b| b == b':') {
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (&line[..], &[][..]),
            };
            match field {
                b"data" => {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(&String::from_utf8_lossy(value));
                    self.has_data = true;
                }
                b"event" => self.event_is_error = value.trim_ascii() == b"error",
                b"error" => out.push(SseEvent {
                    kind: EventKind::ErrorLine,
                    data: String::from_utf8_lossy(value).into_owned(),
                }),
                _ => {}
            }
        }
        // Reuse the line's allocation.
        self.line = line;
        self.line.clear();
        self.within_limit()
    }

    /// The held event within the limit also after decoding (an invalid UTF-8 byte becomes
    /// the 3-byte U+FFFD) and the `\n` between lines; over it, the event is dropped.
    fn within_limit(&mut self) -> Result<(), SseError> {
        if self.buffered_bytes() > self.max_event_bytes {
            self.data = String::new();
            self.bare = String::new();
            self.has_data = false;
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        Ok(())
    }

    fn push_bare(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if !self.bare.is_empty() {
            self.bare.push('\n');
        }
        self.bare.push_str(&String::from_utf8_lossy(line));
        // Try a parse only where a document can end.
        if line.trim_ascii_end().last() == Some(&b'}')
            && serde_json::from_str::<serde::de::IgnoredAny>(&self.bare).is_ok()
        {
            self.flush_bare(out);
        }
    }

    fn flush_bare(&mut self, out: &mut Vec<SseEvent>) {
        if !self.bare.is_empty() {
            out.push(SseEvent {
                kind: EventKind::Bare,
                data: std::mem::take(&mut self.bare),
            });
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let kind = if self.event_is_error {
            EventKind::Error
        } else {
            EventKind::Message
        };
        if self.has_data || self.event_is_error {
            out.push(SseEvent {
                kind,
                data: std::mem::take(&mut self.data),
            });
            self.has_data = false;
        }
        self.event_is_error = false;
    }
}

/// A line that names an SSE field this parser acts on, or a comment.
fn is_field_line(line: &[u8]) -> bool {
    line.first() == Some(&b':')
        || [&b"data"[..], b"event", b"error", b"id", b"retry"]
            .iter()
            .any(|f| {
                line.strip_prefix(*f)
                    .is_some_and(|r| r.is_empty() || r[0] == b':')
            })
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

    fn kinds_in_pieces(input: &[u8], piece: usize) -> Vec<(EventKind, String)> {
        let mut p = SseParser::new(1 << 20);
        let mut out = Vec::new();
        for c in input.chunks(piece) {
            p.push(c, &mut out).unwrap();
        }
        p.finish(&mut out).unwrap();
        out.into_iter().map(|e| (e.kind, e.data)).collect()
    }

    #[test]
    fn error_events_error_lines_and_bare_json_are_dispatched() {
        use EventKind::*;
        let input = b"data: {\"a\":1}\n\nevent: error\ndata: {\"message\":\"boom\"}\n\nerror: {\"code\":400}\n\n{\"error\":\n  {\"type\":\"x\"}\n}\ndata: [DONE]\n\n{\"error\":\"tail\"}";
        let want = vec![
            (Message, "{\"a\":1}".to_string()),
            (Error, "{\"message\":\"boom\"}".to_string()),
            (ErrorLine, "{\"code\":400}".to_string()),
            (Bare, "{\"error\":\n  {\"type\":\"x\"}\n}".to_string()),
            (Message, "[DONE]".to_string()),
            (Bare, "{\"error\":\"tail\"}".to_string()),
        ];
        for piece in [1, 2, 5, 13, input.len()] {
            assert_eq!(kinds_in_pieces(input, piece), want, "piece {piece}");
        }
        // An unfinished bare document ends at the next SSE field line; event: error without data.
        let input = b"{not json\ndata: x\n\nevent: error\n\n";
        assert_eq!(
            kinds_in_pieces(input, 3),
            vec![
                (Bare, "{not json".to_string()),
                (Message, "x".to_string()),
                (Error, String::new())
            ]
        );
    }

    #[test]
    fn line_ends_and_splits_give_the_same_events() {
        let lf =
            b"data: {\"a\":1}\n\n: keep-alive\n\ndata: x\ndata: y\n\nevent: e\ndata: [DONE]\n\n";
        let crlf = b"data: {\"a\":1}\r\n\r\n: keep-alive\r\n\r\ndata: x\r\ndata: y\r\n\r\nevent: e\r\ndata: [DONE]\r\n\r\n";
        let cr =
            b"data: {\"a\":1}\r\r: keep-alive\r\rdata: x\rdata: y\r\revent: e\rdata: [DONE]\r\r";
        let want = vec![
            "{\"a\":1}".to_string(),
            "x\ny".to_string(),
            "[DONE]".to_string(),
        ];
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
        assert_eq!(p.router_stages, None);
        p.push(b": router-stages {\"first_token_ms\":6.1}\n\n", &mut out)
            .unwrap();
        assert_eq!(p.router_stages.as_deref(), Some("{\"first_token_ms\":6.1}"));
    }

    #[test]
    fn last_event_without_blank_line_is_dispatched_at_finish() {
        assert_eq!(parse_in_pieces(b"data: tail", 4), vec!["tail".to_string()]);
        assert_eq!(
            parse_in_pieces(b"data:nospace\n", 4),
            vec!["nospace".to_string()]
        );
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
        // Invalid UTF-8 grows when decoded (U+FFFD is 3 bytes): still within the limit held.
        let mut p = SseParser::new(16);
        assert!(
            p.push(b"data: \xff\xff\xff\xff\xff\xff\n", &mut out)
                .is_err()
        );
        assert!(p.buffered_bytes() <= 16, "found by the fuzz target");
    }
}
