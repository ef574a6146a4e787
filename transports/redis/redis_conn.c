/* Connections: connect with AUTH/SELECT and timeouts (to the primary the
 * Sentinels name, for redis-sentinel://), reconnect with capped exponential
 * backoff and jitter, and cut (close gives up on a silent server). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "redis_int.h"

void kb__redis_conn_init(kb_redis_conn *k, const kb_transport *t, const char *name)
{
    memset(k, 0, sizeof *k);
    k->t = t;
    k->name = name;
    k->deadline_ns = INT64_MAX;
    pthread_mutex_init(&k->lock, NULL);
}

/* The context changes only under k->lock, so a cut never meets a freed one. */
static void set_context(kb_redis_conn *k, redisContext *c, uint32_t gen)
{
    pthread_mutex_lock(&k->lock);
    redisContext *old = k->c;
    k->c = c;
    k->gen = gen;
    pthread_mutex_unlock(&k->lock);
    if (old != NULL)
        redisFree(old);
}

/* `ms`, or less when the deadline comes first (at least 1 ms). */
static struct timeval timeout_until(int ms, int64_t deadline_ns)
{
    int left = kb_deadline_left_ms(deadline_ns);
    if (left >= 0 && left < ms)
        ms = left > 0 ? left : 1;
    return (struct timeval){ms / 1000, (ms % 1000) * 1000};
}

static struct timeval bounded(const kb_redis_conn *k, int ms)
{
    return timeout_until(ms, k->deadline_ns);
}

/* Every connection builds its replies with redis_reply.c's objects, no
 * string longer than the limits copied. */
static redisContext *connect_to(const kb_transport *t, const char *host, int port,
                                struct timeval tv)
{
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (c != NULL)
        kb__redis_reply_use(c->reader, &t->lim);
    return c;
}

/* ---- redis-sentinel://: the Sentinels name the primary, the standard client
 * pattern. Every connect asks them in turn (`SENTINEL get-master-addr-by-name`,
 * the one that answered last first) and the handshake checks `ROLE` says
 * master, so a connection lost in a failover reconnects to whichever node is
 * primary by then. An answer naming another primary than before (or a
 * +switch-master, redis_sentinel.c) cuts the connections made to the old one;
 * a -READONLY answer drops the connection that got it. ---- */

redisContext *kb__redis_sentinel_connect(const kb_transport *t, const kb_redis_addr *s,
                                         int64_t deadline_ns, char *why, size_t len)
{
    redisContext *c = connect_to(t, s->host, s->port, timeout_until(t->connect_timeout_ms, deadline_ns));
    if (c == NULL) {
        snprintf(why, len, "out of memory");
    } else if (c->err ||
               redisSetTimeout(c, timeout_until(t->read_timeout_ms, deadline_ns)) != REDIS_OK) {
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
    redisContext *c = kb__redis_sentinel_connect(t, s, deadline_ns, why, len);
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
    kb__redis_reply_free(r);
    redisFree(c);
    return ok;
}

uint32_t kb__redis_primary_named(kb_transport *t, size_t from, const kb_redis_addr *a)
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
        kb__redis_conn_kick(&t->stats, gen);
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
            *gen = kb__redis_primary_named(t, at, out);
            return true;
        }
        if (used < sizeof whys)
            used += (size_t)snprintf(whys + used, sizeof whys - used, "%s%s:%d: %s", i ? "; " : "",
                                     s->host, s->port, why);
    }
    kb_errf(errstr, errlen, "no Sentinel named the primary of \"%s\" (%s)", t->master, whys);
    return false;
}

/* ---- connecting ---- */

