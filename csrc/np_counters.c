/* np_counters.c: reading a loop's counters from another thread, and the loops' clock. */
#include "np_common.h"

uint64_t np_counters_bytes(const struct np_counters *c)
{
    return np_get(&c->bytes);
}

uint64_t np_counters_calls(const struct np_counters *c)
{
    return np_get(&c->calls);
}

uint64_t np_counters_packets(const struct np_counters *c)
{
    return np_get(&c->packets);
}

uint64_t np_counters_lost(const struct np_counters *c)
{
    return np_get(&c->lost);
}

uint64_t np_counters_out_of_order(const struct np_counters *c)
{
    return np_get(&c->out_of_order);
}

uint64_t np_counters_duplicates(const struct np_counters *c)
{
    return np_get(&c->duplicates);
}

uint64_t np_counters_foreign(const struct np_counters *c)
{
    return np_get(&c->rx.foreign);
}

uint64_t np_counters_messages(const struct np_counters *c)
{
    return np_get(&c->messages);
}

double np_counters_jitter_ms(const struct np_counters *c)
{
    uint64_t bits = np_get(&c->jitter_ms_bits);
    double ms;

    memcpy(&ms, &bits, sizeof(ms));
    return ms;
}

void np_counters_stop(struct np_counters *c)
{
    __atomic_store_n(&c->stop, 1, __ATOMIC_RELAXED);
}

int np_counters_stopped(const struct np_counters *c)
{
    return np_stop_requested(c);
}

double np_monotonic(void)
{
    struct timespec ts;

    /* Same arithmetic as Python's time.monotonic(), so the two compare exactly. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)((int64_t)ts.tv_sec * NP_NS_PER_S + ts.tv_nsec) / 1e9;
}
