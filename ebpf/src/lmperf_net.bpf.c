// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * lmperf network probes (libbpf-tools tcprtt / tcpconnlat / tcpretrans, as BTF tracepoints).
 *
 * - tp_btf/tcp_probe            every received segment of an established socket: its srtt
 * - tp_btf/inet_sock_set_state  SYN_SENT -> ESTABLISHED: connect latency (start kept per socket)
 * - tp_btf/tcp_retransmit_skb   a retransmitted segment
 *
 * Only sockets whose local or remote port is in `lmperf_ports` are reported (the targets'
 * ports, written by user space before attaching). Events go through the `lmperf_events` ring
 * buffer; a full ring drops the event and counts it in `lmperf_drops`.
 *
 * Needs no kprobes, no fentry and no tracefs: BTF tracepoints (kernel >= 5.5 with BTF). Each has
 * a classic tracepoint twin (`*_tp`, SEC("tracepoint/...")) with the same body, which user space
 * attaches when the kernel refuses the BTF one; those need tracefs mounted.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "lmperf_net.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Unread bytes in the ring buffer at which a submit wakes the reader (64 events). */
#define LMPERF_WAKEUP_BYTES (64 * (sizeof(struct lmperf_event) + 8))

/* Ports to report: a bitmap, bit (port % 64) of entry (port / 64), host order. An array, so
 * the verifier inlines the lookup (no helper call, no hashing) on every event. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} lmperf_ports SEC(".maps");

/* Socket -> bpf_ktime_get_ns() at SYN_SENT; bounded, entries removed at ESTABLISHED/CLOSE. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} lmperf_connect_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} lmperf_events SEC(".maps");

/* [0]: events dropped because the ring buffer was full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lmperf_drops SEC(".maps");

/*
 * Reads a socket field: a direct load in tp_btf programs, whose socket pointer the verifier
 * knows (BTF-typed; CO-RE relocated through preserve_access_index), and bpf_probe_read_kernel
 * in classic tracepoint programs, whose socket is a plain number from the record. `trusted`
 * is a constant in each program, so only one branch is compiled into it. Fields of tcp_sock
 * lie beyond struct sock, which a direct load may not reach: always BPF_CORE_READ.
 */
#define RD(trusted, p, field) ((trusted) ? (p)->field : BPF_CORE_READ(p, field))

static __always_inline bool port_wanted(__u16 port)
{
	__u32 key = port / 64;
	__u64 *bits = bpf_map_lookup_elem(&lmperf_ports, &key);
	return port && bits && (*bits & (1ULL << (port % 64)));
}

static __always_inline bool sock_wanted(const struct sock *sk, bool trusted)
{
	__u16 sport = RD(trusted, sk, __sk_common.skc_num);
	__u16 dport = bpf_ntohs(RD(trusted, sk, __sk_common.skc_dport));
	return port_wanted(sport) || port_wanted(dport);
}

