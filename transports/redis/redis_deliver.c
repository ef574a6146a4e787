/* Handing entries to the pool (the reader thread): an entry read from a
 * stream (redis_entry.c) delivered or dead-lettered, and the entries of a
 * partition that wait for lane space while the reader serves the other
 * partitions. */
#include <stdlib.h>

#include "redis_int.h"

/* What the reader naps for: stop, or a lease taken since it looked. */
typedef struct nap {
    kb_transport *t;
    uint64_t taken;
} nap;

static int nap_over(void *arg)
{
    const nap *n = arg;
    return atomic_load(&n->t->consumers_stop) || atomic_load(&n->t->leases_taken) != n->taken;
}

void kb__redis_reader_nap(kb_transport *t, uint64_t taken, int ms)
{
    nap n = {t, taken};
    kb_signal_wait(t->reader_wake, nap_over, &n, kb_deadline_ns(ms));
}

static void dead_now(kb_transport_topic *tt, uint32_t part, const char *id,
                     const redisReply *fields, bool ref, uint32_t attempts, const char *reason)
{
    kb_transport *t = tt->t;
    char *dead = kb__redis_dead_pack_raw(fields, ref, part, id, attempts, reason);
    if (dead == NULL)
        return;   /* out of memory: stays pending and comes back on the next sweep */
    kb_log(t->bus, KB_LOG_WARNING, "redis: %s entry %s to the dead-letter stream: %s",
           tt->parts[part].stream, id, reason);
    atomic_fetch_add(&t->dead_queued, 1);
    kb__redis_job_push(t, &tt->parts[part], id, dead);
}

/* `attempt`: the run the handler would start (recorded runs + 1); `flags`:
 * KB_DELIVERY_F_REDELIVERED for an entry swept from the pending list;
 * `epoch`: the lease the entry was read under (a lease lost and taken again
 * since then needs a new sweep first). */
int kb__redis_deliver(kb_transport_topic *tt, uint32_t part, const redisReply *e, uint32_t attempt,
                      unsigned flags, uint32_t epoch, int timeout_ms)
{
    kb_transport *t = tt->t;
    kb_redis_part *p = &tt->parts[part];
    kb_redis_entry en;
    int what = kb__redis_entry_read(e, part, tt->nparts, attempt, t->max_attempts, &t->lim, &en);
    if (what == KB_REDIS_ENTRY_NONE)
        return KB_REDIS_DELIVERED;
    /* Count first, then look: the keeper sets DRAINING, then waits for 0. */
    atomic_fetch_add(&p->inflight, 1);
    if (!kb__redis_part_live(p) || atomic_load(&p->epoch) != epoch) {
        atomic_fetch_sub(&p->inflight, 1);
        return KB_REDIS_PART_GONE;   /* stays in our PEL; the next owner claims it */
    }
    if (what == KB_REDIS_ENTRY_DEAD) {
        atomic_fetch_sub(&p->inflight, 1);
        dead_now(tt, part, en.id, en.fields, en.ref, en.attempt, en.why);
        return KB_REDIS_DELIVERED;
    }
    kb_delivery dl = {.topic = tt->name, .tt = tt, .key = en.key->str, .key_len = en.key->len,
                      .payload = en.payload->str, .payload_len = en.payload->len,
                      .partition = part, .attempt = en.attempt, .id = en.id,
                      .cookie = (void *)(uintptr_t)epoch,   /* checked by still_owned */
                      .headers = en.headers, .n_headers = en.n_headers, .flags = flags};
    int rc = kb_sink_deliver(tt->sink, &dl, timeout_ms);
    if (rc == KB_OK)
        return KB_REDIS_DELIVERED;
    atomic_fetch_sub(&p->inflight, 1);
    if (rc == KB_ECLOSED)
        return KB_REDIS_CLOSING;
    if (rc == KB_EFULL)
        return KB_REDIS_LANE_FULL;
    dead_now(tt, part, en.id, en.fields, false, en.attempt, "refused by the pool");
    return KB_REDIS_DELIVERED;
}

