/* Internal structures of the keyed pool and its executors. */
#ifndef KB_CORE_POOL_INT_H
#define KB_CORE_POOL_INT_H

#ifndef _LGPL_SOURCE
#define _LGPL_SOURCE   /* inline liburcu queue operations */
#endif
#include <ck_ring.h>
#include <pthread.h>
#include <stdbool.h>
#include <urcu/wfcqueue.h>

#include <keybus/pool.h>

#include "pool_calls.h"
#include "ring.h"
#include "sync.h"

struct kb_executor;
struct kb_parked;
struct kb_waiting;

#define KB_LANE_LOOKAHEAD 16   /* a power of two: the look-ahead is a circular buffer */

/* One lane: a bounded ring of item pointers drained by exactly one executor.
 * Allocated (with its ring) the first time a key routes to it. */
struct kb_lane {
    ck_ring_t ring;                    /* ck pads consumer and producer counters apart */
    ck_ring_buffer_t *buf;
    kb_pool *pool;
    struct kb_executor *ex;
    uint32_t index;

    /* Written by producers and the executor. */
    _Alignas(KB_CACHELINE) _Atomic uint32_t scheduled;  /* in a ready queue, running or delayed */
    kb_ring_seen seen;                 /* the consumer's side as producers last read it */
    kb_signal space;                   /* producers waiting on a full ring */

    /* Written by the executor only (read by stats and flush). */
    _Alignas(KB_CACHELINE) struct cds_wfcq_node ready_node;
    struct kb_lane *run_next;          /* executor's private run list */
    struct kb_lane *recheck_next;      /* executor's lists of lanes just unscheduled */
    bool rechecking;                   /* on one of them */
    uint8_t recheck_looks;             /* cheap looks it had there */
    struct kb_lane **fenced_pprev;     /* past its looks: what points to it, to unlink it */
    _Atomic uint32_t done;             /* items finished, wraps like the ring counters */
    _Atomic uint32_t max_depth;        /* deepest the ring was (with the items held) at a refill */
    _Atomic uint64_t taken, handled, retried, dead;
    /* Items taken off the ring but not finished, in order from ahead_head
     * (circular): the executor pops a few at once and prefetches them, and a
     * head item waiting for its retry stays here with everything popped
     * behind it. */
    void    *ahead[KB_LANE_LOOKAHEAD];
    uint8_t  ahead_head, ahead_len;
    uint8_t  idle_visits;              /* consecutive visits that found nothing */
    uint32_t attempt;                  /* attempt number of ahead[ahead_head] */
    int64_t  due_ns;                   /* when a delayed lane may run again */
    /* retry.scope = key: aggregates waiting for a retry and the events set
     * aside behind them (parked.h); allocated at the lane's first such retry. */
    struct kb_parked *parked;
    uint32_t waiting;                  /* aggregates waiting now (executor's copy) */
    bool held_up;                      /* no room to set an event aside: waits for some */
    _Atomic uint32_t waiting_seen;     /* `waiting`, for stats */
};

/* Something due at a time: a delayed lane (w NULL) or an aggregate waiting
 * for its retry. */
struct kb_timer {
    int64_t due_ns;
    struct kb_lane *lane;
    struct kb_waiting *w;
};

struct kb_executor {
    struct __cds_wfcq_head head;       /* consumer end: this executor only */
    kb_sched *sched;
    uint32_t index;
    kb_thread *thread;
    struct kb_lane *run_head, *run_tail;  /* lanes to visit, in order */
    uint32_t run_len;                  /* lanes on the run list */
    uint32_t round_visits, round_items;  /* lane visits and items handled this round */
    struct kb_lane *rechecking;        /* unscheduled, not yet re-checked after a barrier */
    struct kb_lane *fence_only;        /* those past their cheap looks: the barrier's only */
    int64_t recheck_due_ns;            /* when they must be re-checked at the latest */
    uint32_t recheck_visits;           /* lane visits, to pace looking at the clock */
    uint32_t blocked_passes;           /* passes in a row stuck on a half-linked ready node */
    struct kb_timer *heap;             /* delayed lanes and waiting aggregates, min-heap */
    size_t heap_len, heap_cap;
    uint64_t rng;                      /* retry jitter */

    _Alignas(KB_CACHELINE) struct cds_wfcq_tail tail;  /* producers exchange here */
    _Alignas(KB_CACHELINE) kb_signal wake;              /* parked while idle */
};

struct kb_sched {
    uint32_t n;
    kb_idle idle;
    struct kb_executor *ex;
    _Atomic uint32_t stop;
    kb_signal progress;                /* items finished: flush and drain wait on it */
};

/* A multi-producer pool fed by one thread so far pushes without a CAS: the
 * first submitting thread owns it until another one submits; that one turns
 * the pool shared, for good, once the owner is out of its push. */
enum { KB_OWNED = 0, KB_SHARING = 1, KB_SHARED = 2 };

struct kb_pool {
    kb_pool_options o;
    uint32_t ring_size;                /* power of two > capacity */
    bool lanes_pow2;                   /* lanes is a power of two: route with a mask */
    kb_sched *sched;
    bool own_sched;
    _Atomic uint32_t closed;
    _Atomic uint32_t lanes_allocated;
    _Atomic uint64_t rejected;
    _Atomic(struct kb_lane *) *lanes;
    bool skip_ok;                      /* a bus's pool: KB_POOL_SKIP means give back */
    _Atomic uintptr_t owner;           /* the owning thread's token; 0: none yet */
    _Atomic uint32_t sharing;          /* KB_OWNED, KB_SHARING, KB_SHARED */
    _Alignas(KB_CACHELINE) _Atomic uint32_t owner_busy;   /* the owner is pushing */
};

/* Executors (executor.c). */
/* The executor this thread is (NULL on other threads): handlers run here. */
extern _Thread_local struct kb_executor *kb__on_executor;
/* Put a lane that just became non-empty on its executor's ready queue; the
 * caller then wakes the executor (a fence and kb__signal_poke of its `wake`). */
void kb__lane_ready(struct kb_lane *lane);

/* Pools on a shared scheduler (pool.c). */
uint32_t kb__online_cpus(void);   /* the default executor count */

static inline void kb__counter_bump(_Atomic uint64_t *c)
{
    /* single writer: a plain load and store, no locked instruction */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

#endif /* KB_CORE_POOL_INT_H */
