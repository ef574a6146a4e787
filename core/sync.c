#include "sync.h"

#include <errno.h>
#include <linux/futex.h>
#include <limits.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef KB_TSAN
_Atomic uint32_t kb__fence_word;
#endif

void kb__park_wait(_Atomic uint32_t *word, uint32_t expected, int64_t deadline_ns)
{
    struct timespec ts, *tsp = NULL;
    if (deadline_ns != INT64_MAX) {
        int64_t left = deadline_ns - kb__now_ns();
        if (left <= 0)
            return;
        ts.tv_sec = left / 1000000000LL;
        ts.tv_nsec = left % 1000000000LL;
        tsp = &ts;
    }
    /* Relative timeout on CLOCK_MONOTONIC (FUTEX_WAIT's default). EINTR and
     * EAGAIN just return: every caller loops and re-checks its condition. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, tsp, NULL, 0);
}

void kb__park_wake(_Atomic uint32_t *word, int n)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

int kb__signal_wait(kb_signal *s, int (*ready)(void *arg), void *arg, int64_t deadline_ns)
{
    int ok = ready(arg);
    if (ok)
        return ok;
    atomic_fetch_add_explicit(&s->waiters, 1, memory_order_seq_cst);
    for (;;) {
        uint32_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        ok = ready(arg);
        if (ok || kb__now_ns() >= deadline_ns)
            break;
        kb__park_wait(&s->seq, seq, deadline_ns);
    }
    atomic_fetch_sub_explicit(&s->waiters, 1, memory_order_relaxed);
    return ok;
}
