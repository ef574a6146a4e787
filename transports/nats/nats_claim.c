/* Claims and their completion frontier: handlers finish out of order across
 * keys, so each claim keeps its deliveries in stream order and one AckAll for
 * the last entry of the finished prefix acks them all — no round trip per
 * event. The bus's ack, release and still_owned hooks settle entries here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_progress.h"
#include "nats_runs.h"

void kb__nats_claim_name(const kb_transport *t, const kb_nats_part *p, bool wide, uint64_t rev,
                         char *buf, size_t len)
{
    if (wide)
        snprintf(buf, len, "%s_w_%llu", t->group, (unsigned long long)rev);
    else
        snprintf(buf, len, "%s_%u_%llu", t->group, p->n, (unsigned long long)rev);
}

uint64_t kb__nats_claim_rev(const kb_nats_part *p, bool wide)
{
    kb_nats_claim *c = atomic_load(wide ? &p->topic->wide_claims : &p->claims);
    return c != NULL && c->name_free ? c->rev : p->lease_rev;
}

kb_nats_claim *kb__nats_claim_new(kb_transport *t, kb_nats_part *p, uint64_t rev, bool wide)
{
    kb_nats_claim *c = calloc(1, sizeof *c);
    /* nats.max_ack_pending is per partition: a wide claim has them all */
    uint64_t want = (uint64_t)t->max_ack_pending * (wide ? t->partitions : 1);
    uint32_t cap = 16;
    while (cap < want && cap < (1u << 30))
        cap *= 2;
    if (c == NULL || (c->ring = calloc(cap, sizeof *c->ring)) == NULL) {
        free(c);
        return NULL;
    }
    c->cap = cap;
    atomic_store(&c->ack_limit, UINT64_MAX);
    c->part = p;
    c->rev = rev;
    c->wide = wide;
    kb__nats_claim_name(t, p, wide, rev, c->consumer, sizeof c->consumer);
    snprintf(c->next_subj, sizeof c->next_subj, "$JS.API.CONSUMER.MSG.NEXT.%s.%s",
             p->topic->stream, c->consumer);
    _Atomic(kb_nats_claim *) *list = wide ? &p->topic->wide_claims : &p->claims;
    c->next = atomic_load(list);
    atomic_store_explicit(list, c, memory_order_release);
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
    if (d->cookie != NULL) {
        kb__nats_progress_note(d->cookie, d);   /* before: settling may free the entry */
        kb__nats_settle(d->cookie, true);
    }
    return KB_OK;
}

bool kb__nats_claim_cut_passed(const kb_nats_claim *c, const kb_nats_claim *w)
{
    return atomic_load(&c->cut_set) && atomic_load(&w->handled_to) >= atomic_load(&c->cut);
}

bool kb__nats_claim_orphaned(const kb_nats_claim *c)
{
    kb_nats_claim *w = atomic_load(&c->split_from);
    return w != NULL && atomic_load(&w->fenced) && !kb__nats_claim_cut_passed(c, w);
}

/* Executor, before each handler: is the claim that delivered this still the
 * partition's current, unfenced one, its lease not run out locally? A few
 * atomic loads and a clock read, no round trip.
 * The entry is alive: its ring is freed only once every entry is settled. */
int kb__nats_still_owned(kb_transport *t, const kb_delivery *d)
{
    const kb_nats_entry *e = d->cookie;
    if (e == NULL)
        return 1;
    kb_nats_claim *c = e->claim;
    if (atomic_load_explicit(&c->fenced, memory_order_acquire))
        goto unowned;
    /* the wide claim it took over from stopped before handling what it was
     * given of the partition: this key's earlier event may have been released */
    if (kb__nats_claim_orphaned(c)) {
        kb__nats_claim_reset(t, c);
        goto unowned;
    }
    if (kb_now_ns() > atomic_load_explicit(&c->valid_until_ns, memory_order_relaxed)) {
        /* expired for good: a late renewal must not bring the claim back
         * after this event of its key was released (its next one would then
         * be handled before it) */
        kb__nats_claim_reset(t, c);
        goto unowned;
    }
    return 1;
unowned:
    atomic_fetch_add_explicit(&c->part->topic->unowned, 1, memory_order_relaxed);
    return 0;
}

