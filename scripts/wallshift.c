/* An LD_PRELOAD library that moves the wall clock (CLOCK_REALTIME and its coarse variant,
 * gettimeofday, time) by WALLSHIFT_S seconds and leaves every other clock alone, for running
 * tests at a chosen time of day (scripts/test_at_time.sh).
 *
 * Why not libfaketime: its 0.9.10 (Debian 12) breaks Python's waits either way: with the
 * monotonic clock faked, threading.Event.wait hangs; with it left alone, time.sleep fails with
 * EINVAL. Sleeps and timed waits here run on the real monotonic clock, as they should.
 * Programs that read the clock without a dynamic libc keep the real time: Go binaries such as
 * prometheus, chDB's engine, and ki-agent (static-pie). Tests that query what those wrote at
 * "now" fail under any shift (test_api_write_auth's and test_remote_write_histograms_prometheus'
 * Prometheus, test_rules_e2e's agent, also at a plain one-hour shift): not a day boundary.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static long shift;
static int shift_set;

static long shift_s(void) {
    if (!shift_set) {
        const char *text = getenv("WALLSHIFT_S");
        shift = text != NULL ? strtol(text, NULL, 10) : 0;
        shift_set = 1;
    }
    return shift;
}

static clock_gettime_fn real_clock_gettime(void) {
    static clock_gettime_fn real;
    if (real == NULL) {
        *(void **)&real = dlsym(RTLD_NEXT, "clock_gettime");
    }
    return real;
}

/* Moves the wall clock so that it reads target_s now (scripts/wallshift_plugin.py calls it when
 * pytest starts collecting: a loaded machine takes 10-20 s to get there, and the test modules'
 * "now"s are what must fall at the chosen time). */
void wallshift_to(long long target_s);

void wallshift_to(long long target_s) {
    struct timespec now;
    if (real_clock_gettime()(CLOCK_REALTIME, &now) == 0) {
        shift = (long)(target_s - now.tv_sec);
        shift_set = 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = real_clock_gettime()(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        ts->tv_sec += shift_s();
    }
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return -1;
    }
    tv->tv_sec = ts.tv_sec; /* glibc declares tv nonnull */
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
