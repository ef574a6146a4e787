/* Thin wrappers over ck_ring: the lane's ring holds item pointers. The
 * single-producer form is used when one thread feeds the pool (a broker
 * consumer loop), the multi-producer form when application threads do. */
#ifndef KB_CORE_RING_H
#define KB_CORE_RING_H

#include <ck_ring.h>
#include <stdbool.h>

#include "sync.h"

/* What producers know of the consumer's side. `held` counts items the
 * executor took off the ring but still keeps (set aside while their key waits
 * for a retry): they count against the ring's room, so a lane's set-aside
 * events and queued ones together stay within its capacity. The executor
 * writes `held` only when it changes, so in steady state nothing here is
 * written by the consumer. */
typedef struct kb_ring_seen {
    _Atomic unsigned int consumed;   /* c_head less held, as producers last read them */
    _Atomic unsigned int held;
} kb_ring_seen;

/* The consumer's position as producers last read it, refreshed only when the
 * ring looks too full for n more: c_head sits on the executor's cache line, and
 * reading it on every push would pull that line back and forth per event.
 * c_head - held only grows (taking an item raises c_head, setting it aside
 * raises both, finishing it lowers held), so an old value only underestimates
 * the room; c_head is read first, so the value never passes c_head itself.
 * Between the executor's pop and its count of the items it set aside, the
 * room may be overestimated by those few (at most KB_LANE_LOOKAHEAD). */
static inline unsigned int kb__ring_consumed(const ck_ring_t *ring, kb_ring_seen *seen,
                                             unsigned int head, unsigned int n)
{
    unsigned int c = atomic_load_explicit(&seen->consumed, memory_order_relaxed);
    if (head - c + n <= ring->mask)
        return c;
    c = ck_pr_load_uint(&ring->c_head);
    c -= atomic_load_explicit(&seen->held, memory_order_acquire);
    atomic_store_explicit(&seen->consumed, c, memory_order_relaxed);
    return c;
}

/* Who may push at the same time. */
typedef enum {
    KB_PUSH_SPSC,    /* one producer for the ring's life: ck's single-producer form (p_tail only) */
    KB_PUSH_OWNER,   /* one producer now, others maybe later: p_head kept, without a CAS */
    KB_PUSH_MPSC,    /* any number: a CAS on p_head reserves the slots */
} kb_push_mode;

/* Enqueue up to n items with one reservation (ck_ring 0.7 has no batch
 * enqueue; this follows its _ck_ring_enqueue_mp over ck_ring's own fields): a
 * single CAS — or none with one producer — and one p_tail store for the run,
 * where n single enqueues would pay n of each. Returns how many were
 * enqueued, a prefix of items (0: full). Always inlined: with n and mode known
 * at the call, most of it folds away. Thread: any producer, as `mode` says. */
static inline __attribute__((always_inline)) unsigned int
kb__ring_push_n(ck_ring_t *ring, ck_ring_buffer_t *buf, void *const *items, unsigned int n,
                kb_push_mode mode, kb_ring_seen *seen)
{
    const unsigned int mask = ring->mask;
    unsigned int head, take;
    if (mode != KB_PUSH_MPSC) {
        /* ck's single-producer operations keep only p_tail; the owner also
         * keeps p_head, for the multi-producer pushes that may follow it. */
        head = ck_pr_load_uint(mode == KB_PUSH_SPSC ? &ring->p_tail : &ring->p_head);
        unsigned int used = head - kb__ring_consumed(ring, seen, head, n);
        if (used >= mask)
            return 0;
        take = mask - used < n ? mask - used : n;
        if (mode == KB_PUSH_OWNER)
            ck_pr_store_uint(&ring->p_head, head + take);
    } else {
        head = ck_pr_load_uint(&ring->p_head);
        for (;;) {
            ck_pr_fence_load();   /* c_head no older than the p_head snapshot */
            unsigned int used = head - kb__ring_consumed(ring, seen, head, n);
            if (used >= mask) {
                /* Full, or a stale p_head: re-read it ordered after c_head. */
                ck_pr_fence_load();
                unsigned int again = ck_pr_load_uint(&ring->p_head);
                if (again == head)
                    return 0;
                head = again;
                continue;
            }
            take = mask - used < n ? mask - used : n;
            if (ck_pr_cas_uint_value(&ring->p_head, head, head + take, &head))
                break;
        }
    }
    for (unsigned int i = 0; i < take; i++) {
        /* Slots and counters go through ck_pr like ck's own operations, with
         * the fences below; tell TSan the item's contents were written before
         * the handoff. */
        KB_TSAN_RELEASE(items[i]);
        ck_pr_store_ptr(&buf[(head + i) & mask].value, items[i]);
    }
    /* Producers that reserved earlier slots commit first: p_tail is always
     * the end of the written prefix. */
    while (ck_pr_load_uint(&ring->p_tail) != head)
        ck_pr_stall();
    ck_pr_fence_store();
    ck_pr_store_uint(&ring->p_tail, head + take);
    return take;
}

/* Dequeue up to n items into items[], oldest first; returns how many, and
 * the items the ring held before in *queued. One read of the producers'
 * counter and one store of ours for the whole run, where n
 * ck_ring_dequeue_spsc calls would move those cache lines n times (ck_ring
 * 0.7 has no batch dequeue; this is its _ck_ring_dequeue_sc over n slots).
 * Thread: the lane's executor only. */
static inline unsigned int kb__ring_pop_n(ck_ring_t *ring, ck_ring_buffer_t *buf, void **items,
                                          unsigned int n, unsigned int *queued)
{
    unsigned int head = ring->c_head;
    unsigned int ready = ck_pr_load_uint(&ring->p_tail) - head;
    *queued = ready;
    if (ready == 0)
        return 0;
    if (ready > n)
        ready = n;
    ck_pr_fence_load();   /* the slots no older than our p_tail snapshot */
    for (unsigned int i = 0; i < ready; i++) {
        items[i] = ck_pr_load_ptr(&buf[(head + i) & ring->mask].value);
        KB_TSAN_ACQUIRE(items[i]);
    }
    ck_pr_fence_store();  /* slots read before producers may reuse them */
    ck_pr_store_uint(&ring->c_head, head + ready);
    return ready;
}

/* Dequeue one item or NULL. Thread: the lane's executor only. */
static inline void *kb__ring_pop(ck_ring_t *ring, ck_ring_buffer_t *buf)
{
    void *item;
    unsigned int queued;
    return kb__ring_pop_n(ring, buf, &item, 1, &queued) ? item : NULL;
}

/* Items enqueued so far (free-running, wraps at 2^32): ck_ring's committed
 * producer counter. flush compares it with the lane's done counter. */
static inline unsigned int kb__ring_enqueued(const ck_ring_t *ring)
{
    return ck_pr_load_uint(&ring->p_tail);
}

#endif /* KB_CORE_RING_H */
