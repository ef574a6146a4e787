/* Handing entries to the pool (the reader thread): an entry read from a
 * stream (redis_entry.c) delivered or dead-lettered, and the entries of a
 * partition that wait for lane space while the reader serves the other
 * partitions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        return;   /* out of memory: stays pending, swept when the partition is next taken */
    kb_log(t->bus, KB_LOG_WARNING, "redis: %s entry %s to the dead-letter stream: %s",
           tt->parts[part].stream, id, reason);
    atomic_fetch_add(&t->dead_queued, 1);
    (void)kb__redis_job_push(t, &tt->parts[part], id, dead, 0);   /* lost: stays pending, as above */
}

/* Count first, then look: the keeper sets DRAINING, then waits for 0. True
 * when the partition is still ours under `epoch` (n counted in inflight). */
static bool hold(kb_redis_part *p, uint32_t epoch, size_t n)
{
    atomic_fetch_add(&p->inflight, n);
    if (kb__redis_part_live(p) && atomic_load(&p->epoch) == epoch)
        return true;
    atomic_fetch_sub(&p->inflight, n);
    return false;
}

static uint32_t attempt_of(const redisReply *runs, size_t i)
{
    return runs != NULL ? kb__redis_sweep_attempt(runs, i) : 1;
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
    if (!hold(p, epoch, 1))
        return KB_REDIS_PART_GONE;   /* stays in our PEL; the next owner claims it */
    if (what == KB_REDIS_ENTRY_DEAD) {
        atomic_fetch_sub(&p->inflight, 1);
        dead_now(tt, part, en.id, en.fields, en.ref, en.attempt, en.why);
        return KB_REDIS_DELIVERED;
    }
    kb_delivery dl = {.topic = tt->name, .tt = tt, .key = en.key->str, .key_len = en.key->len,
                      .payload = en.payload->str, .payload_len = en.payload->len,
                      .partition = part, .attempt = en.attempt, .id = en.id,
                      .cookie = kb__redis_cookie_plain(epoch),   /* checked by still_owned */
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
    size_t ent[RUN_MAX];   /* dl[j] is entry ent[j] (a frame's: its event) */
    char ids[RUN_MAX][KB_REDIS_EVENT_ID_MAX];   /* a frame's events' */
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
    if (!hold(p, epoch, n)) {
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

/* ---- frames: each event a delivery of its own, the entry acked once all
 * are settled (redis_settle.c) ---- */

/* The reader is done with p's frame in hand: every event taken, or (`back`)
 * the rest stays in the PEL, so the entry must not be acked. */
static void frame_let_go(kb_transport *t, kb_redis_part *p, bool back)
{
    kb_redis_fstate *fs = p->fcur.fs;
    if (fs == NULL)
        return;
    p->fcur.fs = NULL;
    p->fcur.next = 0;
    if (back)
        atomic_store(&fs->released, true);
    kb__redis_frame_unref(t, p, fs);
    atomic_fetch_sub(&p->inflight, 1);   /* the reader's hold, after its ack is queued */
}

/* An event of the frame goes to the dead letters alone, as a plain entry. */
static void frame_dead(kb_transport_topic *tt, kb_redis_part *p, const kb_delivery *d,
                       const char *why)
{
    kb_transport *t = tt->t;
    char *dead = kb__redis_dead_pack(d, why);
    if (dead == NULL) {   /* out of memory: the frame stays pending, swept again */
        atomic_store(&p->fcur.fs->released, true);
        p->swept = 0;
        p->sweep_whole = true;   /* from the start: the frame will count as handed */
        return;
    }
    kb_log(t->bus, KB_LOG_WARNING, "redis: %s event %s to the dead-letter stream: %s", p->stream,
           d->id, why);
    atomic_fetch_add(&t->dead_queued, 1);
    if (kb__redis_job_push(t, p, d->id, dead, 0)) {
        kb__redis_progress_note(t, p, p->fcur.fs, d);
    } else {   /* lost: its bit stays clear, the frame pending, swept again */
        atomic_store(&p->fcur.fs->released, true);
        p->swept = 0;
        p->sweep_whole = true;
    }
}

/* Hand the frame's staged events over (r->ent: their indexes). */
static int frame_flush(kb_transport_topic *tt, kb_redis_part *p, run *r, int timeout_ms)
{
    kb_redis_fstate *fs = p->fcur.fs;
    size_t n = r->n, taken = 0;
    r->n = 0;
    atomic_fetch_add(&fs->refs, (uint32_t)n);
    atomic_fetch_add(&p->inflight, n);   /* the reader's hold keeps the lease's check valid */
    int rc = kb_sink_deliver_batch(tt->sink, r->dl, n, timeout_ms, &taken);
    atomic_fetch_sub(&fs->refs, (uint32_t)(n - taken));   /* the reader's hold keeps it above 0 */
    atomic_fetch_sub(&p->inflight, n - taken);
    p->fcur.next = (uint32_t)(taken < n ? r->ent[taken] : r->ent[n - 1] + 1);
    if (rc == KB_OK)
        return KB_REDIS_DELIVERED;
    if (rc == KB_ECLOSED)
        return KB_REDIS_CLOSING;
    if (rc == KB_EFULL)
        return KB_REDIS_LANE_FULL;
    frame_dead(tt, p, &r->dl[taken], "refused by the pool");
    p->fcur.next++;
    return KB_REDIS_DELIVERED;
}

/* "<entry ID>.<j>" at out (KB_REDIS_EVENT_ID_MAX bytes); `len`: the ID's. */
static void event_id(char *out, const char *id, size_t len, uint32_t j)
{
    char digits[12];
    size_t n = 0;
    do
        digits[n++] = (char)('0' + j % 10);
    while ((j /= 10) > 0);
    memcpy(out, id, len);
    out[len] = '.';
    for (size_t k = 0; k < n; k++)
        out[len + 1 + k] = digits[n - 1 - k];
    out[len + 1 + n] = '\0';
}

/* One pass over the frame's events from p->fcur.next: KB_REDIS_*, and
 * *again when the pool refused one of a run (the pass stops there). */
static int frame_pass(kb_transport_topic *tt, kb_redis_part *p, kb_redis_frame f,
                      const char *id, const redisReply *runs, size_t i, unsigned flags,
                      uint32_t epoch, int timeout_ms, bool *again)
{
    run r;
    kb_redis_event ck;
    kb_transport *t = tt->t;
    size_t id_len = strlen(id);
    kb_frame_event ev;
    *again = false;
    for (uint32_t j = 0; j < p->fcur.next; j++)
        kb__redis_frame_next(&f, &ev);
    r.n = 0;
    int rc = KB_REDIS_DELIVERED;
    for (uint32_t j = p->fcur.next; kb__redis_frame_next(&f, &ev); j++) {
        if (!kb__redis_part_live(p) || atomic_load(&p->epoch) != epoch) {
            rc = KB_REDIS_PART_GONE;
            break;
        }
        if (kb__redis_progress_covers(runs, i, j)) {   /* settled before it came again */
            atomic_fetch_or(&p->fcur.fs->settled[j / 64], (uint64_t)1 << (j % 64));
            if (r.n == 0)
                p->fcur.next = j + 1;
            continue;
        }
        uint32_t attempt = runs != NULL ? kb__redis_sweep_event_attempt(runs, i, j) : 1;
        int what = kb__redis_event_read(&ev, p->index, tt->nparts, attempt, t->max_attempts,
                                        &t->lim, &ck);
        bool alone = what != KB_REDIS_ENTRY_EVENT || ck.n_headers > 0;
        /* headers (their array is per event) or a dead letter: after the run */
        if (alone && r.n > 0) {
            if ((rc = frame_flush(tt, p, &r, timeout_ms)) != KB_REDIS_DELIVERED)
                break;
            timeout_ms = 0;
            if ((*again = p->fcur.next != j))
                break;
        }
        event_id(r.ids[r.n], id, id_len, j);
        kb_delivery d = {.topic = tt->name, .tt = tt, .key = ev.key, .key_len = ev.key_len,
                         .payload = ev.payload, .payload_len = ev.payload_len,
                         .partition = p->index, .attempt = ck.attempt, .id = r.ids[r.n],
                         .cookie = p->fcur.fs, .headers = ck.n_headers ? ck.headers : NULL,
                         .n_headers = ck.n_headers, .flags = flags};
        if (what == KB_REDIS_ENTRY_DEAD) {
            frame_dead(tt, p, &d, ck.why);
            p->fcur.next = j + 1;
            continue;
        }
        r.dl[r.n] = d;
        r.ent[r.n++] = j;
        if (alone || r.n == RUN_MAX) {
            if ((rc = frame_flush(tt, p, &r, timeout_ms)) != KB_REDIS_DELIVERED)
                break;
            timeout_ms = 0;
            if ((*again = p->fcur.next != j + 1))
                break;
        }
    }
    if (rc == KB_REDIS_DELIVERED && r.n > 0 && !*again) {
        uint32_t end = (uint32_t)r.ent[r.n - 1] + 1;
        rc = frame_flush(tt, p, &r, timeout_ms);
        *again = rc == KB_REDIS_DELIVERED && p->fcur.next != end;
    }
    return rc;
}

/* Frame entry ents[i]: its events from p->fcur.next on, in runs;
 * KB_REDIS_*. A stop in the middle (a full lane) keeps p->fcur for the
 * next call. */
static int deliver_frame(kb_transport_topic *tt, kb_redis_part *p, const redisReply *e,
                         const redisReply *runs, size_t i, unsigned flags, uint32_t epoch,
                         int timeout_ms)
{
    const char *id = e->element[0]->str;
    const redisReply *fields = e->element[1];
    kb_redis_frame f;
    char why[300];
    if (kb__redis_frame_open(fields, &f, why, sizeof why) != 0) {
        if (!hold(p, epoch, 1))
            return KB_REDIS_PART_GONE;
        atomic_fetch_sub(&p->inflight, 1);
        dead_now(tt, p->index, id, fields, false, attempt_of(runs, i), why);
        return KB_REDIS_DELIVERED;
    }
    if (p->fcur.fs == NULL) {
        kb_redis_fstate *fs = kb__redis_fstate_new(id, epoch, f.left);
        if (fs == NULL) {
            p->swept = 0;   /* out of memory: swept again, from our PEL, before newer ones */
            return KB_REDIS_PART_GONE;
        }
        if (!hold(p, epoch, 1)) {
            free(fs);
            return KB_REDIS_PART_GONE;
        }
        p->fcur.fs = fs;
        p->fcur.next = 0;
    }
    bool again = true;
    int rc = KB_REDIS_DELIVERED;
    while (rc == KB_REDIS_DELIVERED && again) {
        rc = frame_pass(tt, p, f, id, runs, i, flags, epoch, timeout_ms, &again);
        timeout_ms = 0;
    }
    if (rc != KB_REDIS_LANE_FULL)
        frame_let_go(tt->t, p, rc != KB_REDIS_DELIVERED);
    return rc;
}

/* Entries ents[from, to) were taken (handed over, dead-lettered, or
 * skipped: not an entry): the newest ID among them is p's handed mark. */
static void note_handed(kb_redis_part *p, const redisReply *ents, size_t from, size_t to,
                        uint32_t epoch)
{
    while (to > from) {
        const redisReply *e = ents->element[--to];
        if (e->type == REDIS_REPLY_ARRAY && e->elements >= 1 &&
            e->element[0]->type == REDIS_REPLY_STRING && kb__redis_id_valid(e->element[0]->str)) {
            snprintf(p->handed, sizeof p->handed, "%s", e->element[0]->str);
            p->handed_epoch = epoch;
            return;
        }
    }
}

int kb__redis_deliver_run(kb_transport_topic *tt, uint32_t part, const redisReply *ents,
                          size_t *next, const redisReply *runs, unsigned flags, uint32_t epoch,
                          int timeout_ms, bool head_alone)
{
    run r;
    kb_redis_part *p = &tt->parts[part];
    r.n = 0;
    /* A head refused before goes alone: while its lane stays full, a try
     * copies (and frees) one record, not a run's. */
    size_t run_max = head_alone ? 1 : RUN_MAX;
    kb_redis_entry en;
    size_t i = *next;
    int rc = KB_REDIS_DELIVERED;
    while (rc == KB_REDIS_DELIVERED && i < ents->elements) {
        const redisReply *e = ents->element[i];
        uint32_t attempt = attempt_of(runs, i);
        if (e->type == REDIS_REPLY_ARRAY && e->elements >= 2 &&
            e->element[0]->type == REDIS_REPLY_STRING && kb__redis_is_frame(e->element[1])) {
            if (r.n > 0) {   /* the plain ones before it first */
                size_t at = i;
                rc = run_flush(tt, part, ents, &r, epoch, timeout_ms, &i);
                timeout_ms = 0;
                if (rc != KB_REDIS_DELIVERED || i != at)
                    continue;
            }
            rc = deliver_frame(tt, p, e, runs, i, flags, epoch, timeout_ms);
            timeout_ms = 0;
            if (rc == KB_REDIS_DELIVERED)
                i++;
            continue;
        }
        int what = kb__redis_entry_read(e, part, tt->nparts, attempt, tt->t->max_attempts,
                                        &tt->t->lim, &en);
        if (what == KB_REDIS_ENTRY_NONE) {
            i++;
            continue;
        }
        if (what == KB_REDIS_ENTRY_EVENT && en.n_headers == 0) {
            r.dl[r.n] = (kb_delivery){.topic = tt->name, .tt = tt, .key = en.key->str,
                                      .key_len = en.key->len, .payload = en.payload->str,
                                      .payload_len = en.payload->len, .partition = part,
                                      .attempt = en.attempt, .id = en.id,
                                      .cookie = kb__redis_cookie_plain(epoch), .flags = flags};
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
        rc = kb__redis_deliver(tt, part, e, attempt, flags, epoch, timeout_ms);
        timeout_ms = 0;
        run_max = RUN_MAX;
        if (rc == KB_REDIS_DELIVERED)
            i++;
    }
    if (rc == KB_REDIS_DELIVERED && r.n > 0)
        rc = run_flush(tt, part, ents, &r, epoch, timeout_ms, &i);
    note_handed(p, ents, *next, i, epoch);
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
    const redisReply *runs;   /* a sweep's: runs per entry of ents (redelivered); NULL: a read's */
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
                         uint32_t epoch, const redisReply *runs)
{
    kb_redis_wait *w = malloc(sizeof *w);
    if (w == NULL)
        return false;
    *w = (kb_redis_wait){NULL, h, ents, from, epoch, runs};
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
    frame_let_go(p->tt->t, p, true);   /* its events not handed out come again */
    while (p->waiting != NULL) {
        kb_redis_wait *w = p->waiting;
        p->waiting = w->next;
        kb__redis_held_unref(w->h);
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
        int rc = kb__redis_deliver_run(p->tt, p->index, w->ents, &w->next_ent, w->runs,
                                       w->runs != NULL ? KB_DELIVERY_F_REDELIVERED : 0,
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
        free(w);
    }
    return KB_REDIS_DELIVERED;
}
