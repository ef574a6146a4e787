/* Claims and their completion frontier: handlers finish out of order across
 * keys, so each claim keeps its deliveries in stream order and one AckAll for
 * the last entry of the finished prefix acks them all — no round trip per
 * event. The bus's ack, release and still_owned hooks settle entries here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"

kb_nats_claim *kb__nats_claim_new(kb_transport *t, kb_nats_part *p, uint64_t rev)
{
    kb_nats_claim *c = calloc(1, sizeof *c);
    uint32_t cap = 16;
    while (cap < (uint64_t)t->max_ack_pending)
        cap *= 2;
    if (c == NULL || (c->ring = calloc(cap, sizeof *c->ring)) == NULL) {
        free(c);
        return NULL;
    }
    c->cap = cap;
    c->part = p;
    c->rev = rev;
    snprintf(c->consumer, sizeof c->consumer, "%s_%u_%llu", t->group, p->n,
             (unsigned long long)rev);
    snprintf(c->next_subj, sizeof c->next_subj, "$JS.API.CONSUMER.MSG.NEXT.%s.%s",
             p->topic->stream, c->consumer);
    c->next = atomic_load(&p->claims);
    atomic_store_explicit(&p->claims, c, memory_order_release);
    return c;
}

uint32_t kb__nats_attempt(const kb_nats_claim *c, uint64_t sseq, uint64_t delivered)
{
    uint64_t n = delivered;
    for (uint32_t i = 0; i < c->nmarks; i++)
        n += c->marks[i] >= sseq;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

void kb__nats_claim_reset(kb_transport *t, kb_nats_claim *c)
{
    atomic_store(&c->fenced, 1);
    atomic_store(&t->lease_kick, 1);
    kb_signal_notify(t->lease_wake);
}

/* One event of the entry is finished with; the last one settles the entry,
 * done only when none was released unhandled. */
void kb__nats_settle(kb_nats_entry *e, bool done)
{
    kb_nats_claim *c = e->claim;
    if (!done)
        atomic_store_explicit(&e->released, 1, memory_order_relaxed);
    if (atomic_fetch_sub_explicit(&e->pending, 1, memory_order_acq_rel) != 1)
        return;
    if (!atomic_load_explicit(&e->released, memory_order_relaxed))
        atomic_store_explicit(&e->done, 1, memory_order_release);
    atomic_fetch_add_explicit(&c->settled, 1, memory_order_acq_rel);
}

int kb__nats_ack(kb_transport *t, const kb_delivery *d)
{
    (void)t;
    if (d->cookie != NULL)
        kb__nats_settle(d->cookie, true);
    return KB_OK;
}

/* Executor, before each handler: is the claim that delivered this still the
 * partition's current, unfenced one? One or two atomic loads, no round trip.
 * The entry is alive: its ring is freed only once every entry is settled. */
int kb__nats_still_owned(kb_transport *t, const kb_delivery *d)
{
    (void)t;
    const kb_nats_entry *e = d->cookie;
    if (e == NULL)
        return 1;
    kb_nats_claim *c = e->claim;
    if (atomic_load_explicit(&c->fenced, memory_order_acquire)) {
        atomic_fetch_add_explicit(&c->part->topic->unowned, 1, memory_order_relaxed);
        return 0;
    }
    return 1;
}

void kb__nats_release(kb_transport *t, const kb_delivery *d)
{
    (void)t;
    if (d->cookie != NULL)
        kb__nats_settle(d->cookie, false);   /* stays unacked: redelivered elsewhere */
}

static void free_ring(kb_nats_claim *c)
{
    uint64_t head = atomic_load(&c->head), tail = atomic_load(&c->tail);
    for (uint64_t i = head; i < tail; i++)
        natsMsg_Destroy(c->ring[i & (c->cap - 1)].msg);
    free(c->ring);
    c->ring = NULL;
    atomic_store(&c->freed, 1);
}

/* Ack what is finished. Acking handled events is right even for a fenced
 * claim: the consumer is this claim's own, and fencing only stops feeding. */
void kb__nats_claim_ack(kb_transport *t, kb_nats_claim *c, int64_t now)
{
    if (atomic_load(&c->freed))
        return;
    uint64_t h0 = atomic_load(&c->head), h = h0;
    uint64_t tl = atomic_load_explicit(&c->tail, memory_order_acquire);
    while (h < tl &&
           atomic_load_explicit(&c->ring[h & (c->cap - 1)].done, memory_order_acquire))
        h++;
    /* Not sent while reconnecting (nats.c buffers nothing then): next tick. */
    kb_nats_entry *last = h > h0 ? &c->ring[(h - 1) & (c->cap - 1)] : NULL;
    if (last != NULL &&
        natsConnection_PublishString(t->nc, natsMsg_GetReply(last->msg), "+ACK") != NATS_OK)
        h = h0;
    if (h > h0) {
        atomic_store(&c->acked_to, last->sseq);
        for (uint64_t i = h0; i < h; i++) {
            natsMsg_Destroy(c->ring[i & (c->cap - 1)].msg);
            c->ring[i & (c->cap - 1)].msg = NULL;
        }
        atomic_store_explicit(&c->head, h, memory_order_release);
        kb_signal_notify(t->acked);
    }
    /* A long handler holds the frontier: keep its message from redelivery. */
    int64_t third = t->ack_wait_ms * 1000000 / 3;
    if (h < tl && !atomic_load(&c->fenced)) {
        kb_nats_entry *e = &c->ring[h & (c->cap - 1)];
        if (now - e->since_ns > third && now - c->last_wpi_ns > third) {
            natsConnection_PublishString(t->nc, natsMsg_GetReply(e->msg), "+WPI");
            c->last_wpi_ns = now;
        }
    }
    /* feeder_left first: after it, the tail no longer moves. */
    if (atomic_load(&c->fenced) && atomic_load(&c->feeder_left) &&
        atomic_load(&c->settled) == atomic_load(&c->tail))
        free_ring(c);
}

void kb__nats_claims_free(kb_nats_part *p)
{
    for (kb_nats_claim *c = atomic_load(&p->claims), *next; c; c = next) {
        next = c->next;
        if (!atomic_load(&c->freed))
            free_ring(c);
        free(c);
    }
}
