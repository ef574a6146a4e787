/* Consuming: subscribe, and the reader thread of a bus (kb-redis-reader):
 * recovery sweeps of newly taken partitions, then one batched XREADGROUP over
 * the partitions this process owns in every subscribed topic, each entry
 * handed to its topic's pool. The only thread that feeds those pools, so
 * threads and connections do not grow with topics. It blocks in XREADGROUP
 * (redis.block_ms), or on reader_wake while it owns nothing (a lease taken or
 * stop wakes it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

/* A partition asked for in a read, under the epoch it had when sent. */
typedef struct rpart {
    kb_redis_part *p;
    uint32_t epoch;
    bool ok;                 /* validated: deliver this partition's entries */
    bool ahead;              /* its lease and XPENDING checks went right behind the read */
    bool ahead_ok;           /* and passed */
} rpart;

/* A read in flight: what was asked, in request order. */
typedef struct rround {
    rpart *v;
    size_t n, cap;
    bool pending;            /* sent, replies not read */
} rround;

/* Commands encoded once and sent again while what they name is unchanged:
 * hiredis's formatting of a read over every partition and of its checks (sds
 * appends, a strlen per argument, snprintf) was about a tenth of the reader's
 * time at 10k events/s (perf), for the same bytes read after read. */
typedef struct enc {
    kb_redis_part **parts;   /* the partitions named, in order */
    size_t n, pcap;
    int count;               /* a read's COUNT, 0 for checks */
    bool block;
    bool valid;
    char *buf;
    size_t len, cap;
} enc;

/* Scratch of the reader thread; grows with the partitions it reads. */
typedef struct reader {
    rround r[2];             /* the read being handled and the one sent ahead of it */
    const char **argv;
    size_t *lens;            /* of argv */
    size_t argv_cap, lens_cap;
    enc read_enc;            /* the last read sent */
    enc chk_enc;             /* the last checks sent */
    size_t *hit;             /* indexes into a rround of the streams a read returned */
    size_t hit_cap;
    size_t *chk;             /* indexes into a rround of the partitions checked together */
    size_t chk_cap;
    int count;               /* XREADGROUP COUNT now: redis.batch .. READ_COUNT_GROWTH times it */
    size_t stuck;            /* partitions whose entries wait for lane space */
} reader;

/* A hot partition (one aggregate, say) fills every read: let its reads grow
 * so the per-read cost (a round trip, the lease and XPENDING checks) is spread
 * over more entries, and shrink them back when reads come back well short,
 * so lanes of quiet topics are not flooded. COUNT times the partitions that
 * brought entries (`hits`) stays within what one partition may bring
 * (redis.batch x READ_COUNT_GROWTH), COUNT halving each read while over it,
 * down to redis.batch: eight full partitions at 2,048 each made 10 MB
 * replies, whose fresh memory cost the reader a page fault per 4 KiB. */
#define READ_COUNT_GROWTH 8

#define WARM_NS 1000000000LL   /* a partition with entries this recently: checks behind a blocking read */
#define WARM_AHEAD_MAX 16

static void adapt_count(reader *rd, int batch, size_t most, size_t hits)
{
    size_t whole = (size_t)batch * READ_COUNT_GROWTH, count = (size_t)rd->count;
    hits = hits > 0 ? hits : 1;
    if (most >= count && count * 2 * hits <= whole)
        rd->count *= 2;
    else if ((most < count / 4 || count * hits > whole) && rd->count > batch)
        rd->count /= 2;
}

/* Room for n partitions in both rounds and in argv; false when out of memory. */
static bool reserve(reader *rd, size_t n)
{
    return kb_vec_reserve((void **)&rd->r[0].v, &rd->r[0].cap, n, sizeof *rd->r[0].v) == KB_OK &&
           kb_vec_reserve((void **)&rd->r[1].v, &rd->r[1].cap, n, sizeof *rd->r[1].v) == KB_OK &&
           kb_vec_reserve((void **)&rd->argv, &rd->argv_cap, 9 + 2 * n, sizeof *rd->argv) == KB_OK &&
           kb_vec_reserve((void **)&rd->lens, &rd->lens_cap, 9 + 2 * n, sizeof *rd->lens) == KB_OK &&
           kb_vec_reserve((void **)&rd->hit, &rd->hit_cap, n, sizeof *rd->hit) == KB_OK &&
           kb_vec_reserve((void **)&rd->chk, &rd->chk_cap, n, sizeof *rd->chk) == KB_OK;
}

