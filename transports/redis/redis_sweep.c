/* Recovery of a partition just taken: its whole pending list (ours from
 * before a restart and the previous owner's) is claimed and delivered, oldest
 * first, before anything new is read, so per-key order holds across failover. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

/* Reads are fenced on the server: a process that lost its lease (paused, say)
 * must not move entries into its PEL after the new owner swept it, or those
 * entries would sit there, skipped, while later ones of their keys are handled. */
/* An entry deleted while pending (c[3]: XAUTOCLAIM drops it from the PEL;
 * Redis 7 only, 6.2 reports none and leaves it to the hash's expiry) is
 * never acked, so its progress record would outlive it: deleted here, up to
 * 1000 IDs per HDEL (c[3] holds up to 10 x COUNT, and unpack is bounded by
 * Lua's stack). A record written after this HDEL (a half-settled frame that
 * was trimmed, released at close) stays until the hash expires.
 * A frame's events' runs are recorded under "<ID>.<index>": its element of
 * `runs` is then an array, one per event, and its progress record last
 * (redis_progress.c; nil when none). HGET, as every command docs/security.md
 * grants (no HMGET); none when the partition has no run records at all (the
 * usual case after a crash: records are only written for redelivered or
 * retried events), where a frame would cost one HGET per event for nothing.
 * That is checked per page (per call of this script): once the events of an
 * earlier page have run again and recorded it, a later page reads them. */
static const char SWEEP_LUA[] =
    "if redis.call('get',KEYS[1])~=ARGV[1] then return -1 end "
    "local c = redis.call('xautoclaim',KEYS[2],ARGV[2],ARGV[3],0,ARGV[4],'COUNT',ARGV[5]) "
    "local g = c[3] "
    "if type(g) == 'table' then for i = 1, #g, 1000 do "
    "redis.call('hdel',KEYS[4],unpack(g,i,math.min(i+999,#g))) end end "
    "local has = redis.call('exists',KEYS[3]) == 1 "
    "local runs = {} "
    "for i, e in ipairs(c[2]) do "
    "local r = 0 "
    "if type(e) == 'table' and type(e[2]) == 'table' then "
    "local n, k, f = nil, false, false "
    "for j = 1, #e[2], 2 do local x = e[2][j] "
    "if x == 'k' then k = true elseif x == 'f' then f = true "
    "elseif x == 'n' then n = tonumber(e[2][j+1]) end end "
    "if n and f and not k and n >= 1 and n <= 4096 then "
    "r = {} for j = 0, n - 1 do "
    "r[j+1] = has and tonumber(redis.call('hget',KEYS[3],e[1] .. '.' .. j) or '0') or 0 end "
    "r[n+1] = redis.call('hget',KEYS[4],e[1]) "
    "elseif has then r = tonumber(redis.call('hget',KEYS[3],e[1]) or '0') end end "
    "runs[i] = r end "
    "return {runs, c}";

bool kb__redis_sweep_reply(const redisReply *r, kb_redis_swept *out)
{
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_ARRAY ||
        r->element[1]->type != REDIS_REPLY_ARRAY || r->element[1]->elements < 2)
        return false;
    const redisReply *ac = r->element[1];
    out->runs = r->element[0];
    out->ents = ac->element[1]->type == REDIS_REPLY_ARRAY ? ac->element[1] : NULL;
    out->gone = ac->elements >= 3 && ac->element[2]->type == REDIS_REPLY_ARRAY ? ac->element[2]
                                                                              : NULL;
    bool last = ac->element[0]->type != REDIS_REPLY_STRING ||
                strcmp(ac->element[0]->str, "0-0") == 0;
    out->cursor = last ? NULL : ac->element[0]->str;
    return true;
}

/* Entries deleted while pending (trimmed by redis.maxlen, or XDEL by another
 * client): XAUTOCLAIM lists their IDs and drops them from the pending list,
 * so recovery goes on without them. They are lost: each is named. */
static uint64_t trimmed(kb_transport *t, const kb_redis_part *p, const redisReply *ids)
{
    if (ids->type != REDIS_REPLY_ARRAY)
        return 0;
    for (size_t i = 0; i < ids->elements; i++)
        if (ids->element[i]->type == REDIS_REPLY_STRING)
            kb_log(t->bus, KB_LOG_WARNING, "redis: %s entry %s was deleted (trimmed by "
                   "redis.maxlen?) while pending: lost before it was handled", p->stream,
                   ids->element[i]->str);
    return ids->elements;
}

/* A sweep page's entries from `from` on wait for lane space, with their
 * runs; the page's reply `r` is theirs now. False when out of memory. */
