//! The `lmperf.tcp.*` instruments (see `telemetry::names` for the names and the conventions
//! they follow). Histograms and the retransmit counter are recorded as events are drained
//! (on the probe thread); the probe's own counters are observed from [`NetState`].

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
    addresses: Mutex<AddressCap>,
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
            addresses: Mutex::new(AddressCap::default()),
        }
    }

    /// Records one event of a socket on `side` of a connection to `server`.
    pub fn record(&self, side: Side, server: SocketAddr, family_v6: bool, kind: Kind) {
        let address = match self.addresses.lock() {
            Ok(mut cap) => cap.label(server.ip()),
            Err(_) => AddressCap::OTHER.to_owned(),
        };
        let attrs = [
            KeyValue::new(names::SERVER_ADDRESS, address),
            KeyValue::new(names::SERVER_PORT, i64::from(server.port())),
            KeyValue::new(names::NETWORK_TYPE, if family_v6 { "ipv6" } else { "ipv4" }),
            KeyValue::new(names::LMPERF_TCP_SIDE, side.as_str()),
        ];
        match kind {
            Kind::Rtt { srtt_us } => self.rtt.record(srtt_us as f64 / 1e6, &attrs),
            Kind::Connect { ns } => self.connect.record(ns as f64 / 1e9, &attrs),
            Kind::Retransmit { .. } => self.retransmits.add(1, &attrs),
        }
    }
}
