/* np_sock.c: what every stream loop does around its socket: short timeouts so that a
 * blocked call comes back to look at the stop flag, waiting on non-blocking sockets, and
 * the stop/deadline check. */
#include "np_common.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

static int64_t deadline_ns(double deadline)
{
    if (!(deadline < 9.0e9)) /* +inf (or NaN): no deadline; also guards the int cast */
        return NP_NO_DEADLINE;
    return (int64_t)(deadline * (double)NP_NS_PER_S);
}

static const char *timeo_name(int opt, int set)
{
    if (opt == SO_SNDTIMEO)
        return set ? "setsockopt(SO_SNDTIMEO)" : "getsockopt(SO_SNDTIMEO)";
    return set ? "setsockopt(SO_RCVTIMEO)" : "getsockopt(SO_RCVTIMEO)";
}

int64_t np_loop_begin(struct np_loop *lp, int fd, struct np_counters *c,
                      const struct np_params *p, int timeo_opt, double units_per_s)
{
    struct timeval tick = { 0, NP_TICK_NS / 1000 };
    socklen_t len = sizeof(lp->saved);
    int flags;

    memset(lp, 0, sizeof(*lp));
    lp->fd = fd;
    lp->c = c;
    lp->timeo_opt = timeo_opt;
    lp->deadline_ns = deadline_ns(p->deadline);
    if (getsockopt(fd, SOL_SOCKET, timeo_opt, &lp->saved, &len) < 0)
        return np_fail(c, timeo_name(timeo_opt, 0), errno);
    if (setsockopt(fd, SOL_SOCKET, timeo_opt, &tick, sizeof(tick)) < 0)
        return np_fail(c, timeo_name(timeo_opt, 1), errno);
    flags = fcntl(fd, F_GETFL);
    lp->nonblocking = flags >= 0 && (flags & O_NONBLOCK);
    np_pace_start(&lp->pace, units_per_s, np_now_ns());
    lp->timed = lp->deadline_ns != NP_NO_DEADLINE || lp->pace.ns_per_unit > 0;
    return 0;
}

void np_loop_end(struct np_loop *lp)
{
    /* Best effort: the loop's own result matters more than a failed restore. */
    (void)setsockopt(lp->fd, SOL_SOCKET, lp->timeo_opt, &lp->saved, sizeof(lp->saved));
    np_pace_end(&lp->pace);
}

/* After EAGAIN. A blocking socket has already waited one tick inside the call; a
 * non-blocking one waits here, so that the loop never spins. */
int64_t np_loop_wait(struct np_loop *lp, short events)
{
    struct pollfd pfd = { lp->fd, events, 0 };
    int64_t wait_ns = NP_TICK_NS;

    if (!lp->nonblocking)
        return 0;
    if (lp->deadline_ns != NP_NO_DEADLINE)
        wait_ns = np_min64(wait_ns, lp->deadline_ns - np_now_ns());
    if (wait_ns <= 0)
        return 0;
    if (poll(&pfd, 1, (int)((wait_ns + 999999) / 1000000)) < 0 && errno != EINTR)
        return np_fail(lp->c, "poll", errno);
    return 0;
}

/* 1 when the loop must end (stop flag or deadline). *now_ns gets the clock when the loop
 * is timed, else 0: an untimed loop reads no clock at all. */
int np_loop_done(struct np_loop *lp, int64_t *now_ns)
{
    *now_ns = 0;
    if (np_stop_requested(lp->c))
        return 1;
    if (!lp->timed)
        return 0;
    *now_ns = np_now_ns();
    return *now_ns >= lp->deadline_ns;
}
