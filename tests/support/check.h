/* Assertions that say why they failed: a keybus call that must succeed
 * (its text, its code and kb_last_error() on failure), and a wait for a
 * condition up to a deadline instead of a polling loop that ends silently
 * and leaves the next assertion to guess. Include after <cmocka.h>. */
#ifndef KB_TEST_CHECK_H
#define KB_TEST_CHECK_H

#include <stdint.h>

#include <keybus/keybus.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Fail the test unless `call` (any int-valued expression, mostly a kb_*
 * call) is KB_OK, printing the call's text, the code's name and
 * kb_last_error() of this thread. */
#define kb_assert_ok(call) kb_test_assert_ok((call), #call, __FILE__, __LINE__)
void kb_test_assert_ok(int rc, const char *call, const char *file, int line);

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

/* The monotonic clock `timeout_ms` from now, in ns. */
int64_t kb_test_deadline(int timeout_ms);
/* Sleep a millisecond, or fail the test once the deadline has passed. */
void kb_test_wait_step(int64_t deadline_ns, int timeout_ms, const char *cond, const char *file,
                       int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* KB_TEST_CHECK_H */
