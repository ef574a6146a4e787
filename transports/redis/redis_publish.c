/* Publishing: XADDs pipelined on one connection under pub_lock. Publishers
 * append and write once 64 KiB are buffered; the keeper sends the rest soon
 * (kb__redis_pub_send); replies are read as they come, each noting its
 * entry's ID for kb_drain. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/sds.h>

#include "redis_int.h"

#define PUB_WRITE_BYTES (64 * 1024)   /* publishers write once this much is buffered */
#define PUB_MAX_INFLIGHT 100000       /* then they wait for replies: bounded memory */

static void pub_fail(kb_transport *t, const char *why)
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
    size_t old = o->cap;
    if (kb_vec_reserve((void **)&o->v, &o->cap, old ? old * 2 : 1024, sizeof *o->v) != KB_OK)
        return false;
    if (o->head + o->n > old)   /* the wrapped start goes after the old end */
        memcpy(o->v + old, o->v, (o->head + o->n - old) * sizeof *o->v);
    return true;
}

static void note_last(kb_redis_part *p, const char *id)
{
    if (p->last_id[0] == '\0' || kb__redis_id_cmp(id, p->last_id) > 0)
        snprintf(p->last_id, sizeof p->last_id, "%s", id);
}

/* The reply to the oldest XADD in flight: its ID is the newest of its partition. */
static void origin_done(kb_redis_origins *o, const redisReply *r)
{
    if (o->n == 0)
        return;
    kb_redis_part *p = o->v[o->head];
    o->head = (o->head + 1) % o->cap;
    o->n--;
    if (r->type == REDIS_REPLY_STRING)
        note_last(p, r->str);
}

/* Send what is buffered and read the replies that are there; with wait_all,
 * wait for every reply until the deadline. Caller holds pub_lock. */
static void pub_pump(kb_transport *t, bool wait_all, int64_t deadline_ns)
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
            int64_t left = deadline_ns == INT64_MAX ? 1000 : (deadline_ns - kb_now_ns()) / 1000000;
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

/* Check the topic's metadata once (caller holds pub_lock); a server that is
 * down is asked again at the next publish. */
static int meta_checked(kb_transport *t, kb_transport_topic *tt)
{
    if (tt->meta_rc == 1) {
        int rc = kb__redis_check_meta(t, tt);
        if (rc != KB_ETRANSPORT)
            tt->meta_rc = rc;
    }
    return tt->meta_rc == 1 ? KB_ETRANSPORT : tt->meta_rc;
}

int kb__redis_publish(kb_transport *t, kb_transport_topic *tt, const kb_msg *m)
{
    char maxlen[24];
    kb_redis_part *p = &tt->parts[m->hash % t->partitions];
    snprintf(maxlen, sizeof maxlen, "%lld", (long long)t->maxlen);
    /* the core checked the headers: at most KB_MAX_HEADERS, names of the rules */
    char names[KB_MAX_HEADERS * KB_REDIS_HEADER_FIELD_MAX];
    const char *argv[12 + 2 * KB_MAX_HEADERS];
    size_t lens[12 + 2 * KB_MAX_HEADERS];
    int n = 0;
#define ARG(s, l) (argv[n] = (s), lens[n] = (l), n++)
    ARG("XADD", 4);
    ARG(p->stream, strlen(p->stream));
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
    redisContext *c = NULL;
    if ((rc = meta_checked(t, tt)) != KB_OK) {
        /* the metadata check said why */
    } else if ((rc = kb__redis_limit_check(t, tt->name, m)) != KB_OK) {
        /* the server would drop the connection, and every publish in flight on it */
    } else if ((c = kb__redis_conn_get(&t->pub, NULL, 0)) == NULL) {
        rc = KB_ETRANSPORT;
    } else if (!origin_reserve(&t->origins) ||
               redisAppendCommandArgv(c, n, argv, lens) != REDIS_OK) {
        kb_errf(NULL, 0, "kb_publish %s: out of memory", tt->name);
        rc = KB_ENOMEM;
    } else {
        kb_redis_origins *o = &t->origins;
        o->v[(o->head + o->n++) % o->cap] = p;
        t->pub_inflight++;
        size_t big = m->key_len > m->payload_len ? m->key_len : m->payload_len;
        if (big > t->pub_big)
            t->pub_big = big;
        atomic_fetch_add_explicit(&tt->published, 1, memory_order_relaxed);
        if (sdslen(c->obuf) >= PUB_WRITE_BYTES || t->pub_inflight > PUB_MAX_INFLIGHT)
            pub_pump(t, false, kb_deadline_ns(t->read_timeout_ms));
        else if (!atomic_exchange_explicit(&t->pub_dirty, true, memory_order_relaxed))
            rc = 2;   /* wake the keeper to send it soon, outside the lock */
    }
    pthread_mutex_unlock(&t->pub_lock);
    if (rc == 2) {
        kb_signal_notify(t->keeper_wake);
        rc = KB_OK;
    }
    return rc;
}

void kb__redis_pub_note(kb_transport *t, kb_transport_topic *tt, uint32_t part, const char *id)
{
    pthread_mutex_lock(&t->pub_lock);
    atomic_fetch_add_explicit(&tt->published, 1, memory_order_relaxed);
    note_last(&tt->parts[part], id);
    pthread_mutex_unlock(&t->pub_lock);
}

void kb__redis_pub_send(kb_transport *t)
{
    if (!atomic_load_explicit(&t->pub_dirty, memory_order_relaxed))
        return;
    pthread_mutex_lock(&t->pub_lock);
    pub_pump(t, false, 0);
    pthread_mutex_unlock(&t->pub_lock);
}

int kb__redis_pub_settle(kb_transport *t, int64_t deadline_ns, const char *who)
{
    pthread_mutex_lock(&t->pub_lock);
    pub_pump(t, true, deadline_ns);
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

int kb__redis_flush(kb_transport *t, int timeout_ms)
{
    return kb__redis_pub_settle(t, kb_deadline_ns(timeout_ms), "kb_flush");
}

int kb__redis_pub_close(kb_transport *t, int64_t deadline_ns)
{
    pthread_mutex_lock(&t->pub_lock);
    if (t->pub_inflight > 0 && kb__redis_conn_until(&t->pub, deadline_ns) != NULL)
        pub_pump(t, true, deadline_ns);   /* a silent server: writes end by the deadline too */
    int rc = KB_OK;
    if (t->pub_inflight > 0 || t->pub_failed > 0) {
        /* accepted by kb_publish, not stored, not reported by a kb_flush yet */
        kb_errf(NULL, 0, "redis: %llu published events never sent to %s (%llu unconfirmed at "
                "close, %llu failed since the last kb_flush%s%s)",
                (unsigned long long)(t->pub_inflight + t->pub_failed), t->where,
                (unsigned long long)t->pub_inflight, (unsigned long long)t->pub_failed,
                t->pub_failed > 0 ? ": " : "", t->pub_failed > 0 ? t->pub_error : "");
        kb_log(t->bus, KB_LOG_ERROR, "%s", kb_last_error());
        rc = KB_ETRANSPORT;
    }
    pthread_mutex_unlock(&t->pub_lock);
    return rc;
}
