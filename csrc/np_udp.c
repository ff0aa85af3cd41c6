/* np_udp.c: UDP send and receive loops, batched with sendmmsg/recvmmsg.
 *
 * Datagram format, network byte order: bytes 0-7 sequence number (from 0), bytes 8-15
 * CLOCK_MONOTONIC send time in ns, then padding. The receiver counts gaps, reordering and
 * duplicates from the sequence numbers and RFC 3550 jitter from the send times.
 *
 * Sequence numbers start at the test's random base (counters->rx.seq_base, told to both
 * ends over the control connection) and run modulo 2**64. A datagram numbered more than
 * NP_SEQ_AHEAD past the highest one seen cannot be the sender's (that many lost in a row
 * is terabytes), so it is counted as foreign and touches no figure: a forger who does not
 * know the base hits the window with a chance of 2**-31 per datagram, and no forged
 * number can make the loss count wrap. */
#include "np_common.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>

#define NP_WINDOW_SEQS (64 * 1024) /* must match window[] in struct np_rx_state */
#define NP_SEQ_AHEAD (1ULL << 32)   /* farthest plausible jump past the highest number */

enum seq_kind { SEQ_NEW, SEQ_LATE, SEQ_DUPLICATE, SEQ_FOREIGN };

/* Receiver buffers: message i reads into its own slot of `slot` bytes, its control
 * message (the UDP_GRO segment size) into its own `control` slot. */
struct udp_rx {
    struct mmsghdr *msgs;
    struct iovec *iov;
    unsigned char *data;
    unsigned char *control;
    size_t slot;
    int gro;                    /* UDP_GRO is on: a message may hold many datagrams */
};

/* Sender buffers. The datagrams of one call lie back to back in `data`, each with its own
 * 16-byte header in place, and a message is one iovec over `seg` consecutive datagrams.
 * With UDP GSO (seg > 1) the kernel cuts one message into datagrams of gso_size bytes,
 * which saves most of the per-datagram cost of the send path; the datagrams on the wire
 * are the same. One contiguous iovec a message, not a header and a shared padding per
 * datagram: the kernel copies each iovec segment on its own, and 82 segments a message,
 * half of them 16 bytes, made the copy dearer per byte than one 60 KiB run. A call carries
 * whole messages, up to NP_TX_CALL_BYTES of them (so the data it copies from stays in the
 * cache from one call to the next): a call of 32 datagrams, as before, left a message of
 * 41 a quarter empty. Together, at 1472 bytes pinned on loopback: 2.4-2.9 Mpps before,
 * 3.7-4.3 after, where iperf3 3.21 --gsro (one 64 KiB buffer a write) did 3.3-3.7. */
struct udp_tx {
    struct mmsghdr *msgs;
    struct iovec *iov;
    unsigned char *data;
    unsigned char *control;     /* one UDP_SEGMENT cmsg per message */
    unsigned seg;               /* datagrams per message */
    unsigned msgs_max;          /* messages per call with `seg` datagrams each */
    unsigned batch;             /* messages per call at most */
    unsigned cap;               /* datagrams the buffer holds */
    unsigned length;
};

#define NP_SOL_UDP 17           /* IPPROTO_UDP */
#define NP_UDP_SEGMENT 103      /* spelled out: older libc headers lack it */
#define NP_GSO_MAX_SEGS 128     /* the kernel's UDP_MAX_SEGMENTS since Linux 6.8 */
#define NP_GSO_OLD_SEGS 64      /* ... and before: a kernel that refuses 128 gets 64 */
/* The largest UDP payload of one IPv4 packet (65535 - 20 - 8; IPv6 allows 20 more): a
 * message this full of datagrams is one GSO packet. 61440 (60 KiB) before, "to leave room
 * for headers", which the kernel counts apart: at 1472 bytes that was 41 datagrams a
 * message where 44 fit, 7% more messages, each with its system call share, queueing and
 * wake-up. A path that adds headers we cannot see (IP options, a tunnel) answers
 * EMSGSIZE, and the sender halves the message (fewer_segments). */
#define NP_GSO_MAX_BYTES 65507
#define NP_TX_CALL_BYTES (256 * 1024) /* data one sendmmsg carries at most (a few msgs) */
#define NP_UDP_GRO 104          /* spelled out: older libc headers lack it (Linux 5.0) */
/* A coalesced message is one IP packet's worth at most: GRO stops adding datagrams before
 * the packet would pass 64 KiB (the IP length field), unless an administrator has raised
 * the device's gro_max_size (BIG TCP); segments past a slot are then unreadable, and left
 * uncounted like any datagram the receiver never got. */
