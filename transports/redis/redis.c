/* Redis Streams transport: the ops table, open/close, pipelined publishing,
 * subscribe, and the ack/release/dead-letter hand-off to the keeper. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/sds.h>
#include <keybus/pool.h>

#include "../../core/err.h"
#include "../../core/sync.h"
#include "redis_int.h"

#define PUB_WRITE_BYTES (64 * 1024)   /* publishers write once this much is buffered */
#define PUB_MAX_INFLIGHT 100000       /* then they wait for replies: bounded memory */

static _Atomic(kb_redis_topic *) *bucket(struct kb_transport *t, const char *name)
{
    return &t->by_name[kb_fnv1a32(name, strlen(name)) % KB_REDIS_TOPIC_BUCKETS];
}

kb_redis_topic *kb__redis_topic_find(struct kb_transport *t, const char *name)
{
    for (kb_redis_topic *rt = atomic_load(bucket(t, name)); rt != NULL; rt = rt->same_bucket)
        if (strcmp(rt->name, name) == 0)
            return rt;
    return NULL;
}

void kb__redis_keeper_wake(struct kb_transport *t)
{
    pthread_mutex_lock(&t->keeper_lock);
    pthread_cond_signal(&t->keeper_cond);
    pthread_mutex_unlock(&t->keeper_lock);
}

/* Register the topic and its partition count, or refuse a different count:
 * two processes hashing keys modulo different counts would break per-key order. */
int kb__redis_check_meta(struct kb_transport *t, const char *topic)
{
    char meta[300], parts[16];
    snprintf(meta, sizeof meta, "kb:{%s}:meta", topic);
    snprintf(parts, sizeof parts, "%u", t->partitions);
    pthread_mutex_lock(&t->ctl_lock);
    redisContext *c = kb__redis_conn_get(&t->ctl, NULL, 0);
    int rc = KB_ETRANSPORT;
    if (c != NULL) {
        redisAppendCommand(c, "SADD kb:topics %s", topic);
        redisAppendCommand(c, "HSETNX %s partitions %s", meta, parts);
        redisAppendCommand(c, "HGET %s partitions", meta);
        redisReply *r[3] = {NULL, NULL, NULL};
        int got = 0;
        while (got < 3 && redisGetReply(c, (void **)&r[got]) == REDIS_OK)
            got++;
        if (got < 3) {
            kb_errf(NULL, 0, "redis: metadata of topic %s on %s: %s", topic, t->where, c->errstr);
            kb__redis_conn_fail(&t->ctl, c->errstr);
        } else if (r[2]->type != REDIS_REPLY_STRING) {
            kb_errf(NULL, 0, "redis: %s: unexpected reply for partitions (%s)", meta,
                     r[2]->type == REDIS_REPLY_ERROR ? r[2]->str : "not a string");
        } else if (strcmp(r[2]->str, parts) != 0) {
            kb_errf(NULL, 0, "redis: topic %s has partitions=%s in %s on %s but this process "
                     "is configured with partitions=%u; use the stored count", topic, r[2]->str,
                     meta, t->where, t->partitions);
            kb_log(t->bus, 3, "%s", kb_last_error());
            rc = KB_EINVAL;
        } else {
            rc = KB_OK;
        }
        for (int i = 0; i < got; i++)
            freeReplyObject(r[i]);
    } else {
        kb_errf(NULL, 0, "redis: %s is unreachable for topic %s metadata", t->where, topic);
    }
    pthread_mutex_unlock(&t->ctl_lock);
    return rc;
}

/* ---- publishing ---- */

static void pub_fail(struct kb_transport *t, const char *why)
{
    if (t->pub_inflight > 0) {
        char cause[600];
        kb__redis_limit_explain(t, t->pub_big, cause, sizeof cause);
        t->pub_failed += t->pub_inflight;
        /* a long cause is cut, not the count or the address */
        snprintf(t->pub_error, sizeof t->pub_error, "%.500sconnection to %.200s lost with %llu "
                 "publishes unconfirmed: %.200s", cause, t->where,
                 (unsigned long long)t->pub_inflight, why);
    }
    t->pub_inflight = 0;
    t->origins.n = 0;
    t->pub_big = 0;
    kb__redis_conn_fail(&t->pub, why);
}

