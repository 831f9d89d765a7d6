/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lmperf kernel/user ABI: the events the probes send through the ring buffer.
 *
 * API Boundary: daemon/src/net/event.rs holds the one Rust mirror (`#[repr(C)]`) with
 * const asserts on its size and every offset, and the _Static_asserts below check the same here;
 * change both together.
 */
#ifndef LMPERF_NET_H
#define LMPERF_NET_H

/* Event kinds (`lmperf_event.kind`). */
#define LMPERF_EV_RTT 1      /* value = smoothed RTT (tcp_sock.srtt_us >> 3), microseconds */
#define LMPERF_EV_CONNECT 2  /* value = SYN_SENT -> ESTABLISHED, nanoseconds */
#define LMPERF_EV_RETRANS 3  /* value = tcp_sock.total_retrans after this retransmit */

/* Address families (`lmperf_event.family`), as AF_INET / AF_INET6. */
#define LMPERF_AF_INET 2
#define LMPERF_AF_INET6 10

/* One event: 56 bytes. Addresses in network order (IPv4 in the first 4 bytes), ports in host order.
 * "local"/"remote" are the socket's own view. */
struct lmperf_event {
	__u64 ts_ns;          /* bpf_ktime_get_ns(): CLOCK_MONOTONIC, nanoseconds */
	__u64 value;          /* see the kinds above */
	__u8 saddr[16];       /* local address */
	__u8 daddr[16];       /* remote address */
	__u16 sport;          /* local port */
	__u16 dport;          /* remote port */
	__u16 family;         /* LMPERF_AF_INET | LMPERF_AF_INET6 */
	__u8 kind;            /* LMPERF_EV_* */
	__u8 state;           /* the socket's TCP state when the event fired */
};

/* The layout that daemon/src/net/event.rs asserts (size and every offset): a change on one side
 * fails the build of the other. */
_Static_assert(sizeof(struct lmperf_event) == 56, "lmperf_event: 56 bytes");
_Static_assert(__builtin_offsetof(struct lmperf_event, ts_ns) == 0, "ts_ns at 0");
_Static_assert(__builtin_offsetof(struct lmperf_event, value) == 8, "value at 8");
_Static_assert(__builtin_offsetof(struct lmperf_event, saddr) == 16, "saddr at 16");
_Static_assert(__builtin_offsetof(struct lmperf_event, daddr) == 32, "daddr at 32");
_Static_assert(__builtin_offsetof(struct lmperf_event, sport) == 48, "sport at 48");
_Static_assert(__builtin_offsetof(struct lmperf_event, dport) == 50, "dport at 50");
_Static_assert(__builtin_offsetof(struct lmperf_event, family) == 52, "family at 52");
_Static_assert(__builtin_offsetof(struct lmperf_event, kind) == 54, "kind at 54");
_Static_assert(__builtin_offsetof(struct lmperf_event, state) == 55, "state at 55");

#endif