#define NP_GRO_SLOT_BYTES 65536
/* Room for the UDP_GRO cmsg and others the socket's owner may have asked for (receive
 * timestamps, packet info): a truncated control area could lose the segment size. */
#define NP_RX_CONTROL (CMSG_SPACE(sizeof(int)) + 128)

/* The big-endian form of v, to be stored with memcpy: a byte swap on little-endian hosts
 * (one instruction), nothing on big-endian ones. A byte loop stayed a loop at -O2: perf
 * put the two stamps of every datagram at 7.6% of a 512-byte UDP sender's samples, as
 * much as all the rest of its user-space code and the system call entry together. */
static uint64_t be64(uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return v;
#elif defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return __builtin_bswap64(v);
#else
    unsigned char b[8];

    for (int i = 7; i >= 0; i--, v >>= 8)
        b[i] = (unsigned char)v;
    memcpy(&v, b, sizeof(v));
    return v;
#endif
}

static void put_be64(unsigned char *b, uint64_t v)
{
    v = be64(v);
    memcpy(b, &v, sizeof(v));
}

static uint64_t get_be64(const unsigned char *b)
{
    uint64_t v;

    memcpy(&v, b, sizeof(v));
    return be64(v);
}

/* Soft errors: retry after a wait. ECONNREFUSED is an ICMP echo of an earlier datagram to
 * a port nobody listens on (yet, or any more): a UDP test carries on through it. */
static int soft_errno(int err)
{
    return err == EINTR || err == EAGAIN || err == EWOULDBLOCK || err == ECONNREFUSED
           || err == ENOBUFS;
}

/* What a kernel, device or path without usable UDP GSO answers (old kernel, no checksum
 * offload, datagrams needing IP fragmentation): the sender then sends one per message. */
static int gso_refused(int err)
{
    return err == EIO || err == EINVAL || err == ENOPROTOOPT || err == EOPNOTSUPP
           || err == EMSGSIZE;
}

/* Datagrams a message after a refusal: a kernel before 6.8 takes 64 at most (EINVAL for
 * more); a message too long for the path's headers (EMSGSIZE) is halved; otherwise the
 * path cannot segment at all, and a message is one datagram. */
static unsigned fewer_segments(unsigned seg, int err)
{
    if (err == EINVAL && seg > NP_GSO_OLD_SEGS)
        return NP_GSO_OLD_SEGS;
    if (err == EMSGSIZE)
        return seg / 2 > 1 ? seg / 2 : 1;
    return 1;
}

static void tx_free(struct udp_tx *t)
{
    free(t->msgs);
    free(t->iov);
    free(t->data);
    free(t->control);
}

static void tx_control(struct udp_tx *t, int n)
{
    size_t space = CMSG_SPACE(sizeof(uint16_t));

    for (int i = 0; i < n; i++) {
        struct msghdr *mh = &t->msgs[i].msg_hdr;
        struct cmsghdr *cm;
        uint16_t gso = (uint16_t)t->length;

        mh->msg_control = t->control + space * (size_t)i;
        mh->msg_controllen = space;
        cm = CMSG_FIRSTHDR(mh);
        cm->cmsg_level = NP_SOL_UDP;
        cm->cmsg_type = NP_UDP_SEGMENT;
        cm->cmsg_len = CMSG_LEN(sizeof(gso));
        memcpy(CMSG_DATA(cm), &gso, sizeof(gso));
    }
}

/* Messages per call: `batch` at most, and no more than NP_TX_CALL_BYTES of data (at least
 * one message). The buffer holds msgs_max * seg datagrams, whatever tx_send falls back to. */