/* Room for one more origin (caller holds pub_lock); false on out of memory. */
static bool origin_reserve(kb_redis_origins *o)
{
    if (o->n < o->cap)
        return true;
    size_t cap = o->cap ? o->cap * 2 : 1024;
    kb_redis_origin *v = malloc(cap * sizeof *v);
    if (v == NULL)
        return false;
    for (size_t i = 0; i < o->n; i++)   /* unwrapped: head becomes 0 */
        v[i] = o->v[(o->head + i) % o->cap];
    free(o->v);
    o->v = v;
    o->head = 0;
    o->cap = cap;
    return true;
}

static void note_last(kb_redis_pubtopic *pt, uint32_t part, const char *id)
{
    if (pt->last[part][0] == '\0' || kb__redis_id_cmp(id, pt->last[part]) > 0)
        snprintf(pt->last[part], KB_REDIS_ID_MAX, "%s", id);
}

/* The reply to the oldest XADD in flight: its ID is the newest of its partition. */
static void origin_done(kb_redis_origins *o, const redisReply *r)
{
    if (o->n == 0)
        return;
    kb_redis_origin og = o->v[o->head];
    o->head = (o->head + 1) % o->cap;
    o->n--;
    if (r->type == REDIS_REPLY_STRING)
        note_last(og.pt, og.part, r->str);
}

/* Send what is buffered and read the replies that are there; with wait_all,
 * wait for every reply until the deadline. Caller holds pub_lock. */
