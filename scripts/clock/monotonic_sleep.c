/*
 * Loaded before Debian's libfaketime (0.9.10) by `make test-clock`.
 *
 * With FAKETIME_DONT_FAKE_MONOTONIC=1, libfaketime 0.9.10 still shifts the deadline of an
 * absolute clock_nanosleep() on CLOCK_MONOTONIC by the fake offset. With a forward offset the
 * kernel gets a negative time and answers EINVAL, which is every time.sleep() of Python 3.11
 * and later (libfaketime issue #426, "--exclude-monotonic broken with clock_nanosleep() and
 * TIMER_ABSTIME"). The monotonic clock is not faked in that mode, so its sleeps go to the
 * kernel unchanged here; every other clock goes on to libfaketime, which shifts it as it should.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_nanosleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *request,
                    struct timespec *remain) {
    if (clock_id == CLOCK_MONOTONIC || clock_id == CLOCK_BOOTTIME) {
        /* clock_nanosleep() returns the error number itself, not -1 with errno. */
        return syscall(SYS_clock_nanosleep, clock_id, flags, request, remain) == 0 ? 0 : errno;
    }
    static clock_nanosleep_fn next;
    if (next == NULL) {
        next = (clock_nanosleep_fn)dlsym(RTLD_NEXT, "clock_nanosleep");
    }
    return next(clock_id, flags, request, remain);
}
