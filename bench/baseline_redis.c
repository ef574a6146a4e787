/* baseline:redis-raw, the Redis limit for this workload: plain hiredis, no
 * keybus. One producer thread pipelines `XADD stream * k <key> d <payload>`
 * (the fields keybus writes) into one stream; a consumer thread on its own
 * connection loops `XREADGROUP ... COUNT n BLOCK ms >`, hands each entry to the
 * same checker as every runner, and acks each batch with one `XACK` pipelined
 * ahead of the next read. One stream keeps every aggregate in order, so the
 * order check applies as to the other runners. Flat out the XADDs go out a
 * window at a time; under --rate each is written when the driver publishes it,
 * paced exactly as keybus's producers are (the window then only bounds the
 * replies left unread). Run only for redis:// URLs.
 *
 * baseline:redis-xadd, the server's ceiling for appending: the same pipelined
 * XADDs and nothing else (no reader). Its events/s is the events over the time
 * from the first XADD to the last reply; then the stream is read back with
 * XRANGE into the same checker (order, loss, duplicates), outside the timing,
 * so its latency columns mean nothing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <keybus/keybus.h>

#include "bench.h"

#ifndef RAW_BATCH
#define RAW_BATCH 2048       /* XREADGROUP COUNT: keybus reads up to 8 partitions x redis.batch (256) per call */
#endif
#define STR_(x) #x
#define STR(x) STR_(x)
#define RAW_BATCH_STR STR(RAW_BATCH)
#define RAW_WINDOW 1024      /* XADDs sent per write; at most 2 windows unanswered */
#define RAW_BLOCK_MS "100"

struct raw_ctx {
    char host[256], user[128], pass[256];
    int port, db;
    char stream[96];
    redisContext *pub;
    uint64_t appended, unanswered, total;
    bool paced;                 /* under --rate: each XADD is written when it is published */
    uint64_t last_reply_ns;     /* xadd: the last XADD answered */
    int pub_error;
    redisContext *sub;
    atomic_int stop;
    int sub_error;
};

/* redis://[user:pass@]host[:port][/db]: enough for the bench. */
static int parse(const char *url, struct raw_ctx *c)
{
    if (strncmp(url, "redis://", 8) != 0)
        return -1;
    const char *s = url + 8, *at = strrchr(s, '@');
    if (at != NULL) {
        const char *colon = memchr(s, ':', (size_t)(at - s));
        if (colon == NULL) {
            snprintf(c->pass, sizeof c->pass, "%.*s", (int)(at - s), s);
        } else {
            snprintf(c->user, sizeof c->user, "%.*s", (int)(colon - s), s);
            snprintf(c->pass, sizeof c->pass, "%.*s", (int)(at - colon - 1), colon + 1);
        }
        s = at + 1;
    }
    size_t hl = strcspn(s, ":/?");
    snprintf(c->host, sizeof c->host, "%.*s", (int)hl, hl ? s : "127.0.0.1");
    c->port = 6379;
    s += hl;
    if (*s == ':')
        c->port = (int)strtol(s + 1, (char **)&s, 10);
    if (*s == '/')
        c->db = (int)strtol(s + 1, NULL, 10);
    return 0;
}

static redisContext *connect_to(const struct raw_ctx *c)
{
    struct timeval tv = {5, 0};
    redisContext *k = redisConnectWithTimeout(c->host, c->port, tv);
    if (k == NULL || k->err) {
        fprintf(stderr, "baseline:redis-raw: connect %s:%d: %s\n", c->host, c->port,
                k ? k->errstr : "out of memory");
        if (k)
            redisFree(k);
        return NULL;
    }
    redisSetTimeout(k, tv);
    redisReply *r = NULL;
    if (c->pass[0] && c->user[0])
        r = redisCommand(k, "AUTH %s %s", c->user, c->pass);
    else if (c->pass[0])
        r = redisCommand(k, "AUTH %s", c->pass);
    if (r != NULL && r->type == REDIS_REPLY_ERROR)
        fprintf(stderr, "baseline:redis-raw: AUTH: %s\n", r->str);
    freeReplyObject(r);
    if (c->db)
        freeReplyObject(redisCommand(k, "SELECT %d", c->db));
    return k;
}