static __always_inline void emit(const struct sock *sk, bool trusted, __u8 kind, __u64 value)
{
	struct lmperf_event *e = bpf_ringbuf_reserve(&lmperf_events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&lmperf_drops, &zero);
		if (n)
			*n += 1;
		return;
	}
	__u16 family = RD(trusted, sk, __sk_common.skc_family);
	e->ts_ns = bpf_ktime_get_ns();
	e->value = value;
	e->family = family;
	e->kind = kind;
	e->state = RD(trusted, sk, __sk_common.skc_state);
	e->sport = RD(trusted, sk, __sk_common.skc_num);
	e->dport = bpf_ntohs(RD(trusted, sk, __sk_common.skc_dport));
	__builtin_memset(e->saddr, 0, sizeof(e->saddr));
	__builtin_memset(e->daddr, 0, sizeof(e->daddr));
	if (family == LMPERF_AF_INET6) {
		bpf_probe_read_kernel(e->saddr, 16, &sk->__sk_common.skc_v6_rcv_saddr);
		bpf_probe_read_kernel(e->daddr, 16, &sk->__sk_common.skc_v6_daddr);
	} else {
		/* The record is 8-aligned and the addresses at offsets 16 and 32. */
		*(__u32 *)e->saddr = RD(trusted, sk, __sk_common.skc_rcv_saddr);
		*(__u32 *)e->daddr = RD(trusted, sk, __sk_common.skc_daddr);
	}
	/* Wake the reader only when a batch is waiting: a wakeup per event costs microseconds in
	 * the kernel and in the agent. The reader also drains on a short timer and before each
	 * span is built (daemon/src/net/loader.rs). */
	__u64 waiting = bpf_ringbuf_query(&lmperf_events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(e, waiting >= LMPERF_WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

static __always_inline void on_segment(const struct sock *sk, bool trusted)
{
	if (!sock_wanted(sk, trusted))
		return;
	const struct tcp_sock *tp = (const struct tcp_sock *)sk;
	__u32 srtt = BPF_CORE_READ(tp, srtt_us) >> 3;
	emit(sk, trusted, LMPERF_EV_RTT, srtt);
}

static __always_inline void on_state(const struct sock *sk, bool trusted, int oldstate, int newstate)
{
	__u64 key = (__u64)sk;
	if (newstate == TCP_SYN_SENT) {
		/* The local port may not be chosen yet: filter on the remote one. */
		__u16 dport = bpf_ntohs(RD(trusted, sk, __sk_common.skc_dport));
		if (!port_wanted(dport))
			return;
		__u64 now = bpf_ktime_get_ns();
		bpf_map_update_elem(&lmperf_connect_start, &key, &now, BPF_ANY);
		return;
	}
	if (oldstate != TCP_SYN_SENT)
		return;
	__u64 *start = bpf_map_lookup_elem(&lmperf_connect_start, &key);
	if (!start)
		return;
	__u64 took = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(&lmperf_connect_start, &key);
	if (newstate == TCP_ESTABLISHED)
		emit(sk, trusted, LMPERF_EV_CONNECT, took);
}

static __always_inline void on_retransmit(const struct sock *sk, bool trusted)
{
	if (!sock_wanted(sk, trusted))
		return;
	const struct tcp_sock *tp = (const struct tcp_sock *)sk;
	emit(sk, trusted, LMPERF_EV_RETRANS, BPF_CORE_READ(tp, total_retrans));
}

SEC("tp_btf/tcp_probe")
int BPF_PROG(lmperf_tcp_probe, struct sock *sk, const struct sk_buff *skb)
{
	on_segment(sk, true);
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(lmperf_set_state, const struct sock *sk, const int oldstate, const int newstate)
{
	on_state(sk, true, oldstate, newstate);
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(lmperf_retransmit, const struct sock *sk, const struct sk_buff *skb)
{
	on_retransmit(sk, true);
	return 0;
}

/* The classic tracepoint twins: the record holds the socket's address (`skaddr`). */

SEC("tracepoint/tcp/tcp_probe")
int lmperf_tcp_probe_tp(struct trace_event_raw_tcp_probe *ctx)
{
	on_segment((const struct sock *)BPF_CORE_READ(ctx, skaddr), false);
	return 0;
}

SEC("tracepoint/sock/inet_sock_set_state")
int lmperf_set_state_tp(struct trace_event_raw_inet_sock_set_state *ctx)
{
	on_state((const struct sock *)BPF_CORE_READ(ctx, skaddr), false, BPF_CORE_READ(ctx, oldstate), BPF_CORE_READ(ctx, newstate));
	return 0;
}

SEC("tracepoint/tcp/tcp_retransmit_skb")
int lmperf_retransmit_tp(struct trace_event_raw_tcp_retransmit_skb *ctx)
{
	on_retransmit((const struct sock *)BPF_CORE_READ(ctx, skaddr), false);
	return 0;
}