void kb__redis_pub_pump(struct kb_transport *t, bool wait_all, int64_t deadline_ns)
{
    redisContext *c = t->pub.c;
    if (c == NULL)
        return;
    int done = 0;
    while (!done)
        if (redisBufferWrite(c, &done) != REDIS_OK) {
            pub_fail(t, c->errstr);
            return;
        }
    atomic_store_explicit(&t->pub_dirty, false, memory_order_relaxed);
    while (t->pub_inflight > 0) {
        void *reply = NULL;
        if (redisGetReplyFromReader(c, &reply) != REDIS_OK) {
            pub_fail(t, c->errstr);
            return;
        }
        if (reply != NULL) {
            redisReply *r = reply;
            origin_done(&t->origins, r);
            if (r->type == REDIS_REPLY_ERROR) {
                /* "Protocol error: invalid bulk length" may arrive before the close */
                char cause[600] = "";
                bool dropped = strstr(r->str, "Protocol error") != NULL;
                if (dropped)
                    kb__redis_limit_explain(t, t->pub_big, cause, sizeof cause);
                t->pub_failed++;
                snprintf(t->pub_error, sizeof t->pub_error, "%sXADD refused: %s", cause, r->str);
                if (dropped) {   /* the server closes the connection after it */
                    t->pub_inflight--;
                    freeReplyObject(r);
                    pub_fail(t, "closed by the server after a protocol error");
                    return;
                }
            }
            freeReplyObject(r);
            if (--t->pub_inflight == 0)
                t->pub_big = 0;
            continue;
        }
        int wait_ms = 0;
        if (wait_all || t->pub_inflight > PUB_MAX_INFLIGHT) {
            int64_t left = deadline_ns == INT64_MAX ? 1000 : (deadline_ns - kb__now_ns()) / 1000000;
            if (left <= 0)
                return;
            wait_ms = left > 1000 ? 1000 : (int)left;
        }
        struct pollfd pfd = {c->fd, POLLIN, 0};
        int n = poll(&pfd, 1, wait_ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            return;
        if (redisBufferRead(c) != REDIS_OK) {
            pub_fail(t, c->errstr);
            return;
        }
    }
}

/* Caller holds pub_lock. */
static kb_redis_pubtopic *pubtopic(struct kb_transport *t, const char *topic)
{
    kb_redis_pubtopic *pt = t->pubtopics;
    while (pt != NULL && strcmp(pt->name, topic) != 0)
        pt = pt->next;
    if (pt == NULL) {
        pt = calloc(1, sizeof *pt);
        if (pt == NULL || (pt->name = strdup(topic)) == NULL ||
            (pt->last = calloc(t->partitions, sizeof *pt->last)) == NULL) {
            if (pt != NULL)
                free(pt->name);
            free(pt);
            return NULL;
        }
        pt->meta_rc = 1;   /* not checked yet */
        pt->next = t->pubtopics;
        t->pubtopics = pt;
    }
    if (pt->meta_rc == 1) {
        int rc = kb__redis_check_meta(t, topic);
        if (rc != KB_ETRANSPORT)   /* a server that is down is asked again later */
            pt->meta_rc = rc;
    }
    return pt;
}

static int redis_publish(kb_transport *t, const char *topic, const kb_msg *m)
{
    char key[300], maxlen[24];
    uint32_t part = m->hash % t->partitions;
    snprintf(key, sizeof key, "kb:{%s}:p:%u", topic, part);
    snprintf(maxlen, sizeof maxlen, "%lld", (long long)t->maxlen);
    /* the core checked the headers: at most KB_MAX_HEADERS, names of the rules */
    char names[KB_MAX_HEADERS * KB_REDIS_HEADER_FIELD_MAX];
    const char *argv[12 + 2 * KB_MAX_HEADERS];
    size_t lens[12 + 2 * KB_MAX_HEADERS];
    int n = 0;
#define ARG(s, l) (argv[n] = (s), lens[n] = (l), n++)
    ARG("XADD", 4);
    ARG(key, strlen(key));
    if (t->maxlen > 0) {   /* approximate trimming: whole macro nodes, cheap */
        ARG("MAXLEN", 6);
        ARG("~", 1);
        ARG(maxlen, strlen(maxlen));
    }
    ARG("*", 1);
    ARG("k", 1);
    ARG(m->key, m->key_len);
    ARG("d", 1);
    ARG(m->payload_len ? m->payload : "", m->payload_len);
    ARG("a", 1);
    ARG("1", 1);
#undef ARG
    n += (int)kb__redis_headers_args(m->headers, m->n_headers, names, argv + n, lens + n);

    pthread_mutex_lock(&t->pub_lock);
    int rc = KB_OK;
    kb_redis_pubtopic *pt = pubtopic(t, topic);
    redisContext *c = NULL;
    if (pt == NULL) {
        kb_errf(NULL, 0, "kb_publish %s: out of memory", topic);
        rc = KB_ENOMEM;
    } else if (pt->meta_rc != KB_OK) {
        rc = pt->meta_rc == 1 ? KB_ETRANSPORT : pt->meta_rc;
    } else if ((rc = kb__redis_limit_check(t, topic, m)) != KB_OK) {
        /* the server would drop the connection, and every publish in flight on it */
    } else if ((c = kb__redis_conn_get(&t->pub, NULL, 0)) == NULL) {
        rc = KB_ETRANSPORT;
    } else if (!origin_reserve(&t->origins) ||
               redisAppendCommandArgv(c, n, argv, lens) != REDIS_OK) {
        kb_errf(NULL, 0, "kb_publish %s: out of memory", topic);
        rc = KB_ENOMEM;
    } else {
        kb_redis_origins *o = &t->origins;
        o->v[(o->head + o->n++) % o->cap] = (kb_redis_origin){pt, part};
        t->pub_inflight++;
        size_t big = m->key_len > m->payload_len ? m->key_len : m->payload_len;
        if (big > t->pub_big)
            t->pub_big = big;
        atomic_fetch_add_explicit(&pt->published, 1, memory_order_relaxed);
        if (sdslen(c->obuf) >= PUB_WRITE_BYTES || t->pub_inflight > PUB_MAX_INFLIGHT)
            kb__redis_pub_pump(t, false, kb__deadline_ns(t->read_timeout_ms));
        else if (!atomic_exchange_explicit(&t->pub_dirty, true, memory_order_relaxed))
            rc = 2;   /* wake the keeper to send it soon, outside the lock */
    }
    pthread_mutex_unlock(&t->pub_lock);
    if (rc == 2) {
        kb__redis_keeper_wake(t);
        rc = KB_OK;
    }
    return rc;
}

void kb__redis_pub_note(struct kb_transport *t, const char *topic, uint32_t part, const char *id)
{
    pthread_mutex_lock(&t->pub_lock);
    kb_redis_pubtopic *pt = pubtopic(t, topic);
    if (pt != NULL) {
        atomic_fetch_add_explicit(&pt->published, 1, memory_order_relaxed);
        note_last(pt, part, id);
    }
    pthread_mutex_unlock(&t->pub_lock);
}

int kb__redis_pub_settle(struct kb_transport *t, int64_t deadline_ns, const char *who)
{
    pthread_mutex_lock(&t->pub_lock);
    kb__redis_pub_pump(t, true, deadline_ns);
    int rc = KB_OK;
    if (t->pub_failed > 0) {
        kb_errf(NULL, 0, "%s: %llu publishes to %s failed: %s", who,
                 (unsigned long long)t->pub_failed, t->where, t->pub_error);
        t->pub_failed = 0;
        rc = KB_ETRANSPORT;
    } else if (t->pub_inflight > 0) {
        rc = KB_ETIMEDOUT;
    }
    pthread_mutex_unlock(&t->pub_lock);
    return rc;
}

static int redis_flush(kb_transport *t, int timeout_ms)
{
    return kb__redis_pub_settle(t, kb__deadline_ns(timeout_ms), "kb_flush");
}

/* ---- subscribing ---- */

static void topic_free(kb_redis_topic *rt)
{
    for (uint32_t i = 0; rt->parts != NULL && i < rt->nparts; i++) {
        for (size_t j = 0; j < rt->parts[i].jobs.n; j++)
            free(rt->parts[i].jobs.v[j].dead);
        for (size_t j = 0; j < rt->parts[i].sending.n; j++)
            free(rt->parts[i].sending.v[j].dead);
        free(rt->parts[i].jobs.v);
        free(rt->parts[i].sending.v);
        pthread_mutex_destroy(&rt->parts[i].lock);
    }
    free(rt->parts);
    free(rt->name);
    free(rt);
}

static int redis_subscribe(kb_transport *t, const char *topic, kb_sink *sink)
{
    int rc = kb__redis_check_meta(t, topic);
    if (rc != KB_OK)
        return rc;
    kb_redis_topic *rt = calloc(1, sizeof *rt);
    if (rt == NULL || (rt->name = strdup(topic)) == NULL ||
        (rt->parts = calloc(t->partitions, sizeof *rt->parts)) == NULL) {
        if (rt != NULL)
            topic_free(rt);
        kb_errf(NULL, 0, "kb_subscribe %s: out of memory", topic);
        return KB_ENOMEM;
    }
    rt->t = t;
    rt->sink = sink;
    rt->nparts = t->partitions;
    snprintf(rt->dlq, sizeof rt->dlq, "kb:{%s}:dlq", topic);
    snprintf(rt->members, sizeof rt->members, "kb:{%s}:members", topic);
    for (uint32_t i = 0; i < rt->nparts; i++) {
        rt->parts[i].rt = rt;
        rt->parts[i].index = i;
        pthread_mutex_init(&rt->parts[i].lock, NULL);
        snprintf(rt->parts[i].stream, sizeof rt->parts[i].stream, "kb:{%s}:p:%u", topic, i);
        snprintf(rt->parts[i].lease, sizeof rt->parts[i].lease, "kb:{%s}:lease:%u", topic, i);
    }
    char err[300];
    pthread_mutex_lock(&t->ctl_lock);
    rc = kb__redis_create_groups(&t->ctl, rt, err, sizeof err);
    pthread_mutex_unlock(&t->ctl_lock);
    if (rc != KB_OK) {
        topic_free(rt);
        kb_errf(NULL, 0, "kb_subscribe %s: %s", topic, err);
        return KB_ETRANSPORT;
    }
    if (!t->reader_started) {
        /* The first topic starts the bus's reader; its connection is made
         * here so that a failure (EMFILE, say) is this call's error. */
        if (kb__redis_conn_force(&t->rconn, err, sizeof err) == NULL) {
            topic_free(rt);
            kb_errf(NULL, 0, "kb_subscribe %s: the consumer cannot start: %s", topic, err);
            return KB_ETRANSPORT;
        }
        if (pthread_create(&t->reader, NULL, kb__redis_consume_main, t) != 0) {
            topic_free(rt);
            kb_errf(NULL, 0, "kb_subscribe %s: cannot start the consumer thread", topic);
            return KB_ETRANSPORT;
        }
        t->reader_started = true;
    }
    atomic_store(&rt->fresh, true);
    /* subscribes are serialised by the bus: no other writer */
    rt->same_bucket = atomic_load(bucket(t, topic));
    atomic_store(bucket(t, topic), rt);
    rt->next = atomic_load(&t->topics);
    atomic_store(&t->topics, rt);
    atomic_store(&t->duties_now, true);
    kb__redis_keeper_wake(t);       /* take leases now rather than at the next tick */
    return KB_OK;
}

/* ---- settling deliveries (executor threads) ---- */

/* A delivery's cookie is the lease epoch it was read under (see deliver() in
 * redis_consume.c); its topic is found by name (hash chains, push-only). */
static kb_redis_part *delivery_part(kb_transport *t, const kb_delivery *d)
{
    kb_redis_topic *rt = kb__redis_topic_find(t, d->topic);
    return rt != NULL && d->partition < rt->nparts ? &rt->parts[d->partition] : NULL;
}

static void settle(kb_transport *t, const kb_delivery *d, char *dead)
{
    kb_redis_part *p = delivery_part(t, d);
    if (p == NULL) {
        free(dead);
        return;
    }
    kb__redis_job_push(p, d->id, dead);
    /* after the push: the keeper releases a lease only once inflight is 0 and
     * then finds every job of the partition queued */
    atomic_fetch_sub(&p->inflight, 1);
    if (atomic_fetch_add(&t->jobs_queued, 1) == 0)
        kb__redis_keeper_wake(t);
}

static int redis_ack(kb_transport *t, const kb_delivery *d)
{
    settle(t, d, NULL);
    return KB_OK;
}

int kb__redis_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason)
{
    char *dead = kb__redis_dead_pack(d, reason);
    if (dead == NULL) {
        kb_redis_part *p = delivery_part(t, d);
        if (p != NULL)
            atomic_fetch_sub(&p->inflight, 1);
        kb_errf(NULL, 0, "redis: out of memory for a dead letter");
        return KB_ENOMEM;   /* left unacked: redelivered later */
    }
    atomic_fetch_add(&t->dead_queued, 1);
    settle(t, d, dead);
    return KB_OK;
}

