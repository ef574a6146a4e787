/* The reader thread of a bus: recovery sweeps of newly taken partitions,
 * then one batched XREADGROUP over the partitions this process owns in every
 * subscribed topic, each entry handed to its topic's pool. The only thread
 * that feeds those pools, so threads and connections do not grow with topics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/pool.h>

#include "../../core/err.h"
#include "../../core/sync.h"
#include "redis_int.h"

enum { DELIVERED, PART_GONE, CLOSING, LANE_FULL };

int kb__redis_create_groups(kb_redis_conn *k, kb_redis_topic *rt, char *errstr, size_t errlen)
{
    struct kb_transport *t = rt->t;
    redisContext *c = kb__redis_conn_get(k, errstr, errlen);
    if (c == NULL)
        return KB_ETRANSPORT;
    /* From 0, never $: entries published before the group existed (or before a
     * server lost its data) are consumed, not skipped. */
    for (uint32_t i = 0; i < rt->nparts; i++)
        redisAppendCommand(c, "XGROUP CREATE %s %s 0 MKSTREAM", rt->parts[i].stream, t->group);
    int rc = KB_OK;
    for (uint32_t i = 0; i < rt->nparts; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            kb_errf(errstr, errlen, "XGROUP CREATE on %s: %s", t->where, c->errstr);
            kb__redis_conn_fail(k, c->errstr);
            return KB_ETRANSPORT;
        }
        if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "BUSYGROUP", 9) != 0 && rc == KB_OK) {
            kb_errf(errstr, errlen, "XGROUP CREATE %s %s: %s", rt->parts[i].stream, t->group,
                     r->str);
            rc = KB_ETRANSPORT;
        }
        freeReplyObject(r);
    }
    return rc;
}

static void dead_now(kb_redis_topic *rt, uint32_t part, const char *id, const redisReply *fields,
                     uint32_t attempts, const char *reason)
{
    struct kb_transport *t = rt->t;
    char *dead = kb__redis_dead_pack_raw(fields, part, id, attempts, reason);
    if (dead == NULL)
        return;   /* out of memory: stays pending and comes back on the next sweep */
    kb_log(t->bus, 4, "redis: %s entry %s to the dead-letter stream: %s", rt->parts[part].stream,
           id, reason);
    atomic_fetch_add(&t->dead_queued, 1);
    kb__redis_job_push(&rt->parts[part], id, dead);
    if (atomic_fetch_add(&t->jobs_queued, 1) == 0)
        kb__redis_keeper_wake(t);
}

/* Hand one entry ([id, fields]) to the pool. `attempt`: deliveries so far;
 * `epoch`: the lease the entry was read under (a lease lost and taken again
 * since then needs a new sweep first). */