/* AUTH and SELECT on a fresh context; an error text without secrets, or NULL. */
static const char *handshake(redisContext *c, const kb_transport *t, char *buf, size_t len)
{
    redisReply *r = NULL;
    const char *user = t->url->user, *pass = t->url->password;
    if (pass != NULL && pass[0] != '\0') {
        const char *argv[] = {"AUTH", user != NULL ? user : pass, pass};
        r = redisCommandArgv(c, user != NULL ? 3 : 2, argv, NULL);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            snprintf(buf, len, "AUTH%s%.64s refused: %s", user != NULL ? " as " : "",
                     user != NULL ? user : "", r ? r->str : c->errstr);
            kb__redis_reply_free(r);
            return buf;
        }
        kb__redis_reply_free(r);
    }
    /* Something that is not Redis may listen here: find out now, not at the
     * first real command. */
    r = redisCommand(c, "PING");
    bool pong = r != NULL && ((r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0) ||
                              (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "LOADING", 7) == 0));
    if (!pong) {   /* LOADING after a restart is Redis too: commands retry then */
        bool silent = r == NULL && c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
        if (r != NULL && r->type == REDIS_REPLY_ERROR)   /* Redis, but not for us: NOAUTH... */
            snprintf(buf, len, "PING refused: %s", r->str);
        else
            snprintf(buf, len, "not a Redis server? PING %s: %s",
                     silent ? "got no answer within redis.read_timeout_ms" : "failed",
                     r == NULL ? c->errstr : "the answer is not PONG");
        kb__redis_reply_free(r);
        return buf;
    }
    kb__redis_reply_free(r);
    if (t->sentinel) {   /* a Sentinel may name a node that is not primary (yet, or any more) */
        r = redisCommand(c, "ROLE");
        bool master = r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
                      r->element[0]->type == REDIS_REPLY_STRING &&
                      strcmp(r->element[0]->str, "master") == 0;
        if (!master)
            snprintf(buf, len, "not the primary: ROLE says %.60s",
                     r == NULL ? c->errstr
                     : r->type == REDIS_REPLY_ERROR ? r->str
                     : r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
                             r->element[0]->type == REDIS_REPLY_STRING
                         ? r->element[0]->str
                         : "something else");
        kb__redis_reply_free(r);
        if (!master)
            return buf;
    }
    if (t->db != 0) {
        r = redisCommand(c, "SELECT %d", t->db);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            snprintf(buf, len, "SELECT %d failed: %s", t->db, r ? r->str : c->errstr);
            kb__redis_reply_free(r);
            return buf;
        }
        kb__redis_reply_free(r);
    }
    return NULL;
}

/* The handshake on a silent server waits redis.read_timeout_ms per step: a
 * cut (close) must not wait for it. */
static const char *handshake_cuttable(kb_redis_conn *k, redisContext *c, char *buf, size_t len)
{
    pthread_mutex_lock(&k->lock);
    k->connecting = c;
    if (atomic_load(&k->cut))
        shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&k->lock);
    const char *err = handshake(c, k->t, buf, len);
    pthread_mutex_lock(&k->lock);
    k->connecting = NULL;
    pthread_mutex_unlock(&k->lock);
    return err;
}

redisContext *kb__redis_conn_force(kb_redis_conn *k, char *errstr, size_t errlen)
{
    const kb_transport *t = k->t;
    if (k->c != NULL)
        return k->c;
    if (atomic_load(&k->cut)) {
        kb_errf(errstr, errlen, "redis %s: closing", k->name);
        return NULL;
    }
    char why[700];
    const char *err = NULL;
    redisContext *c = NULL;
    kb_redis_addr at;
    uint32_t gen = 0;
    if (!kb__redis_primary((kb_transport *)t, k->deadline_ns, &at, &gen, why, sizeof why))
        err = why;
    else if ((c = connect_to(t, at.host, at.port, bounded(k, t->connect_timeout_ms))) == NULL)
        err = "out of memory";
    else if (c->err)
        err = c->errstr[0] ? c->errstr : strerror(errno);
    else if (redisSetTimeout(c, bounded(k, t->read_timeout_ms)) != REDIS_OK ||
             redisEnableKeepAlive(c) != REDIS_OK)
        err = c->errstr;
    else
        err = handshake_cuttable(k, c, why, sizeof why);
    if (err != NULL) {
        if (err != why && t->sentinel)
            snprintf(why, sizeof why, "primary %.255s:%d: %.300s", at.host, at.port, err);
        else if (err != why)
            snprintf(why, sizeof why, "%.600s", err);   /* err may point into c */
        err = why;
        kb_errf(errstr, errlen, "redis %s: cannot connect to %s: %s", k->name, t->where, err);
        if (c != NULL)
            redisFree(c);
        /* jittered, so many processes do not reconnect in lockstep after a
         * server restart */
        k->next_try_ns = kb_now_ns() + kb_backoff_ns(t->backoff_min_ms, t->backoff_max_ms,
                                                     (uint32_t)k->failures, kb_bus_random(t->bus));
        if (k->failures++ == 0)
            kb_log(t->bus, KB_LOG_WARNING, "redis %s: connection to %s down: %s", k->name, t->where, err);
        k->was_down = true;
        return NULL;
    }
    if (k->was_down && t->sentinel)
        kb_log(t->bus, KB_LOG_INFO, "redis %s: reconnected to %s, primary %s:%d, after %d attempts",
               k->name, t->where, at.host, at.port, k->failures);
    else if (k->was_down)
        kb_log(t->bus, KB_LOG_INFO, "redis %s: reconnected to %s after %d attempts", k->name, t->where,
               k->failures);
    k->failures = 0;
    k->was_down = false;
    set_context(k, c, gen);
    if (atomic_load(&k->cut))   /* cut while connecting: its shutdown missed this one */
        shutdown(c->fd, SHUT_RDWR);
    return c;
}