/* e was encoded for the partitions ro->v[idx[j]] (ro->v[j] when idx is NULL),
 * j < n, with this COUNT and BLOCK. */
static bool enc_same(const enc *e, const rround *ro, const size_t *idx, size_t n, int count,
                     bool block)
{
    if (!e->valid || e->n != n || e->count != count || e->block != block)
        return false;
    for (size_t j = 0; j < n; j++)
        if (e->parts[j] != ro->v[idx != NULL ? idx[j] : j].p)
            return false;
    return true;
}

/* Start encoding e anew for those partitions. False when out of memory. */
static bool enc_start(enc *e, const rround *ro, const size_t *idx, size_t n, int count, bool block)
{
    e->valid = false;
    e->len = 0;
    if (kb_vec_reserve((void **)&e->parts, &e->pcap, n, sizeof *e->parts) != KB_OK)
        return false;
    for (size_t j = 0; j < n; j++)
        e->parts[j] = ro->v[idx != NULL ? idx[j] : j].p;
    e->n = n;
    e->count = count;
    e->block = block;
    return true;
}

/* Append one command to e (lens: scratch for argc lengths). */
static bool enc_add(enc *e, int argc, const char **argv, size_t *lens)
{
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    size_t need = kb__redis_backlog_cmd_bytes(argc, lens);
    if (kb_vec_reserve((void **)&e->buf, &e->cap, e->len + need, 1) != KB_OK)
        return false;
    kb__redis_cmd_put(e->buf + e->len, argc, argv, lens);
    e->len += need;
    return true;
}

static void enc_free(enc *e)
{
    free(e->parts);
    free(e->buf);
}

/* Validated reads (redis.fenced_reads = 1, the default): for each partition
 * the read returned entries of, its lease (one MGET for all of them) and the
 * XPENDING summary, run by the server after the read and read here before
 * any entry is delivered:
 *   - the lease still holding our token means it was ours when the read ran:
 *     a token is this process's alone, and losing and retaking the lease in
 *     between bumps the local epoch, which deliver() checks. Otherwise the
 *     entries are not delivered: they stay in our PEL for the next owner.
 *   - a read by a process that had lost the lease (paused past the TTL) leaves
 *     entries in *its* PEL after this owner's sweep, newer than anything this
 *     owner read before. XPENDING shows them (no other consumer may have
 *     pending entries in a partition we swept), and before delivering anything
 *     of the partition this process sweeps again: XAUTOCLAIM moves them here
 *     and they are handled first, in ID order.
 * A partition that returned entries in its previous read has them sent right
 * behind this read (send_round); others that return entries now are checked
 * with a round trip of their own. Partitions that returned nothing cost
 * nothing, so an idle topic adds one stream name to the read and no command.
 * Checks are batched as 1 + n commands for n partitions: the server's cost of
 * a command (parsing, dispatch, a reply) is paid per command, not per key. */
static bool append_checks(kb_transport *t, reader *rd, const rround *ro, size_t n)
{
    enc *e = &rd->chk_enc;
    if (!enc_same(e, ro, rd->chk, n, 0, false)) {
        if (!enc_start(e, ro, rd->chk, n, 0, false))
            return false;
        rd->argv[0] = "MGET";   /* every lease in one command, not a GET each */
        for (size_t j = 0; j < n; j++)
            rd->argv[1 + j] = ro->v[rd->chk[j]].p->lease;
        if (!enc_add(e, (int)(1 + n), rd->argv, rd->lens))
            return false;
        for (size_t j = 0; j < n; j++) {
            const char *pend[] = {"XPENDING", ro->v[rd->chk[j]].p->stream, t->group};
            if (!enc_add(e, 3, pend, rd->lens))
                return false;
        }
        e->valid = true;
    }
    return redisAppendFormattedCommand(t->rconn.c, e->buf, e->len) == REDIS_OK;
}