static void redis_release(kb_transport *t, const kb_delivery *d)
{
    kb_redis_part *p = delivery_part(t, d);
    if (p != NULL)
        atomic_fetch_sub(&p->inflight, 1);   /* stays pending on the broker */
}

/* Executor, just before the handler: is the lease the entry was read under
 * still ours? Local only (no round trip): the partition is not free, its local
 * deadline (TTL minus a fifth, see redis_lease.c) is ahead, and it was not lost
 * and taken again since the read (the epoch in the cookie). */
static int redis_still_owned(kb_transport *t, const kb_delivery *d)
{
    kb_redis_part *p = delivery_part(t, d);
    if (p == NULL)
        return 0;
    if (atomic_load(&p->state) == KB_PART_FREE ||
        atomic_load(&p->epoch) != (uint32_t)(uintptr_t)d->cookie ||
        kb__now_ns() >= atomic_load(&p->deadline_ns)) {
        atomic_fetch_add_explicit(&t->unowned, 1, memory_order_relaxed);
        return 0;
    }
    return 1;
}

/* ---- life cycle ---- */

static void redis_stop(kb_transport *t)
{
    if (atomic_exchange(&t->consumers_stop, true))
        return;
    if (t->reader_started)
        pthread_join(t->reader, NULL);
}