static int deliver(kb_redis_topic *rt, uint32_t part, const redisReply *e, uint32_t attempt,
                   uint32_t epoch, int timeout_ms)
{
    struct kb_transport *t = rt->t;
    kb_redis_part *p = &rt->parts[part];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 || e->element[0]->type != REDIS_REPLY_STRING)
        return DELIVERED;   /* not an entry at all: nothing to ack */
    const char *id = e->element[0]->str;
    const redisReply *fields = e->element[1];
    const redisReply *k = kb__redis_field(fields, "k"), *d = kb__redis_field(fields, "d"),
                     *a = kb__redis_field(fields, "a");
    /* Count first, then look: the keeper sets DRAINING, then waits for 0. */
    atomic_fetch_add(&p->inflight, 1);
    if (!kb__redis_part_live(p) || atomic_load(&p->epoch) != epoch) {
        atomic_fetch_sub(&p->inflight, 1);
        return PART_GONE;   /* stays in our PEL; the next owner claims it */
    }
    if (k == NULL || k->len == 0 || d == NULL) {
        atomic_fetch_sub(&p->inflight, 1);
        dead_now(rt, part, id, fields,
                 attempt, k == NULL || k->len == 0 ? "malformed: no key field \"k\""
                                                   : "malformed: no payload field \"d\"");
        return DELIVERED;
    }
    kb_header headers[KB_MAX_HEADERS];
    size_t n_headers = 0;
    char why[300];   /* a dead letter's reason */
    if (kb__redis_headers_of(fields, headers, &n_headers, why, sizeof why) != KB_OK) {
        /* written by another client: kept whole in the DLQ, with the rule it broke */
        atomic_fetch_sub(&p->inflight, 1);
        dead_now(rt, part, id, fields, attempt, why);
        return DELIVERED;
    }
    uint32_t home = kb_fnv1a32(k->str, k->len) % rt->nparts;
    if (home != part) {
        /* XADDed by another client into the wrong stream: handling it here would
         * race the key's real partition, perhaps owned by another process */
        atomic_fetch_sub(&p->inflight, 1);
        snprintf(why, sizeof why, "partition is another one: the key hashes to partition %u", home);
        dead_now(rt, part, id, fields, attempt, why);
        return DELIVERED;
    }
    if (a != NULL) {
        unsigned long n = strtoul(a->str, NULL, 10);
        if (n > attempt && n < 1000000)
            attempt = (uint32_t)n;
    }
    if (attempt > t->max_attempts) {
        /* Delivered that often without an ack: likely a handler that kills the
         * process. Stop the crash loop here. */
        atomic_fetch_sub(&p->inflight, 1);
        snprintf(why, sizeof why, "delivered %u times without an ack", attempt - 1);
        dead_now(rt, part, id, fields, attempt - 1, why);
        return DELIVERED;
    }
    kb_delivery dl = {.topic = rt->name, .key = k->str, .key_len = k->len, .payload = d->str,
                      .payload_len = d->len, .partition = part, .attempt = attempt, .id = id,
                      .cookie = (void *)(uintptr_t)epoch,   /* checked by still_owned */
                      .headers = headers, .n_headers = n_headers};
    int rc = kb_sink_deliver(rt->sink, &dl, timeout_ms);
    if (rc == KB_OK)
        return DELIVERED;
    atomic_fetch_sub(&p->inflight, 1);
    if (rc == KB_ECLOSED)
        return CLOSING;
    if (rc == KB_EFULL)
        return LANE_FULL;
    dead_now(rt, part, id, fields, attempt, "refused by the pool");
    return DELIVERED;
}

/* Entries of one partition a read or a sweep returned whose lane was full:
 * they wait, in order, while the reader goes on with other partitions and
 * topics, so one slow topic does not stop the others. The reply they live in
 * is shared by every partition of the read and freed with its last waiting
 * entry. */
typedef struct held {
    redisReply *reply;
    int refs;
} held;

typedef struct kb_redis_wait {
    struct kb_redis_wait *next;
    held *h;
    const redisReply *ents;
    size_t next_ent;
    uint32_t epoch;
    uint32_t *attempts;   /* a sweep's: per entry of ents; NULL: a read's (1) */
} kb_redis_wait;

static void held_unref(held *h)
{
    if (--h->refs == 0) {
        freeReplyObject(h->reply);
        free(h);
    }
}

/* Queue ents[from..] behind what already waits; false when out of memory
 * (the caller stops delivering the partition: the next sweep finds them). */
static bool wait_push(kb_redis_part *p, held *h, const redisReply *ents, size_t from, uint32_t epoch,
                      uint32_t *attempts)
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
static void wait_drop(kb_redis_part *p)
{
    while (p->waiting != NULL) {
        kb_redis_wait *w = p->waiting;
        p->waiting = w->next;
        held_unref(w->h);
        free(w->attempts);
        free(w);
    }
}

/* Deliver what waits in p, up to a lane that is still full. The first full
 * lane may be waited for up to timeout_ms. */
static int wait_deliver(kb_redis_part *p, int timeout_ms)
{
    while (p->waiting != NULL) {
        kb_redis_wait *w = p->waiting;
        while (w->next_ent < w->ents->elements) {
            int rc = deliver(p->rt, p->index, w->ents->element[w->next_ent],
                             w->attempts != NULL ? w->attempts[w->next_ent] : 1, w->epoch,
                             timeout_ms);
            if (rc == LANE_FULL)
                return LANE_FULL;
            if (rc != DELIVERED) {
                wait_drop(p);   /* lease gone: the next owner sweeps them */
                p->sweeping = 0;
                return rc;
            }
            w->next_ent++;
            timeout_ms = 0;
        }
        p->waiting = w->next;
        held_unref(w->h);
        free(w->attempts);
        free(w);
    }
    return DELIVERED;
}

