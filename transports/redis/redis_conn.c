/* Connections: URL parsing, connect with AUTH/SELECT and timeouts, reconnect
 * with capped exponential backoff and jitter. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "../../core/err.h"
#include "../../core/sync.h"
#include "redis_int.h"

static int copy_part(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap)
        return -1;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return 0;
}

/* redis://[user:pass@]host[:port][/db]. Messages quote the host, never the password. */
int kb__redis_parse_url(const char *url, kb_redis_addr *a, char *errstr, size_t errlen)
{
    memset(a, 0, sizeof *a);
    a->port = 6379;
    if (strncmp(url, "rediss://", 9) == 0) {
        kb_errf(errstr, errlen, "transport: rediss:// (TLS) is not supported: hiredis 0.14 has "
                 "no TLS; use redis:// on a trusted network or a TLS tunnel");
        return KB_EINVAL;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        kb_errf(errstr, errlen, "transport: expected redis://host[:port][/db]");
        return KB_EINVAL;
    }
    const char *p = url + 8;
    const char *end = p + strcspn(p, "/?#");
    const char *at = NULL;
    for (const char *q = p; q < end; q++)
        if (*q == '@')
            at = q;   /* the last '@': passwords may contain one */
    if (at != NULL) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *uend = colon ? colon : at;
        if (copy_part(a->user, sizeof a->user, p, (size_t)(uend - p)) != 0 ||
            (colon && copy_part(a->pass, sizeof a->pass, colon + 1, (size_t)(at - colon - 1)) != 0)) {
            kb_errf(errstr, errlen, "transport: user or password in the redis URL is too long");
            return KB_EINVAL;
        }
        p = at + 1;
    }
    const char *hend = end;
    if (*p == '[') {   /* [v6addr]:port */
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (rb == NULL) {
            kb_errf(errstr, errlen, "transport: unterminated [ in the redis host");
            return KB_EINVAL;
        }
        if (copy_part(a->host, sizeof a->host, p + 1, (size_t)(rb - p - 1)) != 0)
            return KB_EINVAL;
        hend = rb + 1;
    } else {
        const char *colon = memchr(p, ':', (size_t)(end - p));
        hend = colon ? colon : end;
        if (copy_part(a->host, sizeof a->host, p, (size_t)(hend - p)) != 0) {
            kb_errf(errstr, errlen, "transport: redis host name is too long");
            return KB_EINVAL;
        }
    }
    if (a->host[0] == '\0') {
        kb_errf(errstr, errlen, "transport: redis URL has no host");
        return KB_EINVAL;
    }
    if (hend < end) {
        if (*hend != ':') {
            kb_errf(errstr, errlen, "transport: junk after the redis host \"%s\"", a->host);
            return KB_EINVAL;
        }
        char *e;
        long port = strtol(hend + 1, &e, 10);
        if (e != end || e == hend + 1 || port < 1 || port > 65535) {
            kb_errf(errstr, errlen, "transport: bad port in redis URL for host \"%s\"", a->host);
            return KB_EINVAL;
        }
        a->port = (int)port;
    }
    if (*end == '/' && end[1] != '\0') {
        char *e;
        long db = strtol(end + 1, &e, 10);
        if (*e != '\0' || db < 0 || db > 100000) {
            kb_errf(errstr, errlen, "transport: bad database number after %s:%d", a->host, a->port);
            return KB_EINVAL;
        }
        a->db = (int)db;
    } else if (*end != '\0' && strcmp(end, "/") != 0) {
        kb_errf(errstr, errlen, "transport: redis URL takes no query or fragment");
        return KB_EINVAL;
    }
    return KB_OK;
}

int64_t kb__redis_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void kb__redis_conn_init(kb_redis_conn *k, const struct kb_transport *t, const char *name)
{
    memset(k, 0, sizeof *k);
    k->t = t;
    k->name = name;
}

static struct timeval tv_ms(int ms)
{
    return (struct timeval){ms / 1000, (ms % 1000) * 1000};
}