/* Entries handed over in one kb_sink_deliver_batch: one wake of the
 * executors per run, where delivering entry by entry woke one about every
 * second entry (perf trace). */
#define RUN_MAX 64

typedef struct run {
    kb_delivery dl[RUN_MAX];
    size_t ent[RUN_MAX];   /* dl[j] is entry ent[j] */
    size_t n;
} run;

/* Hand the staged run over. *i: the entry after the run on the way in, the
 * first one not taken on the way out. */
static int run_flush(kb_transport_topic *tt, uint32_t part, const redisReply *ents, run *r,
                     uint32_t epoch, int timeout_ms, size_t *i)
{
    kb_redis_part *p = &tt->parts[part];
    size_t n = r->n;
    r->n = 0;
    /* Count first, then look: the keeper sets DRAINING, then waits for 0. */
    atomic_fetch_add(&p->inflight, n);
    if (!kb__redis_part_live(p) || atomic_load(&p->epoch) != epoch) {
        atomic_fetch_sub(&p->inflight, n);
        *i = r->ent[0];
        return KB_REDIS_PART_GONE;   /* stays in our PEL; the next owner claims it */
    }
    size_t taken = 0;
    int rc = kb_sink_deliver_batch(tt->sink, r->dl, n, timeout_ms, &taken);
    if (rc == KB_OK)
        return KB_REDIS_DELIVERED;
    atomic_fetch_sub(&p->inflight, n - taken);
    *i = r->ent[taken];
    if (rc == KB_ECLOSED)
        return KB_REDIS_CLOSING;
    if (rc == KB_EFULL)
        return KB_REDIS_LANE_FULL;
    kb_redis_entry en;
    kb__redis_entry_read(ents->element[*i], part, tt->nparts, r->dl[taken].attempt,
                         tt->t->max_attempts, &tt->t->lim, &en);
    dead_now(tt, part, en.id, en.fields, false, en.attempt, "refused by the pool");
    ++*i;
    return KB_REDIS_DELIVERED;
}

int kb__redis_deliver_run(kb_transport_topic *tt, uint32_t part, const redisReply *ents,
                          size_t *next, const uint32_t *attempts, unsigned flags, uint32_t epoch,
                          int timeout_ms, bool head_alone)
{
    run r;
    r.n = 0;
    /* A head refused before goes alone: while its lane stays full, a try
     * copies (and frees) one record, not a run's. */
    size_t run_max = head_alone ? 1 : RUN_MAX;
    kb_redis_entry en;
    size_t i = *next;
    int rc = KB_REDIS_DELIVERED;
    while (rc == KB_REDIS_DELIVERED && i < ents->elements) {
        uint32_t attempt = attempts != NULL ? attempts[i] : 1;
        int what = kb__redis_entry_read(ents->element[i], part, tt->nparts, attempt,
                                        tt->t->max_attempts, &tt->t->lim, &en);
        if (what == KB_REDIS_ENTRY_NONE) {
            i++;
            continue;
        }
        if (what == KB_REDIS_ENTRY_EVENT && en.n_headers == 0) {
            r.dl[r.n] = (kb_delivery){.topic = tt->name, .tt = tt, .key = en.key->str,
                                      .key_len = en.key->len, .payload = en.payload->str,
                                      .payload_len = en.payload->len, .partition = part,
                                      .attempt = en.attempt, .id = en.id,
                                      .cookie = (void *)(uintptr_t)epoch, .flags = flags};
            r.ent[r.n++] = i++;
            if (r.n == run_max) {
                rc = run_flush(tt, part, ents, &r, epoch, timeout_ms, &i);
                timeout_ms = 0;
                run_max = RUN_MAX;
            }
            continue;
        }
        /* headers (their array is per entry) or a dead letter: after the run */
        if (r.n > 0) {
            size_t at = i;
            rc = run_flush(tt, part, ents, &r, epoch, timeout_ms, &i);
            timeout_ms = 0;
            if (rc != KB_REDIS_DELIVERED || i != at)
                continue;
        }
        rc = kb__redis_deliver(tt, part, ents->element[i], attempt, flags, epoch, timeout_ms);
        timeout_ms = 0;
        run_max = RUN_MAX;
        if (rc == KB_REDIS_DELIVERED)
            i++;
    }
    if (rc == KB_REDIS_DELIVERED && r.n > 0)
        rc = run_flush(tt, part, ents, &r, epoch, timeout_ms, &i);
    *next = i;
    return rc;
}

