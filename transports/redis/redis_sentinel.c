/* redis-sentinel://: the Sentinels name the primary, the standard client
 * pattern. Every connect asks them in turn (`SENTINEL get-master-addr-by-name`,
 * the one that answered last first) and the handshake checks `ROLE` says
 * master, so a connection lost in a failover reconnects to whichever node is
 * primary by then. A primary demoted while its connections stay up is left by
 * two paths: the kb-redis-watch thread, subscribed to +switch-master on a
 * Sentinel, and every new answer that names another primary, cut the
 * connections made to the old one (their owners reconnect); writes answered
 * -READONLY drop the connection too (redis_conn.c, redis_sender.c). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

#define WATCH_NAP_MS 100   /* how often the watcher looks at its stop flag */
#define WATCH_RETRY_MS 500 /* after no Sentinel could be subscribed to */

/* A connection to Sentinel `s`, or NULL with `why`. */
static redisContext *sentinel_connect(const kb_transport *t, const kb_redis_addr *s,
                                      int64_t deadline_ns, char *why, size_t len)
{
    redisContext *c = redisConnectWithTimeout(s->host, s->port,
                                              kb__redis_timeout(t->connect_timeout_ms, deadline_ns));
    if (c == NULL) {
        snprintf(why, len, "out of memory");
    } else if (c->err ||
               redisSetTimeout(c, kb__redis_timeout(t->read_timeout_ms, deadline_ns)) != REDIS_OK) {
        snprintf(why, len, "%s", c->errstr);
        redisFree(c);
        c = NULL;
    }
    return c;
}

/* Ask Sentinel `s` for the primary: true with *out, else `why`. */
static bool ask_one(const kb_transport *t, const kb_redis_addr *s, int64_t deadline_ns,
                    kb_redis_addr *out, char *why, size_t len)
{
    redisContext *c = sentinel_connect(t, s, deadline_ns, why, len);
    if (c == NULL)
        return false;
    redisReply *r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", t->master);
    bool ok = false;
    if (r == NULL)
        snprintf(why, len, "%s", c->errstr);
    else if (r->type == REDIS_REPLY_ERROR)
        snprintf(why, len, "%.200s", r->str);
    else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
             r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        snprintf(why, len, "does not know a master named \"%s\"", t->master);
    else {
        snprintf(out->host, sizeof out->host, "%s", r->element[0]->str);
        out->port = atoi(r->element[1]->str);
        ok = out->port > 0 && out->port <= 65535;
        if (!ok)
            snprintf(why, len, "named port \"%.20s\"", r->element[1]->str);
    }
    freeReplyObject(r);
    redisFree(c);
    return ok;
}

/* Sentinel `from` named `a` the primary: keep it, and when it is another one
 * than before, cut the connections made to the old one. */
static uint32_t note_primary(kb_transport *t, size_t from, const kb_redis_addr *a)
{
    pthread_mutex_lock(&t->primary_lock);
    t->sentinel_first = from;
    kb_redis_addr old = t->primary;
    bool changed = old.port != a->port || strcmp(old.host, a->host) != 0;
    if (changed) {
        t->primary = *a;
        atomic_fetch_add(&t->primary_gen, 1);
    }
    uint32_t gen = atomic_load(&t->primary_gen);
    pthread_mutex_unlock(&t->primary_lock);
    if (changed && old.port != 0) {
        kb_log(t->bus, KB_LOG_WARNING, "redis: the primary of %s is now %s:%d (was %s:%d)", t->master,
               a->host, a->port, old.host, old.port);
        kb__redis_conn_kick(&t->pub, gen);
        kb__redis_conn_kick(&t->ctl, gen);
        kb__redis_conn_kick(&t->kc, gen);
        kb__redis_conn_kick(&t->rconn, gen);
    }
    return gen;
}

