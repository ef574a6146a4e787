/* Thin wrappers over ck_ring: the lane's ring holds item pointers. The
 * single-producer operations are used when one thread feeds the pool (a broker
 * consumer loop), the multi-producer enqueue when application threads do. */
#ifndef KB_CORE_RING_H
#define KB_CORE_RING_H

#include <ck_ring.h>
#include <stdbool.h>

#include "sync.h"

/* Enqueue `item`; *depth receives the number of items queued before it.
 * Thread: any producer (single_producer: one at a time). */
static inline bool kb__ring_push(ck_ring_t *ring, ck_ring_buffer_t *buf, void *item,
                                 bool single_producer, unsigned int *depth)
{
    /* ck publishes the slot with its own fences; tell TSan the item's contents
     * were written before the handoff. */
    KB_TSAN_RELEASE(item);
    return single_producer ? ck_ring_enqueue_spsc_size(ring, buf, item, depth)
                           : ck_ring_enqueue_mpsc_size(ring, buf, item, depth);
}

/* Dequeue one item or NULL. Thread: the lane's executor only. */
static inline void *kb__ring_pop(ck_ring_t *ring, ck_ring_buffer_t *buf)
{
    void *item;
    if (!ck_ring_dequeue_spsc(ring, buf, &item))
        return NULL;
    KB_TSAN_ACQUIRE(item);
    return item;
}

/* Items enqueued so far (free-running, wraps at 2^32): ck_ring's committed
 * producer counter. flush compares it with the lane's done counter. */
static inline unsigned int kb__ring_enqueued(const ck_ring_t *ring)
{
    return ck_pr_load_uint(&ring->p_tail);
}

#endif /* KB_CORE_RING_H */