/* Entries of one partition a read or a sweep returned whose lane was full:
 * they wait, in order, while the reader goes on with other partitions and
 * topics, so one slow topic does not stop the others. The reply they live in
 * is shared by every partition of the read and freed with its last waiting
 * entry. */
struct kb_redis_held {
    redisReply *reply;
    int refs;
};

typedef struct kb_redis_wait {
    struct kb_redis_wait *next;
    kb_redis_held *h;
    const redisReply *ents;
    size_t next_ent;
    uint32_t epoch;
    uint32_t *attempts;   /* a sweep's: per entry of ents (redelivered); NULL: a read's (1) */
} kb_redis_wait;

kb_redis_held *kb__redis_held_new(redisReply *r)
{
    kb_redis_held *h = malloc(sizeof *h);
    if (h != NULL)
        *h = (kb_redis_held){r, 1};
    return h;
}

void kb__redis_held_unref(kb_redis_held *h)
{
    if (--h->refs == 0) {
        kb__redis_reply_free(h->reply);
        free(h);
    }
}

/* Queue ents[from..] behind what already waits; false when out of memory
 * (the caller stops delivering the partition: the next sweep finds them). */
bool kb__redis_wait_push(kb_redis_part *p, kb_redis_held *h, const redisReply *ents, size_t from,
                         uint32_t epoch, uint32_t *attempts)
{
    kb_redis_wait *w = malloc(sizeof *w);
    if (w == NULL)
        return false;
    *w = (kb_redis_wait){NULL, h, ents, from, epoch, attempts};
    h->refs++;
    kb_redis_wait **tail = &p->waiting;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = w;
    return true;
}

/* Forget what waits (the entries stay in our PEL: a sweep or the next owner
 * delivers them); before every sweep of the partition. */
void kb__redis_wait_drop(kb_redis_part *p)
{
    while (p->waiting != NULL) {
        kb_redis_wait *w = p->waiting;
        p->waiting = w->next;
        kb__redis_held_unref(w->h);
        free(w->attempts);
        free(w);
    }
}

/* Deliver what waits in p, up to a lane that is still full. The first full
 * lane may be waited for up to timeout_ms. */
int kb__redis_wait_deliver(kb_redis_part *p, int timeout_ms)
{
    bool head_refused = true;   /* the first waiting entry's lane was full */
    while (p->waiting != NULL) {
        kb_redis_wait *w = p->waiting;
        int rc = kb__redis_deliver_run(p->tt, p->index, w->ents, &w->next_ent, w->attempts,
                                       w->attempts != NULL ? KB_DELIVERY_F_REDELIVERED : 0,
                                       w->epoch, timeout_ms, head_refused);
        head_refused = false;
        if (rc == KB_REDIS_LANE_FULL)
            return KB_REDIS_LANE_FULL;
        if (rc != KB_REDIS_DELIVERED) {
            kb__redis_wait_drop(p);   /* lease gone: the next owner sweeps them */
            p->sweeping = 0;
            return rc;
        }
        timeout_ms = 0;
        p->waiting = w->next;
        kb__redis_held_unref(w->h);
        free(w->attempts);
        free(w);
    }
    return KB_REDIS_DELIVERED;
}
