/* redis-sentinel://: the kb-redis-watch thread, subscribed to +switch-master
 * on one Sentinel after the other, so that connections that stay up to a
 * demoted primary (SENTINEL FAILOVER) leave it: a switch cuts them and their
 * owners reconnect, asking the Sentinels (redis_conn.c). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

#define WATCH_NAP_MS 100   /* how often the watcher looks at its stop flag */
#define WATCH_RETRY_MS 500 /* after no Sentinel could be subscribed to */
#define WATCH_STEP_MS 1000 /* bound on each blocking step, so kb_close never waits longer */

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
    kb__redis_primary_named(t, from, &a);
}

/* Subscribed to Sentinel `at` until it goes away or stop; false when it
 * could not be subscribed to. */
static bool listen_to(kb_transport *t, size_t at)
{
    char why[256];
    redisContext *c = kb__redis_sentinel_connect(t, &t->sentinels[at], kb_deadline_ns(WATCH_STEP_MS),
                                                 why, sizeof why);
    if (c == NULL)
        return false;
    redisReply *r = redisCommand(c, "SUBSCRIBE +switch-master");
    bool ok = r != NULL && r->type == REDIS_REPLY_ARRAY;
    kb__redis_reply_free(r);
    if (ok) {
        /* a switch before the subscription is not missed: ask once more */
        kb_redis_addr a;
        uint32_t gen;
        kb__redis_primary(t, kb_deadline_ns(WATCH_STEP_MS), &a, &gen, NULL, 0);
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
            kb__redis_reply_free(one);
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