redisContext *kb__redis_conn_get(kb_redis_conn *k, char *errstr, size_t errlen)
{
    if (k->c != NULL && k->t->sentinel && k->gen != atomic_load(&k->t->primary_gen)) {
        /* made to a primary that is no more (an idle control connection
         * would otherwise fail its next call): to the new one at once */
        kb__redis_conn_fail(k, "the Sentinels name another primary");
        k->next_try_ns = 0;
    }
    if (k->c == NULL && kb_now_ns() < k->next_try_ns) {
        kb_errf(errstr, errlen, "redis %s: %s is down; next reconnect in %lld ms", k->name,
                 k->t->where, (long long)((k->next_try_ns - kb_now_ns()) / 1000000));
        return NULL;
    }
    return kb__redis_conn_force(k, errstr, errlen);
}

void kb__redis_conn_fail(kb_redis_conn *k, const char *why)
{
    if (k->c == NULL)
        return;
    if (!atomic_load(&k->cut))
        kb_log(k->t->bus, KB_LOG_WARNING, "redis %s: lost %s: %s", k->name, k->t->where, why);
    set_context(k, NULL, 0);
    k->was_down = true;
    k->next_try_ns = kb_now_ns() + (int64_t)k->t->backoff_min_ms * 1000000;
}

void kb__redis_conn_close(kb_redis_conn *k)
{
    set_context(k, NULL, 0);
    pthread_mutex_destroy(&k->lock);
}

void kb__redis_conn_cut(kb_redis_conn *k)
{
    pthread_mutex_lock(&k->lock);
    atomic_store(&k->cut, true);
    if (k->c != NULL)
        shutdown(k->c->fd, SHUT_RDWR);   /* a blocked read or write returns now */
    if (k->connecting != NULL)
        shutdown(k->connecting->fd, SHUT_RDWR);
    pthread_mutex_unlock(&k->lock);
}

redisContext *kb__redis_conn_until(kb_redis_conn *k, int64_t deadline_ns)
{
    k->deadline_ns = deadline_ns;
    if (kb_deadline_left_ms(deadline_ns) == 0)
        return NULL;
    redisContext *c = k->c;
    if (c == NULL)
        return kb__redis_conn_get(k, NULL, 0);   /* a new one is bounded as it connects */
    if (redisSetTimeout(c, bounded(k, k->t->read_timeout_ms)) != REDIS_OK) {
        kb__redis_conn_fail(k, c->errstr);
        return NULL;
    }
    return c;
}

void kb__redis_conn_kick(kb_redis_conn *k, uint32_t gen)
{
    pthread_mutex_lock(&k->lock);
    if (k->c != NULL && k->gen != gen)
        shutdown(k->c->fd, SHUT_RDWR);   /* its owner sees the error and reconnects */
    pthread_mutex_unlock(&k->lock);
}

bool kb__redis_readonly(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "READONLY", 8) == 0;
}

redisReply *kb__redis_cmd(kb_redis_conn *k, int argc, const char **argv, const size_t *lens)
{
    redisContext *c = kb__redis_conn_get(k, NULL, 0);
    if (c == NULL)
        return NULL;
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    if (r == NULL)
        kb__redis_conn_fail(k, c->errstr);
    else if (kb__redis_readonly(r))
        kb__redis_conn_fail(k, r->str);   /* a replica now: reconnect to the primary */
    return r;
}