static void transport_free(kb_transport *t)
{
    kb_redis_topic *rt = atomic_load(&t->topics);
    while (rt != NULL) {
        kb_redis_topic *next = rt->next;
        topic_free(rt);
        rt = next;
    }
    kb_redis_pubtopic *pt = t->pubtopics;
    while (pt != NULL) {
        kb_redis_pubtopic *next = pt->next;
        free(pt->last);
        free(pt->name);
        free(pt);
        pt = next;
    }
    free(t->origins.v);
    kb__redis_conn_close(&t->pub);
    kb__redis_conn_close(&t->ctl);
    kb__redis_conn_close(&t->kc);
    kb__redis_conn_close(&t->rconn);
    pthread_mutex_destroy(&t->pub_lock);
    pthread_mutex_destroy(&t->ctl_lock);
    pthread_mutex_destroy(&t->keeper_lock);
    pthread_cond_destroy(&t->keeper_cond);
    memset(t->addr.pass, 0, sizeof t->addr.pass);
    free(t);
}

static int redis_close(kb_transport *t)
{
    redis_stop(t);
    /* The keeper sends the last acks and dead letters, then hands leases back
     * so another process takes over at once instead of after the TTL. */
    atomic_store(&t->keeper_stop, true);
    kb__redis_keeper_wake(t);
    if (t->keeper_started)
        pthread_join(t->keeper, NULL);
    pthread_mutex_lock(&t->pub_lock);
    kb__redis_pub_pump(t, true, kb__deadline_ns(t->read_timeout_ms));
    int rc = KB_OK;
    if (t->pub_inflight > 0 || t->pub_failed > 0) {
        /* accepted by kb_publish, not stored, not reported by a kb_flush yet */
        kb_errf(NULL, 0, "redis: %llu published events never sent to %s (%llu unconfirmed at "
                 "close, %llu failed since the last kb_flush%s%s)",
                 (unsigned long long)(t->pub_inflight + t->pub_failed), t->where,
                 (unsigned long long)t->pub_inflight, (unsigned long long)t->pub_failed,
                 t->pub_failed > 0 ? ": " : "", t->pub_failed > 0 ? t->pub_error : "");
        kb_log(t->bus, 3, "%s", kb_last_error());
        rc = KB_ETRANSPORT;
    }
    pthread_mutex_unlock(&t->pub_lock);
    transport_free(t);
    return rc;
}