void kb__nats_release(kb_transport *t, const kb_delivery *d)
{
    (void)t;
    if (d->cookie != NULL) {
        kb_nats_entry *e = d->cookie;
        if (d->attempt > 1 || (d->flags & KB_DELIVERY_F_REDELIVERED))
            atomic_store(&e->claim->released_ran, true);   /* its runs may be recorded */
        /* before: settling may free it */
        kb__nats_progress_released(e->claim, e->sseq, d->id, d->key, d->key_len);
        kb__nats_settle(e, false);   /* stays unacked: redelivered elsewhere */
    }
}

/* An acked entry's message is no longer needed, nor its run record. */
static void acked_entry(kb_transport *t, kb_nats_entry *e)
{
    natsMsg_Destroy(e->msg);
    e->msg = NULL;
    if (atomic_exchange_explicit(&e->runs, false, memory_order_relaxed))
        kb__nats_runs_forget(t, e);
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

/* The finished prefix of the claim's frontier, with one AckAll for its last
 * entry (the consumers are AckAll): the new head. An event held by its
 * handler or its retries is not done, so no later ack covers it. The ack
 * carries the prefix's newest delivery sequence: after redeliveries (a
 * server restart) an entry's first one may be below what the server took.
 * Not sent while reconnecting (nats.c buffers nothing then): next tick. */
/* May the handled prefix pass entry e? */
static bool passable(const kb_nats_entry *e, uint64_t limit)
{
    return e->sseq <= limit && atomic_load_explicit(&e->done, memory_order_acquire) &&
           (e->after == NULL || atomic_load(&e->after->handled_to) >= e->sseq);
}

static uint64_t ack_prefix(kb_transport *t, kb_nats_claim *c, uint64_t h0, uint64_t tl)
{
    uint64_t h = h0, limit = atomic_load(&c->ack_limit), dseq = 0, handled = 0, i = h0;
    c->ack_failed = false;
    /* An entry the bridge read (nats_consume.c) has no delivery sequence
     * until its consumer delivers it: the prefix ends at the last entry with
     * one (its AckAll covers the bridged entries before it). */
    for (; i < tl; i++) {
        kb_nats_entry *e = &c->ring[i & (c->cap - 1)];
        if (!passable(e, limit) || e->moved)
            break;
        uint64_t d = atomic_load_explicit(&e->dseq, memory_order_relaxed);
        if (d != 0)
            h = i + 1;
        dseq = d > dseq ? d : dseq;
        handled = e->sseq;
    }
    /* Acks end for good at a moved entry; the handled prefix goes on past
     * it (the cuts of the partitions that stay wait on it), from where it
     * was last seen to end. */
    if (i < tl && c->ring[i & (c->cap - 1)].moved && passable(&c->ring[i & (c->cap - 1)], limit)) {
        uint64_t j = c->moved_scan > i ? c->moved_scan : i;
        for (; j < tl && passable(&c->ring[j & (c->cap - 1)], limit); j++)
            c->moved_handled = c->ring[j & (c->cap - 1)].sseq;
        c->moved_scan = j;
        handled = c->moved_handled > handled ? c->moved_handled : handled;
    }
    if (handled != 0)
        atomic_store(&c->handled_to, handled);
    kb_nats_entry *last = h > h0 ? &c->ring[(h - 1) & (c->cap - 1)] : NULL;
    if (last == NULL)
        return h0;
    char subj[3 * KB_NATS_NAME];
    if (!kb__nats_ack_subject(subj, sizeof subj, c->part->topic->stream, c->consumer, last->sseq, dseq) ||
        natsConnection_PublishString(kb__nats_feed_conn(t), subj, "+ACK") != NATS_OK) {
        c->ack_failed = true;
        return h0;
    }
    atomic_store(&c->acked_dseq, dseq);
    atomic_store(&c->acked_to, last->sseq);
    return h;
}

bool kb__nats_claim_reack(kb_transport *t, kb_nats_claim *c, uint64_t server_dseq)
{
    uint64_t sseq = atomic_load(&c->acked_to), dseq = atomic_load(&c->acked_dseq);
    if (dseq <= server_dseq)
        dseq = server_dseq + 1;   /* the server ignores an AckAll at or below its floor */
    char subj[3 * KB_NATS_NAME];
    return kb__nats_ack_subject(subj, sizeof subj, c->part->topic->stream, c->consumer, sseq, dseq) &&
           natsConnection_PublishString(kb__nats_feed_conn(t), subj, "+ACK") == NATS_OK;
}

/* Ack what is finished. Acking handled events is right even for a fenced
 * claim: the consumer is this claim's own, and fencing only stops feeding. */
void kb__nats_claim_ack(kb_transport *t, kb_nats_claim *c, int64_t now)
{
    if (atomic_load(&c->freed))
        return;
    /* read before the acks: every entry settled by then is acked below */
    uint64_t settled = atomic_load(&c->settled);
    uint64_t h0 = atomic_load(&c->head);
    uint64_t tl = atomic_load_explicit(&c->tail, memory_order_acquire);
    uint64_t h = ack_prefix(t, c, h0, tl);
    if (h > h0) {
        for (uint64_t i = h0; i < h; i++)
            acked_entry(t, &c->ring[i & (c->cap - 1)]);
        atomic_store_explicit(&c->head, h, memory_order_release);
        kb_signal_notify(t->acked);
    }
    /* A long handler holds the frontier: keep its message from redelivery. */
    int64_t third = t->ack_wait_ms * 1000000 / 3;
    if (h < tl && !atomic_load(&c->fenced)) {
        kb_nats_entry *e = &c->ring[h & (c->cap - 1)];
        if (now - e->since_ns > third && now - c->last_wpi_ns > third &&
            atomic_load_explicit(&e->dseq, memory_order_relaxed) != 0) {
            natsConnection_PublishString(kb__nats_feed_conn(t), natsMsg_GetReply(e->msg), "+WPI");
            c->last_wpi_ns = now;
        }
    }
    /* feeder_left first: after it, the tail no longer moves. Not while an
     * ack of a finished entry is still to be sent. */
    if (atomic_load(&c->fenced) && atomic_load(&c->feeder_left) && settled == tl &&
        !c->ack_failed)
        free_ring(c);
}

bool kb__nats_claim_redelivered(kb_nats_claim *c, const kb_nats_meta *meta)
{
    /* the ring is in stream order and only its prefix below the head is acked */
    uint64_t h = atomic_load(&c->head), tl = atomic_load(&c->tail);
    if (h == tl || meta->sseq < c->ring[h & (c->cap - 1)].sseq)
        return true;
    while (h < tl) {
        uint64_t mid = h + (tl - h) / 2;
        kb_nats_entry *e = &c->ring[mid & (c->cap - 1)];
        if (e->sseq == meta->sseq) {
            if (meta->dseq > atomic_load_explicit(&e->dseq, memory_order_relaxed))
                atomic_store_explicit(&e->dseq, meta->dseq, memory_order_relaxed);
            break;
        }
        if (e->sseq < meta->sseq)
            h = mid + 1;
        else
            tl = mid;
    }
    return false;
}

bool kb__nats_claim_skips(const kb_nats_claim *c, uint64_t sseq)
{
    if (sseq > c->skip_to)
        return false;
    uint32_t lo = 0, hi = c->nkeep;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c->keep[mid] == sseq)
            return false;
        if (c->keep[mid] < sseq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return true;
}

bool kb__nats_nak_range(kb_transport *t, const char *stream, const char *consumer, uint64_t from,
                        uint64_t to, uint64_t dseq)
{
    char subj[3 * KB_NATS_NAME];
    if (to < from || to - from >= KB_NATS_NAK_MAX)
        return false;   /* the server redelivers them after AckWait anyway */
    for (uint64_t s = from; s <= to; s++)
        if (!kb__nats_ack_subject(subj, sizeof subj, stream, consumer, s, dseq) ||
            natsConnection_PublishString(kb__nats_feed_conn(t), subj, "-NAK") != NATS_OK)
            return false;
    return true;
}

static void claims_free(kb_nats_claim *c)
{
    for (kb_nats_claim *next; c; c = next) {
        next = c->next;
        if (!atomic_load(&c->freed))
            free_ring(c);
        free(c->keep);
        kb__nats_progress_free(c);
        free(c);
    }
}

void kb__nats_claims_free(kb_nats_topic *tp, uint32_t partitions)
{
    for (uint32_t i = 0; i < partitions; i++)
        claims_free(atomic_load(&tp->parts[i].claims));
    claims_free(atomic_load(&tp->wide_claims));
}

/* A split's claims stand or fall together while the wide claim lives: its
 * entries of a partition whose claim stopped wait on that claim for ever,
 * and a partition claim whose wide claim stopped before handling up to the
 * cut waits on it (kb__nats_claim_orphaned). Either is reset, and the lease
 * thread claims again from the floors. */
static void split_check(kb_transport *t, kb_nats_claim *c)
{
    kb_nats_claim *w = atomic_load(&c->split_from);
    if (w == NULL)
        return;
    if (atomic_load(&c->fenced) && !atomic_load(&w->fenced))
        kb__nats_claim_reset(t, w);
    else if (!atomic_load(&c->fenced) && kb__nats_claim_orphaned(c))
        kb__nats_claim_reset(t, c);
}

void kb__nats_ack_topic(kb_transport *t, kb_nats_topic *tp, int64_t now, bool last)
{
    for (uint32_t i = 0; i < t->partitions; i++)
        for (kb_nats_claim *c = atomic_load(&tp->parts[i].claims); c; c = c->next) {
            split_check(t, c);
            kb__nats_claim_ack(t, c, now);
            kb__nats_progress_write(t, c, now, last);
        }
    for (kb_nats_claim *c = atomic_load(&tp->wide_claims); c; c = c->next) {
        kb__nats_claim_ack(t, c, now);
        kb__nats_progress_write(t, c, now, last);
    }
}

bool kb__nats_acked_to(const kb_nats_topic *tp, uint32_t n, uint64_t seq)
{
    for (kb_nats_claim *c = atomic_load(&tp->parts[n].claims); c; c = c->next)
        if (atomic_load(&c->acked_to) >= seq)
            return true;
    for (kb_nats_claim *c = atomic_load(&tp->wide_claims); c; c = c->next)
        if (atomic_load(&c->acked_to) >= seq)
            return true;
    return false;
}

bool kb__nats_claims_done(const kb_nats_part *p, const kb_nats_claim *but)
{
    for (kb_nats_claim *c = atomic_load(&p->claims); c; c = c->next)
        if (!atomic_load(&c->freed))
            return false;
    for (kb_nats_claim *c = atomic_load(&p->topic->wide_claims); c; c = c->next)
        if (c != but && !atomic_load(&c->freed))
            return false;
    return true;
}

static bool wide_goes_on(kb_transport *t, kb_nats_claim *w, int64_t now)
{
    return w != NULL && !atomic_load(&w->feeder_left) && !kb__nats_claim_fenced(t, w, now);
}

kb_nats_claim *kb__nats_split_wide(kb_transport *t, const kb_nats_part *p, int64_t now)
{
    kb_nats_claim *w = p->split_to != NULL ? atomic_load(&p->split_to->split_from) : NULL;
    if (wide_goes_on(t, w, now))
        return w;
    w = atomic_load(&p->move_cut_for);   /* an early move's */
    return wide_goes_on(t, w, now) ? w : NULL;
}

/* Is claim c fenced? One whose lease ran out locally (the lease thread
 * blocked past it) is fenced here, and the lease thread woken: a renewal
 * it still gets in starts a fresh claim. */
bool kb__nats_claim_fenced(kb_transport *t, kb_nats_claim *c, int64_t now)
{
    if (atomic_load(&c->fenced))
        return true;
    if (now <= atomic_load(&c->valid_until_ns) && !kb__nats_claim_orphaned(c))
        return false;
    kb__nats_claim_reset(t, c);
    return true;
}