/* An XPENDING summary: no other consumer has entries pending here. */
static bool none_foreign(kb_transport *t, kb_redis_part *p, const redisReply *y)
{
    if (kb__redis_foreign_pending(t, y)) {
        p->swept = 0;            /* sweep again before anything newer */
        p->sweep_whole = p->sweep_after;   /* they lie below what we handed */
        if (atomic_fetch_add(&t->stray, 1) == 0)
            kb_log(t->bus, KB_LOG_WARNING, "redis: %s has entries pending for another consumer (a read "
                   "after its lease was lost); sweeping it again", p->stream);
        return false;
    }
    return true;
}

/* The replies of append_checks for rd->chk[0, n): each partition's verdict
 * in ahead_ok (`ahead`) or ANDed into ok. False: the connection failed
 * (nothing is delivered: the next sweep finds the entries). */
static bool read_checks(kb_transport *t, reader *rd, rround *ro, size_t n, bool ahead)
{
    redisContext *c = t->rconn.c;
    redisReply *m = NULL;
    if (redisGetReply(c, (void **)&m) != REDIS_OK) {
        kb__redis_conn_fail(&t->rconn, c->errstr);
        return false;
    }
    bool alive = true;
    for (size_t j = 0; j < n; j++) {
        rpart *rp = &ro->v[rd->chk[j]];
        redisReply *y = NULL;
        if (redisGetReply(c, (void **)&y) != REDIS_OK) {
            kb__redis_conn_fail(&t->rconn, c->errstr);
            alive = false;
            break;
        }
        /* a refused check (LOADING, say) proves nothing either way: what was
         * read waits in our PEL, and a sweep (retried while refused) brings it */
        bool refused = m->type != REDIS_REPLY_ARRAY || y->type == REDIS_REPLY_ERROR;
        if (refused)
            rp->p->swept = 0;
        bool passed = !refused && none_foreign(t, rp->p, y) && kb__redis_lease_ours(t, m, j);
        if (passed)
            rp->p->sweep_after = false;
        kb__redis_reply_free(y);
        if (ahead)
            rp->ahead_ok = passed;
        else
            rp->ok &= passed;
    }
    kb__redis_reply_free(m);
    return alive;
}

/* Send one read: a single XREADGROUP over every live, swept partition of
 * every topic, with BLOCK when `wait` and no entries wait for lane space.
 * False: nothing to read (no live partition), out of memory, or the
 * connection failed. */