static int redis_open(kb_transport **out, kb_bus *bus, const kb_conf *c, char *errstr,
                      size_t errlen)
{
    kb_transport *t = calloc(1, sizeof *t);
    if (t == NULL) {
        kb_errf(errstr, errlen, "redis: out of memory");
        return KB_ENOMEM;
    }
    t->bus = bus;
    pthread_mutex_init(&t->pub_lock, NULL);
    pthread_mutex_init(&t->ctl_lock, NULL);
    pthread_mutex_init(&t->keeper_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->keeper_cond, &ca);
    pthread_condattr_destroy(&ca);
    kb__redis_conn_init(&t->pub, t, "publish");
    kb__redis_conn_init(&t->ctl, t, "control");
    kb__redis_conn_init(&t->kc, t, "keeper");
    kb__redis_conn_init(&t->rconn, t, "consumer");
    if (kb__redis_parse_url(kb_conf_str(c, "transport"), &t->addr, errstr, errlen) != KB_OK) {
        transport_free(t);
        return KB_ETRANSPORT;
    }
    snprintf(t->where, sizeof t->where, "%s:%d", t->addr.host, t->addr.port);
    t->partitions = (uint32_t)kb_conf_int(c, "partitions");
    snprintf(t->group, sizeof t->group, "%s", kb_conf_str(c, "group"));
    snprintf(t->consumer, sizeof t->consumer, "%s", kb_conf_str(c, "consumer"));
    t->connect_timeout_ms = (int)kb_conf_int(c, "redis.connect_timeout_ms");
    t->read_timeout_ms = (int)kb_conf_int(c, "redis.read_timeout_ms");
    t->block_ms = (int)kb_conf_int(c, "redis.block_ms");
    t->batch = (int)kb_conf_int(c, "redis.batch");
    t->maxlen = kb_conf_int(c, "redis.maxlen");
    t->lease_ttl_ms = (int)kb_conf_int(c, "redis.lease_ttl_ms");
    t->fenced_reads = kb_conf_int(c, "redis.fenced_reads") != 0;
    t->backoff_min_ms = (int)kb_conf_int(c, "redis.reconnect_min_ms");
    t->backoff_max_ms = (int)kb_conf_int(c, "redis.reconnect_max_ms");
    t->max_attempts = (uint32_t)kb_conf_int(c, "retry.max_attempts");
    if (t->read_timeout_ms <= t->block_ms) {
        kb_errf(errstr, errlen, "redis.read_timeout_ms (%d) must exceed redis.block_ms (%d)",
                 t->read_timeout_ms, t->block_ms);
        transport_free(t);
        return KB_EINVAL;
    }
    if (t->backoff_max_ms < t->backoff_min_ms)
        t->backoff_max_ms = t->backoff_min_ms;
    /* The nonce tells this process's leases from a restarted namesake's. */
    srandom((unsigned)(kb__now_ns() ^ (getpid() * 2654435761u)));
    snprintf(t->token, sizeof t->token, "%s#%08lx%08lx", t->consumer, random(), random());

    /* Fail fast: an unreachable server or a refused AUTH is a kb_open error. */
    pthread_mutex_lock(&t->ctl_lock);
    redisContext *ctx = kb__redis_conn_force(&t->ctl, errstr, errlen);
    pthread_mutex_unlock(&t->ctl_lock);
    if (ctx == NULL) {
        transport_free(t);
        return KB_ETRANSPORT;
    }
    kb__redis_limit_read(t);
    if (pthread_create(&t->keeper, NULL, kb__redis_keeper_main, t) != 0) {
        kb_errf(errstr, errlen, "redis: cannot start the keeper thread");
        transport_free(t);
        return KB_ENOMEM;
    }
    t->keeper_started = true;
    *out = t;
    return KB_OK;
}

const kb_transport_ops kb__redis_ops = {
    .abi_version = KB_TRANSPORT_ABI,
    .scheme = "redis",
    .flags = KB_TRANSPORT_F_SINGLE_FEEDER | KB_TRANSPORT_F_HEADERS,
    .open = redis_open,
    .publish = redis_publish,
    .subscribe = redis_subscribe,
    .ack = redis_ack,
    .dead_letter = kb__redis_dead_letter,
    .release = redis_release,
    .flush = redis_flush,
    .drain = kb__redis_drain,
    .stats = kb__redis_stats,
    .partition_stats = kb__redis_partition_stats,
    .dead_letters = kb__redis_dead_letters,
    .dead_letter_replay = kb__redis_dead_letter_replay,
    .still_owned = redis_still_owned,
    .stop = redis_stop,
    .close = redis_close,
};

/* rediss:// is registered only so kb_open can refuse it with a reason
 * (redis_open fails for it before anything else is used). */
const kb_transport_ops kb__rediss_ops = {
    .abi_version = KB_TRANSPORT_ABI,
    .scheme = "rediss",
    .open = redis_open,
};
