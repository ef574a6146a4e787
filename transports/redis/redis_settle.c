/* Settling deliveries: the executors' ack, dead_letter, release and
 * still_owned, and the keeper's job of sending what they queued: fenced XACKs
 * in batches and one fenced XADD+XACK per dead letter, pipelined over every
 * partition. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

#define ACKS_PER_CALL 1000   /* ids per fenced XACK: well under Lua's unpack limit */

/* Fencing: the ack happens only while KEYS[1] still holds our token. The
 * entries' run records (KEYS[3], redis_runs.c) go with them; the hash rarely
 * exists (crashes, retries), so usually this costs one EXISTS. */
static const char ACK_LUA[] =
    "if redis.call('get',KEYS[1])~=ARGV[1] then return -1 end "
    "if redis.call('exists',KEYS[3])==1 then redis.call('hdel',KEYS[3],unpack(ARGV,3)) end "
    "return redis.call('xack',KEYS[2],ARGV[2],unpack(ARGV,3))";
/* ---- executor threads ---- */

/* The bus hands back the delivery's topic (d->tt); its cookie is the lease
 * epoch it was read under (see kb__redis_deliver). */
static kb_redis_part *delivery_part(const kb_delivery *d)
{
    kb_transport_topic *tt = d->tt;
    return d->partition < tt->nparts ? &tt->parts[d->partition] : NULL;
}

static void settle(kb_transport *t, const kb_delivery *d, char *dead)
{
    kb_redis_part *p = delivery_part(d);
    if (p == NULL) {
        free(dead);
        return;
    }
    /* the push comes first: the keeper hands a lease back only once inflight
     * is 0, and then finds every job of the partition queued */
    kb__redis_job_push(t, p, d->id, dead);
    atomic_fetch_sub(&p->inflight, 1);
}

int kb__redis_ack(kb_transport *t, const kb_delivery *d)
{
    settle(t, d, NULL);
    return KB_OK;
}

int kb__redis_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason)
{
    char *dead = kb__redis_dead_pack(d, reason);
    if (dead == NULL) {
        kb_redis_part *p = delivery_part(d);
        if (p != NULL)
            atomic_fetch_sub(&p->inflight, 1);
        kb_errf(NULL, 0, "redis: out of memory for a dead letter");
        return KB_ENOMEM;   /* left unacked: redelivered later */
    }
    atomic_fetch_add(&t->dead_queued, 1);
    settle(t, d, dead);
    return KB_OK;
}

void kb__redis_release(kb_transport *t, const kb_delivery *d)
{
    (void)t;
    kb_redis_part *p = delivery_part(d);
    if (p != NULL)
        atomic_fetch_sub(&p->inflight, 1);   /* stays pending on the broker */
}

/* Executor, just before the handler: is the lease the entry was read under
 * still ours? Local only (no round trip): the partition is not free, its local
 * deadline (TTL minus a fifth, see redis_lease.c) is ahead, and it was not lost
 * and taken again since the read (the epoch in the cookie). */
int kb__redis_still_owned(kb_transport *t, const kb_delivery *d)
{
    kb_redis_part *p = delivery_part(d);
    if (p == NULL)
        return 0;
    if (atomic_load(&p->state) == KB_PART_FREE ||
        atomic_load(&p->epoch) != (uint32_t)(uintptr_t)d->cookie ||
        kb_now_ns() >= atomic_load(&p->deadline_ns)) {
        atomic_fetch_add_explicit(&t->unowned, 1, memory_order_relaxed);
        return 0;
    }
    return 1;
}

/* ---- the keeper's job ---- */

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
    if (kb_vec_reserve((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v) != KB_OK) {
        l->oom = true;
        return;
    }
    l->v[l->n++] = (sent_cmd){p, from, to};
}

/* Append the commands for p->sending: fenced XACKs in batches, and one fenced
 * XADD+XACK per dead letter. */
static void append_jobs(redisContext *c, kb_transport *t, kb_redis_part *p, sent_list *sent)
{
    const char *argv[8 + ACKS_PER_CALL];
    size_t argc = 0, from = 0;
    char runs[KB_REDIS_KEY_MAX];
    kb__redis_runs_key(runs, sizeof runs, p->tt->name, p->index);
    for (size_t i = 0; i <= p->sending.n; i++) {
        bool end = i == p->sending.n;
        if (argc > 0 && (end || argc == 8 + ACKS_PER_CALL || p->sending.v[i].dead != NULL)) {
            redisAppendCommandArgv(c, (int)argc, argv, NULL);
            sent_add(sent, p, from, i);
            argc = 0;
        }
        if (end)
            break;
        kb_redis_job *j = &p->sending.v[i];
        if (j->dead != NULL) {
            if (kb__redis_dead_append(c, t, p, j))
                sent_add(sent, p, i, i + 1);
            else
                j->again = true;
            continue;
        }
        if (argc == 0) {
            from = i;
            argv[argc++] = "EVAL";
            argv[argc++] = ACK_LUA;
            argv[argc++] = "3";
            argv[argc++] = p->lease;
            argv[argc++] = p->stream;
            argv[argc++] = runs;
            argv[argc++] = t->token;
            argv[argc++] = t->group;
        }
        argv[argc++] = j->id;
    }
}

/* Forget what the server settled; keep what it refused for now. */
static bool jobs_done(kb_transport *t, kb_redis_part *p)
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

void kb__redis_settle_send(kb_transport *t)
{
    redisContext *c = kb__redis_conn_get(&t->kc, NULL, 0);
    t->jobs_unsent = true;   /* until every reply is read */
    if (c == NULL)
        return;
    sent_list sent = {NULL, 0, 0, 0, false};
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next)
        for (uint32_t i = 0; i < tt->nparts; i++) {
            kb_redis_part *p = &tt->parts[i];
            if (kb__redis_jobs_take(t, p) && p->sending.n > 0)
                append_jobs(c, t, p, &sent);
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
                kb_log(t->bus, KB_LOG_WARNING, "redis: acks refused for a partition whose lease this process "
                       "lost; the new owner redelivers those entries");
        } else if (r->type == REDIS_REPLY_ERROR) {
            /* LOADING after a restart and the like: try again, or the entries
             * would sit acked by the handler but pending on the server */
            for (size_t j = got < sent.n ? sent.v[got].from : 0; got < sent.n && j < sent.v[got].to; j++)
                sent.v[got].p->sending.v[j].again = true;
            again |= got >= sent.n;   /* unmapped (out of memory): all is resent below */
            if (!again)
                kb_log(t->bus, KB_LOG_WARNING, "redis: acks or dead letters refused, retrying: %s", r->str);
            again = true;
        }
        kb__redis_reply_free(r);
    }
    free(sent.v);
    if (sent.oom && again) {
        t->jobs_unsent = true;   /* cannot tell which failed: resend all (XACK is idempotent) */
        return;
    }
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next)
        for (uint32_t i = 0; i < tt->nparts; i++)
            again |= jobs_done(t, &tt->parts[i]);
    t->jobs_unsent = again;
    if (sent.cmds > 0)
        kb__redis_settled(t);   /* kb_drain and kb_dead_letters look again */
}
