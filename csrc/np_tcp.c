/* np_tcp.c: TCP (any stream socket) send and receive loops. */
#include "np_common.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NP_MFD_CLOEXEC 1U /* MFD_CLOEXEC, spelled out: older libc headers lack it */
#define NP_PACED_MIN_CHUNK 1024.0

struct tcp_tx {
    struct np_loop lp;
    const unsigned char *buf;
    int file_fd;            /* >= 0: zerocopy, sendfile() from this file */
};

static int soft_errno(int err)
{
    return err == EINTR || err == EAGAIN || err == EWOULDBLOCK;
}

/* Paced writes are cut to ~1 ms of data so that the schedule, not the buffer size, bounds
 * how far the sender runs ahead: one 128 KiB write at 100 Mbit/s is 1% of a second. */
static size_t chunk_size(const struct np_params *p)
{
    double per_ms = p->rate_bps / 8.0 / 1000.0;

    if (p->rate_bps <= 0 || per_ms >= (double)p->length)
        return (size_t)p->length;
    return per_ms < NP_PACED_MIN_CHUNK ? (size_t)NP_PACED_MIN_CHUNK : (size_t)per_ms;
}

static ssize_t tx_write(const struct tcp_tx *tx, size_t n, const char **call)
{
    off_t off = 0;

    if (tx->file_fd < 0) {
        *call = "send";
        return send(tx->lp.fd, tx->buf, n, MSG_NOSIGNAL);
    }
    *call = "sendfile";
    return sendfile(tx->lp.fd, tx->file_fd, &off, n);
}

static int64_t tcp_send_loop(struct tcp_tx *tx, const struct np_params *p)
{
    struct np_loop *lp = &tx->lp;
    struct np_counters *c = lp->c;
    uint64_t base = np_get(&c->bytes), calls = np_get(&c->calls), total = 0;
    size_t chunk = chunk_size(p);
    const char *call;
    int64_t now, rc;
    ssize_t r;

    while (!np_loop_done(lp, &now) && total < p->max_bytes) {
        if (lp->pace.ns_per_unit > 0 && np_pace_allowed(&lp->pace, total, now) == 0) {
            np_sleep_until(np_min64(np_pace_due(&lp->pace, total),
                                    np_min64(lp->deadline_ns, now + NP_TICK_NS)));
            continue;
        }
        r = tx_write(tx, (size_t)np_minu64(chunk, p->max_bytes - total), &call);
        np_put(&c->calls, ++calls);
        if (r < 0) {
            rc = soft_errno(errno) ? np_loop_wait(lp, POLLOUT) : np_fail(c, call, errno);
            if (rc < 0)
                return rc;
            continue;
        }
        total += (uint64_t)r;
        np_put(&c->bytes, base + total);
    }
    return (int64_t)total;
}

static int make_temp_file(void)
{
    char path[] = "/tmp/netprobe-XXXXXX";
    int fd = mkstemp(path);

    if (fd >= 0)
        unlink(path);
    return fd;
}

/* A file holding one buffer of the pattern, for sendfile(); memfd where the kernel has
 * it (3.17+), else an unlinked temporary file. Returns the fd or -errno. */
static int pattern_file(const unsigned char *buf, size_t len, const char **call)
{
    int fd = -1;
    size_t done = 0;
    ssize_t r;

#ifdef SYS_memfd_create
    fd = (int)syscall(SYS_memfd_create, "netprobe", NP_MFD_CLOEXEC);
#endif
    *call = "memfd_create";
    if (fd < 0 && (fd = make_temp_file()) < 0)
        return -errno;
    *call = "write";
    while (done < len) {
        r = pwrite(fd, buf + done, len - done, (off_t)done);
        if (r < 0 && errno != EINTR) {
            int err = errno;
            close(fd);
            return -err;
        }
        done += r > 0 ? (size_t)r : 0;
    }
    return fd;
}

