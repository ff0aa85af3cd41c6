/* test_core.c: standalone checks of the C core on real loopback sockets, without Python.
 *
 * Build and run from the repository root (or `make -C csrc check`):
 *   mkdir -p build && cc -std=gnu99 -O2 -Wall -Wextra -Werror -Icsrc -o build/test_core \
 *       csrc/np_*.c csrc/test_core.c -pthread && build/test_core
 */
#include "np_common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int failures;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                              \
        }                                                                            \
    } while (0)

static struct np_params params(int64_t length)
{
    struct np_params p;

    memset(&p, 0, sizeof(p));
    p.length = length;
    p.deadline = np_monotonic() + 5.0; /* every loop bounded in time */
    p.max_bytes = UINT64_MAX;
    p.max_packets = UINT64_MAX;
    p.batch = 32;
    p.udp_gso = 1;
    return p;
}

static void tcp_pair(int fds[2])
{
    struct sockaddr_in addr = { .sin_family = AF_INET };
    socklen_t len = sizeof(addr);
    int listener = socket(AF_INET, SOCK_STREAM, 0);

    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof(addr)) < 0
        || listen(listener, 1) < 0 || getsockname(listener, (struct sockaddr *)&addr, &len) < 0
        || (fds[0] = socket(AF_INET, SOCK_STREAM, 0)) < 0
        || connect(fds[0], (struct sockaddr *)&addr, sizeof(addr)) < 0
        || (fds[1] = accept(listener, NULL, NULL)) < 0) {
        perror("tcp_pair");
        exit(2);
    }
    close(listener);
}

static void udp_pair(int fds[2])
{
    struct sockaddr_in addr = { .sin_family = AF_INET };
    socklen_t len = sizeof(addr);
    int big = 4 << 20;

    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fds[1] = socket(AF_INET, SOCK_DGRAM, 0);
    fds[0] = socket(AF_INET, SOCK_DGRAM, 0);
    if (fds[0] < 0 || fds[1] < 0
        || setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big)) < 0
        || bind(fds[1], (struct sockaddr *)&addr, sizeof(addr)) < 0
        || getsockname(fds[1], (struct sockaddr *)&addr, &len) < 0
        || connect(fds[0], (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        perror("udp_pair");
        exit(2);
    }
}

struct job {
    int fd;
    struct np_counters *c;
    struct np_params p;
    int64_t rc;
    double delay;
};

static void *send_job(void *arg)
{
    struct job *j = arg;

    j->rc = np_tcp_send(j->fd, j->c, &j->p);
    shutdown(j->fd, SHUT_WR);
    return NULL;
}

static void *udp_recv_job(void *arg)
{
    struct job *j = arg;

    j->rc = np_udp_recv(j->fd, j->c, &j->p);
    return NULL;
}

static void *stop_job(void *arg)
{
    struct job *j = arg;

    usleep((useconds_t)(j->delay * 1e6));
    np_counters_stop(j->c);
    return NULL;
}

static void test_tcp_exact(int zerocopy)
{
    static struct np_counters tx, rx;
    struct job j = { .c = &tx, .p = params(65536) };
    struct np_params p = params(131072);
    pthread_t t;
    int fds[2];

    memset(&tx, 0, sizeof(tx));
    memset(&rx, 0, sizeof(rx));
    tcp_pair(fds);
    j.fd = fds[0];
    j.p.max_bytes = 3000017;
    j.p.zerocopy = zerocopy;
    pthread_create(&t, NULL, send_job, &j);
    CHECK(np_tcp_recv(fds[1], &rx, &p) == 3000017);
    pthread_join(t, NULL);
    CHECK(j.rc == 3000017);
    CHECK(np_counters_bytes(&tx) == 3000017 && np_counters_bytes(&rx) == 3000017);
    close(fds[0]);
    close(fds[1]);
}

static void test_stop_unblocks(void)
{
    static struct np_counters c;
    struct np_params p = params(1024);
    struct job stopper = { .c = &c, .delay = 0.15 };
    pthread_t t;
    int fds[2];
    double start = np_monotonic();

    memset(&c, 0, sizeof(c));
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    pthread_create(&t, NULL, stop_job, &stopper);
    CHECK(np_tcp_recv(fds[1], &c, &p) == 0);
    CHECK(np_monotonic() - start < 0.15 + 0.3);
    CHECK(np_counters_stopped(&c));
    pthread_join(t, NULL);
    close(fds[0]);
    close(fds[1]);
}