bool kb__redis_primary(kb_transport *t, int64_t deadline_ns, kb_redis_addr *out, uint32_t *gen,
                       char *errstr, size_t errlen)
{
    if (!t->sentinel) {
        snprintf(out->host, sizeof out->host, "%s", t->url->host);
        out->port = t->url->port;
        *gen = 0;
        return true;
    }
    pthread_mutex_lock(&t->primary_lock);
    size_t first = t->sentinel_first;
    pthread_mutex_unlock(&t->primary_lock);
    char whys[600] = "";
    size_t used = 0;
    for (size_t i = 0; i < t->n_sentinels; i++) {
        size_t at = (first + i) % t->n_sentinels;
        const kb_redis_addr *s = &t->sentinels[at];
        char why[256];
        if (ask_one(t, s, deadline_ns, out, why, sizeof why)) {
            *gen = note_primary(t, at, out);
            return true;
        }
        if (used < sizeof whys)
            used += (size_t)snprintf(whys + used, sizeof whys - used, "%s%s:%d: %s", i ? "; " : "",
                                     s->host, s->port, why);
    }
    kb_errf(errstr, errlen, "no Sentinel named the primary of \"%s\" (%s)", t->master, whys);
    return false;
}

/* ---- the +switch-master listener ---- */

static bool nap(kb_transport *t, int ms)
{
    for (int slept = 0; slept < ms && !atomic_load(&t->watcher_stop); slept += WATCH_NAP_MS)
        poll(NULL, 0, WATCH_NAP_MS);
    return !atomic_load(&t->watcher_stop);
}

/* "+switch-master <name> <old-ip> <old-port> <new-ip> <new-port>" */
static void switch_message(kb_transport *t, size_t from, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[2]->type != REDIS_REPLY_STRING)
        return;
    char name[KB_REDIS_MASTER_MAX], oldh[256], newh[256];
    int oldp, newp;
    if (sscanf(r->element[2]->str, "%127s %255s %d %255s %d", name, oldh, &oldp, newh, &newp) != 5 ||
        strcmp(name, t->master) != 0)
        return;
    kb_redis_addr a;
    snprintf(a.host, sizeof a.host, "%s", newh);
    a.port = newp;
    note_primary(t, from, &a);
}

/* Subscribed to Sentinel `at` until it goes away or stop; false when it
 * could not be subscribed to. */
static bool listen_to(kb_transport *t, size_t at)
{
    char why[256];
    redisContext *c = sentinel_connect(t, &t->sentinels[at], INT64_MAX, why, sizeof why);
    if (c == NULL)
        return false;
    redisReply *r = redisCommand(c, "SUBSCRIBE +switch-master");
    bool ok = r != NULL && r->type == REDIS_REPLY_ARRAY;
    freeReplyObject(r);
    if (ok) {
        /* a switch before the subscription is not missed: ask once more */
        kb_redis_addr a;
        uint32_t gen;
        kb__redis_primary(t, kb_deadline_ns(t->read_timeout_ms), &a, &gen, NULL, 0);
    }
    while (ok && !atomic_load(&t->watcher_stop)) {
        struct pollfd p = {c->fd, POLLIN, 0};
        if (poll(&p, 1, WATCH_NAP_MS) <= 0)
            continue;
        if (redisBufferRead(c) != REDIS_OK)
            break;
        void *one = NULL;
        while (redisGetReplyFromReader(c, &one) == REDIS_OK && one != NULL) {
            switch_message(t, at, one);
            freeReplyObject(one);
            one = NULL;
        }
        if (c->err)
            break;
    }
    redisFree(c);
    return ok;
}

static void *watcher_main(void *arg)
{
    kb_transport *t = arg;
    size_t at = 0;
    int idle = 0;   /* Sentinels tried in a row without a subscription */
    while (!atomic_load(&t->watcher_stop)) {
        pthread_mutex_lock(&t->primary_lock);
        if (idle == 0)
            at = t->sentinel_first;
        pthread_mutex_unlock(&t->primary_lock);
        if (listen_to(t, at)) {
            idle = 0;
            continue;
        }
        at = (at + 1) % t->n_sentinels;
        if (++idle >= (int)t->n_sentinels) {
            idle = 0;
            nap(t, WATCH_RETRY_MS);
        }
    }
    return NULL;
}

int kb__redis_watcher_start(kb_transport *t, char *errstr, size_t errlen)
{
    if (kb_thread_start(&t->watcher, "kb-redis-watch", watcher_main, t) != KB_OK) {
        kb_errf(errstr, errlen, "redis: cannot start the Sentinel listener thread: %s",
                kb_last_error());
        t->watcher = NULL;
        return KB_ENOMEM;
    }
    return KB_OK;
}

void kb__redis_watcher_stop(kb_transport *t)
{
    if (t->watcher == NULL)
        return;
    atomic_store(&t->watcher_stop, true);
    kb_thread_join(t->watcher);
    t->watcher = NULL;
}