int64_t np_tcp_send(int fd, struct np_counters *c, const struct np_params *p)
{
    struct tcp_tx tx;
    unsigned char *buf = np_alloc_data((size_t)p->length);
    const char *call = "malloc";
    int64_t rc;

    if (buf == NULL)
        return np_fail(c, call, ENOMEM);
    np_fill_pattern(buf, (size_t)p->length, 0);
    tx.buf = buf;
    tx.file_fd = p->zerocopy ? pattern_file(buf, (size_t)p->length, &call) : -1;
    if (p->zerocopy && tx.file_fd < 0) {
        free(buf);
        return np_fail(c, call, -tx.file_fd);
    }
    rc = np_loop_begin(&tx.lp, fd, c, p, SO_SNDTIMEO, p->rate_bps / 8.0);
    if (rc == 0) {
        rc = tcp_send_loop(&tx, p);
        np_loop_end(&tx.lp);
    }
    if (tx.file_fd >= 0)
        close(tx.file_fd);
    free(buf);
    return rc;
}

/* Fewer wake-ups. A blocked recv() is woken for every segment that arrives: on a link
 * slower than the receiver (100 Mbit/s is ~8,000 segments a second) that is a wake-up, a
 * context switch and a 1448-byte copy each time, which is most of a receiver's CPU there.
 * With SO_RCVLOWAT the kernel wakes us once `lowat` bytes are in (or at EOF, or when the
 * 100 ms tick times the call out, which then returns what did arrive).
 *
 * What the threshold starts from: the caller's wake_bytes (NP_WAKE_BYTES, 1 MiB, when it
 * gives none), or the read length where that is longer. Not the read length alone: the
 * kernel wakes a sleeping reader once `lowat` bytes are queued whatever the call asked for
 * (the woken call returns at most its own length and the next ones find the rest queued),
 * so short calls need not mean frequent wake-ups. A loop of 16 KiB reads on loopback woke
 * ~30,000 times a second at its read length, and waking per 1 MiB took -P 1 -l 16K from
 * 21.9 to 26.2 Gbit/s and -l 32K from 27.9 to 34.8 (iperf3 3.21 26.8 and 27.2, same run).
 * But what waits in the queue is read later, from further out in the cache: with 4
 * streams on 2 cores 1 MiB each lost to the read length at 128K and 256K (66.6 and 59.2
 * against 74.6 and 73.8). So the engine shares 1 MiB between the side's receiving streams
 * (wake_bytes() in netprobe/engine/side.py): one stream wakes per 1 MiB, four per 256 KiB.
 * Below it, two bounds:
 * - a quarter of SO_RCVBUF: within it tcp_set_rcvlowat() never has to grow the buffer or
 *   clamp the window, and the window stays open while we sleep;
 * - what the flow brings in NP_RCV_LAG_NS: the counter moves only when a call returns, so
 *   it lags what has arrived by up to `lowat` bytes, and a sample (an interval, the
 *   warm-up's base) must not be off by more than 1% of a 1 s interval. A threshold of a
 *   whole read (256 KiB) was 21 ms at 100 Mbit/s and raised a 6 s figure by 0.3%.
 * The last is unknown until data comes, so the threshold is left at the caller's value
 * until it is: a threshold set at the start from the first two alone (256 KiB to 1 MiB)
 * held up to 84 ms of a 100 Mbit/s flow uncounted at the start of every loop, and a
 * warm-up base taken then made a 100 Mbit/s link read 98-99. The rate is timed from the
 * first call that ends past the bytes queued when the loop began (FIONREAD), so those are
 * not taken for the flow's pace, and judged NP_RCV_LAG_NS later, then once a tick, as the
 * buffer (the kernel grows an autotuned one from 128 KiB to ~1.7 MiB across a 100 Mbit/s
 * link with a 50 ms queue) and the rate change. (It was timed from the first call that
 * returned less than it asked for, the queue then empty; but calls that divide the
 * sender's writes exactly, 16 KiB reads of 64 KiB writes, never return less, and such a
 * loop kept waking per segment for the whole test.) Best effort: where the option is
 * missing or refused the loop runs as before (it changes when we wake, never what we
 * count). */
#define NP_RCV_LAG_NS (10LL * 1000 * 1000)
#define NP_WAKE_BYTES (1 << 20) /* records.WAKE_BYTES in Python */

struct rcv_wake {
    int usable;             /* SO_RCVLOWAT can be read, so the caller's value is known */
    int saved;              /* the caller's value, put back at the end if lowat differs */
    int lowat;
    int64_t wanted;         /* the threshold before its bounds: wake_bytes or the length */
    uint64_t backlog;       /* bytes queued when the loop began */
    int64_t first_ns;       /* when a call first ended past them (0: not yet) */
    uint64_t first_total;   /* bytes counted by then */
    int64_t next_check_ns;
};