static void test_errors_name_the_call(void)
{
    static struct np_counters c;
    struct np_params p = params(65536);
    struct linger hard = { 1, 0 };
    int fds[2];
    int64_t rc;

    memset(&c, 0, sizeof(c));
    tcp_pair(fds);
    setsockopt(fds[1], SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
    close(fds[1]); /* RST */
    usleep(50000);
    rc = np_tcp_send(fds[0], &c, &p);
    CHECK(rc == -EPIPE || rc == -ECONNRESET);
    CHECK(c.failed_call != NULL && strcmp(c.failed_call, "send") == 0);
    close(fds[0]);
    memset(&c, 0, sizeof(c));
    CHECK(np_udp_recv(fds[0], &c, &p) == -EBADF);
    CHECK(strcmp(c.failed_call, "getsockopt(SO_RCVTIMEO)") == 0);
}

static void send_datagram(int fd, uint64_t seq, uint64_t sent_ns)
{
    unsigned char d[64] = { 0 };

    for (int i = 0; i < 8; i++) {
        d[7 - i] = (unsigned char)(seq >> (8 * i));
        d[15 - i] = (unsigned char)(sent_ns >> (8 * i));
    }
    CHECK(send(fd, d, sizeof(d), 0) == (ssize_t)sizeof(d));
}

static void test_udp_accounting(void)
{
    static const uint64_t seqs[] = { 0, 1, 2, 5, 3, 3, 4, 9, 7 };
    static struct np_counters c;
    struct np_params p = params(2048);
    int fds[2];

    memset(&c, 0, sizeof(c));
    udp_pair(fds);
    for (size_t i = 0; i < sizeof(seqs) / sizeof(seqs[0]); i++)
        send_datagram(fds[0], seqs[i], 1000000000ULL + 10000000ULL * i);
    CHECK(send(fds[0], "short", 5, 0) == 5);
    p.max_packets = 10;
    CHECK(np_udp_recv(fds[1], &c, &p) == 9 * 64 + 5);
    CHECK(np_counters_packets(&c) == 10);
    CHECK(np_counters_duplicates(&c) == 1);
    CHECK(np_counters_out_of_order(&c) == 3);
    CHECK(np_counters_lost(&c) == 2);
    CHECK(np_counters_jitter_ms(&c) > 1.0); /* send times 10 ms apart, arrivals not */
    close(fds[0]);
    close(fds[1]);
}

static void test_udp_stream_paced(void)
{
    static struct np_counters tx, rx;
    struct job r = { .c = &rx, .p = params(2048) };
    struct np_params p = params(100);
    pthread_t t;
    int fds[2];

    memset(&tx, 0, sizeof(tx));
    memset(&rx, 0, sizeof(rx));
    udp_pair(fds);
    r.fd = fds[1];
    r.p.max_packets = 2000;
    pthread_create(&t, NULL, udp_recv_job, &r);
    p.max_packets = 2000;
    p.rate_pps = 10000;
    double start = np_monotonic();
    CHECK(np_udp_send(fds[0], &tx, &p) == 2000 * 100);
    start = np_monotonic() - start; /* last datagram due at 0.1999 s */
    CHECK(start >= 0.199 && start < 0.3);
    pthread_join(t, NULL);
    CHECK(r.rc == 2000 * 100);
    CHECK(np_counters_lost(&rx) == 0 && np_counters_out_of_order(&rx) == 0);
    close(fds[0]);
    close(fds[1]);
}

/* The GSO sender into the receiver, with UDP_GRO and without: the same exact counts; with
 * it (where the kernel has it) one read takes a whole 32-datagram message. 2000 datagrams
 * fit the receive buffer before anything reads them, so none may be lost. */
static void test_udp_gro(int gro)
{
    static struct np_counters tx, rx;
    struct np_params p = params(100), r = params(2048);
    int fds[2], on = 0;
    socklen_t len = sizeof(on);

    memset(&tx, 0, sizeof(tx));
    memset(&rx, 0, sizeof(rx));
    udp_pair(fds);
    r.udp_gro = gro;
    r.batch = 1;
    r.max_packets = 0; /* sets the socket up and returns: GRO decides as datagrams arrive */
    CHECK(np_udp_recv(fds[1], &rx, &r) == 0);
    p.max_packets = r.max_packets = 2000;
    CHECK(np_udp_send(fds[0], &tx, &p) == 2000 * 100);
    CHECK(np_udp_recv(fds[1], &rx, &r) == 2000 * 100);
    CHECK(np_counters_packets(&rx) == 2000 && np_counters_lost(&rx) == 0);
    CHECK(np_counters_out_of_order(&rx) == 0 && np_counters_duplicates(&rx) == 0);
    /* 655 datagrams of 100 bytes fit a GSO message, 2000 take 4 messages (or more after a
     * fall-back); every message read is counted, one or many datagrams each. */
    CHECK(np_counters_messages(&tx) >= 4 && np_counters_messages(&tx) <= 2000);
    if (getsockopt(fds[1], IPPROTO_UDP, 104 /* UDP_GRO */, &on, &len) == 0 && on)
        CHECK(gro && np_counters_calls(&rx) <= 2000 / 8 && np_counters_messages(&rx) < 2000);
    else
        CHECK(np_counters_calls(&rx) >= 2000 && np_counters_messages(&rx) == 2000);
    /* Without GSO every message is one datagram, whatever the receiver asks. */
    p = params(100);
    p.udp_gso = 0;
    p.max_packets = r.max_packets = 200;
    memset(&tx, 0, sizeof(tx));
    CHECK(np_udp_send(fds[0], &tx, &p) == 200 * 100);
    CHECK(np_counters_messages(&tx) == 200);
    r.deadline = np_monotonic() + 5.0;
    CHECK(np_udp_recv(fds[1], &rx, &r) == 200 * 100);
    CHECK(np_counters_packets(&rx) == 2200 && np_counters_lost(&rx) == 0);
    close(fds[0]);
    close(fds[1]);
}

/* qemu-user hands back only the first 4 bytes of TCP_INFO (it copies every TCP option
 * out as an int): under that emulation the figures cannot be checked. */
static int tcp_info_truncated(int fd)
{
    unsigned char raw[256];
    socklen_t len = sizeof(raw);

    return getsockopt(fd, IPPROTO_TCP, 11 /* TCP_INFO */, raw, &len) == 0 && len <= 4;
}

/* An old kernel's TCP_INFO is shorter than our struct: 192 bytes on 4.10-4.17 (a 4.14
 * router: no delivered, bytes_sent, bytes_retrans), 104 on 3.x before 3.15 (up to
 * total_retrans). A filter cannot shorten what the kernel returns, so a real socket's bytes
 * are cut to those lengths and read as the core reads a kernel's answer: what lies past the
 * length is unknown (-1), never a zero from the rest of the buffer. */
static void test_short_tcp_info(void)
{
    unsigned char raw[256];
    socklen_t len = sizeof(raw);
    struct np_tcp_info ti;
    int fds[2];

    tcp_pair(fds);
    CHECK(send(fds[0], "hello", 5, 0) == 5);
    usleep(20000);
    CHECK(getsockopt(fds[0], IPPROTO_TCP, 11 /* TCP_INFO */, raw, &len) == 0);
    if (len <= 4) {
        printf("test_core: TCP_INFO truncated to 4 bytes (qemu-user): short forms not checked\n");
    } else {
        memset(raw + 192, 0xab, sizeof(raw) - 192); /* what a short answer leaves behind */
        np_tcp_info_fill(&ti, raw, 192);
        CHECK(ti.retransmits >= 0 && ti.delivery_rate_bps >= 0 && ti.bytes_acked >= 5);
        CHECK(ti.bytes_retrans == -1);
        np_tcp_info_fill(&ti, raw, 104);
        CHECK(ti.retransmits >= 0 && ti.rtt_us >= 0 && ti.snd_cwnd_bytes > 0);
        CHECK(ti.bytes_acked == -1 && ti.delivery_rate_bps == -1 && ti.min_rtt_us == -1);
        np_tcp_info_fill(&ti, raw, 4);
        CHECK(ti.retransmits == -1 && ti.snd_mss_bytes == -1 && ti.snd_cwnd_bytes == -1);
    }
    close(fds[0]);
    close(fds[1]);
}

static void test_system_figures(void)
{
    struct np_tcp_info ti;
    struct np_rusage ru;
    struct np_host_cpu cpu;
    const char *failed = NULL;
    int fds[2];

    tcp_pair(fds);
    CHECK(send(fds[0], "hello", 5, 0) == 5);
    usleep(20000);
    CHECK(np_tcp_info(fds[0], &ti, &failed) == 0);
    if (tcp_info_truncated(fds[0])) {
        printf("test_core: TCP_INFO truncated to 4 bytes (qemu-user): figures not checked\n");
    } else {
        CHECK(ti.snd_mss_bytes > 0 && ti.snd_cwnd_bytes >= ti.snd_mss_bytes);
        CHECK(ti.bytes_acked >= 5 && ti.rtt_us >= 0 && ti.delivery_rate_bps >= 0);
    }
    close(fds[0]);
    close(fds[1]);
    CHECK(np_tcp_info(fds[0], &ti, &failed) == -EBADF);
    CHECK(strcmp(failed, "getsockopt(TCP_INFO)") == 0);
    CHECK(np_rusage(0, &ru, &failed) == 0 && ru.user_s >= 0 && ru.system_s >= 0);
    CHECK(np_rusage(1, &ru, &failed) == 0);
    CHECK(np_host_cpu(&cpu, &failed) == 0 && cpu.user + cpu.system + cpu.idle > 0);
}

static pthread_barrier_t all_allocating;

static void *allocate_while_all_live(void *unused)
{
    /* A thread's first malloc picks (or makes) its arena; volatile and written to, so the
     * compiler cannot drop the malloc/free pair. */
    char *volatile block = malloc(1000);

    (void)unused;
    if (block != NULL)
        block[0] = 1;
    pthread_barrier_wait(&all_allocating);
    free(block);
    return NULL;
}

/* Six threads allocating at once would get six arenas of their own; bounded, they share
 * two. Runs first: the bound holds only for arenas made after it. */
static void test_allocator_arenas(void)
{
    const char *failed = NULL;
    pthread_t threads[6];
    int rc = np_malloc_arena_max(2);
    int arenas;

    CHECK(rc == 1 || rc == 0);
    pthread_barrier_init(&all_allocating, NULL, 6);
    for (int i = 0; i < 6; i++)
        CHECK(pthread_create(&threads[i], NULL, allocate_while_all_live, NULL) == 0);
    for (int i = 0; i < 6; i++)
        pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&all_allocating);
    arenas = np_malloc_arenas(&failed);
    if (rc == 1)
        CHECK(arenas >= 1 && arenas <= 2);
    else
        CHECK(arenas == -ENOSYS && strcmp(failed, "malloc_info") == 0);
    rc = np_malloc_trim();
    CHECK(rc == 0 || rc == 1);
}

/* Data buffers start on a page whatever their size: the block sizes glibc serves from its
 * heap and from mappings of their own (128 KiB and up, 16 bytes into the page) alike. */
static void test_data_buffers_are_page_aligned(void)
{
    static const size_t sizes[] = { 1, 100, 12000, 65536, 196608, 1 << 20 };
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        unsigned char *p = np_alloc_data(sizes[i]);

        CHECK(p != NULL && (uintptr_t)p % page == 0);
        if (p != NULL) {
            memset(p, 0xa5, sizes[i]); /* all of it is usable */
            free(p);
        }
    }
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* sendfile() cannot say MSG_NOSIGNAL; Python ignores it too */
    test_allocator_arenas();
    test_data_buffers_are_page_aligned();
    test_tcp_exact(0);
    test_tcp_exact(1);
    test_stop_unblocks();
    test_errors_name_the_call();
    test_udp_accounting();
    test_udp_stream_paced();
    test_udp_gro(1);
    test_udp_gro(0);
    test_system_figures();
    test_short_tcp_info();
    if (failures) {
        fprintf(stderr, "test_core: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_core: all checks passed\n");
    return 0;
}
