/* Membership of a topic's consumer group: each live process heartbeats its
 * consumer name into kb:{topic}:members (a sorted set scored by wall-clock
 * ms); names not seen within a lease TTL are dropped, and consumers that left
 * are removed from the group. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redis_int.h"

/* Consumers that left: no pending entry, no lease, no heartbeat within a TTL,
 * idle at least ARGV[3] ms (ARGV[4]: only this name, or ""). Checked and
 * deleted in one script, so no entry can become pending in between and be
 * dropped with its consumer. KEYS: members, then the streams, then the leases. */
static const char PRUNE_LUA[] =
    "local n=(#KEYS-1)/2 local held={} "
    "for i=1,n do local v=redis.call('get',KEYS[n+1+i]) "
    "if v then held[string.match(v,'^(.*)#') or v]=true end end "
    "local gone=0 "
    "for i=1,n do local cs=redis.pcall('xinfo','consumers',KEYS[1+i],ARGV[1]) "
    "if not cs.err then for _,c in ipairs(cs) do local f={} "
    "for j=1,#c,2 do f[c[j]]=c[j+1] end "
    "if f.pending==0 and f.idle>=tonumber(ARGV[3]) and not held[f.name] and "
    "(ARGV[4]=='' or ARGV[4]==f.name) then local s=redis.call('zscore',KEYS[1],f.name) "
    "if not s or tonumber(s)<=tonumber(ARGV[2]) then "
    "redis.call('xgroup','delconsumer',KEYS[1+i],ARGV[1],f.name) gone=gone+1 end end "
    "end end end return gone";

/* Wall clock: the member scores are compared across processes. */
static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool kb__redis_members_beat(kb_transport *t, kb_transport_topic *tt, redisReply **reply,
                            const char ***names, size_t *n, size_t *cap)
{
    *reply = NULL;
    *n = 0;
    redisContext *c = kb__redis_conn_get(&t->kc, NULL, 0);
    if (c == NULL)
        return false;
    char now[24], dead_before[24], future[24];
    int64_t wall = wall_ms();
    snprintf(now, sizeof now, "%lld", (long long)wall);
    snprintf(dead_before, sizeof dead_before, "(%lld", (long long)(wall - t->lease_ttl_ms));
    /* A live member's score is its clock's now: never past ours by more than
     * the TTL and the clocks' skew. One past that was not written by keybus;
     * kept, it would own partitions no process serves for as long as it
     * stays. Dropped, so its worst is TTL + skew + TTL of such a delay. */
    snprintf(future, sizeof future, "(%lld",
             (long long)(wall + t->lease_ttl_ms + KB_REDIS_SKEW_MS));
    redisAppendCommand(c, "ZADD %s %s %s", tt->members, now, t->consumer);
    redisAppendCommand(c, "ZREMRANGEBYSCORE %s -inf %s", tt->members, dead_before);
    redisAppendCommand(c, "ZREMRANGEBYSCORE %s %s +inf", tt->members, future + 1);
    redisAppendCommand(c, "ZRANGEBYSCORE %s %s %s", tt->members, dead_before, future);
    redisReply *r[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++)
        if (redisGetReply(c, (void **)&r[i]) != REDIS_OK) {
            for (int j = 0; j < i; j++)
                kb__redis_reply_free(r[j]);
            kb__redis_conn_fail(&t->kc, c->errstr);
            return false;
        }
    if (r[2]->type == REDIS_REPLY_INTEGER && r[2]->integer > 0 &&
        atomic_fetch_add(&t->forged_members, 1) == 0)
        kb_log(t->bus, KB_LOG_WARNING, "redis: removed %lld members of %s scored past now + "
               "redis.lease_ttl_ms + %d ms of clock skew: not written by a keybus heartbeat "
               "(logged once)", r[2]->integer, tt->members, KB_REDIS_SKEW_MS);
    kb__redis_reply_free(r[0]);
    kb__redis_reply_free(r[1]);
    kb__redis_reply_free(r[2]);
    redisReply *m = r[3];
    if (m->type != REDIS_REPLY_ARRAY ||
        kb_vec_reserve((void **)names, cap, m->elements, sizeof **names) != KB_OK) {
        kb__redis_reply_free(m);
        return false;
    }
    for (size_t i = 0; i < m->elements; i++)
        if (m->element[i]->type == REDIS_REPLY_STRING)
            (*names)[(*n)++] = m->element[i]->str;
    *reply = m;
    return true;
}

/* Consumers that left are removed (see PRUNE_LUA), so names like <host>-<pid>
 * do not pile up in XINFO CONSUMERS. */
void kb__redis_members_prune(kb_transport *t, kb_transport_topic *tt, const char *only)
{
    size_t n = tt->nparts, argc = 0;
    const char **argv = malloc((8 + 2 * n) * sizeof *argv);
    if (argv == NULL)
        return;   /* next time */
    char keys[16], dead_before[24], idle[16];
    snprintf(keys, sizeof keys, "%zu", 1 + 2 * n);
    snprintf(dead_before, sizeof dead_before, "%lld",
             (long long)(wall_ms() - t->lease_ttl_ms));
    snprintf(idle, sizeof idle, "%d", only[0] != '\0' ? 0 : t->lease_ttl_ms);
    argv[argc++] = "EVAL";
    argv[argc++] = PRUNE_LUA;
    argv[argc++] = keys;
    argv[argc++] = tt->members;
    for (size_t i = 0; i < n; i++)
        argv[argc++] = tt->parts[i].stream;
    for (size_t i = 0; i < n; i++)
        argv[argc++] = tt->parts[i].lease;
    argv[argc++] = t->group;
    argv[argc++] = dead_before;
    argv[argc++] = idle;
    argv[argc++] = only;
    redisReply *r = kb__redis_cmd(&t->kc, (int)argc, argv, NULL);
    if (r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer > 0)
        kb_log(t->bus, KB_LOG_INFO, "redis: removed %lld idle consumers that left %s from group %s",
               r->integer, tt->name, t->group);
    else if (r != NULL && r->type == REDIS_REPLY_ERROR)
        kb_log(t->bus, KB_LOG_WARNING, "redis: removing consumers that left %s: %s", tt->name, r->str);
    kb__redis_reply_free(r);
    free(argv);
}

void kb__redis_members_leave(kb_transport *t, kb_transport_topic *tt)
{
    const char *argv[] = {"ZREM", tt->members, t->consumer};
    redisReply *r = kb__redis_cmd(&t->kc, 3, argv, NULL);
    kb__redis_reply_free(r);
    if (r != NULL)
        kb__redis_members_prune(t, tt, t->consumer);   /* everything acked: leave the group too */
}
