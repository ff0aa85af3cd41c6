/* np_pace.c: rate limiting by schedule. Unit k (a byte or a datagram) is due at
 * start + k / rate; a sender that is ahead sleeps until its next unit is due, one that is
 * behind (late wake-up, slow call) sends at once, so errors never accumulate. */
#include "np_common.h"

#include <sys/prctl.h>

/* Default timer slack (50 us) would make every paced sleep late; 1 us is plenty. prctl's
 * slack is per thread, so this only touches the thread running the loop. */
#define NP_PACE_SLACK_NS 1000L

void np_pace_start(struct np_pacer *p, double units_per_s, int64_t now_ns)
{
    p->start_ns = now_ns;
    p->ns_per_unit = units_per_s > 0 ? (double)NP_NS_PER_S / units_per_s : 0.0;
    p->saved_slack = -1;
    if (p->ns_per_unit > 0) {
        p->saved_slack = (long)prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
        (void)prctl(PR_SET_TIMERSLACK, NP_PACE_SLACK_NS, 0, 0, 0);
    }
}

void np_pace_end(struct np_pacer *p)
{
    if (p->saved_slack > 0)
        (void)prctl(PR_SET_TIMERSLACK, (unsigned long)p->saved_slack, 0, 0, 0);
    p->saved_slack = -1;
}

int64_t np_pace_due(const struct np_pacer *p, uint64_t done)
{
    return p->start_ns + (int64_t)((double)done * p->ns_per_unit);
}

/* How many units may go now (at least 1 once unit `done` is due). */
uint64_t np_pace_allowed(const struct np_pacer *p, uint64_t done, int64_t now_ns)
{
    double due_units;
    uint64_t total;

    if (now_ns < np_pace_due(p, done))
        return 0;
    due_units = (double)(now_ns - p->start_ns) / p->ns_per_unit;
    total = (uint64_t)due_units + 1;
    return total > done ? total - done : 1;
}

void np_sleep_until(int64_t when_ns)
{
    struct timespec ts = { (time_t)(when_ns / NP_NS_PER_S), (long)(when_ns % NP_NS_PER_S) };

    /* EINTR is fine: the caller re-reads the clock and sleeps again if still early. */
    (void)clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
}
