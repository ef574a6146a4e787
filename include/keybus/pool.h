/*
 * The keyed worker pool on its own: `lanes` bounded lock-free rings, each drained
 * by exactly one executor thread for the pool's whole life. Items with the same
 * key go to the same lane (FNV-1a 32 of the key, modulo lanes), so they are
 * handled strictly in submission order; different lanes run in parallel.
 *
 * The pool never copies or frees items: it routes the caller's pointers and hands
 * each back exactly once through `finish`.
 */
#ifndef KEYBUS_POOL_H
#define KEYBUS_POOL_H

#include <keybus/keybus.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kb_pool kb_pool;

/* Handle one item: return KB_HANDLED, KB_RETRY or KB_DEAD (anything else
 * counts as KB_RETRY). `attempt` is 1 on the first call for this
 * item. Runs on the lane's executor thread; never concurrently with another
 * call for that lane. */
typedef int (*kb_pool_handle_fn)(void *item, uint32_t attempt, void *opaque);

/* The item is done with: `outcome` is KB_HANDLED, KB_DEAD (the handler said so
 * or max_attempts ran out; `attempts` tells which) or KB_ECLOSED (the pool was
 * destroyed before the item was handled). Ownership of the item returns to the
 * caller here. Runs on an executor thread, or in kb_pool_destroy. */
typedef void (*kb_pool_finish_fn)(void *item, int outcome, uint32_t attempts, void *opaque);

/* What executors do when their lanes are empty, and what a producer does on a
 * full lane (after the LMAX Disruptor's wait strategies). docs/benchmarks.md
 * has the measured trade-off. */
typedef enum kb_idle {
    KB_IDLE_ADAPTIVE = 0,   /* spin ~50 us, then yield for ~2 ms, then block (default) */
    KB_IDLE_SPIN = 1,       /* busy-poll: lowest latency, burns a CPU per idle executor */
    KB_IDLE_YIELD = 2,      /* sched_yield loop: gives the CPU to runnable threads, still 100% */
    KB_IDLE_BLOCK = 3,      /* block on a futex at once: no idle CPU, a wake-up per burst */
} kb_idle;

/* Who waits while an item waits for its retry (kb_pool_options.retry_scope). */
typedef enum kb_retry_scope {
    /* Only the item's key: later items of that key that reach the lane are
     * set aside in arrival order and run after it, before any newer item of
     * the key; other keys of the lane go on. Set-aside items count against
     * the lane's capacity. Needs `key`; without it the lane waits. */
    KB_RETRY_SCOPE_KEY = 0,
    KB_RETRY_SCOPE_LANE = 1,   /* the whole lane waits (its other keys too) */
} kb_retry_scope;

/* The key of an item, compared byte by byte (NUL is an ordinary byte): its
 * address, valid until the item is finished, and its length in *key_len. Runs
 * on the lane's executor, only while a key of the lane waits for a retry. */
typedef const void *(*kb_pool_key_fn)(const void *item, size_t *key_len, void *opaque);

typedef struct kb_pool_options {
    uint32_t lanes;               /* default 1024 */
    uint32_t threads;             /* executor threads; 0 = automatic (kb_pool_default_threads) */
    uint32_t capacity;            /* items per lane, default 1000 (ring rounded up to 2^n) */
    uint32_t max_attempts;        /* handler calls before KB_DEAD; 0 = retry forever; default 5 */
    uint32_t backoff_ms;          /* first retry delay, doubled each attempt, default 10 */
    uint32_t max_backoff_ms;      /* cap on the retry delay, default 5000 */
    int      single_producer;     /* 1: only one thread at a time calls submit (SPSC rings) */
    uint32_t salt;                /* mixed into the lane -> executor choice */
    kb_idle  idle;                /* default KB_IDLE_ADAPTIVE */
    kb_pool_handle_fn handle;     /* required */
    kb_pool_finish_fn finish;     /* optional */
    void    *opaque;              /* passed to handle, finish and key */
    kb_retry_scope retry_scope;   /* default KB_RETRY_SCOPE_KEY */
    kb_pool_key_fn key;           /* for KB_RETRY_SCOPE_KEY; NULL: the lane waits */
} kb_pool_options;

/* Fill *o with the defaults above (handle/finish NULL). Thread: any. */
KB_EXPORT void kb_pool_options_init(kb_pool_options *o);

/* Executors used for threads = 0: the online CPUs, less one for the
 * publishing thread when executors spin (every strategy but KB_IDLE_BLOCK),
 * so spinning executors and a producer do not share a CPU; at least 1.
 * Thread: any. */
KB_EXPORT uint32_t kb_pool_default_threads(kb_idle idle);

/* Create a pool and start its executors. Lane rings are allocated on first use.
 * KB_EINVAL-class problems are written to errstr; returns NULL on failure.
 * The options are copied. Thread: any. */