/* Reads are fenced on the server: a process that lost its lease (paused, say)
 * must not move entries into its PEL after the new owner swept it, or those
 * entries would sit there, skipped, while later ones of their keys are handled. */
static const char SWEEP_LUA[] =
    "if redis.call('get',KEYS[1])~=ARGV[1] then return -1 end "
    "return {redis.call('xpending',KEYS[2],ARGV[2],ARGV[4],'+',ARGV[5]),"
    "redis.call('xautoclaim',KEYS[2],ARGV[2],ARGV[3],0,ARGV[4],'COUNT',ARGV[5])}";
static bool group_gone(const char *err)
{
    return strstr(err, "NOGROUP") != NULL || strstr(err, "UNBLOCKED") != NULL;
}

/* Deliveries so far of entry `id`: `pend` is the XPENDING list, in ID order
 * like the entries, walked along with them from *pi. */
static uint32_t deliveries(const redisReply *pend, size_t *pi, const char *id)
{
    while (*pi < pend->elements) {
        const redisReply *pe = pend->element[*pi];
        int cmp = pe->type == REDIS_REPLY_ARRAY && pe->elements >= 4
                      ? kb__redis_id_cmp(pe->element[0]->str, id)
                      : -1;
        if (cmp > 0)
            break;
        (*pi)++;
        if (cmp == 0)
            return (uint32_t)pe->element[3]->integer;
    }
    return 1;
}

static const char *entry_id(const redisReply *e)
{
    return e->type == REDIS_REPLY_ARRAY && e->elements >= 1 &&
                   e->element[0]->type == REDIS_REPLY_STRING
               ? e->element[0]->str
               : NULL;
}

/* A sweep page's entries from `from` on wait for lane space, with their
 * attempts; the page's reply `r` is theirs now. False when out of memory. */
static bool sweep_wait(kb_redis_part *p, redisReply *r, const redisReply *ents, size_t from,
                       uint32_t first, const redisReply *pend, size_t pi, uint32_t epoch)
{
    uint32_t *att = malloc(ents->elements * sizeof *att);
    held *h = malloc(sizeof *h);
    if (att == NULL || h == NULL) {
        free(att);
        free(h);
        freeReplyObject(r);
        return false;
    }
    att[from] = first;
    for (size_t i = from + 1; i < ents->elements; i++) {
        const char *id = entry_id(ents->element[i]);
        att[i] = id != NULL ? deliveries(pend, &pi, id) + 1 : 1;
    }
    *h = (held){r, 0};
    if (!wait_push(p, h, ents, from, epoch, att)) {
        free(att);
        free(h);
        freeReplyObject(r);
        return false;
    }
    return true;
}

/* On taking a partition: its whole PEL (ours from before a restart and the
 * previous owner's), oldest first, before anything new, so per-key order holds
 * across failover. XPENDING in the same script gives the delivery counts.
 * A full lane pauses it (LANE_FULL): the page's rest waits like a read's,
 * and the sweep goes on from p->sweep_cursor once it is delivered. */