/* AUTH and SELECT on a fresh context; an error text without secrets, or NULL. */
static const char *handshake(redisContext *c, const kb_redis_addr *a, char *buf, size_t len)
{
    redisReply *r = NULL;
    if (a->pass[0] != '\0') {
        if (a->user[0] != '\0')
            r = redisCommand(c, "AUTH %s %s", a->user, a->pass);
        else
            r = redisCommand(c, "AUTH %s", a->pass);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            snprintf(buf, len, "AUTH%s%s refused: %s", a->user[0] ? " as " : "", a->user,
                     r ? r->str : c->errstr);
            freeReplyObject(r);
            return buf;
        }
        freeReplyObject(r);
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
        freeReplyObject(r);
        return buf;
    }
    freeReplyObject(r);
    if (a->db != 0) {
        r = redisCommand(c, "SELECT %d", a->db);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            snprintf(buf, len, "SELECT %d failed: %s", a->db, r ? r->str : c->errstr);
            freeReplyObject(r);
            return buf;
        }
        freeReplyObject(r);
    }
    return NULL;
}

redisContext *kb__redis_conn_force(kb_redis_conn *k, char *errstr, size_t errlen)
{
    const struct kb_transport *t = k->t;
    if (k->c != NULL)
        return k->c;
    char why[300];
    const char *err = NULL;
    redisContext *c = redisConnectWithTimeout(t->addr.host, t->addr.port,
                                              tv_ms(t->connect_timeout_ms));
    if (c == NULL)
        err = "out of memory";
    else if (c->err)
        err = c->errstr[0] ? c->errstr : strerror(errno);
    else if (redisSetTimeout(c, tv_ms(t->read_timeout_ms)) != REDIS_OK ||
             redisEnableKeepAlive(c) != REDIS_OK)
        err = c->errstr;
    else
        err = handshake(c, &t->addr, why, sizeof why);
    if (err != NULL) {
        if (err != why)
            snprintf(why, sizeof why, "%s", err);   /* err may point into c */
        err = why;
        kb_errf(errstr, errlen, "redis %s: cannot connect to %s: %s", k->name, t->where, err);
        if (c != NULL)
            redisFree(c);
        /* Capped exponential backoff with jitter in [1/2, 1] of the step, so
         * many processes do not reconnect in lockstep after a server restart. */
        int shift = k->failures < 16 ? k->failures : 16;
        int64_t step = (int64_t)t->backoff_min_ms << shift;
        if (step > t->backoff_max_ms)
            step = t->backoff_max_ms;
        step = step / 2 + (int64_t)(random() % (step / 2 + 1));
        k->next_try_ns = kb__now_ns() + step * 1000000;
        if (k->failures++ == 0)
            kb_log(t->bus, 4, "redis %s: connection to %s down: %s", k->name, t->where, err);
        k->was_down = true;
        return NULL;
    }
    if (k->was_down)
        kb_log(t->bus, 6, "redis %s: reconnected to %s after %d attempts", k->name, t->where,
               k->failures);
    k->failures = 0;
    k->was_down = false;
    k->c = c;
    return c;
}

redisContext *kb__redis_conn_get(kb_redis_conn *k, char *errstr, size_t errlen)
{
    if (k->c == NULL && kb__now_ns() < k->next_try_ns) {
        kb_errf(errstr, errlen, "redis %s: %s is down; next reconnect in %lld ms", k->name,
                 k->t->where, (long long)((k->next_try_ns - kb__now_ns()) / 1000000));
        return NULL;
    }
    return kb__redis_conn_force(k, errstr, errlen);
}

void kb__redis_conn_fail(kb_redis_conn *k, const char *why)
{
    if (k->c == NULL)
        return;
    kb_log(k->t->bus, 4, "redis %s: lost %s: %s", k->name, k->t->where, why);
    redisFree(k->c);
    k->c = NULL;
    k->was_down = true;
    k->next_try_ns = kb__now_ns() + (int64_t)k->t->backoff_min_ms * 1000000;
}

void kb__redis_conn_close(kb_redis_conn *k)
{
    if (k->c != NULL)
        redisFree(k->c);
    k->c = NULL;
}

void kb__redis_nap(_Atomic bool *stop, int ms)
{
    struct timespec step = {0, 5 * 1000000L};
    for (int waited = 0; waited < ms && !atomic_load(stop); waited += 5)
        nanosleep(&step, NULL);
}

redisReply *kb__redis_cmd(kb_redis_conn *k, int argc, const char **argv, const size_t *lens)
{
    redisContext *c = kb__redis_conn_get(k, NULL, 0);
    if (c == NULL)
        return NULL;
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    if (r == NULL)
        kb__redis_conn_fail(k, c->errstr);
    return r;
}
