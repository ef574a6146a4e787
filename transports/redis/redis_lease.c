/* The keeper thread: sends buffered publishes, batched fenced XACKs and dead
 * letters, heartbeats membership, and takes, renews and hands back partition
 * leases so live members share partitions by rendezvous hashing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <keybus/pool.h>

#include "../../core/sync.h"
#include "redis_int.h"

#define ACKS_PER_CALL 1000   /* ids per fenced XACK: well under Lua's unpack limit */

/* Fencing: the ack happens only while KEYS[1] still holds our token. */
static const char ACK_LUA[] =
    "if redis.call('get',KEYS[1])~=ARGV[1] then return -1 end "
    "return redis.call('xack',KEYS[2],ARGV[2],unpack(ARGV,3))";
static const char RENEW_LUA[] =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('pexpire',KEYS[1],ARGV[2]) end "
    "return 0";
static const char RELEASE_LUA[] =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0";

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

int kb__redis_id_cmp(const char *a, const char *b)
{
    char *e;
    unsigned long long am = strtoull(a, &e, 10), as = *e == '-' ? strtoull(e + 1, NULL, 10) : 0;
    unsigned long long bm = strtoull(b, &e, 10), bs = *e == '-' ? strtoull(e + 1, NULL, 10) : 0;
    if (am != bm)
        return am < bm ? -1 : 1;
    return as < bs ? -1 : as > bs;
}

bool kb__redis_part_live(const kb_redis_part *p)
{
    return atomic_load(&p->state) == KB_PART_OWNED && kb__now_ns() < atomic_load(&p->deadline_ns);
}

/* ---- acks and dead letters ---- */

static int take_jobs(struct kb_transport *t, kb_redis_part *p)
{
    pthread_mutex_lock(&p->lock);
    size_t n = p->jobs.n;
    if (n > 0 && p->sending.cap < p->sending.n + n) {
        size_t cap = (p->sending.n + n) * 2;
        kb_redis_job *v = realloc(p->sending.v, cap * sizeof *v);
        if (v == NULL) {
            pthread_mutex_unlock(&p->lock);
            return -1;   /* try again on the next loop */
        }
        p->sending.v = v;
        p->sending.cap = cap;
    }
    if (n > 0)
        memcpy(p->sending.v + p->sending.n, p->jobs.v, n * sizeof *p->jobs.v);
    p->sending.n += n;
    p->jobs.n = 0;
    pthread_mutex_unlock(&p->lock);
    atomic_fetch_sub(&t->jobs_queued, n);
    return 0;
}

/* One command sent for jobs [from, to) of a partition's `sending`. */
typedef struct sent_cmd {
    kb_redis_part *p;
    size_t from, to;
} sent_cmd;

typedef struct sent_list {
    sent_cmd *v;
    size_t n, cap;
    size_t cmds;   /* replies to read; differs from n only when out of memory */
    bool oom;
} sent_list;