static int wake_threshold(int fd, int64_t wanted, double bytes_per_ns)
{
    int size = 0;
    socklen_t len = sizeof(size);
    uint64_t lowat;

    if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, &len) < 0 || size < 4)
        return -1;
    lowat = np_minu64((uint64_t)wanted, (uint64_t)size / 4);
    lowat = np_minu64(lowat, (uint64_t)(bytes_per_ns * (double)NP_RCV_LAG_NS));
    return lowat > 0 ? (int)lowat : 1;
}

static void fewer_wakeups(int fd, const struct np_params *p, struct rcv_wake *w)
{
    int64_t wake = p->wake_bytes > 0 ? p->wake_bytes : NP_WAKE_BYTES;
    int queued = 0;

    w->usable = 0;
    w->first_ns = 0;
    w->wanted = p->length > wake ? p->length : wake;
    w->backlog = ioctl(fd, FIONREAD, &queued) == 0 && queued > 0 ? (uint64_t)queued : 0;
#ifdef SO_RCVLOWAT
    socklen_t len = sizeof(w->saved);

    if (getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &w->saved, &len) == 0) {
        w->usable = 1;
        w->lowat = w->saved;
    }
#else
    (void)fd;
#endif
}

/* After every successful recv, with the bytes received so far: a clock read (vDSO), and
 * once a tick two system calls at most. */
static void follow_flow(int fd, struct rcv_wake *w, uint64_t total)
{
#ifdef SO_RCVLOWAT
    int64_t now;
    int lowat;

    if (!w->usable || (w->first_ns == 0 && total <= w->backlog))
        return;
    now = np_now_ns();
    if (w->first_ns == 0) {
        w->first_ns = now;
        w->first_total = total;
        w->next_check_ns = now + NP_RCV_LAG_NS;
        return;
    }
    if (now < w->next_check_ns)
        return;
    w->next_check_ns = now + NP_TICK_NS;
    lowat = wake_threshold(fd, w->wanted,
                           (double)(total - w->first_total) / (double)(now - w->first_ns));
    if (lowat > 0 && lowat != w->lowat
        && setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof(lowat)) == 0)
        w->lowat = lowat;
#else
    (void)fd;
    (void)w;
    (void)total;
#endif
}

static void restore_wakeups(int fd, const struct rcv_wake *w)
{
#ifdef SO_RCVLOWAT
    if (w->usable && w->lowat != w->saved)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &w->saved, sizeof(w->saved));
#else
    (void)fd;
    (void)w;
#endif
}

static int64_t tcp_recv_loop(struct np_loop *lp, const struct np_params *p, unsigned char *buf,
                             struct rcv_wake *wake)
{
    struct np_counters *c = lp->c;
    uint64_t base = np_get(&c->bytes), calls = np_get(&c->calls), total = 0;
    int flags = p->skip_copy ? MSG_TRUNC : 0;
    int64_t now, rc;
    size_t ask;
    ssize_t r;

    while (!np_loop_done(lp, &now) && total < p->max_bytes) {
        ask = (size_t)np_minu64((uint64_t)p->length, p->max_bytes - total);
        r = recv(lp->fd, buf, ask, flags);
        np_put(&c->calls, ++calls);
        if (r == 0)
            break; /* peer closed or shut down its write side */
        if (r < 0) {
            rc = soft_errno(errno) ? np_loop_wait(lp, POLLIN) : np_fail(c, "recv", errno);
            if (rc < 0)
                return rc;
            continue;
        }
        total += (uint64_t)r;
        np_put(&c->bytes, base + total);
        follow_flow(lp->fd, wake, total);
    }
    return (int64_t)total;
}

int64_t np_tcp_recv(int fd, struct np_counters *c, const struct np_params *p)
{
    struct np_loop lp;
    struct rcv_wake wake;
    unsigned char *buf = np_alloc_data((size_t)p->length);
    int64_t rc;

    if (buf == NULL)
        return np_fail(c, "malloc", ENOMEM);
    rc = np_loop_begin(&lp, fd, c, p, SO_RCVTIMEO, 0.0);
    if (rc == 0) {
        fewer_wakeups(fd, p, &wake);
        rc = tcp_recv_loop(&lp, p, buf, &wake);
        restore_wakeups(fd, &wake);
        np_loop_end(&lp);
    }
    free(buf);
    return rc;
}
