/* The consumer thread of a topic: recovery sweeps of newly taken partitions,
 * then batched XREADGROUP over the partitions this process owns, each entry
 * handed to the topic's pool. The only thread that feeds that pool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/pool.h>

#include "../../core/err.h"
#include "../../core/sync.h"
#include "redis_int.h"

enum { DELIVERED, PART_GONE, CLOSING };

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
            kb__errf(errstr, errlen, "XGROUP CREATE on %s: %s", t->where, c->errstr);
            kb__redis_conn_fail(k, c->errstr);
            return KB_ETRANSPORT;
        }
        if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "BUSYGROUP", 9) != 0 && rc == KB_OK) {
            kb__errf(errstr, errlen, "XGROUP CREATE %s %s: %s", rt->parts[i].stream, t->group,
                     r->str);
            rc = KB_ETRANSPORT;
        }
        freeReplyObject(r);
    }
    return rc;
}

static const redisReply *field(const redisReply *fields, const char *name)
{
    if (fields == NULL || fields->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < fields->elements; i += 2) {
        const redisReply *f = fields->element[i];
        if (f->type == REDIS_REPLY_STRING && f->len == strlen(name) &&
            memcmp(f->str, name, f->len) == 0)
            return fields->element[i + 1]->type == REDIS_REPLY_STRING ? fields->element[i + 1]
                                                                      : NULL;
    }
    return NULL;
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
                   uint32_t epoch)
{
    struct kb_transport *t = rt->t;
    kb_redis_part *p = &rt->parts[part];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 || e->element[0]->type != REDIS_REPLY_STRING)
        return DELIVERED;   /* not an entry at all: nothing to ack */
    const char *id = e->element[0]->str;
    const redisReply *fields = e->element[1];
    const redisReply *k = field(fields, "k"), *d = field(fields, "d"), *a = field(fields, "a");
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
    uint32_t home = kb_fnv1a32(k->str, k->len) % rt->nparts;
    if (home != part) {
        /* XADDed by another client into the wrong stream: handling it here would
         * race the key's real partition, perhaps owned by another process */
        atomic_fetch_sub(&p->inflight, 1);
        char why[96];
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
        char why[96];
        snprintf(why, sizeof why, "delivered %u times without an ack", attempt - 1);
        dead_now(rt, part, id, fields, attempt - 1, why);
        return DELIVERED;
    }
    kb_delivery dl = {.topic = rt->name, .key = k->str, .key_len = k->len, .payload = d->str,
                      .payload_len = d->len, .partition = part, .attempt = attempt, .id = id,
                      .cookie = (void *)(uintptr_t)epoch};   /* checked by still_owned */
    int rc = kb_sink_deliver(rt->sink, &dl, -1);   /* blocks while the lane is full */
    if (rc == KB_OK)
        return DELIVERED;
    atomic_fetch_sub(&p->inflight, 1);
    if (rc == KB_ECLOSED)
        return CLOSING;
    dead_now(rt, part, id, fields, attempt, "refused by the pool");
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

/* On taking a partition: its whole PEL (ours from before a restart and the
 * previous owner's), oldest first, before anything new, so per-key order holds
 * across failover. XPENDING in the same script gives the delivery counts. */