static int sweep(kb_redis_topic *rt, uint32_t part, uint32_t epoch)
{
    struct kb_transport *t = rt->t;
    kb_redis_part *p = &rt->parts[part];
    if (p->sweeping != epoch) {
        p->sweeping = epoch;
        snprintf(p->sweep_cursor, sizeof p->sweep_cursor, "0-0");
    }
    char count[16];
    snprintf(count, sizeof count, "%d", t->batch);
    uint64_t claimed = 0, deleted = 0;
    int rc = DELIVERED;
    while (rc == DELIVERED && p->sweep_cursor[0] != '\0') {
        const char *argv[] = {"EVAL", SWEEP_LUA, "2", p->lease, p->stream, t->token, t->group,
                              t->consumer, p->sweep_cursor, count};
        redisReply *r = kb__redis_cmd(&t->rconn, 10, argv, NULL);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_ARRAY ||
            r->element[1]->type != REDIS_REPLY_ARRAY || r->element[1]->elements < 2) {
            p->sweeping = 0;   /* start over next time */
            if (r == NULL)
                return PART_GONE;
            if (r->type == REDIS_REPLY_ERROR && group_gone(r->str))
                kb__redis_create_groups(&t->rconn, rt, NULL, 0);
            else if (r->type == REDIS_REPLY_ERROR)
                kb_log(t->bus, 4, "redis: recovery of %s: %s", p->stream, r->str);
            /* -1: the lease is gone on the server; the keeper will notice */
            freeReplyObject(r);
            kb__redis_nap(&t->consumers_stop, 100);   /* e.g. LOADING after a restart */
            return PART_GONE;
        }
        const redisReply *pend = r->element[0], *ac = r->element[1];
        const redisReply *ents = ac->element[1];
        if (ac->elements >= 3 && ac->element[2]->type == REDIS_REPLY_ARRAY)
            deleted += ac->element[2]->elements;
        bool last = ac->element[0]->type != REDIS_REPLY_STRING ||
                    strcmp(ac->element[0]->str, "0-0") == 0;
        snprintf(p->sweep_cursor, sizeof p->sweep_cursor, "%s", last ? "" : ac->element[0]->str);
        size_t pi = 0;
        for (size_t i = 0; rc == DELIVERED && ents->type == REDIS_REPLY_ARRAY &&
                           i < ents->elements; i++) {
            const char *id = entry_id(ents->element[i]);
            if (id == NULL)
                continue;
            uint32_t before = deliveries(pend, &pi, id);
            rc = deliver(rt, part, ents->element[i], before + 1, epoch, 0);
            claimed += rc == DELIVERED;
            if (rc == LANE_FULL) {
                if (!sweep_wait(p, r, ents, i, before + 1, pend, pi, epoch)) {
                    p->sweeping = 0;   /* out of memory: from the start next time */
                    return PART_GONE;
                }
                r = NULL;
            }
        }
        freeReplyObject(r);
    }
    if (rc != LANE_FULL)
        p->sweeping = 0;   /* done, or to be started over */
    if (rc == DELIVERED && (claimed > 0 || deleted > 0))
        kb_log(t->bus, 6, "redis: took %s: %llu pending entries redelivered, %llu deleted "
               "while pending", p->stream, (unsigned long long)claimed, (unsigned long long)deleted);
    return rc;
}

/* A read in flight: what was asked, under which epochs. */
typedef struct rround {
    kb_redis_part **parts;   /* partitions read, in request order */
    uint32_t *epochs;        /* their epochs when the read was sent */
    bool *ok;                /* validated: deliver this partition's entries */
    size_t n, cap;
    bool pending;            /* sent, replies not read */
} rround;

/* Scratch of the reader thread; grows with the partitions it reads. */
typedef struct reader {
    rround r[2];             /* the read being handled and the one sent ahead of it */
    const char **argv;
    size_t argv_cap;
    size_t *hit;             /* indexes into a rround of the streams a read returned */
    int count;               /* XREADGROUP COUNT now: redis.batch .. READ_COUNT_GROWTH times it */
    size_t stuck;            /* partitions whose entries wait for lane space */
} reader;

/* A hot partition (one aggregate, say) fills every read: let its reads grow
 * so the per-read cost (a round trip, the lease and XPENDING checks) is spread
 * over more entries, and shrink them back when reads come back well short,
 * so lanes of quiet topics are not flooded. */
#define READ_COUNT_GROWTH 8

static void adapt_count(reader *rd, int batch, size_t most)
{
    if (most >= (size_t)rd->count && rd->count < batch * READ_COUNT_GROWTH)
        rd->count *= 2;
    else if (most < (size_t)rd->count / 4 && rd->count > batch)
        rd->count /= 2;
}

