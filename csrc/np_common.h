/* np_common.h: helpers private to the C core. Include first in every C file of the core. */
#ifndef NP_COMMON_H
#define NP_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RUSAGE_THREAD, sendmmsg/recvmmsg, memfd_create */
#endif

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "netprobe_core.h"

#define NP_NS_PER_S 1000000000LL
/* How long a blocked call may wait before the loop looks at its stop flag and deadline. */
#define NP_TICK_NS (100LL * 1000 * 1000)
#define NP_NO_DEADLINE INT64_MAX
#define NP_UDP_HEADER 16

/* Relaxed atomics: enough for a counter another thread samples, and on armv7l they keep
 * 64-bit values from tearing, at the cost of a plain store on x86_64/aarch64. */
static inline void np_put(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static inline uint64_t np_get(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline int np_stop_requested(const struct np_counters *c)
{
    return __atomic_load_n(&c->stop, __ATOMIC_RELAXED);
}

static inline int64_t np_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NP_NS_PER_S + ts.tv_nsec;
}

static inline int64_t np_min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static inline uint64_t np_minu64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* Fills buf with a byte pattern that is neither zeros nor aligned to powers of two, so
 * that compression or zero-page tricks on the path cannot flatter the figures. */
static inline void np_fill_pattern(unsigned char *buf, size_t len, size_t phase)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (unsigned char)((i + phase) % 251);
}

/* A data buffer (what the kernel copies payload into or out of), starting on a page
 * boundary; free() releases it, NULL when there is no memory.
 *
 * Why: the kernel's copy to the caller's buffer runs up to 3x slower when the buffer starts a
 * few bytes past a page boundary. glibc hands out a large malloc() 16 bytes into its own
 * mapping, and there 4 TCP streams on loopback moved 21-25 Gbit/s where the same loops with
 * the buffer at page offset 0 moved 49-73 in three sets of three runs (AMD EPYC; offsets 8
 * and 16 slow, 32 to 80 fast; the receive copy was 61% of all CPU samples in the slow
 * case; the sender's buffer made no difference). The likely cause, not proven here, is 4K
 * aliasing: x86 cores hold a load back behind a recent store to the same offset within a
 * 4 KiB page, and a destination a few bytes off the source's offset makes that every
 * load's lot. A page-aligned buffer is also cache-line aligned on every CPU, so the rule
 * costs nothing where the effect is absent. */
static inline void *np_alloc_data(size_t len)
{
    long page = sysconf(_SC_PAGESIZE);
    void *p = NULL;

    if (page < 64)
        page = 4096;
    return posix_memalign(&p, (size_t)page, len > 0 ? len : 1) == 0 ? p : NULL;
}

static inline int64_t np_fail(struct np_counters *c, const char *call, int err)
{
    c->failed_call = call;
    return -(int64_t)err;
}

/* Pacing schedule (np_pace.c): unit k is due at start + k * ns_per_unit. */
struct np_pacer {
    int64_t start_ns;
    double ns_per_unit;     /* 0 = unpaced */
    long saved_slack;
};

void np_pace_start(struct np_pacer *p, double units_per_s, int64_t now_ns);
void np_pace_end(struct np_pacer *p);
int64_t np_pace_due(const struct np_pacer *p, uint64_t done);
uint64_t np_pace_allowed(const struct np_pacer *p, uint64_t done, int64_t now_ns);
void np_sleep_until(int64_t when_ns);

/* np_tcpinfo.c: the figures of a TCP_INFO answer `len` bytes long (an old kernel's is
 * shorter: what it does not reach is -1). */
void np_tcp_info_fill(struct np_tcp_info *out, const void *raw, socklen_t len);

/* One stream loop's session on a socket (np_sock.c): sets a short SO_SNDTIMEO or
 * SO_RCVTIMEO so blocked calls come back to look at the stop flag, and restores the
 * caller's value at the end (the socket belongs to Python). */
struct np_loop {
    int fd;
    int timeo_opt;          /* SO_SNDTIMEO or SO_RCVTIMEO */
    int nonblocking;        /* O_NONBLOCK was set by the owner: wait with poll() */
    int timed;              /* a deadline or pacing needs the clock */
    int64_t deadline_ns;
    struct timeval saved;
    struct np_counters *c;
    struct np_pacer pace;
};

int64_t np_loop_begin(struct np_loop *lp, int fd, struct np_counters *c,
                      const struct np_params *p, int timeo_opt, double units_per_s);
void np_loop_end(struct np_loop *lp);
int64_t np_loop_wait(struct np_loop *lp, short events);
int np_loop_done(struct np_loop *lp, int64_t *now_ns);

#endif