static bool send_round(kb_transport *t, reader *rd, rround *ro, bool wait)
{
    redisContext *c = t->rconn.c;
    ro->n = 0;
    ro->pending = false;
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); c != NULL && tt != NULL;
         tt = tt->sub_next)
        for (uint32_t i = 0; i < tt->nparts; i++) {
            kb_redis_part *p = &tt->parts[i];
            uint32_t e = atomic_load(&p->epoch);
            if (p->swept == 0 || p->swept != e || !kb__redis_part_live(p) || p->waiting != NULL)
                continue;
            if (!reserve(rd, ro->n + 1))
                return false;
            ro->v[ro->n++] = (rpart){p, e, false, false, false};
        }
    if (ro->n == 0)
        return false;
    /* Redis times a BLOCK out only on its next timer tick (hz 10 by default:
     * up to 100 ms late; BLOCK 1 on quiet streams answered after 50-95 ms).
     * Entries that wait for lane space cannot wait that long, so a read sent
     * while they do, or sent ahead of a delivery (which may fill a lane),
     * does not block. */
    bool block_now = wait && rd->stuck == 0;
    size_t n = ro->n;
    enc *e = &rd->read_enc;
    if (!enc_same(e, ro, NULL, n, rd->count, block_now)) {
        char count[16], block[16];
        snprintf(count, sizeof count, "%d", rd->count);
        snprintf(block, sizeof block, "%d", t->block_ms);
        const char **argv = rd->argv;
        size_t argc = 0;
        argv[argc++] = "XREADGROUP";
        argv[argc++] = "GROUP";
        argv[argc++] = t->group;
        argv[argc++] = t->consumer;
        argv[argc++] = "COUNT";
        argv[argc++] = count;
        if (block_now) {
            argv[argc++] = "BLOCK";
            argv[argc++] = block;
        }
        argv[argc++] = "STREAMS";
        for (size_t j = 0; j < n; j++)
            argv[argc++] = ro->v[j].p->stream;
        for (size_t j = 0; j < n; j++)
            argv[argc++] = ">";
        if (!enc_start(e, ro, NULL, n, rd->count, block_now) ||
            !enc_add(e, (int)argc, argv, rd->lens))
            return false;
        e->valid = true;
    }
    if (redisAppendFormattedCommand(c, e->buf, e->len) != REDIS_OK)
        return false;
    /* A partition that returned entries last time likely does again (one hot
     * aggregate): its checks go right behind the read, so they cost no round
     * trip of their own. They still run after the read: the server runs a
     * connection's commands in order, a blocked read first. A blocking read
     * is sparse traffic, one event a read, rarely from the partition of the
     * read before: there the partitions that brought entries within
     * WARM_NS go behind it too (at most WARM_AHEAD_MAX, so many quiet topics
     * add no commands), or each event would wait for a round trip of checks. */
    size_t hot = 0, warm = 0;
    int64_t now = block_now && t->fenced_reads ? kb_now_ns() : 0;
    for (size_t j = 0; t->fenced_reads && j < n; j++) {
        const kb_redis_part *p = ro->v[j].p;
        bool w = !p->hot && block_now && p->warm_ns != 0 && now - p->warm_ns < WARM_NS &&
                 warm < WARM_AHEAD_MAX;
        if (p->hot || w) {
            rd->chk[hot++] = j;
            ro->v[j].ahead = true;
            warm += w;
        }
    }
    if (hot > 0 && !append_checks(t, rd, ro, hot))
        for (size_t j = 0; j < n; j++)
            ro->v[j].ahead = false;   /* out of memory: checked after the reply instead */
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
        if (strcmp(ro->v[j].p->stream, stream) == 0)
            return j;
    }
    return ro->n;
}

/* Read the checks sent behind a read. False: the connection failed. */
static bool read_ahead_checks(kb_transport *t, reader *rd, rround *ro)
{
    size_t hot = 0;
    for (size_t j = 0; j < ro->n; j++)
        if (ro->v[j].ahead)
            rd->chk[hot++] = j;
    return hot == 0 || read_checks(t, rd, ro, hot, true);
}

/* The checks of the partitions that returned entries: those sent ahead are
 * in; the others get their round trip now. False: the connection failed. */
static bool validate(kb_transport *t, reader *rd, rround *ro, size_t hits, bool *clean)
{
    size_t late = 0;
    for (size_t h = 0; h < hits; h++)
        if (!ro->v[rd->hit[h]].ahead)
            rd->chk[late++] = rd->hit[h];
    if (late > 0 && !append_checks(t, rd, ro, late)) {
        for (size_t j = 0; j < late; j++) {   /* out of memory: left pending, swept again */
            ro->v[rd->chk[j]].ok = false;
            ro->v[rd->chk[j]].p->swept = 0;
        }
    } else if (late > 0 && !read_checks(t, rd, ro, late, false)) {
        return false;
    }
    for (size_t h = 0; h < hits; h++) {
        rpart *rp = &ro->v[rd->hit[h]];
        if (rp->ahead)
            rp->ok &= rp->ahead_ok;
        *clean &= rp->ok;
    }
    return true;
}

/* Recreate the groups of every topic (the server lost its data: FLUSHALL, a
 * restart without AOF); from 0, so nothing published meanwhile is skipped. */