static void sent_add(sent_list *l, kb_redis_part *p, size_t from, size_t to)
{
    l->cmds++;
    if (l->oom)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        sent_cmd *v = realloc(l->v, cap * sizeof *v);
        if (v == NULL) {
            l->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (sent_cmd){p, from, to};
}

/* Append the commands for p->sending: fenced XACKs in batches, and one fenced
 * XADD+XACK per dead letter. */
static void append_jobs(redisContext *c, struct kb_transport *t, kb_redis_topic *rt,
                        kb_redis_part *p, sent_list *sent)
{
    const char *argv[7 + ACKS_PER_CALL];
    size_t argc = 0, from = 0;
    for (size_t i = 0; i <= p->sending.n; i++) {
        bool end = i == p->sending.n;
        if (argc > 0 && (end || argc == 7 + ACKS_PER_CALL || p->sending.v[i].dead != NULL)) {
            redisAppendCommandArgv(c, (int)argc, argv, NULL);
            sent_add(sent, p, from, i);
            argc = 0;
        }
        if (end)
            break;
        kb_redis_job *j = &p->sending.v[i];
        if (j->dead != NULL) {
            if (kb__redis_dead_append(c, t, rt, p, j))
                sent_add(sent, p, i, i + 1);
            else
                j->again = true;
            continue;
        }
        if (argc == 0) {
            from = i;
            argv[argc++] = "EVAL";
            argv[argc++] = ACK_LUA;
            argv[argc++] = "2";
            argv[argc++] = p->lease;
            argv[argc++] = p->stream;
            argv[argc++] = t->token;
            argv[argc++] = t->group;
        }
        argv[argc++] = j->id;
    }
}

/* Forget what the server settled; keep what it refused for now. */
static bool jobs_done(struct kb_transport *t, kb_redis_part *p)
{
    size_t kept = 0;
    for (size_t i = 0; i < p->sending.n; i++) {
        kb_redis_job *j = &p->sending.v[i];
        if (j->again) {
            j->again = false;
            p->sending.v[kept++] = *j;
        } else if (j->dead != NULL) {
            free(j->dead);
            atomic_fetch_sub(&t->dead_queued, 1);
        }
    }
    p->sending.n = kept;
    return kept > 0;
}

/* Send every queued ack and dead letter, pipelined over all partitions. */
static void flush_jobs(struct kb_transport *t)
{
    redisContext *c = kb__redis_conn_get(&t->kc, NULL, 0);
    t->jobs_unsent = true;   /* until every reply is read */
    if (c == NULL)
        return;
    sent_list sent = {NULL, 0, 0, 0, false};
    for (kb_redis_topic *rt = atomic_load(&t->topics); rt != NULL; rt = rt->next)
        for (uint32_t i = 0; i < rt->nparts; i++) {
            kb_redis_part *p = &rt->parts[i];
            if (take_jobs(t, p) == 0 && p->sending.n > 0)
                append_jobs(c, t, rt, p, &sent);
        }
    bool again = false;
    for (size_t got = 0; got < sent.cmds; got++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            /* everything stays in `sending`: resent after the reconnect (XACK is idempotent) */
            kb__redis_conn_fail(&t->kc, c->errstr);
            free(sent.v);
            return;
        }
        if (r->type == REDIS_REPLY_INTEGER && r->integer < 0) {
            if (atomic_fetch_add(&t->fenced, 1) == 0)
                kb_log(t->bus, 4, "redis: acks refused for a partition whose lease this process "
                       "lost; the new owner redelivers those entries");
        } else if (r->type == REDIS_REPLY_ERROR) {
            /* LOADING after a restart and the like: try again, or the entries
             * would sit acked by the handler but pending on the server */
            for (size_t j = got < sent.n ? sent.v[got].from : 0; got < sent.n && j < sent.v[got].to; j++)
                sent.v[got].p->sending.v[j].again = true;
            again |= got >= sent.n;   /* unmapped (out of memory): all is resent below */
            if (!again)
                kb_log(t->bus, 4, "redis: acks or dead letters refused, retrying: %s", r->str);
            again = true;
        }
        freeReplyObject(r);
    }
    free(sent.v);
    if (sent.oom && again) {
        t->jobs_unsent = true;   /* cannot tell which failed: resend all (XACK is idempotent) */
        return;
    }
    for (kb_redis_topic *rt = atomic_load(&t->topics); rt != NULL; rt = rt->next)
        for (uint32_t i = 0; i < rt->nparts; i++)
            again |= jobs_done(t, &rt->parts[i]);
    t->jobs_unsent = again;
    if (sent.cmds > 0)
        kb__redis_settled(t);   /* kb_drain and kb_dead_letters look again */
}

/* ---- membership and leases ---- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Rendezvous hashing: a partition goes to the live member with the highest
 * score, so a member joining or leaving moves only its own share. */
