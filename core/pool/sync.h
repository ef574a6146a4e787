/* Small synchronisation helpers shared by the core: monotonic time, futex
 * parking, and the ThreadSanitizer annotations that describe the happens-before
 * edges concurrencykit and liburcu create with inline assembly TSan cannot see. */
#ifndef KB_CORE_SYNC_H
#define KB_CORE_SYNC_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include <keybus/transport.h>

#if defined(__SANITIZE_THREAD__)
#define KB_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KB_TSAN 1
#endif
#endif

#ifdef KB_TSAN
#include <sanitizer/tsan_interface.h>
#define KB_TSAN_RELEASE(addr) __tsan_release((void *)(addr))
#define KB_TSAN_ACQUIRE(addr) __tsan_acquire((void *)(addr))
#else
#define KB_TSAN_RELEASE(addr) ((void)0)
#define KB_TSAN_ACQUIRE(addr) ((void)0)
#endif

#define KB_CACHELINE 64

/* Full (store-load) fence for the Dekker pairs between producers and
 * executors. GCC refuses atomic_thread_fence under -fsanitize=thread, so TSan
 * builds use a locked read-modify-write, which is a full barrier on x86. */
#ifdef KB_TSAN
extern _Atomic uint32_t kb__fence_word;
static inline void kb__fence(void)
{
    atomic_fetch_add_explicit(&kb__fence_word, 0, memory_order_seq_cst);
}
#else
static inline void kb__fence(void)
{
    atomic_thread_fence(memory_order_seq_cst);
}
#endif

/* Asymmetric fences, for Dekker pairs whose one side runs per event and the
 * other rarely (an executor poking waiters after every lane visit; a waiter
 * registering on a kb_signal): the hot side orders with a compiler barrier
 * and the rare side calls membarrier(2), which runs a full barrier on every
 * CPU running this process's threads. Where membarrier is missing both sides
 * use kb__fence(). kb__asym_init runs before the first executor starts. */
extern _Atomic int kb__asym_ok;
void kb__asym_init(void);
void kb__fence_rare(void);

static inline void kb__fence_hot(void)
{
    if (atomic_load_explicit(&kb__asym_ok, memory_order_relaxed))
        atomic_signal_fence(memory_order_seq_cst);
    else
        kb__fence();
}

static inline int64_t kb__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);   /* vDSO: no syscall */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Deadline `timeout_ms` from now; INT64_MAX for a negative timeout (none). */
static inline int64_t kb__deadline_ns(int timeout_ms)
{
    return timeout_ms < 0 ? INT64_MAX : kb__now_ns() + (int64_t)timeout_ms * 1000000LL;
}

/* Block while *word == expected, until woken or `deadline_ns` (INT64_MAX: no
 * deadline) passes. Spurious returns are allowed; callers re-check. */
void kb__park_wait(_Atomic uint32_t *word, uint32_t expected, int64_t deadline_ns);

/* Wake up to `n` threads blocked on word (INT32_MAX: all). */
void kb__park_wake(_Atomic uint32_t *word, int n);

/* A futex-backed "something changed" signal for slow-path waiters (flush,
 * drain, full lanes): waiters register, so the fast path only pays a load. */
typedef struct kb_signal {
    _Atomic uint32_t seq;
    _Atomic uint32_t waiters;
    uint32_t hot_pokers;   /* 1: pokers fence with kb__fence_hot(), waiters pay the rest */
    _Atomic int efd;       /* kb_signal_fd's eventfd + 1 (0: none); only the SDK's
                            * kb_signal_notify writes it */
} kb_signal;

/* Wake the waiters, if any. The caller has already issued a fence after
 * publishing its change, kb__fence_hot() at least: waiters pay the rest
 * (several pokes may share one fence). */
static inline void kb__signal_poke(kb_signal *s)
{
    if (atomic_load_explicit(&s->waiters, memory_order_relaxed) != 0) {
        atomic_fetch_add_explicit(&s->seq, 1, memory_order_release);
        kb__park_wake(&s->seq, INT32_MAX);
    }
}

/* Call after publishing the change the waiters look for. */
static inline void kb__signal_notify(kb_signal *s)
{
    /* Dekker pairing with kb__signal_wait: the change must be visible before we
     * read `waiters`, or a waiter that registered just now could sleep on it. */
    kb__fence();
    kb__signal_poke(s);
}

/* Wait until ready(arg) is true or the deadline passes; returns ready's last
 * value. `ready` is re-evaluated after every notify. */
int kb__signal_wait(kb_signal *s, int (*ready)(void *arg), void *arg, int64_t deadline_ns);

#endif /* KB_CORE_SYNC_H */
