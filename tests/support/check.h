/* Assertions that say why they failed: a keybus call that must succeed
 * (its text, its code and kb_last_error() on failure), and a wait for a
 * condition up to a deadline instead of a polling loop that ends silently
 * and leaves the next assertion to guess. */
#ifndef KB_TEST_CHECK_H
#define KB_TEST_CHECK_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

/* Fail the test unless `call` (any int-valued expression, mostly a kb_*
 * call) is KB_OK, printing the call's text, the code's name and
 * kb_last_error() of this thread. */
#define kb_assert_ok(call) kb_test_assert_ok((call), #call, __FILE__, __LINE__)

/* Wait until `cond` holds, looking every millisecond, for up to timeout_ms;
 * then fail the test with the printf-style message, the condition's text
 * and how long it waited. */
#define kb_wait_until(cond, timeout_ms, ...)                                             \
    do {                                                                                 \
        int64_t kb_wait_until_deadline_ = kb_test_deadline((timeout_ms));                  \
        while (!(cond))                                                                  \
            kb_test_wait_step(kb_wait_until_deadline_, (timeout_ms), #cond, __FILE__,     \
                              __LINE__, __VA_ARGS__);                                    \
    } while (0)

/* Header-only, so that every test program can use it, the ones linked with
 * libkeybus.so instead of the support library too. */
static inline void kb_test_assert_ok(int rc, const char *call, const char *file, int line)
{
    if (rc == KB_OK)
        return;
    print_error("%s\n  returned %d (%s): %s\n", call, rc, kb_strerror(rc), kb_last_error());
    _fail(file, line);
}

/* The monotonic clock `timeout_ms` from now, in ns. */
static inline int64_t kb_test_deadline(int timeout_ms)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec + (int64_t)timeout_ms * 1000000;
}

/* Sleep a millisecond, or fail the test once the deadline has passed. */
static inline
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    void kb_test_wait_step(int64_t deadline_ns, int timeout_ms, const char *cond,
                           const char *file, int line, const char *fmt, ...)
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

#endif /* KB_TEST_CHECK_H */