static int tx_alloc(struct udp_tx *t, int batch, unsigned length, int gso)
{
    unsigned fit = gso ? NP_GSO_MAX_BYTES / length : 1, per_call;
    size_t n;

    t->length = length;
    t->batch = (unsigned)batch;
    t->seg = fit < 2 ? 1 : fit < NP_GSO_MAX_SEGS ? fit : NP_GSO_MAX_SEGS;
    per_call = NP_TX_CALL_BYTES / (t->seg * length);
    t->msgs_max = per_call < 1 ? 1 : per_call < (unsigned)batch ? per_call : (unsigned)batch;
    n = (size_t)t->msgs_max * t->seg;
    t->cap = (unsigned)n;
    /* A call never has more than `batch` messages, before or after a fall-back. */
    t->msgs = calloc((size_t)batch, sizeof(*t->msgs));
    t->iov = calloc((size_t)batch, sizeof(*t->iov));
    t->data = np_alloc_data(n * length);
    t->control = calloc((size_t)batch, CMSG_SPACE(sizeof(uint16_t)));
    if (!t->msgs || !t->iov || !t->data || !t->control) {
        tx_free(t);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        np_fill_pattern(t->data + i * length + NP_UDP_HEADER, length - NP_UDP_HEADER,
                        NP_UDP_HEADER);
    tx_control(t, batch);
    return 0;
}

/* Lays n datagrams out as messages of up to `seg` each; returns the message count. */
static unsigned tx_layout(struct udp_tx *t, unsigned n)
{
    unsigned msgs = 0;

    for (unsigned first = 0; first < n; first += t->seg, msgs++) {
        struct msghdr *mh = &t->msgs[msgs].msg_hdr;
        unsigned count = n - first < t->seg ? n - first : t->seg;

        t->iov[msgs].iov_base = t->data + (size_t)first * t->length;
        t->iov[msgs].iov_len = (size_t)count * t->length;
        mh->msg_iov = &t->iov[msgs];
        mh->msg_iovlen = 1;
        mh->msg_controllen = t->seg > 1 ? CMSG_SPACE(sizeof(uint16_t)) : 0;
        if (t->seg == 1)
            mh->msg_control = NULL;
    }
    return msgs;
}

/* Every datagram of a call carries the call's send time: swapped once, stored n times. */
static void stamp(struct udp_tx *t, unsigned n, uint64_t seq, int64_t now_ns)
{
    uint64_t when = be64((uint64_t)now_ns);

    for (unsigned i = 0; i < n; i++) {
        unsigned char *h = t->data + (size_t)t->length * i;
        put_be64(h, seq + i);
        memcpy(h + 8, &when, sizeof(when));
    }
}

static unsigned send_count(struct np_loop *lp, const struct udp_tx *t, uint64_t sent,
                           uint64_t max_pk, int64_t *now)
{
    uint64_t n = np_minu64((uint64_t)t->msgs_max * t->seg, max_pk - sent), allowed;

    if (lp->pace.ns_per_unit <= 0)
        return (unsigned)n;
    allowed = np_pace_allowed(&lp->pace, sent, *now);
    if (allowed == 0)
        np_sleep_until(np_min64(np_pace_due(&lp->pace, sent),
                                np_min64(lp->deadline_ns, *now + NP_TICK_NS)));
    return (unsigned)np_minu64(n, allowed);
}

/* Sends n stamped datagrams in one sendmmsg; returns how many went, or -1 (errno set).
 * *msgs gets the messages that went. */
static int64_t tx_send(struct udp_tx *t, int fd, unsigned n, uint64_t *msgs)
{
    int r;

    for (;;) {
        r = sendmmsg(fd, t->msgs, tx_layout(t, n), 0);
        *msgs = r > 0 ? (uint64_t)r : 0;
        if (r >= 0)
            return (int64_t)np_minu64(n, (uint64_t)r * t->seg);
        if (t->seg == 1 || !gso_refused(errno))
            return -1;
        /* And retry with fewer segments a message. From now on a call has as many
         * messages as the buffer holds, `batch` at most. */
        t->seg = fewer_segments(t->seg, errno);
        t->msgs_max = (unsigned)np_minu64(t->cap / t->seg, t->batch);
        n = (unsigned)np_minu64(n, (uint64_t)t->msgs_max * t->seg);
    }
}

static int64_t udp_send_loop(struct np_loop *lp, struct udp_tx *t, const struct np_params *p)
{
    struct np_counters *c = lp->c;
    uint64_t len = (uint64_t)p->length, seq0 = np_get(&c->packets), base = np_get(&c->bytes);
    uint64_t calls = np_get(&c->calls), sent = 0, msgs = np_get(&c->messages), went;
    uint64_t max_pk = np_minu64(p->max_packets, p->max_bytes / len);
    int64_t now, r;
    unsigned n;

    while (!np_loop_done(lp, &now) && sent < max_pk) {
        if ((n = send_count(lp, t, sent, max_pk, &now)) == 0)
            continue; /* slept until the next datagram is due */
        stamp(t, n, c->rx.seq_base + seq0 + sent, lp->timed ? now : np_now_ns());
        r = tx_send(t, lp->fd, n, &went);
        np_put(&c->calls, ++calls);
        msgs += went;
        np_put(&c->messages, msgs);
        if (r < 0) {
            int64_t rc = soft_errno(errno) ? np_loop_wait(lp, POLLOUT)
                                           : np_fail(c, "sendmmsg", errno);
            if (rc < 0)
                return rc;
            continue;
        }
        sent += (uint64_t)r;
        np_put(&c->packets, seq0 + sent);
        np_put(&c->bytes, base + sent * len);
    }
    return (int64_t)(sent * len);
}

/* Whether this kernel has UDP GSO, asked positively. A kernel before 4.18 does not know
 * UDP_SEGMENT, yet takes a sendmsg carrying it without an error: the SOL_UDP control
 * message is skipped, and a message of 44 datagrams leaves as one 64 KiB datagram (IP
 * fragments), which the receiver counts as one with 43 lost. Such a kernel refuses the
 * getsockopt (ENOPROTOOPT), so that answer, not a send that did not fail, decides. */
static int gso_confirmed(int fd)
{
    int size = 0;
    socklen_t len = sizeof(size);

    return getsockopt(fd, NP_SOL_UDP, NP_UDP_SEGMENT, &size, &len) == 0;
}

int64_t np_udp_send(int fd, struct np_counters *c, const struct np_params *p)
{
    struct np_loop lp;
    struct udp_tx t;
    double pps = p->rate_pps > 0 ? p->rate_pps : p->rate_bps / (8.0 * (double)p->length);
    int64_t rc;

    if (tx_alloc(&t, p->batch, (unsigned)p->length, p->udp_gso && gso_confirmed(fd)) < 0)
        return np_fail(c, "malloc", ENOMEM);
    rc = np_loop_begin(&lp, fd, c, p, SO_SNDTIMEO, pps);
    if (rc == 0) {
        rc = udp_send_loop(&lp, &t, p);
        np_loop_end(&lp);
    }
    tx_free(&t);
    return rc;
}

static void rx_free(struct udp_rx *b)
{
    free(b->msgs);
    free(b->iov);
    free(b->data);
    free(b->control);
}

/* Why the receiver asks for UDP_GRO. Without it the kernel hands a socket one datagram
 * per skb: a GSO sender's 64 KiB message is cut back into datagrams before it is queued
 * (on loopback and veth, where it arrived whole), and a NIC's GRO must not merge them, so
 * each datagram pays a queueing, a wake-up share and a recvmmsg slot of its own. With
 * UDP_GRO the socket takes a coalesced skb as it is, and one slot of one call reads up to
 * 64 KiB of back-to-back datagrams of the flow, with their common size in a cmsg: the
 * per-datagram cost of the receive path becomes a per-64-KiB cost, which is what the
 * sender's UDP_SEGMENT already buys on its side. The datagrams are the same bytes, each
 * with its own header, so the accounting below walks them one by one. A kernel before
 * 5.0 answers ENOPROTOOPT: then every message is one datagram, as before. The option
 * stays on when the loop returns: coalesced skbs may still be queued, and a reader that
 * turned it off would get them whole without the cmsg that says how to cut them. */
static int rx_gro_enable(int fd, int wanted)
{
    int on = 1;
    socklen_t len = sizeof(on);

    if (wanted && setsockopt(fd, NP_SOL_UDP, NP_UDP_GRO, &on, sizeof(on)) == 0)
        return 1;
    /* Not asked for (or refused): it may still be on from an earlier loop on the socket. */
    on = 0;
    return getsockopt(fd, NP_SOL_UDP, NP_UDP_GRO, &on, &len) == 0 && on;
}

static int rx_alloc(struct udp_rx *b, int n, size_t length, int gro)
{
    memset(b, 0, sizeof(*b));
    b->gro = gro;
    b->slot = gro && length < NP_GRO_SLOT_BYTES ? NP_GRO_SLOT_BYTES : length;
    b->msgs = calloc((size_t)n, sizeof(*b->msgs));
    b->iov = calloc((size_t)n, sizeof(*b->iov));
    b->data = np_alloc_data(b->slot * (size_t)n);
    b->control = calloc((size_t)n, NP_RX_CONTROL);
    if (b->msgs == NULL || b->iov == NULL || b->data == NULL || b->control == NULL) {
        rx_free(b);
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        b->iov[i].iov_base = b->data + b->slot * (size_t)i;
        b->iov[i].iov_len = b->slot;
        b->msgs[i].msg_hdr.msg_iov = &b->iov[i];
        b->msgs[i].msg_hdr.msg_iovlen = 1;
    }
    return 0;
}

/* The kernel shrinks msg_controllen to what it wrote: give every slot its room back. */
static void rx_rearm(struct udp_rx *b, unsigned n)
{
    for (unsigned i = 0; b->gro && i < n; i++) {
        b->msgs[i].msg_hdr.msg_control = b->control + NP_RX_CONTROL * (size_t)i;
        b->msgs[i].msg_hdr.msg_controllen = NP_RX_CONTROL;
    }
}

/* The segment size of a coalesced message, or 0: a message without the cmsg (not
 * coalesced, or GRO off) is one datagram. */
static unsigned rx_gso_size(struct msghdr *mh)
{
    int size = 0;

/* musl's CMSG_NXTHDR compares a signed with an unsigned length (-Werror=sign-compare). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm != NULL; cm = CMSG_NXTHDR(mh, cm))
        if (cm->cmsg_level == NP_SOL_UDP && cm->cmsg_type == NP_UDP_GRO
            && cm->cmsg_len >= CMSG_LEN(sizeof(int)))
            memcpy(&size, CMSG_DATA(cm), sizeof(size));
#pragma GCC diagnostic pop
    return size > 0 ? (unsigned)size : 0;
}

/* Marks seq in the window of the last NP_WINDOW_SEQS sequence numbers and says what it
 * was. Beyond the window a late datagram cannot be told from a duplicate: it counts as
 * late, the rarer mistake on any real path. */
static enum seq_kind rx_seq(struct np_rx_state *rx, uint64_t seq)
{
    uint64_t slot = seq % NP_WINDOW_SEQS, mask = 1ULL << (slot & 63);
    uint64_t *word = &rx->window[slot >> 6];

    if (seq >= rx->next_seq && seq - rx->next_seq >= NP_SEQ_AHEAD)
        return SEQ_FOREIGN;
    if (seq >= rx->next_seq) {
        if (seq - rx->next_seq >= NP_WINDOW_SEQS)
            memset(rx->window, 0, sizeof(rx->window));
        else /* slots of the skipped numbers still hold marks from a window ago */
            for (uint64_t s = rx->next_seq; s < seq; s++)
                rx->window[(s % NP_WINDOW_SEQS) >> 6] &= ~(1ULL << (s & 63));
        *word |= mask;
        rx->next_seq = seq + 1;
        rx->unique++;
        return SEQ_NEW;
    }
    if (rx->next_seq - seq <= NP_WINDOW_SEQS) {
        if (*word & mask)
            return SEQ_DUPLICATE;
        *word |= mask;
    }
    rx->unique++;
    return SEQ_LATE;
}

/* RFC 3550 section 6.4.1: J += (|D| - J) / 16, D the change in transit time. */
static void rx_jitter(struct np_rx_state *rx, uint64_t sent_ns, int64_t arrival_ns)
{
    int64_t transit = arrival_ns - (int64_t)sent_ns, d;

    if (rx->have_transit) {
        d = transit - rx->last_transit_ns;
        rx->jitter_ns += ((double)(d < 0 ? -d : d) - rx->jitter_ns) / 16.0;
    }
    rx->last_transit_ns = transit;
    rx->have_transit = 1;
}

struct rx_tally {
    uint64_t packets, bytes, out_of_order, duplicates, foreign;
};

static void rx_account(struct np_rx_state *rx, struct rx_tally *t, const unsigned char *h,
                       unsigned len, int64_t arrival_ns)
{
    enum seq_kind kind = SEQ_NEW;

    if (len >= NP_UDP_HEADER && (kind = rx_seq(rx, get_be64(h) - rx->seq_base)) == SEQ_FOREIGN) {
        t->foreign++;
        return;
    }
    t->packets++;
    t->bytes += len;
    if (len < NP_UDP_HEADER)
        return; /* too short to carry a sequence number: counted, nothing more */
    if (kind == SEQ_DUPLICATE) {
        t->duplicates++;
        return;
    }
    t->out_of_order += kind == SEQ_LATE;
    rx_jitter(rx, get_be64(h + 8), arrival_ns);
}

static void rx_publish(struct np_counters *c, const struct rx_tally *t)
{
    const struct np_rx_state *rx = &c->rx;
    double jitter_ms = rx->jitter_ns / 1e6;
    uint64_t bits;

    memcpy(&bits, &jitter_ms, sizeof(bits));
    np_put(&c->packets, t->packets);
    np_put(&c->bytes, t->bytes);
    np_put(&c->out_of_order, t->out_of_order);
    np_put(&c->duplicates, t->duplicates);
    np_put(&c->rx.foreign, t->foreign);
    np_put(&c->lost, rx->next_seq > rx->unique ? rx->next_seq - rx->unique : 0);
    np_put(&c->jitter_ms_bits, bits);
}

/* Accounts every datagram of message i: one, or the segments of a coalesced one (all of
 * gso_size bytes but the last, which may be shorter). Returns how many it walked. */
static uint64_t rx_message(struct np_rx_state *rx, struct rx_tally *t, struct udp_rx *b,
                           int i, int64_t arrival_ns)
{
    struct msghdr *mh = &b->msgs[i].msg_hdr;
    const unsigned char *data = b->iov[i].iov_base;
    size_t len = b->msgs[i].msg_len, seg = b->gro ? rx_gso_size(mh) : 0, off;
    uint64_t n = 0;

    if (seg == 0 || seg >= len) {
        rx_account(rx, t, data, (unsigned)len, arrival_ns);
        return 1;
    }
    for (off = 0; off < len && off + np_minu64(seg, len - off) <= b->slot; off += seg, n++)
        rx_account(rx, t, data + off, (unsigned)np_minu64(seg, len - off), arrival_ns);
    return n;
}

/* How many slots the next call offers: enough for about `batch` datagrams at the number
 * per message the last call saw. One datagram per message (no GSO sender, or no GRO):
 * all of them. Coalesced messages of 41 (1472 bytes) or 64: one, because a call that
 * filled 32 slots of 64 KiB would copy 2 MiB into buffers that fall out of the cache
 * between calls (it cost 1.4x per datagram what 1-8 slots did at 1472 bytes), while the
 * system call is already shared by tens of datagrams. Slots never offered are never
 * touched, so their pages cost no memory either. */
static unsigned rx_slots(int batch, int r, uint64_t walked)
{
    uint64_t per_msg = r > 0 && walked > (uint64_t)r ? walked / (uint64_t)r : 1;

    return (unsigned)(((uint64_t)batch + per_msg - 1) / per_msg);
}

static int64_t udp_recv_loop(struct np_loop *lp, struct udp_rx *b, const struct np_params *p)
{
    struct np_counters *c = lp->c;
    struct rx_tally t = { np_get(&c->packets), np_get(&c->bytes), np_get(&c->out_of_order),
                          np_get(&c->duplicates), np_get(&c->rx.foreign) };
    uint64_t calls = np_get(&c->calls), base = t.bytes, got = 0, walked;
    uint64_t msgs = np_get(&c->messages);
    int64_t now;
    unsigned want, slots = 1; /* the first call learns what a message holds */
    int r;

    while (!np_loop_done(lp, &now) && got < p->max_packets) {
        /* With GRO one slot can hold many datagrams: max_packets is then reached at the
         * end of the message that crosses it (a datagram read cannot be put back). */
        want = (unsigned)np_minu64(slots, p->max_packets - got);
        rx_rearm(b, want);
        r = recvmmsg(lp->fd, b->msgs, want, MSG_WAITFORONE | MSG_TRUNC, NULL);
        np_put(&c->calls, ++calls);
        if (r < 0) {
            int64_t rc = soft_errno(errno) ? np_loop_wait(lp, POLLIN)
                                           : np_fail(c, "recvmmsg", errno);
            if (rc < 0)
                return rc;
            continue;
        }
        /* One clock read per batch: the datagrams of a batch were queued together. */
        now = np_now_ns();
        walked = 0;
        for (int i = 0; i < r; i++)
            walked += rx_message(&c->rx, &t, b, i, now);
        got += walked;
        msgs += (uint64_t)r;
        np_put(&c->messages, msgs);
        slots = rx_slots(p->batch, r, walked);
        rx_publish(c, &t);
    }
    return (int64_t)(t.bytes - base);
}

int64_t np_udp_recv(int fd, struct np_counters *c, const struct np_params *p)
{
    struct np_loop lp;
    struct udp_rx b;
    int64_t rc;

    if (rx_alloc(&b, p->batch, (size_t)p->length, rx_gro_enable(fd, p->udp_gro)) < 0)
        return np_fail(c, "malloc", ENOMEM);
    rc = np_loop_begin(&lp, fd, c, p, SO_RCVTIMEO, 0.0);
    if (rc == 0) {
        rc = udp_recv_loop(&lp, &b, p);
        np_loop_end(&lp);
    }
    rx_free(&b);
    return rc;
}
