/* The consumer thread of a topic: recovery sweeps of newly taken partitions,
 * then batched XREADGROUP over the partitions this process owns, each entry
 * handed to the topic's pool. The only thread that feeds that pool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
                      .cookie = rt};
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
/* New entries, or (none) the stream's last ID to wait on with XREAD BLOCK. */
static const char READ_LUA[] =
    "if redis.call('get',KEYS[1])~=ARGV[1] then return -1 end "
    "local r=redis.call('xreadgroup','GROUP',ARGV[2],ARGV[3],'COUNT',ARGV[4],'STREAMS',KEYS[2],'>') "
    "if r then return r end "
    "local last=redis.call('xrevrange',KEYS[2],'+','-','COUNT',1)[1] "
    "if last then return last[1] end return '0-0'";

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

/* Nothing new anywhere: wait (XREAD BLOCK, which moves no entry into any PEL)
 * until one of the streams grows past the tail the fenced read saw. */
static void wait_new(kb_redis_topic *rt, const char **keys, const char **tails, size_t n)
{
    const char **argv = malloc((6 + 2 * n) * sizeof *argv);
    if (argv == NULL)
        return;
    char block[16];
    snprintf(block, sizeof block, "%d", rt->t->block_ms);
    const char *head[] = {"XREAD", "COUNT", "1", "BLOCK", block, "STREAMS"};
    memcpy(argv, head, sizeof head);
    memcpy(argv + 6, keys, n * sizeof *argv);
    memcpy(argv + 6 + n, tails, n * sizeof *argv);
    freeReplyObject(kb__redis_cmd(&rt->conn, (int)(6 + 2 * n), argv, NULL));
    free(argv);
}

/* One fenced read of every live, swept partition (pipelined); CLOSING ends
 * the thread. */
static int read_new(kb_redis_topic *rt, const uint32_t *seen)
{
    struct kb_transport *t = rt->t;
    redisContext *c = kb__redis_conn_get(&rt->conn, NULL, 0);
    uint32_t *parts = malloc(rt->nparts * sizeof *parts);
    const char **keys = malloc(rt->nparts * sizeof *keys);
    const char **tails = malloc(rt->nparts * sizeof *tails);
    redisReply **r = calloc(rt->nparts, sizeof *r);
    size_t n = 0, got = 0, idle = 0;
    int rc = DELIVERED;
    char count[16];
    snprintf(count, sizeof count, "%d", t->batch);
    for (uint32_t i = 0; c != NULL && parts && keys && tails && r && i < rt->nparts; i++) {
        kb_redis_part *p = &rt->parts[i];
        if (seen[i] == 0 || seen[i] != atomic_load(&p->epoch) || !kb__redis_part_live(p))
            continue;
        const char *fenced[] = {"EVAL", READ_LUA, "2", p->lease, p->stream, t->token, t->group,
                                t->consumer, count};
        const char *plain[] = {"XREADGROUP", "GROUP", t->group, t->consumer, "COUNT", count,
                               "STREAMS", p->stream, ">"};
        redisAppendCommandArgv(c, 9, t->fenced_reads ? fenced : plain, NULL);
        parts[n++] = i;
    }
    for (; got < n; got++)
        if (redisGetReply(c, (void **)&r[got]) != REDIS_OK) {
            kb__redis_conn_fail(&rt->conn, c->errstr);
            rc = PART_GONE;
            break;
        }
    for (size_t j = 0; j < got; j++) {
        uint32_t part = parts[j];
        const redisReply *x = r[j];
        if (x->type == REDIS_REPLY_STRING || x->type == REDIS_REPLY_NIL) {
            /* nothing new: x is the tail (plain reads: unknown, wait for newer than now) */
            keys[idle] = rt->parts[part].stream;
            tails[idle++] = x->type == REDIS_REPLY_STRING ? x->str : "$";
        } else if (x->type == REDIS_REPLY_ERROR) {
            if (group_gone(x->str)) {
                /* the server lost its data (restart without AOF, FLUSHALL): start over from 0 */
                kb_log(t->bus, 4, "redis: group %s missing on %s; recreating from 0", t->group,
                       rt->name);
                kb__redis_create_groups(&rt->conn, rt, NULL, 0);
            } else {
                kb_log(t->bus, 4, "redis: reading %s: %s", rt->parts[part].stream, x->str);
                kb__redis_nap(&t->consumers_stop, 100);
            }
            rc = rc == DELIVERED ? PART_GONE : rc;
        } else if (x->type == REDIS_REPLY_ARRAY && rc != CLOSING) {
            /* [[stream, [entry...]]], read under the epoch the sweep finished in */
            for (size_t s = 0; rc != CLOSING && s < x->elements; s++) {
                const redisReply *sr = x->element[s];
                if (sr->type != REDIS_REPLY_ARRAY || sr->elements < 2)
                    continue;
                const redisReply *ents = sr->element[1];
                for (size_t i = 0; i < ents->elements; i++) {
                    int d = deliver(rt, part, ents->element[i], 1, seen[part]);
                    if (d == CLOSING)
                        rc = CLOSING;
                    if (d != DELIVERED)
                        break;   /* the rest stays in our PEL for the next owner */
                }
            }
        }
    }
    if (rc == DELIVERED && n == 0)
        kb__redis_nap(&t->consumers_stop, 20);
    else if (rc == DELIVERED && idle == n)
        wait_new(rt, keys, tails, idle);
    for (size_t j = 0; j < got; j++)
        freeReplyObject(r[j]);
    free(r);
    free(tails);
    free(keys);
    free(parts);
    return rc;
}

void *kb__redis_consume_main(void *arg)
{
    kb_redis_topic *rt = arg;
    struct kb_transport *t = rt->t;
    /* seen[i]: epoch of partition i whose sweep is done; 0 = sweep needed */
    uint32_t *seen = calloc(rt->nparts, sizeof *seen);
    while (seen != NULL && !atomic_load(&t->consumers_stop)) {
        if (kb__redis_conn_get(&rt->conn, NULL, 0) == NULL) {
            memset(seen, 0, rt->nparts * sizeof *seen);   /* replies may have been lost */
            kb__redis_nap(&t->consumers_stop, 50);
            continue;
        }
        int rc = DELIVERED;
        for (uint32_t i = 0; rc != CLOSING && i < rt->nparts; i++) {
            uint32_t e = atomic_load(&rt->parts[i].epoch);
            if (seen[i] == e || !kb__redis_part_live(&rt->parts[i]))
                continue;
            rc = sweep(rt, i, e);
            if (rc == DELIVERED)
                seen[i] = e;
        }
        if (rc != CLOSING)
            rc = read_new(rt, seen);
        if (rc == CLOSING)
            break;
        if (rt->conn.c == NULL)
            memset(seen, 0, rt->nparts * sizeof *seen);
    }
    free(seen);
    return NULL;
}