/* Room for n partitions in both rounds and in argv; false when out of memory. */
static bool reserve(reader *rd, size_t n)
{
    for (int k = 0; k < 2; k++) {
        rround *ro = &rd->r[k];
        if (ro->cap >= n)
            continue;
        size_t cap = n * 2;
        kb_redis_part **parts = realloc(ro->parts, cap * sizeof *parts);
        if (parts != NULL)
            ro->parts = parts;
        uint32_t *epochs = realloc(ro->epochs, cap * sizeof *epochs);
        if (epochs != NULL)
            ro->epochs = epochs;
        bool *ok = realloc(ro->ok, cap * sizeof *ok);
        if (ok != NULL)
            ro->ok = ok;
        if (parts == NULL || epochs == NULL || ok == NULL)
            return false;
        ro->cap = cap;
    }
    if (rd->argv_cap < 9 + 2 * n) {
        size_t cap = 9 + 4 * n;
        const char **argv = realloc(rd->argv, cap * sizeof *argv);
        size_t *hit = realloc(rd->hit, cap * sizeof *hit);
        if (argv != NULL)
            rd->argv = argv;
        if (hit != NULL)
            rd->hit = hit;
        if (argv == NULL || hit == NULL)
            return false;
        rd->argv_cap = cap;
    }
    return true;
}

/* Another consumer has entries pending in this partition: `x` is the summary
 * form of XPENDING ([count, min, max, [[consumer, count]...]]). */
static bool foreign_pending(const struct kb_transport *t, const redisReply *x)
{
    if (x->type != REDIS_REPLY_ARRAY || x->elements < 4 || x->element[3]->type != REDIS_REPLY_ARRAY)
        return false;
    const redisReply *cs = x->element[3];
    for (size_t i = 0; i < cs->elements; i++) {
        const redisReply *c = cs->element[i];
        if (c->type == REDIS_REPLY_ARRAY && c->elements >= 2 &&
            c->element[0]->type == REDIS_REPLY_STRING && strcmp(c->element[0]->str, t->consumer) != 0)
            return true;
    }
    return false;
}

/* Send one read: a single XREADGROUP ... BLOCK over every live, swept
 * partition of every topic. False: nothing to read (no live partition), out
 * of memory, or the connection failed. */
static bool send_round(struct kb_transport *t, reader *rd, rround *ro)
{
    redisContext *c = t->rconn.c;
    ro->n = 0;
    ro->pending = false;
    for (kb_redis_topic *rt = atomic_load(&t->topics); c != NULL && rt != NULL; rt = rt->next)
        for (uint32_t i = 0; i < rt->nparts; i++) {
            kb_redis_part *p = &rt->parts[i];
            uint32_t e = atomic_load(&p->epoch);
            if (p->swept == 0 || p->swept != e || !kb__redis_part_live(p) || p->waiting != NULL)
                continue;
            if (!reserve(rd, ro->n + 1))
                return false;
            ro->epochs[ro->n] = e;
            ro->parts[ro->n++] = p;
        }
    if (ro->n == 0)
        return false;
    char count[16], block[16];
    snprintf(count, sizeof count, "%d", rd->count);
    /* Entries waiting for lane space are retried after the read: block only a
     * millisecond then — an executor empties a full lane in well under that, and
     * a longer block left it idle (a single hot partition ran at 35k events/s
     * with 10 ms). */
    snprintf(block, sizeof block, "%d", rd->stuck > 0 ? 1 : t->block_ms);
    const char **argv = rd->argv;
    size_t argc = 0, n = ro->n;
    argv[argc++] = "XREADGROUP";
    argv[argc++] = "GROUP";
    argv[argc++] = t->group;
    argv[argc++] = t->consumer;
    argv[argc++] = "COUNT";
    argv[argc++] = count;
    argv[argc++] = "BLOCK";
    argv[argc++] = block;
    argv[argc++] = "STREAMS";
    for (size_t j = 0; j < n; j++)
        argv[argc++] = ro->parts[j]->stream;
    for (size_t j = 0; j < n; j++)
        argv[argc++] = ">";
    redisAppendCommandArgv(c, (int)argc, argv, NULL);
    /* on the wire now: the server prepares it while we deliver the previous one */
    for (int done = 0; !done;)
        if (redisBufferWrite(c, &done) != REDIS_OK) {
            kb__redis_conn_fail(&t->rconn, c->errstr);
            return false;
        }
    ro->pending = true;
    return true;
}