static int sweep(kb_redis_topic *rt, uint32_t part, uint32_t epoch)
{
    struct kb_transport *t = rt->t;
    kb_redis_part *p = &rt->parts[part];
    char cursor[KB_REDIS_ID_MAX] = "0-0", count[16];
    snprintf(count, sizeof count, "%d", t->batch);
    uint64_t claimed = 0, deleted = 0;
    int rc = DELIVERED;
    while (rc == DELIVERED) {
        const char *argv[] = {"EVAL", SWEEP_LUA, "2", p->lease, p->stream, t->token, t->group,
                              t->consumer, cursor, count};
        redisReply *r = kb__redis_cmd(&rt->conn, 10, argv, NULL);
        if (r == NULL)
            return PART_GONE;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_ARRAY ||
            r->element[1]->type != REDIS_REPLY_ARRAY || r->element[1]->elements < 2) {
            if (r->type == REDIS_REPLY_ERROR && group_gone(r->str))
                kb__redis_create_groups(&rt->conn, rt, NULL, 0);
            else if (r->type == REDIS_REPLY_ERROR)
                kb_log(t->bus, 4, "redis: recovery of %s: %s", p->stream, r->str);
            /* -1: the lease is gone on the server; the keeper will notice */
            freeReplyObject(r);
            kb__redis_nap(&t->consumers_stop, 100);   /* e.g. LOADING after a restart */
            return PART_GONE;
        }
        const redisReply *pend = r->element[0], *ac = r->element[1];
        const redisReply *ents = ac->element[1];
        size_t pi = 0;
        for (size_t i = 0; rc == DELIVERED && ents->type == REDIS_REPLY_ARRAY &&
                           i < ents->elements; i++) {
            const redisReply *e = ents->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 1)
                continue;
            /* both lists are in ID order: walk them together */
            uint32_t before = 1;
            while (pi < pend->elements) {
                const redisReply *pe = pend->element[pi];
                int cmp = pe->type == REDIS_REPLY_ARRAY && pe->elements >= 4
                              ? kb__redis_id_cmp(pe->element[0]->str, e->element[0]->str)
                              : -1;
                if (cmp > 0)
                    break;
                pi++;
                if (cmp == 0) {
                    before = (uint32_t)pe->element[3]->integer;
                    break;
                }
            }
            rc = deliver(rt, part, e, before + 1, epoch);
            claimed++;
        }
        if (ac->elements >= 3 && ac->element[2]->type == REDIS_REPLY_ARRAY)
            deleted += ac->element[2]->elements;
        bool last = ac->element[0]->type != REDIS_REPLY_STRING ||
                    strcmp(ac->element[0]->str, "0-0") == 0;
        if (!last)
            snprintf(cursor, sizeof cursor, "%s", ac->element[0]->str);
        freeReplyObject(r);
        if (last)
            break;
    }
    if (rc == DELIVERED && (claimed > 0 || deleted > 0))
        kb_log(t->bus, 6, "redis: took %s: %llu pending entries redelivered, %llu deleted "
               "while pending", p->stream, (unsigned long long)claimed, (unsigned long long)deleted);
    return rc;
}

/* A read in flight: what was asked, under which epochs. */
typedef struct rround {
    uint32_t *parts;     /* partitions read */
    uint32_t *epochs;    /* their epochs when the read was sent */
    bool *ok;            /* validated: deliver this partition's entries */
    size_t n;
    bool pending;        /* sent, replies not read */
} rround;

/* Scratch of the consumer thread, allocated once. */
typedef struct reader {
    uint32_t *seen;      /* seen[i]: epoch of partition i whose sweep is done; 0 = sweep needed */
    rround r[2];          /* the read being handled and the one sent ahead of it */
    const char **argv;
    int count;            /* XREADGROUP COUNT now: redis.batch .. READ_COUNT_GROWTH times it */
} reader;

/* A hot partition (one aggregate, say) fills every read: let its reads grow
 * so the per-read cost (a round trip, the lease and XPENDING checks of every
 * partition) is spread over more entries, and shrink them back when reads
 * come back well short, so lanes of quiet topics are not flooded. */
#define READ_COUNT_GROWTH 8