static void groups_lost(kb_transport *t)
{
    kb_log(t->bus, KB_LOG_WARNING, "redis: group %s missing on %s; recreating from 0", t->group, t->where);
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL && t->rconn.c != NULL;
         tt = tt->sub_next)
        kb__redis_create_groups(&t->rconn, tt, "0", NULL, 0);
}

/* Read a round's reply, validate it and deliver its entries. With `ahead`,
 * the next round is sent first when this one came back full enough and needs no
 * sweep, so the server reads while this thread delivers (each round is
 * validated on its own). KB_REDIS_CLOSING when the bus no longer takes entries. */
static int recv_round(kb_transport *t, reader *rd, rround *ro, rround *ahead)
{
    redisContext *c = t->rconn.c;
    size_t n = ro->n;
    ro->pending = false;
    if (c == NULL)
        return KB_REDIS_PART_GONE;
    redisReply *x = NULL;
    if (redisGetReply(c, (void **)&x) != REDIS_OK) {
        kb__redis_conn_fail(&t->rconn, c->errstr);
        return KB_REDIS_PART_GONE;
    }
    if (!read_ahead_checks(t, rd, ro)) {
        kb__redis_reply_free(x);
        return KB_REDIS_PART_GONE;
    }
    for (size_t j = 0; j < n; j++)
        ro->v[j].p->hot = false;   /* until this read says otherwise */
    int rc = KB_REDIS_DELIVERED;
    if (x->type == REDIS_REPLY_ERROR) {
        if (kb__redis_group_gone(x->str)) {
            groups_lost(t);
        } else if (kb__redis_readonly(x)) {
            kb__redis_conn_fail(&t->rconn, x->str);   /* a replica now: reconnect to the primary */
        } else {
            kb_log(t->bus, KB_LOG_WARNING, "redis: reading from %s: %s", t->where, x->str);
            kb__redis_reader_nap(t, atomic_load(&t->leases_taken), 100);
        }
        rc = KB_REDIS_PART_GONE;
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
            ro->v[j].ok = true;
            ro->v[j].p->hot = true;
            ro->v[j].p->warm_ns = kb_now_ns();
            rd->hit[hits++] = j;
            if (sr->element[1]->elements > most)
                most = sr->element[1]->elements;
        }
        bool clean = true;   /* every check passed: nothing to sweep, nothing refused */
        if (t->fenced_reads && !validate(t, rd, ro, hits, &clean)) {
            kb__redis_reply_free(x);
            return KB_REDIS_PART_GONE;
        }
        /* Reading ahead lets the server fill the next read while this one is
         * delivered; it pays while reads come back full. A read well short
         * of COUNT (under a quarter in every partition: the reader keeps up)
         * would be followed by one that brings only what arrived during a
         * round trip, and the server's cost per read (the stream seeks, the
         * checks, a reply) would be paid for a handful of entries: the next
         * read goes after this delivery, with BLOCK. */
        if (ahead != NULL && clean && most >= (size_t)rd->count / 4)
            send_round(t, rd, ahead, false);
        adapt_count(rd, t->batch, most, hits);
        size_t h = 0;
        kb_redis_held *hd = NULL;   /* x, once entries of it wait for lane space */
        for (size_t s = 0; rc != KB_REDIS_CLOSING && s < x->elements; s++) {
            const redisReply *sr = x->element[s];
            if (sr->type != REDIS_REPLY_ARRAY || sr->elements < 2 ||
                sr->element[0]->type != REDIS_REPLY_STRING ||
                sr->element[1]->type != REDIS_REPLY_ARRAY)
                continue;
            if (h == hits || strcmp(ro->v[rd->hit[h]].p->stream, sr->element[0]->str) != 0)
                continue;   /* not one we asked for */
            size_t k = rd->hit[h++];
            if (!ro->v[k].ok)
                continue;   /* the rest stays in our PEL for the next owner or sweep */
            kb_redis_part *p = ro->v[k].p;
            const redisReply *ents = sr->element[1];
            size_t i = 0;
            int d = KB_REDIS_DELIVERED;
            if (p->waiting == NULL)   /* else these go behind what waits */
                d = kb__redis_deliver_run(p->tt, p->index, ents, &i, NULL, 0, ro->v[k].epoch, 0, false);
            if (d == KB_REDIS_CLOSING)
                rc = KB_REDIS_CLOSING;
            if ((d == KB_REDIS_LANE_FULL || p->waiting != NULL) && i < ents->elements) {
                if (hd == NULL)
                    hd = kb__redis_held_new(x);
                if (hd == NULL || !kb__redis_wait_push(p, hd, ents, i, ro->v[k].epoch, NULL)) {
                    kb__redis_wait_drop(p);   /* out of memory: swept again, from our PEL */
                    p->swept = 0;
                }
            }
        }
        if (hd != NULL) {
            kb__redis_held_unref(hd);
            return rc;
        }
    }
    kb__redis_reply_free(x);
    return rc;
}

