#include "sync.h"

#include <errno.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef KB_TSAN
_Atomic uint32_t kb__fence_word;
#endif

_Atomic int kb__asym_ok;
static pthread_once_t asym_once = PTHREAD_ONCE_INIT;

static void asym_register(void)
{
    /* Registered once per process; a kernel or sandbox without it leaves the
     * symmetric fences in place. */
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
        atomic_store(&kb__asym_ok, 1);
}

void kb__asym_init(void)
{
    pthread_once(&asym_once, asym_register);
}

void kb__fence_rare(void)
{
    if (atomic_load_explicit(&kb__asym_ok, memory_order_acquire))
        syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    else
        kb__fence();
}

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
    /* Dekker with kb__signal_poke: pokers that paid only kb__fence_hot() must
     * see our registration if we miss their change. */
    if (s->hot_pokers)
        kb__fence_rare();
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

/* The SDK's clock and signal: the same code the core uses. */
int64_t kb_now_ns(void)
{
    return kb__now_ns();
}

int64_t kb_deadline_ns(int timeout_ms)
{
    return kb__deadline_ns(timeout_ms);
}

int kb_deadline_left_ms(int64_t deadline_ns)
{
    if (deadline_ns == INT64_MAX)
        return -1;
    int64_t left = deadline_ns - kb__now_ns();
    if (left <= 0)
        return 0;
    int64_t ms = (left + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

kb_signal *kb_signal_new(void)
{
    return calloc(1, sizeof(kb_signal));
}

void kb_signal_free(kb_signal *s)
{
    if (s != NULL && atomic_load(&s->efd) > 0)
        close(atomic_load(&s->efd) - 1);
    free(s);
}

void kb_signal_notify(kb_signal *s)
{
    /* read before the wake-up: a waiter it wakes may free s at once (its
     * condition was published before this call). A descriptor made after
     * this read misses this write, but its poller checks its condition
     * after making it (kb_signal_fd). */
    int efd = atomic_load_explicit(&s->efd, memory_order_acquire);
    kb__signal_notify(s);
    if (efd > 0) {
        /* after the futex side: the change is published, a poller re-checks
         * it once the descriptor is readable; a counter at its maximum
         * (EAGAIN) is readable already */
        uint64_t one = 1;
        ssize_t w = write(efd - 1, &one, sizeof one);
        (void)w;
    }
}

int kb_signal_fd(kb_signal *s)
{
    int efd = atomic_load_explicit(&s->efd, memory_order_acquire);
    if (efd > 0)
        return efd - 1;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
        kb_errf(NULL, 0, "kb_signal_fd: eventfd: %s", strerror(errno));
        return KB_ENOMEM;
    }
    int none = 0;
    if (!atomic_compare_exchange_strong(&s->efd, &none, fd + 1)) {
        close(fd);   /* another thread made it first */
        return none - 1;
    }
    return fd;
}

int kb_signal_wait(kb_signal *s, int (*ready)(void *arg), void *arg, int64_t deadline_ns)
{
    return kb__signal_wait(s, ready, arg, deadline_ns);
}
