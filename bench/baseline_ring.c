/* baseline:ring, the in-process limit: one producer hashes each key with
 * FNV-1a into one of 1024 raw SPSC ck_rings, one consumer thread sweeps them.
 * No records to recycle, no wakeups, no backpressure timeouts: what a keyed
 * fan-out costs before any of keybus's bookkeeping. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ck_ring.h>
#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "bench.h"

#define RING_LANES 1024
#define RING_SLOTS 256   /* small: up to 1024 lanes each hold 2 * RING_SLOTS payload copies */
#define RING_BATCH 64

/* Payload copies live in a per-lane slab of 2 * RING_SLOTS slots, used in
 * order. Writing copy n needs copy n - 2*RING_SLOTS finished; it is, because
 * enqueueing n - 1 needed the consumer to have dequeued n - RING_SLOTS, and it
 * handles a lane's copies in order. */
struct lane {
    ck_ring_t ring;
    ck_ring_buffer_t buf[RING_SLOTS];
    uint64_t produced;
    unsigned char *slab;
};

struct rec {
    size_t len;
    unsigned char data[];
};

struct ring_ctx {
    _Atomic(struct lane *) lanes[RING_LANES];
    size_t stride;
    atomic_int stop;
};

static int publish(void *opaque, const void *key, size_t key_len, const void *payload, size_t len)
{
    struct ring_ctx *c = opaque;
    uint32_t i = kb_fnv1a32(key, key_len) % RING_LANES;
    struct lane *l = atomic_load_explicit(&c->lanes[i], memory_order_relaxed);   /* we wrote it */
    if (l == NULL) {
        l = calloc(1, sizeof *l);
        if (l == NULL || (l->slab = malloc(2 * RING_SLOTS * c->stride)) == NULL) {
            free(l);
            return KB_ENOMEM;
        }
        ck_ring_init(&l->ring, RING_SLOTS);
        atomic_store_explicit(&c->lanes[i], l, memory_order_release);
    }
    struct rec *r = (struct rec *)(l->slab + (l->produced++ % (2 * RING_SLOTS)) * c->stride);
    r->len = len;
    memcpy(r->data, payload, len);
    for (unsigned spins = 0; !ck_ring_enqueue_spsc(&l->ring, l->buf, r);)
        bench_spin_pause(&spins);
    return KB_OK;
}

static void *consume(void *opaque)
{
    struct ring_ctx *c = opaque;
    unsigned idle = 0;
    while (!atomic_load_explicit(&c->stop, memory_order_relaxed)) {
        unsigned got = 0;
        for (uint32_t i = 0; i < RING_LANES; i++) {
            struct lane *l = atomic_load_explicit(&c->lanes[i], memory_order_acquire);
            struct rec *r;
            for (unsigned k = 0; l && k < RING_BATCH && ck_ring_dequeue_spsc(&l->ring, l->buf, &r);
                 k++, got++)
                kb_collect_event(r->data, r->len);
        }
        if (got == 0)
            bench_spin_pause(&idle);
        else
            idle = 0;
    }
    return NULL;
}

void kb_run_ring(const kb_plan *plan, kb_result *r)
{
    kb_plan p = *plan;
    p.producers = 1;   /* by definition: one producer, one consumer */
    snprintf(r->transport, sizeof r->transport, "baseline:ring");
    r->threads = 1;
    struct ring_ctx *c = calloc(1, sizeof *c);
    if (c == NULL || kb_collect_begin(&p) != 0) {
        free(c);
        r->error = KB_ENOMEM;
        return;
    }
    c->stride = (sizeof(struct rec) + p.payload_bytes + 63) & ~(size_t)63;
    pthread_t consumer;
    if (pthread_create(&consumer, NULL, consume, c) != 0) {
        r->error = KB_ENOMEM;
    } else {
        kb_drive(&p, publish, NULL, c, r);
        atomic_store(&c->stop, 1);
        pthread_join(consumer, NULL);
    }
    kb_collect_end(&p, r);
    for (uint32_t i = 0; i < RING_LANES; i++) {
        struct lane *l = atomic_load(&c->lanes[i]);
        if (l)
            free(l->slab);
        free(l);
    }
    free(c);
}
