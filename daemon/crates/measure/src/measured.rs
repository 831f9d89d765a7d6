//! One measured request with the context its span needs: the [`RequestRecord`], the wall-clock
//! send time and the connection that carried it. Plain data, filled by the HTTP client
//! (`canary::client`), read by telemetry, status and the diagnosis.

use std::time::SystemTime;

use super::RequestRecord;

/// One measured request with the context a span needs.
#[derive(Debug, Clone)]
pub struct Measured {
    pub record: RequestRecord,
    /// Wall-clock time of the send (span start).
    pub wall_start: SystemTime,
    /// Re-sends after a stale connection (0 or 1).
    pub retries: u32,
    /// The connection that carried the response, when one did.
    pub conn: Option<Conn>,
}

/// The addresses of a request's TCP connection, as the HTTP client saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conn {
    pub local: core::net::SocketAddr,
    pub remote: core::net::SocketAddr,
}
