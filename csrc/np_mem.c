/* np_mem.c: the C allocator's footprint in a long-running process.
 *
 * glibc gives threads their own malloc arenas (up to 8 a core) and keeps what they freed
 * for reuse: a server that runs every test on new threads grew test after test. musl and
 * other C libraries have no arenas: there these calls do nothing and say so. */
#include "np_common.h"

#include <stdio.h>
#include <stdlib.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

int np_malloc_arena_max(int count)
{
#if defined(__GLIBC__) && defined(M_ARENA_MAX)
    /* Holds for arenas made from now on: call it before threads allocate. */
    return mallopt(M_ARENA_MAX, count) == 1 ? 1 : -EINVAL;
#else
    (void)count;
    return 0;
#endif
}

int np_malloc_trim(void)
{
#if defined(__GLIBC__)
    return malloc_trim(0);
#else
    return 0;
#endif
}

int np_malloc_arenas(const char **failed_call)
{
#if defined(__GLIBC__)
    /* malloc_info() writes one <heap nr="N"> element per arena; there is no other way
     * to read their number back. */
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    int count = 0;

    if (out == NULL) {
        *failed_call = "open_memstream";
        return -errno;
    }
    if (malloc_info(0, out) != 0) {
        int err = errno;

        fclose(out);
        free(text);
        *failed_call = "malloc_info";
        return -err;
    }
    fclose(out);
    for (const char *p = text; (p = strstr(p, "<heap nr=")) != NULL; p++)
        count++;
    free(text);
    return count;
#else
    *failed_call = "malloc_info";
    return -ENOSYS;
#endif
}