/* Which requested partition a returned stream is: Redis answers in request
 * order, so the search goes on from the previous match. */
static size_t find_part(const rround *ro, const char *stream, size_t from)
{
    for (size_t k = 0; k < ro->n; k++) {
        size_t j = (from + k) % ro->n;
        if (strcmp(ro->parts[j]->stream, stream) == 0)
            return j;
    }
    return ro->n;
}

/* Validated reads (redis.fenced_reads = 1, the default): for each partition
 * the read returned entries of, GET its lease and the XPENDING summary, sent
 * after the read's reply arrived and before any entry is delivered:
 *   - GET still holding our token means the lease was ours when the read ran:
 *     a token is this process's alone, and losing and retaking the lease in
 *     between bumps the local epoch, which deliver() checks. Otherwise the
 *     entries are not delivered: they stay in our PEL for the next owner.
 *   - a read by a process that had lost the lease (paused past the TTL) leaves
 *     entries in *its* PEL after this owner's sweep, newer than anything this
 *     owner read before. XPENDING shows them (no other consumer may have
 *     pending entries in a partition we swept), and before delivering anything
 *     of the partition this process sweeps again: XAUTOCLAIM moves them here
 *     and they are handled first, in ID order.
 * Partitions that returned nothing cost nothing, so an idle topic adds one
 * stream name to the read and no command. False: the connection failed. */
static bool validate(struct kb_transport *t, reader *rd, rround *ro, size_t hits, bool *clean)
{
    redisContext *c = t->rconn.c;
    for (size_t h = 0; h < hits; h++) {
        kb_redis_part *p = ro->parts[rd->hit[h]];
        const char *get[] = {"GET", p->lease};
        const char *pend[] = {"XPENDING", p->stream, t->group};
        redisAppendCommandArgv(c, 2, get, NULL);
        redisAppendCommandArgv(c, 3, pend, NULL);
    }
    for (size_t k = 0; k < 2 * hits; k++) {
        redisReply *y = NULL;
        if (redisGetReply(c, (void **)&y) != REDIS_OK) {
            kb__redis_conn_fail(&t->rconn, c->errstr);
            return false;   /* nothing delivered: the next sweep finds the entries */
        }
        size_t j = rd->hit[k / 2];
        kb_redis_part *p = ro->parts[j];
        if (k % 2 == 0) {
            if (y->type != REDIS_REPLY_STRING || strcmp(y->str, t->token) != 0)
                ro->ok[j] = false;   /* lost on the server; the keeper will notice */
        } else if (foreign_pending(t, y)) {
            ro->ok[j] = false;
            p->swept = 0;            /* sweep again before anything newer */
            if (atomic_fetch_add(&t->stray, 1) == 0)
                kb_log(t->bus, 4, "redis: %s has entries pending for another consumer (a read "
                       "after its lease was lost); sweeping it again", p->stream);
        } else if (y->type == REDIS_REPLY_ERROR) {
            ro->ok[j] = false;
        }
        *clean &= ro->ok[j];
        freeReplyObject(y);
    }
    return true;
}

/* Recreate the groups of every topic (the server lost its data: FLUSHALL, a
 * restart without AOF); from 0, so nothing published meanwhile is skipped. */
static void groups_lost(struct kb_transport *t)
{
    kb_log(t->bus, 4, "redis: group %s missing on %s; recreating from 0", t->group, t->where);
    for (kb_redis_topic *rt = atomic_load(&t->topics); rt != NULL && t->rconn.c != NULL;
         rt = rt->next)
        kb__redis_create_groups(&t->rconn, rt, NULL, 0);
}

/* Read a round's reply, validate it and deliver its entries. With `ahead`,
 * the next round is sent first when this one brought entries and needs no
 * sweep, so the server reads while this thread delivers (each round is
 * validated on its own). CLOSING when the bus no longer takes entries. */
