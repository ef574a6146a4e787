/* kb_drain: send what is buffered, then wait until the consumer group has
 * settled every entry this process added. Per partition stream it wrote to,
 * the group's last-delivered ID must have reached this process's newest entry
 * there and nothing up to it may be pending. The group may not exist yet, nor
 * a consumer that owns the partition: that is waiting too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <keybus/kit.h>

#include "redis_int.h"

#define POLL_MIN_MS 2    /* first poll after one that found work left */
#define POLL_MAX_MS 20   /* backoff cap: latency behind consumers in other processes */

/* One partition stream and the newest entry this process added to it. */
typedef struct target {
    const char *stream;   /* the partition's, alive until close */
    char id[KB_REDIS_ID_MAX];
} target;

/* What kb_drain waits for, taken under pub_lock after the publishes are in. */
static target *targets_of(kb_transport *t, size_t *n)
{
    *n = 0;
    size_t cap = 0;
    target *v = NULL;
    pthread_mutex_lock(&t->pub_lock);
    for (kb_transport_topic *tt = atomic_load(&t->opened); tt != NULL; tt = tt->opened_next)
        for (uint32_t i = 0; i < tt->nparts; i++) {
            const kb_redis_part *p = &tt->parts[i];
            if (p->last_id[0] == '\0')
                continue;
            if (kb_vec_reserve((void **)&v, &cap, *n + 1, sizeof *v) != KB_OK) {
                pthread_mutex_unlock(&t->pub_lock);
                free(v);
                *n = SIZE_MAX;
                return NULL;
            }
            v[*n].stream = p->stream;
            snprintf(v[*n].id, sizeof v[*n].id, "%s", p->last_id);
            (*n)++;
        }
    pthread_mutex_unlock(&t->pub_lock);
    return v;
}

/* Settled: the group read past `id` (XINFO GROUPS' last-delivered-id) and
 * nothing up to it is pending (XPENDING with `id` as end). */
static bool settled(const kb_transport *t, const redisReply *groups,
                    const redisReply *pending, const char *id)
{
    const redisReply *row = kb__redis_group_row(t, groups);
    const redisReply *last = row != NULL ? kb__redis_field(row, "last-delivered-id") : NULL;
    return last != NULL && kb__redis_id_cmp(last->str, id) >= 0 &&
           pending->type == REDIS_REPLY_ARRAY && pending->elements == 0;
}

/* Ask about every unsettled target in one pipeline on the control
 * connection; settled ones move to the end. The count still unsettled, or
 * -1 when the server could not be asked. */
static ssize_t poll_targets(kb_transport *t, target *v, size_t n)
{
    pthread_mutex_lock(&t->ctl_lock);
    redisContext *c = kb__redis_conn_get(&t->ctl, NULL, 0);
    if (c == NULL) {
        pthread_mutex_unlock(&t->ctl_lock);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *groups[] = {"XINFO", "GROUPS", v[i].stream};
        const char *pend[] = {"XPENDING", v[i].stream, t->group, "-", v[i].id, "1"};
        redisAppendCommandArgv(c, 3, groups, NULL);
        redisAppendCommandArgv(c, 6, pend, NULL);
    }
    size_t left = n;
    bool *done = calloc(n, sizeof *done);
    for (size_t i = 0; i < n; i++) {
        redisReply *g = NULL, *p = NULL;
        if (redisGetReply(c, (void **)&g) != REDIS_OK ||
            redisGetReply(c, (void **)&p) != REDIS_OK) {
            kb_errf(NULL, 0, "kb_drain: %s: %s", t->where, c->errstr);
            kb__redis_conn_fail(&t->ctl, c->errstr);
            kb__redis_reply_free(g);
            free(done);
            pthread_mutex_unlock(&t->ctl_lock);
            return -1;
        }
        if (done != NULL && settled(t, g, p, v[i].id)) {
            done[i] = true;
            left--;
        }
        kb__redis_reply_free(g);
        kb__redis_reply_free(p);
    }
    pthread_mutex_unlock(&t->ctl_lock);
    for (size_t i = 0, k = 0; done != NULL && i < n; i++)
        if (!done[i])
            v[k++] = v[i];
    free(done);
    return (ssize_t)left;
}

/* One kb_drain's state, for the kit's callbacks. */
typedef struct drain {
    kb_transport *t;
    target *v;
    size_t n;             /* targets not yet settled */
    uint64_t rounds;      /* the keeper's settle rounds when last asked */
} drain;

static int settle_slice(void *d, int64_t until_ns)
{
    return kb__redis_pub_confirmed(((drain *)d)->t, until_ns, "kb_drain");
}

static int drain_targets(void *arg)
{
    drain *d = arg;
    d->v = targets_of(d->t, &d->n);
    if (d->n == SIZE_MAX) {
        kb_errf(NULL, 0, "kb_drain: out of memory");
        return KB_ENOMEM;
    }
    return KB_OK;
}

/* The acks this process sends (the keeper's settle rounds) wake the wait:
 * they are the likeliest to settle the targets. One pipeline, bounded by the
 * control connection's own timeouts. */
static int drain_settled(void *arg, int64_t deadline_ns)
{
    (void)deadline_ns;
    drain *d = arg;
    d->rounds = atomic_load(&d->t->settle_rounds);
    ssize_t left = d->n > 0 ? poll_targets(d->t, d->v, d->n) : 0;
    if (left > 0)
        d->n = (size_t)left;
    return left == 0;
}

static int keeper_settled_more(void *arg)
{
    drain *d = arg;
    return atomic_load(&d->t->settle_rounds) != d->rounds;
}

int kb__redis_drain(kb_transport *t, int timeout_ms)
{
    drain d = {t, NULL, 0, 0};
    kb_kit_drain_conf c = {.size = sizeof c, .opaque = &d, .flush = settle_slice,
                           .targets = drain_targets, .settled = drain_settled,
                           .progress = t->settled, .local = keeper_settled_more,
                           .poll_min_ms = POLL_MIN_MS, .poll_max_ms = POLL_MAX_MS};
    int rc = kb_kit_drain(t->bus, timeout_ms, &c);
    free(d.v);
    return rc;
}
