#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

void kb_test_assert_ok(int rc, const char *call, const char *file, int line)
{
    if (rc == KB_OK)
        return;
    print_error("%s\n  returned %d (%s): %s\n", call, rc, kb_strerror(rc), kb_last_error());
    _fail(file, line);
}

int64_t kb_test_deadline(int timeout_ms)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec + (int64_t)timeout_ms * 1000000;
}

void kb_test_wait_step(int64_t deadline_ns, int timeout_ms, const char *cond, const char *file,
                       int line, const char *fmt, ...)
{
    if (kb_test_deadline(0) < deadline_ns) {
        usleep(1000);
        return;
    }
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    print_error("%s: still not (%s) after %d ms\n", why, cond, timeout_ms);
    _fail(file, line);
}