static int recv_round(struct kb_transport *t, reader *rd, rround *ro, rround *ahead)
{
    redisContext *c = t->rconn.c;
    size_t n = ro->n;
    ro->pending = false;
    if (c == NULL)
        return PART_GONE;
    redisReply *x = NULL;
    if (redisGetReply(c, (void **)&x) != REDIS_OK) {
        kb__redis_conn_fail(&t->rconn, c->errstr);
        return PART_GONE;
    }
    int rc = DELIVERED;
    if (x->type == REDIS_REPLY_ERROR) {
        if (group_gone(x->str)) {
            groups_lost(t);
        } else {
            kb_log(t->bus, 4, "redis: reading from %s: %s", t->where, x->str);
            kb__redis_nap(&t->consumers_stop, 100);
        }
        rc = PART_GONE;
    } else if (x->type == REDIS_REPLY_ARRAY) {
        /* [[stream, [entry...]]...], only streams with new entries */
        size_t most = 0, hits = 0, j = 0;
        for (size_t s = 0; s < x->elements; s++) {
            const redisReply *sr = x->element[s];
            if (sr->type != REDIS_REPLY_ARRAY || sr->elements < 2 ||
                sr->element[0]->type != REDIS_REPLY_STRING ||
                sr->element[1]->type != REDIS_REPLY_ARRAY)
                continue;
            if ((j = find_part(ro, sr->element[0]->str, j)) == n)
                continue;
            ro->ok[j] = true;
            rd->hit[hits++] = j;
            if (sr->element[1]->elements > most)
                most = sr->element[1]->elements;
        }
        bool clean = true;   /* every check passed: nothing to sweep, nothing refused */
        if (t->fenced_reads && !validate(t, rd, ro, hits, &clean)) {
            freeReplyObject(x);
            return PART_GONE;
        }
        if (ahead != NULL && clean)
            send_round(t, rd, ahead);
        adapt_count(rd, t->batch, most);
        size_t h = 0;
        held *hd = NULL;   /* x, once entries of it wait for lane space */
        for (size_t s = 0; rc != CLOSING && s < x->elements; s++) {
            const redisReply *sr = x->element[s];
            if (sr->type != REDIS_REPLY_ARRAY || sr->elements < 2 ||
                sr->element[0]->type != REDIS_REPLY_STRING ||
                sr->element[1]->type != REDIS_REPLY_ARRAY)
                continue;
            if (h == hits || strcmp(ro->parts[rd->hit[h]]->stream, sr->element[0]->str) != 0)
                continue;   /* not one we asked for */
            size_t k = rd->hit[h++];
            if (!ro->ok[k])
                continue;   /* the rest stays in our PEL for the next owner or sweep */
            kb_redis_part *p = ro->parts[k];
            const redisReply *ents = sr->element[1];
            size_t i = 0;
            int d = DELIVERED;
            if (p->waiting == NULL)   /* else these go behind what waits */
                while (i < ents->elements &&
                       (d = deliver(p->rt, p->index, ents->element[i], 1, ro->epochs[k], 0)) ==
                           DELIVERED)
                    i++;
            if (d == CLOSING)
                rc = CLOSING;
            if ((d == LANE_FULL || p->waiting != NULL) && i < ents->elements) {
                if (hd == NULL && (hd = calloc(1, sizeof *hd)) != NULL)
                    *hd = (held){x, 1};
                if (hd == NULL || !wait_push(p, hd, ents, i, ro->epochs[k], NULL)) {
                    wait_drop(p);   /* out of memory: swept again, from our PEL */
                    p->swept = 0;
                }
            }
        }
        if (hd != NULL) {
            held_unref(hd);
            return rc;
        }
    }
    freeReplyObject(x);
    return rc;
}

/* Deliver what waits for lane space, partition by partition. `stuck`: how
 * many partitions still wait. The first that does may be waited for up to
 * timeout_ms (the reader has nothing else to do). */
