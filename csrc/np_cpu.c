/* np_cpu.c: CPU cost: this process's or thread's rusage, and the host's /proc/stat. */
#include "np_common.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

/* Same arithmetic as Python's resource module, so both data paths agree to the bit. */
static double seconds(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec * 0.000001;
}

int np_rusage(int thread_scope, struct np_rusage *out, const char **failed_call)
{
    struct rusage ru;

    if (getrusage(thread_scope ? RUSAGE_THREAD : RUSAGE_SELF, &ru) < 0) {
        *failed_call = "getrusage";
        return -errno;
    }
    out->user_s = seconds(ru.ru_utime);
    out->system_s = seconds(ru.ru_stime);
    return 0;
}

/* Reads the first line of /proc/stat without stdio buffering surprises. */
static int read_first_line(char *buf, size_t size, const char **failed_call)
{
    ssize_t n;
    int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        *failed_call = "open(/proc/stat)";
        return -errno;
    }
    do
        n = read(fd, buf, size - 1);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        int err = errno;
        close(fd);
        *failed_call = "read(/proc/stat)";
        return -err;
    }
    close(fd);
    buf[n] = '\0';
    return 0;
}

int np_host_cpu(struct np_host_cpu *out, const char **failed_call)
{
    char line[512];
    int rc = read_first_line(line, sizeof(line), failed_call);

    if (rc < 0)
        return rc;
    memset(out, 0, sizeof(*out));
    /* Fields a kernel lacks (iowait before 2.6, steal before 2.6.11) stay 0. */
    if (sscanf(line, "cpu %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                     " %" SCNu64 " %" SCNu64 " %" SCNu64,
               &out->user, &out->nice, &out->system, &out->idle, &out->iowait, &out->irq,
               &out->softirq, &out->steal) < 4) {
        *failed_call = "read(/proc/stat)";
        return -EIO;
    }
    return 0;
}
