//! The `lmperf.tcp.*` instruments (see `telemetry::names` for the names and the conventions
//! they follow). Histograms and the retransmit counter are recorded as events are drained
//! (on the probe thread); the probe's own counters are observed from [`NetState`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};

use super::event::Kind;
use super::filter::{AddressCap, Side};
use super::state::NetState;
use crate::telemetry::names;

/// Instruments fed by the probe thread.
#[derive(Debug)]
pub struct NetInstruments {
    rtt: Histogram<f64>,
    connect: Histogram<f64>,
    retransmits: Counter<u64>,
    series: Mutex<Series>,
}

/// The attribute sets recorded so far, built once per connection side and server (an event
/// arrives for each received segment: hundreds a second).
#[derive(Debug, Default)]
struct Series {
    addresses: AddressCap,
    attrs: HashMap<(Side, SocketAddr, bool), Arc<[KeyValue]>>,
}

/// Attribute sets kept at most; past it the cache starts again (the address cap keeps the
/// labels stable).
const MAX_SERIES: usize = 4096;

impl Series {
    fn attrs(&mut self, side: Side, server: SocketAddr, family_v6: bool) -> Arc<[KeyValue]> {
        if let Some(a) = self.attrs.get(&(side, server, family_v6)) {
            return a.clone();
        }
        if self.attrs.len() >= MAX_SERIES {
            self.attrs.clear();
        }
        let a: Arc<[KeyValue]> = Arc::new([
            KeyValue::new(names::SERVER_ADDRESS, self.addresses.label(server.ip())),
            KeyValue::new(names::SERVER_PORT, i64::from(server.port())),
            KeyValue::new(names::NETWORK_TYPE, if family_v6 { "ipv6" } else { "ipv4" }),
            KeyValue::new(names::LMPERF_TCP_SIDE, side.as_str()),
        ]);
        self.attrs.insert((side, server, family_v6), a.clone());
        a
    }
}

impl NetInstruments {
    pub fn new(meter: &Meter, state: Arc<NetState>) -> Self {
        let rtt = meter
            .f64_histogram(names::METRIC_TCP_RTT)
            .with_unit("s")
            .with_description("Smoothed RTT (tcp_sock.srtt_us) after each received segment of the targets' TCP connections.")
            .with_boundaries(names::BUCKETS_TCP_RTT.to_vec())
            .build();
        let connect = meter
            .f64_histogram(names::METRIC_TCP_CONNECT_DURATION)
            .with_unit("s")
            .with_description("TCP connect latency, SYN_SENT to ESTABLISHED, of connections to the targets' ports.")
            .with_boundaries(names::BUCKETS_TCP_RTT.to_vec())
            .build();
        let retransmits = meter
            .u64_counter(names::METRIC_TCP_RETRANSMITS)
            .with_unit("{segment}")
            .with_description("TCP segments retransmitted on the targets' connections.")
            .build();
        let s = state;
        let _events = meter
            .u64_observable_counter(names::METRIC_TCP_PROBE_EVENTS)
            .with_unit("{event}")
            .with_description("Events received from the eBPF probes, by lmperf.tcp.event (rtt | connect | retransmit | dropped: lost to a full ring buffer).")
            .with_callback(move |obs| {
                for (kind, v) in [("rtt", &s.rtt_events), ("connect", &s.connect_events), ("retransmit", &s.retransmit_events), ("dropped", &s.dropped)] {
                    obs.observe(v.load(Ordering::Relaxed), &[KeyValue::new(names::LMPERF_TCP_EVENT, kind)]);
                }
            })
            .build();
        Self {
            rtt,
            connect,
            retransmits,
            series: Mutex::new(Series::default()),
        }
    }

    /// Records one event of a socket on `side` of a connection to `server`.
    pub fn record(&self, side: Side, server: SocketAddr, family_v6: bool, kind: Kind) {
        let attrs = match self.series.lock() {
            Ok(mut series) => series.attrs(side, server, family_v6),
            Err(_) => Arc::new([
                KeyValue::new(names::SERVER_ADDRESS, AddressCap::OTHER),
                KeyValue::new(names::SERVER_PORT, i64::from(server.port())),
                KeyValue::new(names::NETWORK_TYPE, if family_v6 { "ipv6" } else { "ipv4" }),
                KeyValue::new(names::LMPERF_TCP_SIDE, side.as_str()),
            ]),
        };
        match kind {
            Kind::Rtt { srtt_us } => self.rtt.record(srtt_us as f64 / 1e6, &attrs),
            Kind::Connect { ns } => self.connect.record(ns as f64 / 1e9, &attrs),
            Kind::Retransmit { .. } => self.retransmits.add(1, &attrs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(a: &[KeyValue]) -> String {
        a.iter()
            .find(|kv| kv.key.as_str() == names::SERVER_ADDRESS)
            .map(|kv| kv.value.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn series_are_built_once_and_addresses_stay_capped() {
        let mut s = Series::default();
        let server = |i: u32| SocketAddr::from(([10, 0, (i / 256) as u8, (i % 256) as u8], 8000));
        let first = s.attrs(Side::Client, server(0), false);
        assert!(Arc::ptr_eq(
            &first,
            &s.attrs(Side::Client, server(0), false)
        ));
        assert!(!Arc::ptr_eq(
            &first,
            &s.attrs(Side::Server, server(0), false)
        ));
        let labels: Vec<String> = (0..40)
            .map(|i| address(&s.attrs(Side::Client, server(i), false)))
            .collect();
        assert_eq!(labels[0], "10.0.0.0");
        assert_eq!(labels[31], "10.0.0.31");
        assert_eq!(labels[32], AddressCap::OTHER);
        assert_eq!(labels[39], AddressCap::OTHER);
        // Past the cache's bound it starts again; the labels stay what they were.
        for port in 0..MAX_SERIES as u16 {
            s.attrs(Side::Client, SocketAddr::from(([10, 0, 0, 1], port)), false);
        }
        assert!(s.attrs.len() <= MAX_SERIES);
        assert_eq!(
            address(&s.attrs(Side::Client, server(5), false)),
            "10.0.0.5"
        );
        assert_eq!(
            address(&s.attrs(Side::Client, server(35), false)),
            AddressCap::OTHER
        );
    }
}