static int drain_waiting(struct kb_transport *t, size_t *stuck, int timeout_ms)
{
    *stuck = 0;
    for (kb_redis_topic *rt = atomic_load(&t->topics); rt != NULL; rt = rt->next)
        for (uint32_t i = 0; i < rt->nparts; i++) {
            if (rt->parts[i].waiting == NULL)
                continue;
            int rc = wait_deliver(&rt->parts[i], *stuck == 0 ? timeout_ms : 0);
            if (rc == CLOSING)
                return CLOSING;
            *stuck += rt->parts[i].waiting != NULL;
        }
    return DELIVERED;
}

static bool sweep_due(struct kb_transport *t)
{
    for (kb_redis_topic *rt = atomic_load(&t->topics); rt != NULL; rt = rt->next)
        for (uint32_t i = 0; i < rt->nparts; i++)
            if (rt->parts[i].swept != atomic_load(&rt->parts[i].epoch) &&
                kb__redis_part_live(&rt->parts[i]))
                return true;
    return false;
}

/* Sweep every partition taken since its last sweep. */
static int sweep_taken(struct kb_transport *t)
{
    int rc = DELIVERED;
    for (kb_redis_topic *rt = atomic_load(&t->topics); rt != NULL; rt = rt->next)
        for (uint32_t i = 0; rc != CLOSING && t->rconn.c != NULL && i < rt->nparts; i++) {
            kb_redis_part *p = &rt->parts[i];
            uint32_t e = atomic_load(&p->epoch);
            if (p->swept == e || !kb__redis_part_live(p))
                continue;
            if (p->sweeping != e)
                wait_drop(p);   /* a new sweep delivers them again, in order */
            else if (p->waiting != NULL)
                continue;       /* this sweep's entries wait for lane space first */
            rc = sweep(rt, i, e);
            if (rc == DELIVERED)
                p->swept = e;
        }
    return rc;
}

/* Replies may have been lost with the connection: sweep everything again. */
static void forget_sweeps(struct kb_transport *t, reader *rd)
{
    for (kb_redis_topic *rt = atomic_load(&t->topics); rt != NULL; rt = rt->next)
        for (uint32_t i = 0; i < rt->nparts; i++) {
            wait_drop(&rt->parts[i]);
            rt->parts[i].swept = 0;
            rt->parts[i].sweeping = 0;
        }
    rd->r[0].pending = rd->r[1].pending = false;
    rd->stuck = 0;
}

void *kb__redis_consume_main(void *arg)
{
    struct kb_transport *t = arg;
    reader rd = {.count = t->batch};
    rround *cur = &rd.r[0], *next = &rd.r[1];
    while (!atomic_load(&t->consumers_stop)) {
        if (kb__redis_conn_get(&t->rconn, NULL, 0) == NULL) {
            forget_sweeps(t, &rd);
            kb__redis_nap(&t->consumers_stop, 50);
            continue;
        }
        int rc = DELIVERED;
        if (sweep_due(t)) {
            /* the connection must be quiet: finish the read in flight first */
            if (cur->pending)
                rc = recv_round(t, &rd, cur, NULL);
            if (rc != CLOSING)
                rc = sweep_taken(t);
        }
        if (rc != CLOSING)
            rc = drain_waiting(t, &rd.stuck, 0);
        if (rc != CLOSING && t->rconn.c != NULL && !cur->pending && !send_round(t, &rd, cur)) {
            if (t->rconn.c != NULL && rd.stuck > 0)
                rc = drain_waiting(t, &rd.stuck, 20);    /* only full lanes: wait for room */
            else if (t->rconn.c != NULL)
                kb__redis_nap(&t->consumers_stop, 20);   /* nothing owned yet */
        } else if (rc != CLOSING && t->rconn.c != NULL) {
            rc = recv_round(t, &rd, cur, next);
            rround *done = cur;
            cur = next;
            next = done;
        }
        if (rc == CLOSING)
            break;
        if (t->rconn.c == NULL)
            forget_sweeps(t, &rd);
    }
    forget_sweeps(t, &rd);   /* frees what still waits */
    for (int k = 0; k < 2; k++) {
        free(rd.r[k].ok);
        free(rd.r[k].epochs);
        free(rd.r[k].parts);
    }
    free(rd.argv);
    free(rd.hit);
    return NULL;
}