/* Deliver what waits for lane space, partition by partition. `stuck`: how
 * many partitions still wait. The first that does may be waited for up to
 * timeout_ms (the reader has nothing else to do). */
static int drain_waiting(kb_transport *t, size_t *stuck, int timeout_ms)
{
    *stuck = 0;
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next)
        for (uint32_t i = 0; i < tt->nparts; i++) {
            if (tt->parts[i].waiting == NULL)
                continue;
            int rc = kb__redis_wait_deliver(&tt->parts[i], *stuck == 0 ? timeout_ms : 0);
            if (rc == KB_REDIS_CLOSING)
                return KB_REDIS_CLOSING;
            *stuck += tt->parts[i].waiting != NULL;
        }
    return KB_REDIS_DELIVERED;
}

static bool sweep_due(kb_transport *t)
{
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next)
        for (uint32_t i = 0; i < tt->nparts; i++)
            if (tt->parts[i].swept != atomic_load(&tt->parts[i].epoch) &&
                kb__redis_part_live(&tt->parts[i]))
                return true;
    return false;
}

/* Sweep every partition taken since its last sweep. */
static int sweep_taken(kb_transport *t)
{
    int rc = KB_REDIS_DELIVERED;
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next)
        for (uint32_t i = 0; rc != KB_REDIS_CLOSING && t->rconn.c != NULL && i < tt->nparts; i++) {
            kb_redis_part *p = &tt->parts[i];
            uint32_t e = atomic_load(&p->epoch);
            if (p->swept == e || !kb__redis_part_live(p))
                continue;
            if (p->sweeping != e)
                kb__redis_wait_drop(p);   /* a new sweep delivers them again, in order */
            else if (p->waiting != NULL)
                continue;       /* this sweep's entries wait for lane space first */
            rc = kb__redis_sweep(tt, i, e);
            if (rc == KB_REDIS_DELIVERED)
                p->swept = e;
        }
    return rc;
}

/* Replies may have been lost with the connection: sweep everything again. */
static void forget_sweeps(kb_transport *t, reader *rd)
{
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next)
        for (uint32_t i = 0; i < tt->nparts; i++) {
            kb__redis_wait_drop(&tt->parts[i]);
            tt->parts[i].swept = 0;
            tt->parts[i].sweeping = 0;
        }
    rd->r[0].pending = rd->r[1].pending = false;
    rd->stuck = 0;
}

