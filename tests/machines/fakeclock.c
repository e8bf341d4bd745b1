/* A machine whose clock is wrong, for one process tree: LD_PRELOAD this library and set
 * FAKECLOCK_OFFSET_S; CLOCK_REALTIME (clock_gettime, gettimeofday, time) reads that many
 * seconds off. Monotonic clocks are untouched, as on a real machine with a wrong clock.
 * Built by tests/machines/clock.py with the system C compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long offset_s(void) {
    static long off;
    static int done;
    if (!done) {
        const char *s = getenv("FAKECLOCK_OFFSET_S");
        off = s ? atol(s) : 0;
        done = 1;
    }
    return off;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset_s();
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    static int (*real)(struct timeval *, void *);
    if (!real) real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    int r = real(tv, tz);
    if (r == 0 && tv) tv->tv_sec += offset_s();
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