KB_EXPORT kb_pool *kb_pool_new(const kb_pool_options *o, char *errstr, size_t errlen);

/* Route `item` by `key` and enqueue it. Waits while the lane is full: up to
 * timeout_ms (0: not at all, < 0: until space or shutdown), then KB_EFULL.
 * KB_ECLOSED after kb_pool_shutdown; KB_EINVAL for a NULL/empty key or NULL item.
 * On any error the item stays the caller's. Thread: any (with single_producer,
 * one thread at a time). */
KB_EXPORT int kb_pool_submit(kb_pool *p, const void *key, size_t key_len, void *item,
                             int timeout_ms);

/* As kb_pool_submit with the key's kb_fnv1a32 already computed. */
KB_EXPORT int kb_pool_submit_hash(kb_pool *p, uint32_t hash, void *item, int timeout_ms);

/* Submit items[0..n) (hashes[i] = kb_fnv1a32 of item i's key), in order.
 * Consecutive items of one lane are pushed together and each lane is
 * scheduled, and each executor woken, at most once per call. On a full lane
 * it waits like kb_pool_submit; *accepted (not NULL) receives how many items
 * were taken, always a prefix: items[*accepted..n) stay the caller's and can
 * be submitted again without loss or reordering. On an executor thread (a
 * handler), a full lane of that same executor gives KB_EFULL at once: it
 * cannot drain while its executor waits. Returns KB_OK when all n
 * were taken, else the error that stopped at item *accepted. Thread: as
 * kb_pool_submit. */
KB_EXPORT int kb_pool_submit_batch(kb_pool *p, const uint32_t *hashes, void *const *items,
                                   size_t n, int timeout_ms, size_t *accepted);

/* Wait until every item submitted before the call is finished. KB_ETIMEDOUT at
 * the deadline (< 0: none). Thread: any but an executor. */
KB_EXPORT int kb_pool_flush(kb_pool *p, int timeout_ms);

/* Stop intake: later submits return KB_ECLOSED and submitters blocked on a full
 * lane wake with KB_ECLOSED. Idempotent. Thread: any. */
KB_EXPORT void kb_pool_shutdown(kb_pool *p);

/* Shut down, handle what is queued until timeout_ms (< 0: no deadline), stop the
 * executors and free the pool; items left unhandled go to finish(KB_ECLOSED).
 * KB_ETIMEDOUT when the deadline cut the drain short. Call once, after every
 * submitting thread has returned from kb_pool_submit; never from a handler. */
KB_EXPORT int kb_pool_destroy(kb_pool *p, int timeout_ms);

/* FNV-1a, 32 bit (offset basis 2166136261, prime 16777619) over `len` bytes;
 * NUL bytes are ordinary bytes. Thread: any. */
KB_EXPORT uint32_t kb_fnv1a32(const void *data, size_t len);

/* Lane a key routes to in this pool: kb_fnv1a32(key) % lanes. Thread: any. */
KB_EXPORT uint32_t kb_pool_lane_of(const kb_pool *p, const void *key, size_t key_len);

/* Executor index that owns `lane` (fixed for the pool's life). Thread: any. */
KB_EXPORT uint32_t kb_pool_executor_of(const kb_pool *p, uint32_t lane);

typedef struct kb_pool_stats {
    uint64_t submitted;       /* items accepted by submit */
    uint64_t handled;         /* finished with KB_HANDLED */
    uint64_t retried;         /* handler results that asked for a retry */
    uint64_t dead;            /* finished with KB_DEAD */
    uint64_t rejected;        /* submits that returned KB_EFULL */
    uint64_t depth;           /* items queued now */
    uint64_t max_depth;       /* deepest any lane has been */
    uint32_t lanes;
    uint32_t lanes_allocated;
    uint32_t threads;
    uint32_t capacity;        /* usable slots per lane */
    uint64_t memory_bytes;    /* lane table plus allocated lanes and their rings */
    uint64_t set_aside;       /* items set aside now behind a key waiting for its retry */
    uint64_t aggregates_waiting;  /* keys waiting for a retry now (KB_RETRY_SCOPE_KEY) */
} kb_pool_stats;

/* Snapshot of the counters (each read atomically, not all at one instant).
 * Thread: any. */
KB_EXPORT void kb_pool_stats_get(const kb_pool *p, kb_pool_stats *out);

typedef struct kb_lane_stats {
    uint64_t submitted, handled, retried, dead;
    uint32_t depth, max_depth;
    uint32_t executor;
    int      allocated;       /* 1 when the lane's ring exists */
    uint32_t set_aside, aggregates_waiting;   /* as in kb_pool_stats */
} kb_lane_stats;

/* Counters of one lane; KB_EINVAL when lane >= lanes. Thread: any. */
KB_EXPORT int kb_pool_lane_stats(const kb_pool *p, uint32_t lane, kb_lane_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* KEYBUS_POOL_H */