static bool sweep_wait(kb_redis_part *p, redisReply *r, const redisReply *ents, size_t from,
                       const redisReply *runs, uint32_t epoch)
{
    kb_redis_held *h = kb__redis_held_new(r);
    if (h == NULL) {
        kb__redis_reply_free(r);
        return false;
    }
    bool queued = kb__redis_wait_push(p, h, ents, from, epoch, runs);
    kb__redis_held_unref(h);   /* the waiting entries hold it now, if queued */
    return queued;
}

/* On taking a partition: its whole PEL (ours from before a restart and the
 * previous owner's), oldest first, before anything new, so per-key order holds
 * across failover. The same script reads each entry's recorded runs.
 * A full lane pauses it (KB_REDIS_LANE_FULL): the page's rest waits like a read's,
 * and the sweep goes on from p->sweep_cursor once it is delivered. */
int kb__redis_sweep(kb_transport_topic *tt, uint32_t part, uint32_t epoch)
{
    kb_transport *t = tt->t;
    kb_redis_part *p = &tt->parts[part];
    if (p->sweeping != epoch) {
        p->sweeping = epoch;
        /* again under the same lease (a stray read, a refused check, a lost
         * connection): what this process handed over settles on its own */
        p->sweep_after = !p->sweep_whole && p->handed_epoch == epoch &&
                         kb__redis_id_after(p->handed, p->sweep_cursor, sizeof p->sweep_cursor);
        p->sweep_whole = false;
        if (!p->sweep_after)
            snprintf(p->sweep_cursor, sizeof p->sweep_cursor, "0-0");
    }
    char count[16], runs_key[KB_REDIS_KEY_MAX];
    snprintf(count, sizeof count, "%d", t->batch);
    kb__redis_runs_key(runs_key, sizeof runs_key, tt->name, part);
    uint64_t claimed = 0, deleted = 0;
    int rc = KB_REDIS_DELIVERED;
    while (rc == KB_REDIS_DELIVERED && p->sweep_cursor[0] != '\0') {
        const char *argv[] = {"EVAL", SWEEP_LUA, "4", p->lease, p->stream, runs_key, p->done,
                              t->token, t->group, t->consumer, p->sweep_cursor, count};
        redisReply *r = kb__redis_cmd(&t->rconn, 12, argv, NULL);
        kb_redis_swept sw;
        if (!kb__redis_sweep_reply(r, &sw)) {
            p->sweeping = 0;   /* start over next time */
            if (r == NULL)
                return KB_REDIS_PART_GONE;
            if (r->type == REDIS_REPLY_ERROR && kb__redis_group_gone(r->str))
                kb__redis_create_groups(&t->rconn, tt, "0", NULL, 0);
            else if (r->type == REDIS_REPLY_ERROR)
                kb_log(t->bus, KB_LOG_WARNING, "redis: recovery of %s: %s", p->stream, r->str);
            /* -1: the lease is gone on the server; the keeper will notice */
            kb__redis_reply_free(r);
            kb__redis_reader_nap(t, atomic_load(&t->leases_taken), 100);   /* e.g. LOADING after a restart */
            return KB_REDIS_PART_GONE;
        }
        const redisReply *runs = sw.runs, *ents = sw.ents;
        if (sw.gone != NULL) {
            uint64_t gone = trimmed(t, p, sw.gone);
            atomic_fetch_add(&tt->trimmed, gone);
            deleted += gone;
        }
        snprintf(p->sweep_cursor, sizeof p->sweep_cursor, "%s", sw.cursor ? sw.cursor : "");
        size_t i = 0;
        if (ents != NULL)
            rc = kb__redis_deliver_run(tt, part, ents, &i, runs, KB_DELIVERY_F_REDELIVERED,
                                       epoch, 0, false);
        claimed += i;
        if (rc == KB_REDIS_LANE_FULL) {
            if (!sweep_wait(p, r, ents, i, runs, epoch)) {
                kb__redis_wait_drop(p);
                p->sweeping = 0;   /* out of memory: from the start next time */
                return KB_REDIS_PART_GONE;
            }
            r = NULL;
        }
        kb__redis_reply_free(r);
    }
    if (rc != KB_REDIS_LANE_FULL)
        p->sweeping = 0;   /* done, or to be started over */
    if (rc == KB_REDIS_DELIVERED && (claimed > 0 || deleted > 0))
        kb_log(t->bus, KB_LOG_INFO, "redis: took %s: %llu pending entries redelivered, %llu deleted "
               "while pending", p->stream, (unsigned long long)claimed, (unsigned long long)deleted);
    return rc;
}