static void adapt_count(reader *rd, int batch, size_t most)
{
    if (most >= (size_t)rd->count && rd->count < batch * READ_COUNT_GROWTH)
        rd->count *= 2;
    else if (most < (size_t)rd->count / 4 && rd->count > batch)
        rd->count /= 2;
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

/* Send one read rround: a single XREADGROUP ... BLOCK over every live, swept
 * partition, followed in the same pipeline (validated reads, the default
 * redis.fenced_reads = 1) by GET of each lease and the XPENDING summary of each
 * partition. The server runs a pipeline in order, so:
 *   - GET after the read still holding our token means the lease was ours when
 *     the read ran (a token is this process's alone; losing and retaking it in
 *     between bumps the local epoch, which deliver() checks). Otherwise the
 *     entries are not delivered: they stay in our PEL for the next owner.
 *   - a read by a process that had lost the lease (paused past the TTL) leaves
 *     entries in *its* PEL after this owner's sweep. XPENDING shows them (no
 *     other consumer may have pending entries in a partition we swept), and
 *     before delivering anything newer this process sweeps again: XAUTOCLAIM
 *     moves them here and they are handled first, in ID order.
 * Every delivered entry thus passes a server-side lease check, with no Lua
 * conversion of entries. False: nothing to read (no live partition) or the
 * connection failed. */
static bool send_round(kb_redis_topic *rt, reader *rd, rround *ro)
{
    struct kb_transport *t = rt->t;
    redisContext *c = rt->conn.c;
    ro->n = 0;
    ro->pending = false;
    for (uint32_t i = 0; c != NULL && i < rt->nparts; i++) {
        kb_redis_part *p = &rt->parts[i];
        uint32_t e = atomic_load(&p->epoch);
        if (rd->seen[i] == 0 || rd->seen[i] != e || !kb__redis_part_live(p))
            continue;
        ro->epochs[ro->n] = e;
        ro->parts[ro->n++] = i;
    }
    if (ro->n == 0)
        return false;
    char count[16], block[16];
    snprintf(count, sizeof count, "%d", rd->count);
    snprintf(block, sizeof block, "%d", t->block_ms);
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
        argv[argc++] = rt->parts[ro->parts[j]].stream;
    for (size_t j = 0; j < n; j++)
        argv[argc++] = ">";
    redisAppendCommandArgv(c, (int)argc, argv, NULL);
    if (t->fenced_reads) {
        for (size_t j = 0; j < n; j++) {
            const char *get[] = {"GET", rt->parts[ro->parts[j]].lease};
            redisAppendCommandArgv(c, 2, get, NULL);
        }
        for (size_t j = 0; j < n; j++) {
            const char *pend[] = {"XPENDING", rt->parts[ro->parts[j]].stream, t->group};
            redisAppendCommandArgv(c, 3, pend, NULL);
        }
    }
    /* on the wire now: the server prepares it while we deliver the previous one */
    for (int done = 0; !done;)
        if (redisBufferWrite(c, &done) != REDIS_OK) {
            kb__redis_conn_fail(&rt->conn, c->errstr);
            return false;
        }
    ro->pending = true;
    return true;
}

/* Read a rround's replies and deliver its entries. With `ahead`, the next rround
 * is sent first when this one brought entries and needs no sweep, so the
 * server reads while this thread delivers (each rround is validated on its
 * own). CLOSING ends the thread. */
static int recv_round(kb_redis_topic *rt, reader *rd, rround *ro, rround *ahead)
{
    struct kb_transport *t = rt->t;
    redisContext *c = rt->conn.c;
    size_t n = ro->n, want = 1 + (t->fenced_reads ? 2 * n : 0);
    ro->pending = false;
    if (c == NULL)
        return PART_GONE;
    redisReply *x = NULL;
    if (redisGetReply(c, (void **)&x) != REDIS_OK) {
        kb__redis_conn_fail(&rt->conn, c->errstr);
        return PART_GONE;
    }
    bool clean = true;   /* every check passed: nothing to sweep, nothing refused */
    for (size_t j = 0; j < n; j++)
        ro->ok[j] = true;
    for (size_t k = 1; k < want; k++) {
        redisReply *y = NULL;
        if (redisGetReply(c, (void **)&y) != REDIS_OK) {
            kb__redis_conn_fail(&rt->conn, c->errstr);
            freeReplyObject(x);
            return PART_GONE;   /* nothing delivered: the next sweep finds the entries */
        }
        size_t j = (k - 1) % n;
        uint32_t part = ro->parts[j];
        if (k <= n) {
            if (y->type != REDIS_REPLY_STRING || strcmp(y->str, t->token) != 0)
                ro->ok[j] = false;   /* lost on the server; the keeper will notice */
        } else if (foreign_pending(t, y)) {
            ro->ok[j] = false;
            rd->seen[part] = 0;      /* sweep again before anything newer */
            if (atomic_fetch_add(&t->stray, 1) == 0)
                kb_log(t->bus, 4, "redis: %s has entries pending for another consumer (a read "
                       "after its lease was lost); sweeping it again", rt->parts[part].stream);
        } else if (y->type == REDIS_REPLY_ERROR) {
            ro->ok[j] = false;
        }
        clean &= ro->ok[j];
        freeReplyObject(y);
    }
    int rc = DELIVERED;
    if (x->type == REDIS_REPLY_ERROR) {
        if (group_gone(x->str)) {
            /* the server lost its data (restart without AOF, FLUSHALL): start over from 0 */
            kb_log(t->bus, 4, "redis: group %s missing on %s; recreating from 0", t->group,
                   rt->name);
            kb__redis_create_groups(&rt->conn, rt, NULL, 0);
        } else {
            kb_log(t->bus, 4, "redis: reading %s: %s", rt->name, x->str);
            kb__redis_nap(&t->consumers_stop, 100);
        }
        rc = PART_GONE;
    } else if (x->type == REDIS_REPLY_ARRAY) {
        if (ahead != NULL && clean)
            send_round(rt, rd, ahead);
        /* [[stream, [entry...]]...], only streams with new entries */
        size_t most = 0;
        for (size_t s = 0; s < x->elements; s++)
            if (x->element[s]->type == REDIS_REPLY_ARRAY && x->element[s]->elements >= 2 &&
                x->element[s]->element[1]->elements > most)
                most = x->element[s]->element[1]->elements;
        adapt_count(rd, t->batch, most);
        for (size_t s = 0; rc != CLOSING && s < x->elements; s++) {
            const redisReply *sr = x->element[s];
            if (sr->type != REDIS_REPLY_ARRAY || sr->elements < 2 ||
                sr->element[0]->type != REDIS_REPLY_STRING ||
                sr->element[1]->type != REDIS_REPLY_ARRAY)
                continue;
            size_t j = 0;
            while (j < n && strcmp(rt->parts[ro->parts[j]].stream, sr->element[0]->str) != 0)
                j++;
            if (j == n || !ro->ok[j])
                continue;   /* the rest stays in our PEL for the next owner or sweep */
            const redisReply *ents = sr->element[1];
            for (size_t i = 0; i < ents->elements; i++) {
                int d = deliver(rt, ro->parts[j], ents->element[i], 1, ro->epochs[j]);
                if (d == CLOSING)
                    rc = CLOSING;
                if (d != DELIVERED)
                    break;
            }
        }
    }
    freeReplyObject(x);
    return rc;
}

static bool sweep_due(const kb_redis_topic *rt, const uint32_t *seen)
{
    for (uint32_t i = 0; i < rt->nparts; i++)
        if (seen[i] != atomic_load(&rt->parts[i].epoch) && kb__redis_part_live(&rt->parts[i]))
            return true;
    return false;
}

void *kb__redis_consume_main(void *arg)
{
    kb_redis_topic *rt = arg;
    struct kb_transport *t = rt->t;
    size_t np = rt->nparts;
    reader rd = {.seen = calloc(np, sizeof *rd.seen), .argv = calloc(9 + 2 * np, sizeof *rd.argv),
                 .count = t->batch};
    bool ready = rd.seen && rd.argv;
    for (int k = 0; k < 2; k++) {
        rd.r[k].parts = calloc(np, sizeof *rd.r[k].parts);
        rd.r[k].epochs = calloc(np, sizeof *rd.r[k].epochs);
        rd.r[k].ok = calloc(np, sizeof *rd.r[k].ok);
        ready &= rd.r[k].parts && rd.r[k].epochs && rd.r[k].ok;
    }
    if (!ready)
        kb_log(t->bus, 3, "redis: out of memory starting the consumer of %s", rt->name);
    uint32_t *seen = rd.seen;
    rround *cur = &rd.r[0], *next = &rd.r[1];
    while (ready && !atomic_load(&t->consumers_stop)) {
        if (kb__redis_conn_get(&rt->conn, NULL, 0) == NULL) {
            memset(seen, 0, np * sizeof *seen);   /* replies may have been lost */
            cur->pending = next->pending = false;
            kb__redis_nap(&t->consumers_stop, 50);
            continue;
        }
        int rc = DELIVERED;
        if (sweep_due(rt, seen)) {
            /* the connection must be quiet: finish the read in flight first */
            if (cur->pending)
                rc = recv_round(rt, &rd, cur, NULL);
            for (uint32_t i = 0; rc != CLOSING && rt->conn.c != NULL && i < rt->nparts; i++) {
                uint32_t e = atomic_load(&rt->parts[i].epoch);
                if (seen[i] == e || !kb__redis_part_live(&rt->parts[i]))
                    continue;
                rc = sweep(rt, i, e);
                if (rc == DELIVERED)
                    seen[i] = e;
            }
        }
        if (rc != CLOSING && rt->conn.c != NULL && !cur->pending && !send_round(rt, &rd, cur)) {
            if (rt->conn.c != NULL)
                kb__redis_nap(&t->consumers_stop, 20);   /* nothing owned yet */
        } else if (rc != CLOSING && rt->conn.c != NULL) {
            rc = recv_round(rt, &rd, cur, next);
            rround *done = cur;
            cur = next;
            next = done;
        }
        if (rc == CLOSING)
            break;
        if (rt->conn.c == NULL) {
            memset(seen, 0, np * sizeof *seen);
            cur->pending = next->pending = false;
        }
    }
    for (int k = 0; k < 2; k++) {
        free(rd.r[k].ok);
        free(rd.r[k].epochs);
        free(rd.r[k].parts);
    }
    free(rd.argv);
    free(rd.seen);
    return NULL;
}