static void *reader_main(void *arg)
{
    kb_transport *t = arg;
    reader rd = {.count = t->batch};
    rround *cur = &rd.r[0], *next = &rd.r[1];
    while (!atomic_load(&t->consumers_stop)) {
        uint64_t taken = atomic_load(&t->leases_taken);   /* before looking at the leases */
        if (kb__redis_conn_get(&t->rconn, NULL, 0) == NULL) {
            forget_sweeps(t, &rd);
            kb__redis_reader_nap(t, atomic_load(&t->leases_taken), 50);
            continue;
        }
        int rc = KB_REDIS_DELIVERED;
        if (sweep_due(t)) {
            /* the connection must be quiet: finish the read in flight first */
            if (cur->pending)
                rc = recv_round(t, &rd, cur, NULL);
            if (rc != KB_REDIS_CLOSING)
                rc = sweep_taken(t);
        }
        /* Still stuck since the last look: wait up to 1 ms for room (an
         * executor frees a slot within microseconds), so the reads that do not
         * block meanwhile come once per refill, not back to back. */
        if (rc != KB_REDIS_CLOSING)
            rc = drain_waiting(t, &rd.stuck, rd.stuck > 0 ? 1 : 0);
        if (rc != KB_REDIS_CLOSING && t->rconn.c != NULL && !cur->pending &&
            !send_round(t, &rd, cur, true)) {
            if (t->rconn.c != NULL && rd.stuck > 0)
                rc = drain_waiting(t, &rd.stuck, 20);    /* only full lanes: wait for room */
            else if (t->rconn.c != NULL)
                kb__redis_reader_nap(t, taken, t->block_ms);   /* nothing owned: a lease taken wakes it */
        } else if (rc != KB_REDIS_CLOSING && t->rconn.c != NULL) {
            rc = recv_round(t, &rd, cur, next);
            rround *done = cur;
            cur = next;
            next = done;
        }
        if (rc == KB_REDIS_CLOSING)
            break;
        if (t->rconn.c == NULL)
            forget_sweeps(t, &rd);
    }
    forget_sweeps(t, &rd);   /* frees what still waits */
    free(rd.r[0].v);
    free(rd.r[1].v);
    free(rd.argv);
    free(rd.lens);
    enc_free(&rd.read_enc);
    enc_free(&rd.chk_enc);
    free(rd.hit);
    free(rd.chk);
    atomic_store(&t->reader_done, true);
    kb_signal_notify(t->reader_wake);
    return NULL;
}

/* ---- subscribing and stopping ---- */

int kb__redis_subscribe(kb_transport *t, kb_transport_topic *tt, kb_sink *sink)
{
    int rc = kb__redis_check_meta(t, tt);
    if (rc != KB_OK)
        return rc;
    char err[300];
    pthread_mutex_lock(&t->ctl_lock);
    rc = kb__redis_create_groups(&t->ctl, tt, t->group_start, err, sizeof err);
    pthread_mutex_unlock(&t->ctl_lock);
    if (rc != KB_OK) {
        kb_errf(NULL, 0, "kb_subscribe %s: %s", tt->name, err);
        return KB_ETRANSPORT;
    }
    if (t->reader == NULL) {
        /* The first topic starts the bus's reader; its connection is made
         * here so that a failure (EMFILE, say) is this call's error. */
        if (kb__redis_conn_force(&t->rconn, err, sizeof err) == NULL) {
            kb_errf(NULL, 0, "kb_subscribe %s: the consumer cannot start: %s", tt->name, err);
            return KB_ETRANSPORT;
        }
        if (kb_thread_start(&t->reader, "kb-redis-reader", reader_main, t) != KB_OK) {
            kb_errf(NULL, 0, "kb_subscribe %s: cannot start the consumer thread", tt->name);
            return KB_ETRANSPORT;
        }
    }
    /* subscribes are serialised by the bus: no other writer */
    tt->sink = sink;
    atomic_store(&tt->subscribed, true);
    atomic_store(&tt->fresh, true);
    tt->sub_next = atomic_load(&t->subscribed);
    atomic_store(&t->subscribed, tt);
    atomic_store(&t->duties_now, true);
    kb_signal_notify(t->keeper_wake);   /* take leases now rather than at the next tick */
    return KB_OK;
}

static int reader_finished(void *arg)
{
    return atomic_load(&((kb_transport *)arg)->reader_done);
}

/* A read in flight ends within redis.block_ms on a live server; one that
 * answers nothing is cut (what was read stays pending for the next owner). */
void kb__redis_consume_stop(kb_transport *t)
{
    if (atomic_exchange(&t->consumers_stop, true) || t->reader == NULL)
        return;
    kb_signal_notify(t->reader_wake);
    if (!kb_signal_wait(t->reader_wake, reader_finished, t, kb_deadline_ns(t->block_ms + 500)))
        kb__redis_conn_cut(&t->rconn);
    kb_thread_join(t->reader);
    t->reader = NULL;
}
