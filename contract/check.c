/* keybus-contract's checks (check.h): a failed or skipped check ends its case
 * with a longjmp back to kc_run_case, which prints the outcome. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <keybus/keybus.h>

#include "check.h"

const kc_target *kc;

static jmp_buf case_end;
static char case_why[1024];

static void vsay(const char *prefix, const char *fmt, va_list ap)
{
    int o = snprintf(case_why, sizeof case_why, "%s", prefix);
    vsnprintf(case_why + o, sizeof case_why - (size_t)o, fmt, ap);
}

_Noreturn void kc_fail_at(const char *file, int line, const char *fmt, ...)
{
    char where[256];
    const char *base = strrchr(file, '/');
    snprintf(where, sizeof where, "%s:%d: ", base != NULL ? base + 1 : file, line);
    va_list ap;
    va_start(ap, fmt);
    vsay(where, fmt, ap);
    va_end(ap);
    longjmp(case_end, KC_FAILED);
}

_Noreturn void kc_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay("", fmt, ap);
    va_end(ap);
    longjmp(case_end, KC_SKIPPED);
}

void kc_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("             ", stdout);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void kc_check_eq(long long a, long long b, const char *as, const char *bs, const char *file,
                 int line)
{
    if (a != b)
        kc_fail_at(file, line, "%s == %s: %lld != %lld", as, bs, a, b);
}

void kc_check_ok(int rc, const char *call, const char *file, int line)
{
    if (rc != KB_OK)
        kc_fail_at(file, line, "%s returned %d (%s): %s", call, rc, kb_strerror(rc),
                   kb_last_error());
}

void kc_check_str(const char *a, const char *b, const char *as, const char *bs,
                  const char *file, int line)
{
    if (a == NULL || b == NULL || strcmp(a, b) != 0)
        kc_fail_at(file, line, "%s == %s: \"%s\" != \"%s\"", as, bs, a ? a : "(null)",
                   b ? b : "(null)");
}

int64_t kc_deadline(int timeout_ms)
{
    return kb_deadline_ns(timeout_ms);
}

int kc_waited_out(int64_t deadline_ns)
{
    if (kb_now_ns() >= deadline_ns)
        return 1;
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
    return 0;
}

int kc_run_case(const kc_case *c)
{
    /* volatile: read after the longjmp */
    volatile int64_t start = kb_now_ns();
    printf("[ RUN      ] %s\n", c->name);
    fflush(stdout);
    int outcome = setjmp(case_end);
    if (outcome == 0) {
        c->run();
        outcome = KC_PASSED;
    }
    double s = (double)(kb_now_ns() - start) / 1e9;
    if (outcome == KC_PASSED)
        printf("[       OK ] %s (%.1f s)\n", c->name, s);
    else if (outcome == KC_SKIPPED)
        printf("[  SKIPPED ] %s: %s\n", c->name, case_why);
    else
        printf("[   FAILED ] %s (%.1f s): %s\n", c->name, s, case_why);
    fflush(stdout);
    return outcome;
}

