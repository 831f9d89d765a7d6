/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Trimmed vmlinux.h: only the kernel types lmperf's probes read, with the nesting of
 * Linux 6.18's BTF (`bpftool btf dump file /sys/kernel/btf/vmlinux format c`). Every struct
 * is `preserve_access_index`, so field offsets are CO-RE relocations resolved by the loader
 * (aya) against the running kernel's BTF, not this file's layout: only field names and types
 * must exist in the running kernel. Add fields here as probes need them.
 */
#ifndef LMPERF_VMLINUX_H
#define LMPERF_VMLINUX_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef __u16 __sum16;
typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef _Bool bool;
enum { false = 0, true = 1 };

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
};

/* bpf_ringbuf_submit() flags and bpf_ringbuf_query() flags (uapi linux/bpf.h). */
enum {
	BPF_RB_NO_WAKEUP = 1,
	BPF_RB_FORCE_WAKEUP = 2,
};

enum {
	BPF_RB_AVAIL_DATA = 0,
};

enum {
	TCP_ESTABLISHED = 1,
	TCP_SYN_SENT = 2,
	TCP_SYN_RECV = 3,
	TCP_CLOSE = 7,
};

#pragma clang attribute push (__attribute__((preserve_access_index)), apply_to = record)

struct in6_addr {
	union {
		__u8 u6_addr8[16];
		__be16 u6_addr16[8];
		__be32 u6_addr32[4];
	} in6_u;
};

struct sock_common {
	union {
		__u64 skc_addrpair;
		struct {
			__be32 skc_daddr;
			__be32 skc_rcv_saddr;
		};
	};
	union {
		__u32 skc_portpair;
		struct {
			__be16 skc_dport;
			__u16 skc_num;
		};
	};
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
};

struct sock {
	struct sock_common __sk_common;
};

struct sk_buff;

struct tcp_sock {
	u32 srtt_us;
	u32 total_retrans;
};

/* Classic tracepoint records (the fallback when tp_btf is refused): only `skaddr` is read. */
struct trace_entry {
	unsigned short type;
	unsigned char flags;
	unsigned char preempt_count;
	int pid;
};

struct trace_event_raw_tcp_probe {
	struct trace_entry ent;
	const void *skaddr;
};

struct trace_event_raw_inet_sock_set_state {
	struct trace_entry ent;
	const void *skaddr;
	int oldstate;
	int newstate;
};

struct trace_event_raw_tcp_retransmit_skb {
	struct trace_entry ent;
	const void *skaddr;
};

#pragma clang attribute pop

#endif