/* Read replies until at most `keep` are unanswered. */
static int drain(struct raw_ctx *c, uint64_t keep)
{
    while (c->unanswered > keep) {
        redisReply *r = NULL;
        if (redisGetReply(c->pub, (void **)&r) != REDIS_OK) {
            fprintf(stderr, "baseline:redis-raw: XADD: %s\n", c->pub->errstr);
            return -1;
        }
        int bad = r->type == REDIS_REPLY_ERROR;
        if (bad)
            fprintf(stderr, "baseline:redis-raw: XADD: %s\n", r->str);
        freeReplyObject(r);
        c->unanswered--;
        if (bad)
            return -1;
    }
    return 0;
}

static int publish(void *opaque, const void *key, size_t key_len, const void *payload, size_t len)
{
    struct raw_ctx *c = opaque;
    if (c->pub_error)
        return KB_ETRANSPORT;
    const char *argv[] = {"XADD", c->stream, "*", "k", key, "d", payload};
    const size_t lens[] = {4, strlen(c->stream), 1, 1, key_len, 1, len};
    redisAppendCommandArgv(c->pub, 7, argv, lens);
    c->unanswered++;
    bool last = ++c->appended == c->total, window = c->appended % RAW_WINDOW == 0;
    if (window || last || c->paced) {
        int done = 0;
        while (!done)
            if (redisBufferWrite(c->pub, &done) != REDIS_OK) {
                c->pub_error = 1;
                return KB_ETRANSPORT;
            }
    }
    if (window || last) {   /* paced, the replies of the window are already in by now */
        if (drain(c, last ? 0 : RAW_WINDOW) != 0) {
            c->pub_error = 1;
            return KB_ETRANSPORT;
        }
        if (last)
            c->last_reply_ns = kb_now_ns();
    }
    return KB_OK;
}

static const redisReply *field(const redisReply *f, const char *name)
{
    for (size_t i = 0; f->type == REDIS_REPLY_ARRAY && i + 1 < f->elements; i += 2)
        if (f->element[i]->type == REDIS_REPLY_STRING && strcmp(f->element[i]->str, name) == 0)
            return f->element[i + 1];
    return NULL;
}

