/* keybus-contract's checks and its target: a failed check ends the case
 * (longjmp back to the runner) with its file, line and why; a case may
 * also end skipped, saying why. Only the runner's thread checks: other
 * threads of a case record what they saw for it to check. No test
 * framework is needed, so the program installs with the library alone. */
#ifndef KB_CONTRACT_CHECK_H
#define KB_CONTRACT_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <keybus/transport.h>

/* What the suite runs against, set by the runner before the first case. */
typedef struct kc_target {
    const char *url;                 /* the `transport` URL */
    const char *plugin;              /* the shared object to load, or NULL (built in) */
    const kb_transport_ops *ops;     /* its table: which optional hooks it has */
    const char *const *settings;     /* -X key, value pairs: every bus of the suite */
    size_t n_settings;
    const char *const *crash_settings;   /* -K pairs: the consumers of the crash case */
    size_t n_crash_settings;
    char *const *child_argv;         /* the runner's options, for its child processes */
} kc_target;

extern const kc_target *kc;

/* A case: its name and body. */
typedef struct kc_case {
    const char *name;
    void (*run)(void);
} kc_case;

extern const kc_case kc_cases[];
extern const size_t kc_n_cases;

/* Run one case on this thread, printing its outcome: KC_PASSED, KC_FAILED or
 * KC_SKIPPED. */
enum { KC_PASSED, KC_FAILED, KC_SKIPPED };
int kc_run_case(const kc_case *c);

/* The crash case's consumer process: `keybus-contract --child TOPIC LOG MODE
 * OPTIONS... URL` (the runner parsed OPTIONS into kc). Its exit status. */
int kc_child_main(const char *topic, const char *log, const char *mode);

#if defined(__GNUC__)
#define KC_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KC_PRINTF(f, a)
#endif

/* End the case as failed (at file:line) or skipped; say something meanwhile. */
_Noreturn void kc_fail_at(const char *file, int line, const char *fmt, ...) KC_PRINTF(3, 4);
_Noreturn void kc_skip(const char *fmt, ...) KC_PRINTF(1, 2);
void kc_note(const char *fmt, ...) KC_PRINTF(1, 2);

/* Fail unless a == b (as integers), printing both. */
void kc_check_eq(long long a, long long b, const char *as, const char *bs, const char *file,
                 int line);
/* Fail unless rc is KB_OK, printing the call, the code's name and kb_last_error(). */
void kc_check_ok(int rc, const char *call, const char *file, int line);
void kc_check_str(const char *a, const char *b, const char *as, const char *bs,
                  const char *file, int line);

#define kc_fail(...) kc_fail_at(__FILE__, __LINE__, __VA_ARGS__)
#define kc_true(c) ((c) ? (void)0 : kc_fail_at(__FILE__, __LINE__, "%s is false", #c))
#define kc_eq(a, b) kc_check_eq((long long)(a), (long long)(b), #a, #b, __FILE__, __LINE__)
#define kc_ok(call) kc_check_ok((call), #call, __FILE__, __LINE__)
#define kc_str_eq(a, b) kc_check_str((a), (b), #a, #b, __FILE__, __LINE__)
#define kc_not_null(p) kc_true((p) != NULL)

/* Wait until `cond` holds, looking every millisecond, up to timeout_ms; then
 * fail naming `what` and the condition. */
int64_t kc_deadline(int timeout_ms);
int kc_waited_out(int64_t deadline_ns);   /* sleeps a millisecond; 1 once past the deadline */
#define kc_wait_until(cond, timeout_ms, what)                                           \
    do {                                                                                \
        int64_t kc_deadline_ = kc_deadline((timeout_ms));                                \
        while (!(cond))                                                                 \
            if (kc_waited_out(kc_deadline_))                                            \
                kc_fail_at(__FILE__, __LINE__, "%s: still not (%s) after %d ms", (what), \
                           #cond, (timeout_ms));                                        \
    } while (0)

#endif /* KB_CONTRACT_CHECK_H */
