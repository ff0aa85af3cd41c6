/* netprobe_core.h: the C core's public declarations.
 *
 * This file is also the cffi cdef (csrc/build_core.py reads it verbatim), so it holds
 * declarations only: no #include, no macros, no include guard. C files include it through
 * np_common.h, which pulls in <stdint.h> first. Every function returns >= 0 on success and
 * -errno on failure; the failing system call's short name is stored where the caller can
 * read it (counters->failed_call, or the failed_call out-parameter). Nothing here prints,
 * exits or keeps global state.
 */

/* Receiver-side sequence bookkeeping for UDP; private to the receive loop but kept in the
 * counters so that successive np_udp_recv calls on the same counters continue counting. */
struct np_rx_state {
    uint64_t seq_base;          /* the test's first sequence number (sender and receiver) */
    uint64_t foreign;           /* datagrams whose number is out of reach: not this test's */
    uint64_t next_seq;          /* highest sequence number seen + 1, relative to seq_base */
    uint64_t unique;            /* distinct sequence numbers received */
    int64_t last_transit_ns;    /* arrival - send time of the previous datagram */
    double jitter_ns;           /* RFC 3550 running jitter estimate */
    int have_transit;
    int reserved;
    uint64_t window[1024];      /* bitmap of the last 65536 sequence numbers */
};

/* Live state of one stream loop. The loop writes the published fields with relaxed atomic
 * stores; other threads read them through the np_counters_* accessors. */
struct np_counters {
    uint64_t bytes;             /* payload bytes moved */
    uint64_t calls;             /* data system calls made */
    uint64_t packets;           /* UDP datagrams sent or received */
    uint64_t lost;              /* UDP receiver: missing by sequence gap */
    uint64_t out_of_order;      /* UDP receiver: arrived below the highest sequence seen */
    uint64_t duplicates;        /* UDP receiver: sequence number seen twice */
    uint64_t jitter_ms_bits;    /* IEEE-754 bits of the jitter in ms (atomically readable) */
    uint64_t messages;          /* UDP: messages sent (GSO) or read (GRO), each 1+ datagrams */
    int stop;                   /* set by np_counters_stop from any thread */
    int reserved;
    const char *failed_call;    /* static name of the call that ended the loop in error */
    struct np_rx_state rx;
};

/* Arguments of a stream loop; "unbounded" is UINT64_MAX for the limits, +inf for the
 * deadline and 0 for the rates. */
struct np_params {
    int64_t length;             /* write/read size, or datagram size */
    double deadline;            /* CLOCK_MONOTONIC seconds */
    uint64_t max_bytes;
    uint64_t max_packets;
    double rate_bps;            /* payload bits per second */
    double rate_pps;            /* UDP datagrams per second */
    int batch;                  /* UDP datagrams per sendmmsg/recvmmsg */
    int zerocopy;               /* TCP send: sendfile from a memfd */
    int skip_copy;              /* TCP recv: recv(MSG_TRUNC), data discarded in the kernel */
    int udp_gro;                /* UDP recv: ask for coalesced datagrams (UDP_GRO) */
    int udp_gso;                /* UDP send: many datagrams a message (UDP_SEGMENT); 0: one */
    int64_t wake_bytes;         /* TCP recv: bytes let queue before a wake-up; 0: 1 MiB */
};

/* TCP_INFO figures; -1 where the kernel's struct does not reach the field. */
struct np_tcp_info {
    int64_t retransmits;
    int64_t rtt_us;
    int64_t rttvar_us;
    int64_t min_rtt_us;
    int64_t snd_cwnd_bytes;
    int64_t snd_mss_bytes;
    int64_t pmtu_bytes;
    int64_t delivery_rate_bps;
    int64_t bytes_acked;
    int64_t bytes_retrans;
};

struct np_rusage {
    double user_s;
    double system_s;
};

/* First "cpu" line of /proc/stat, in clock ticks (fields an old kernel lacks are 0). */
struct np_host_cpu {
    uint64_t user;
    uint64_t nice;
    uint64_t system;
    uint64_t idle;
    uint64_t iowait;
    uint64_t irq;
    uint64_t softirq;
    uint64_t steal;
};

/* Stream loops (np_tcp.c, np_udp.c): bytes moved by this call, or -errno. */
int64_t np_tcp_send(int fd, struct np_counters *c, const struct np_params *p);
int64_t np_tcp_recv(int fd, struct np_counters *c, const struct np_params *p);
int64_t np_udp_send(int fd, struct np_counters *c, const struct np_params *p);
int64_t np_udp_recv(int fd, struct np_counters *c, const struct np_params *p);

/* One-shot queries: 0 or -errno; *failed_call names the call that failed. */
int np_tcp_info(int fd, struct np_tcp_info *out, const char **failed_call);
int np_rusage(int thread_scope, struct np_rusage *out, const char **failed_call);
int np_host_cpu(struct np_host_cpu *out, const char **failed_call);

/* Counter accessors (np_counters.c): safe from any thread while a loop runs. */
uint64_t np_counters_bytes(const struct np_counters *c);
uint64_t np_counters_calls(const struct np_counters *c);
uint64_t np_counters_packets(const struct np_counters *c);
uint64_t np_counters_lost(const struct np_counters *c);
uint64_t np_counters_out_of_order(const struct np_counters *c);
uint64_t np_counters_duplicates(const struct np_counters *c);
uint64_t np_counters_foreign(const struct np_counters *c);
uint64_t np_counters_messages(const struct np_counters *c);
double np_counters_jitter_ms(const struct np_counters *c);
void np_counters_stop(struct np_counters *c);
int np_counters_stopped(const struct np_counters *c);

/* The clock deadlines are measured on: CLOCK_MONOTONIC in seconds. */
double np_monotonic(void);

/* The C allocator (np_mem.c; glibc's arenas, no-ops elsewhere): bound the arenas made
 * from now on (1 done, 0 no arenas here, -errno); give freed memory back to the system
 * (1 some was, 0 none); how many arenas there are (-ENOSYS where this cannot be known). */
int np_malloc_arena_max(int count);
int np_malloc_trim(void);
int np_malloc_arenas(const char **failed_call);