/* Every entry of the stream, in order, to the checker (xadd, after the timing). */
static int read_back(struct raw_ctx *c)
{
    char from[64] = "-";
    for (;;) {
        redisReply *r = redisCommand(c->pub, "XRANGE %s %s + COUNT 4096", c->stream, from);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
            fprintf(stderr, "baseline:redis-xadd: XRANGE: %s\n",
                    r ? (r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply") : c->pub->errstr);
            freeReplyObject(r);
            return -1;
        }
        size_t n = r->elements;
        for (size_t i = 0; i < n; i++) {
            const redisReply *d = field(r->element[i]->element[1], "d");
            if (d != NULL && d->type == REDIS_REPLY_STRING)
                kb_collect_event(d->str, d->len);
        }
        if (n > 0)   /* exclusive start: the last ID read */
            snprintf(from, sizeof from, "(%s", r->element[n - 1]->element[0]->str);
        freeReplyObject(r);
        if (n == 0)
            return 0;
    }
}

static int publish_then_read(void *opaque, const void *key, size_t key_len, const void *payload,
                             size_t len)
{
    struct raw_ctx *c = opaque;
    int rc = publish(c, key, key_len, payload, len);
    if (rc == KB_OK && c->appended == c->total && read_back(c) != 0) {
        c->pub_error = 1;
        return KB_ETRANSPORT;
    }
    return rc;
}

static void *consume(void *opaque)
{
    struct raw_ctx *c = opaque;
    redisContext *k = c->sub;
    const char *ack[3 + RAW_BATCH] = {"XACK", c->stream, "bench"};
    const char *read[] = {"XREADGROUP", "GROUP", "bench", "raw", "COUNT", RAW_BATCH_STR,
                          "BLOCK", RAW_BLOCK_MS, "STREAMS", c->stream, ">"};
    redisReply *prev = NULL;   /* the last batch: its IDs are acked with the next read */
    while (!atomic_load_explicit(&c->stop, memory_order_relaxed)) {
        int cmds = 1;
        const redisReply *ents = prev ? prev->element[0]->element[1] : NULL;
        if (ents != NULL && ents->elements > 0) {
            for (size_t i = 0; i < ents->elements; i++)
                ack[3 + i] = ents->element[i]->element[0]->str;
            redisAppendCommandArgv(k, (int)(3 + ents->elements), ack, NULL);
            cmds++;
        }
        redisAppendCommandArgv(k, sizeof read / sizeof *read, read, NULL);
        freeReplyObject(prev);
        prev = NULL;
        redisReply *r = NULL;
        for (int i = 0; i < cmds; i++) {
            freeReplyObject(r);
            r = NULL;
            if (redisGetReply(k, (void **)&r) != REDIS_OK) {
                fprintf(stderr, "baseline:redis-raw: XREADGROUP: %s\n", k->errstr);
                c->sub_error = 1;
                return NULL;
            }
        }
        if (r->type == REDIS_REPLY_ERROR) {
            fprintf(stderr, "baseline:redis-raw: XREADGROUP: %s\n", r->str);
            c->sub_error = 1;
            freeReplyObject(r);
            return NULL;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 1) {
            freeReplyObject(r);   /* nil: BLOCK timed out */
            continue;
        }
        const redisReply *e = r->element[0]->element[1];
        for (size_t i = 0; i < e->elements; i++) {
            const redisReply *d = field(e->element[i]->element[1], "d");
            if (d != NULL && d->type == REDIS_REPLY_STRING)
                kb_collect_event(d->str, d->len);
        }
        prev = r;
    }
    freeReplyObject(prev);
    return NULL;
}

/* baseline:redis-raw, or with `xadd_only` baseline:redis-xadd. */
static void run(const kb_plan *plan, const char *url, kb_result *r, bool xadd_only)
{
    static unsigned run_no;
    kb_plan p = *plan;
    p.producers = 1;   /* by definition: one pipelined producer (and one consumer) */
    snprintf(r->transport, sizeof r->transport, "baseline:redis-%s", xadd_only ? "xadd" : "raw");
    r->threads = 1;
    struct raw_ctx *c = calloc(1, sizeof *c);
    if (c == NULL || parse(url, c) != 0 || kb_collect_begin(&p) != 0) {
        kb_result_plan(r, &p);
        free(c);
        r->error = KB_EINVAL;
        return;
    }
    snprintf(c->stream, sizeof c->stream, "kbbench:%s:%s:%ld:%u", xadd_only ? "xadd" : "raw",
             kb_scenario_name(p.scenario), (long)getpid(), run_no++);
    c->total = p.events;
    c->paced = p.rate > 0;   /* paced as keybus is: a paced XADD waits for no window */
    c->pub = connect_to(c);
    c->sub = c->pub && !xadd_only ? connect_to(c) : NULL;
    redisReply *g = c->sub ? redisCommand(c->sub, "XGROUP CREATE %s bench 0 MKSTREAM", c->stream)
                           : NULL;
    pthread_t consumer;
    if (xadd_only && c->pub != NULL) {
        kb_drive(&p, publish_then_read, NULL, c, r);
        if (c->pub_error)
            r->error = KB_ETRANSPORT;
    } else if (g == NULL || g->type == REDIS_REPLY_ERROR ||
               pthread_create(&consumer, NULL, consume, c) != 0) {
        r->error = KB_ETRANSPORT;
    } else {
        kb_drive(&p, publish, NULL, c, r);
        atomic_store(&c->stop, 1);
        pthread_join(consumer, NULL);
        if (c->pub_error || c->sub_error)
            r->error = KB_ETRANSPORT;
    }
    freeReplyObject(g);
    kb_collect_end(&p, r);
    if (xadd_only && c->last_reply_ns > 0) {   /* the appending only; the read-back checks */
        uint64_t distinct = r->events - r->lost;
        r->seconds = (double)(c->last_reply_ns - kb_collect_start_ns()) / 1e9;
        r->events_per_s = r->seconds > 0 ? (double)distinct / r->seconds : 0;
        r->cpu_ns_per_event = 0;   /* it counted the read-back too */
        kb_hist_reset(&r->hist);
    }
    if (c->pub != NULL) {
        freeReplyObject(redisCommand(c->pub, "DEL %s", c->stream));   /* leave no data behind */
        redisFree(c->pub);
    }
    if (c->sub != NULL)
        redisFree(c->sub);
    free(c);
}

void kb_run_redis_raw(const kb_plan *plan, const char *url, kb_result *r)
{
    run(plan, url, r, false);
}

void kb_run_redis_xadd(const kb_plan *plan, const char *url, kb_result *r)
{
    run(plan, url, r, true);
}
