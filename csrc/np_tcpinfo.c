/* np_tcpinfo.c: TCP_INFO, read through our own copy of the kernel's struct tcp_info.
 *
 * Like iperf3 and ss we do not use <netinet/tcp.h>: musl and old glibc ship a shorter
 * struct. The kernel copies min(our size, its size) and says how much in optlen; a field
 * beyond that is reported unsupported (-1), never guessed. */
#include "np_common.h"

#include <netinet/in.h>
#include <sys/socket.h>

#define NP_TCP_INFO 11 /* TCP_INFO, same value on every Linux architecture */
#define NP_NO_MIN_RTT 0xffffffffU /* kernel: no RTT sample yet */

/* include/uapi/linux/tcp.h up to Linux 6.x; bit-fields folded into whole bytes. */
struct np_kernel_tcp_info {
    uint8_t state, ca_state, retransmits, probes, backoff, options, wscale, rate_flags;
    uint32_t rto, ato, snd_mss, rcv_mss;
    uint32_t unacked, sacked, lost, retrans, fackets;
    uint32_t last_data_sent, last_ack_sent, last_data_recv, last_ack_recv;
    uint32_t pmtu, rcv_ssthresh, rtt, rttvar, snd_ssthresh, snd_cwnd, advmss, reordering;
    uint32_t rcv_rtt, rcv_space;
    uint32_t total_retrans;
    uint64_t pacing_rate, max_pacing_rate, bytes_acked, bytes_received;
    uint32_t segs_out, segs_in;
    uint32_t notsent_bytes, min_rtt, data_segs_in, data_segs_out;
    uint64_t delivery_rate;
    uint64_t busy_time, rwnd_limited, sndbuf_limited;
    uint32_t delivered, delivered_ce;
    uint64_t bytes_sent, bytes_retrans;
    uint32_t dsack_dups, reord_seen, rcv_ooopack, snd_wnd;
};

_Static_assert(offsetof(struct np_kernel_tcp_info, total_retrans) == 100, "tcp_info layout");
_Static_assert(offsetof(struct np_kernel_tcp_info, delivery_rate) == 160, "tcp_info layout");
_Static_assert(offsetof(struct np_kernel_tcp_info, bytes_retrans) == 208, "tcp_info layout");

/* Did the kernel fill the field at [off, off + size)? */
#define HAVE(len, field) \
    ((size_t)(len) >= offsetof(struct np_kernel_tcp_info, field) \
                       + sizeof(((struct np_kernel_tcp_info *)0)->field))
#define FIELD(len, ti, field) (HAVE(len, field) ? (int64_t)(ti).field : -1)

/* The figures of a TCP_INFO answer of `len` bytes at `raw`: a field the answer does not
 * reach is -1, whatever lies past it in the caller's buffer (copied into a zeroed struct
 * first, so min_rtt's "no sample" test reads a zero, not a stale byte, on a short one). */
void np_tcp_info_fill(struct np_tcp_info *out, const void *raw, socklen_t len)
{
    struct np_kernel_tcp_info copy, *ti = &copy;

    memset(&copy, 0, sizeof(copy));
    if (len > sizeof(copy))
        len = sizeof(copy);
    memcpy(&copy, raw, len);
    out->retransmits = FIELD(len, *ti, total_retrans);
    out->rtt_us = FIELD(len, *ti, rtt);
    out->rttvar_us = FIELD(len, *ti, rttvar);
    out->min_rtt_us = FIELD(len, *ti, min_rtt);
    if (ti->min_rtt == NP_NO_MIN_RTT)
        out->min_rtt_us = -1;
    out->snd_mss_bytes = FIELD(len, *ti, snd_mss);
    out->snd_cwnd_bytes = HAVE(len, snd_cwnd) && HAVE(len, snd_mss)
                          ? (int64_t)ti->snd_cwnd * ti->snd_mss : -1;
    out->pmtu_bytes = FIELD(len, *ti, pmtu);
    out->delivery_rate_bps = HAVE(len, delivery_rate) ? (int64_t)(ti->delivery_rate * 8) : -1;
    out->bytes_acked = FIELD(len, *ti, bytes_acked);
    out->bytes_retrans = FIELD(len, *ti, bytes_retrans);
}

int np_tcp_info(int fd, struct np_tcp_info *out, const char **failed_call)
{
    struct np_kernel_tcp_info ti;
    socklen_t len = sizeof(ti);

    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, IPPROTO_TCP, NP_TCP_INFO, &ti, &len) < 0) {
        *failed_call = "getsockopt(TCP_INFO)";
        return -errno;
    }
    np_tcp_info_fill(out, &ti, len);
    return 0;
}