static bool mine(const struct kb_transport *t, const redisReply *members, uint32_t part)
{
    uint64_t best = 0;
    const char *owner = NULL;
    for (size_t i = 0; i < members->elements; i++) {
        const redisReply *m = members->element[i];
        if (m->type != REDIS_REPLY_STRING)
            continue;
        uint64_t s = mix64(((uint64_t)kb_fnv1a32(m->str, m->len) << 32) | part);
        if (owner == NULL || s > best || (s == best && strcmp(m->str, owner) < 0)) {
            best = s;
            owner = m->str;
        }
    }
    return owner == NULL || strcmp(owner, t->consumer) == 0;
}

static int64_t lease_margin_ns(const struct kb_transport *t)
{
    /* stop well before the server would expire the lease: one fifth of the TTL */
    return (int64_t)t->lease_ttl_ms * 1000000 / 5;
}

static void lease_topic(struct kb_transport *t, redisContext *c, kb_redis_topic *rt)
{
    char now[24], dead_before[24], ttl[16];
    int64_t wall = kb__redis_wall_ms();
    snprintf(now, sizeof now, "%lld", (long long)wall);
    snprintf(dead_before, sizeof dead_before, "(%lld", (long long)(wall - t->lease_ttl_ms));
    snprintf(ttl, sizeof ttl, "%d", t->lease_ttl_ms);
    redisAppendCommand(c, "ZADD %s %s %s", rt->members, now, t->consumer);
    redisAppendCommand(c, "ZREMRANGEBYSCORE %s -inf %s", rt->members, dead_before);
    redisAppendCommand(c, "ZRANGEBYSCORE %s %s +inf", rt->members, dead_before);
    redisReply *r[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        if (redisGetReply(c, (void **)&r[i]) != REDIS_OK) {
            for (int j = 0; j < i; j++)
                freeReplyObject(r[j]);
            kb__redis_conn_fail(&t->kc, c->errstr);
            return;
        }
    redisReply *members = r[2];
    bool ok = members->type == REDIS_REPLY_ARRAY;

    /* Renew what we hold, try what rendezvous gives us; one pipeline. */
    int64_t sent = kb__now_ns();
    for (uint32_t i = 0; ok && i < rt->nparts; i++) {
        kb_redis_part *p = &rt->parts[i];
        int st = atomic_load(&p->state);
        const char *lease = p->lease, *token = t->token;
        if (st != KB_PART_FREE)
            redisAppendCommand(c, "EVAL %s 1 %s %s %s", RENEW_LUA, lease, token, ttl);
        else if (mine(t, members, i))
            redisAppendCommand(c, "SET %s %s NX PX %s", lease, token, ttl);
    }
    for (uint32_t i = 0; ok && i < rt->nparts; i++) {
        kb_redis_part *p = &rt->parts[i];
        int st = atomic_load(&p->state);
        if (st == KB_PART_FREE && !mine(t, members, i))
            continue;
        redisReply *x = NULL;
        if (redisGetReply(c, (void **)&x) != REDIS_OK) {
            kb__redis_conn_fail(&t->kc, c->errstr);
            break;
        }
        bool held = (x->type == REDIS_REPLY_INTEGER && x->integer == 1) ||
                    (x->type == REDIS_REPLY_STATUS && strcmp(x->str, "OK") == 0);
        int64_t deadline = sent + (int64_t)t->lease_ttl_ms * 1000000 - lease_margin_ns(t);
        if (held) {
            /* a lapse (renewed only after the local deadline) counts as a new
             * acquisition: the consumer re-sweeps before reading new entries */
            bool fresh = st == KB_PART_FREE || kb__now_ns() >= atomic_load(&p->deadline_ns);
            atomic_store(&p->deadline_ns, deadline);
            if (fresh)
                atomic_fetch_add(&p->epoch, 1);
            if (st == KB_PART_FREE) {
                atomic_store(&p->state, KB_PART_OWNED);
                kb_log(t->bus, 6, "redis: %s took %s", t->consumer, p->stream);
            }
        } else if (st != KB_PART_FREE) {
            atomic_store(&p->state, KB_PART_FREE);
            kb_log(t->bus, 4, "redis: %s lost the lease of %s (%s)", t->consumer, p->stream,
                   x->type == REDIS_REPLY_ERROR ? x->str : "taken or expired");
        }
        freeReplyObject(x);
    }
    /* Owned but no longer ours by rendezvous: stop reading, hand back when idle. */
    for (uint32_t i = 0; ok && i < rt->nparts; i++)
        if (atomic_load(&rt->parts[i].state) == KB_PART_OWNED && !mine(t, members, i))
            atomic_store(&rt->parts[i].state, KB_PART_DRAINING);
    for (int i = 0; i < 3; i++)
        freeReplyObject(r[i]);
}

static void release(struct kb_transport *t, kb_redis_topic *rt, uint32_t part)
{
    kb_redis_part *p = &rt->parts[part];
    if (atomic_load(&p->state) != KB_PART_DRAINING || atomic_load(&p->inflight) != 0)
        return;
    /* inflight is 0: every ack of the partition is queued; send them before
     * the next owner can claim the entries */
    flush_jobs(t);
    const char *argv[] = {"EVAL", RELEASE_LUA, "1", p->lease, t->token};
    redisReply *r = kb__redis_cmd(&t->kc, 5, argv, NULL);
    freeReplyObject(r);
    if (r != NULL) {
        atomic_store(&p->state, KB_PART_FREE);
        kb_log(t->bus, 6, "redis: %s handed back %s", t->consumer, p->stream);
    }
}

/* XGROUP DELCONSUMER for the topic's consumers that left (see PRUNE_LUA), so
 * names like <host>-<pid> do not pile up in XINFO CONSUMERS. */
static void prune(struct kb_transport *t, kb_redis_topic *rt, const char *only)
{
    size_t n = rt->nparts, argc = 0;
    const char **argv = malloc((8 + 2 * n) * sizeof *argv);
    if (argv == NULL)
        return;   /* next time */
    char keys[16], dead_before[24], idle[16];
    snprintf(keys, sizeof keys, "%zu", 1 + 2 * n);
    snprintf(dead_before, sizeof dead_before, "%lld",
             (long long)(kb__redis_wall_ms() - t->lease_ttl_ms));
    snprintf(idle, sizeof idle, "%d", only[0] != '\0' ? 0 : t->lease_ttl_ms);
    argv[argc++] = "EVAL";
    argv[argc++] = PRUNE_LUA;
    argv[argc++] = keys;
    argv[argc++] = rt->members;
    for (size_t i = 0; i < n; i++)
        argv[argc++] = rt->parts[i].stream;
    for (size_t i = 0; i < n; i++)
        argv[argc++] = rt->parts[i].lease;
    argv[argc++] = t->group;
    argv[argc++] = dead_before;
    argv[argc++] = idle;
    argv[argc++] = only;
    redisReply *r = kb__redis_cmd(&t->kc, (int)argc, argv, NULL);
    if (r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer > 0)
        kb_log(t->bus, 6, "redis: removed %lld idle consumers that left %s from group %s",
               r->integer, rt->name, t->group);
    else if (r != NULL && r->type == REDIS_REPLY_ERROR)
        kb_log(t->bus, 4, "redis: removing consumers that left %s: %s", rt->name, r->str);
    freeReplyObject(r);
    free(argv);
}

/* Every topic on the tick; between ticks only those just subscribed, so N
 * subscribes cost N lease rounds, not N * topics. */
static void duties(struct kb_transport *t, bool all, bool prune_now)
{
    for (kb_redis_topic *rt = atomic_load(&t->topics); rt != NULL; rt = rt->next) {
        if (!atomic_exchange(&rt->fresh, false) && !all)
            continue;
        redisContext *c = kb__redis_conn_get(&t->kc, NULL, 0);
        if (c == NULL)
            return;
        lease_topic(t, c, rt);
        for (uint32_t i = 0; i < rt->nparts; i++)
            release(t, rt, i);
        if (prune_now)
            prune(t, rt, "");
    }
}

static void goodbye(struct kb_transport *t)
{
    for (int tries = 0; tries < 3; tries++) {
        flush_jobs(t);
        if (!t->jobs_unsent && atomic_load(&t->jobs_queued) == 0)
            break;
        struct timespec nap = {0, 100 * 1000000L};   /* a reconnect may be due */
        nanosleep(&nap, NULL);
    }
    /* Hand every lease back and leave: one pipeline per topic. */
    for (kb_redis_topic *rt = atomic_load(&t->topics); rt != NULL; rt = rt->next) {
        redisContext *c = kb__redis_conn_get(&t->kc, NULL, 0);
        if (c == NULL)
            return;   /* the leases expire after their TTL */
        int n = 0;
        for (uint32_t i = 0; i < rt->nparts; i++, n++)
            redisAppendCommand(c, "EVAL %s 1 %s %s", RELEASE_LUA, rt->parts[i].lease, t->token);
        redisAppendCommand(c, "ZREM %s %s", rt->members, t->consumer);
        for (int got = 0; got <= n; got++) {
            redisReply *r = NULL;
            if (redisGetReply(c, (void **)&r) != REDIS_OK) {
                kb__redis_conn_fail(&t->kc, c->errstr);
                return;
            }
            freeReplyObject(r);
        }
        for (uint32_t i = 0; i < rt->nparts; i++)
            atomic_store(&rt->parts[i].state, KB_PART_FREE);
        kb_log(t->bus, 6, "redis: %s handed back the partitions of %s", t->consumer, rt->name);
        prune(t, rt, t->consumer);   /* everything acked: leave the group too */
    }
}

void *kb__redis_keeper_main(void *arg)
{
    struct kb_transport *t = arg;
    int64_t tick = (int64_t)t->lease_ttl_ms * 1000000 / 4;   /* renew 4x per TTL */
    if (tick > 1000000000)
        tick = 1000000000;
    int64_t next_duty = 0;
    unsigned rounds = 0;
    while (!atomic_load(&t->keeper_stop)) {
        if (atomic_load_explicit(&t->pub_dirty, memory_order_relaxed)) {
            pthread_mutex_lock(&t->pub_lock);
            kb__redis_pub_pump(t, false, 0);
            pthread_mutex_unlock(&t->pub_lock);
        }
        if (atomic_load(&t->jobs_queued) > 0 || t->jobs_unsent)
            flush_jobs(t);
        int64_t now = kb__now_ns();
        bool fresh = atomic_exchange(&t->duties_now, false);
        if (now >= next_duty) {
            duties(t, true, ++rounds % 4 == 0);   /* consumers that left: once per TTL or so */
            next_duty = now + tick;
        } else if (fresh) {
            duties(t, false, false);
        }
        pthread_mutex_lock(&t->keeper_lock);
        if (!atomic_load(&t->keeper_stop) && atomic_load(&t->jobs_queued) == 0 &&
            !atomic_load(&t->pub_dirty) && !atomic_load(&t->duties_now)) {
            int64_t until = next_duty;
            if (t->jobs_unsent) {
                int64_t soon = kb__now_ns() + 20000000;   /* retry unsent work soon */
                until = soon < until ? soon : until;
            }
            struct timespec ts = {until / 1000000000, until % 1000000000};
            pthread_cond_timedwait(&t->keeper_cond, &t->keeper_lock, &ts);
        }
        pthread_mutex_unlock(&t->keeper_lock);
    }
    goodbye(t);
    return NULL;
}
