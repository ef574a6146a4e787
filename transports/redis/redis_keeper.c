/* The keeper thread (kb-redis-keeper): one loop, one connection, one job
 * after the other each pass, so a tick costs one pipeline per job:
 *   - send queued acks and dead letters      (redis_settle.c)
 *   - per subscribed topic, every tick (4 per lease TTL, at most 1 s) and at
 *     once for a topic just subscribed: heartbeat membership
 *     (redis_members.c), renew and take leases, hand back idle ones
 *     (redis_lease.c); remove consumers that left once per TTL or so.
 * It sleeps on keeper_wake until work is queued, a topic is subscribed, close
 * begins or the next tick is due. At close it sends the last acks and hands
 * every lease back, all before the close deadline. */
#include <stdlib.h>

#include "redis_int.h"

#define RETRY_NS 20000000   /* work the server refused for now: try again this soon */
/* While acks keep coming, passes are at least this far apart. A pass costs the
 * server two round trips (the lease checks, then MULTI/EXEC) and a command per
 * partition whatever its number of IDs; sent as soon as one was done they
 * came every ~400 events, half of the server's extra system calls per event
 * against baseline:redis-raw (which acks with its next read). The first ack
 * after a quiet spell goes at once. */
#define PASS_SPACING_NS 5000000

static int has_work(void *arg)
{
    kb_transport *t = arg;
    return atomic_load(&t->keeper_stop) || atomic_load(&t->jobs_queued) > 0 ||
           atomic_load(&t->duties_now);
}

static int is_stopping(void *arg)
{
    return atomic_load(&((kb_transport *)arg)->keeper_stop);
}

static int is_done(void *arg)
{
    return atomic_load(&((kb_transport *)arg)->keeper_done);
}

static int is_cut(void *arg)
{
    return atomic_load(&((kb_transport *)arg)->kc.cut);
}

/* Live members of a topic, as names into the heartbeat's reply (reused). */
typedef struct members {
    const char **names;
    size_t cap;
} members;

/* Every topic on the tick; between ticks only those just subscribed, so N
 * subscribes cost N lease rounds, not N * topics. */
static void duties(kb_transport *t, members *m, bool all, bool prune_now)
{
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next) {
        if (!atomic_exchange(&tt->fresh, false) && !all)
            continue;
        redisReply *r;
        size_t n;
        if (!kb__redis_members_beat(t, tt, &r, &m->names, &n, &m->cap)) {
            if (t->kc.c == NULL)
                return;   /* down: the next tick tries again */
            continue;
        }
        kb__redis_lease_round(t, tt, m->names, n, kb__redis_settle_send);
        kb__redis_reply_free(r);
        if (prune_now)
            kb__redis_members_prune(t, tt, "");
    }
}

/* Send the last acks and dead letters (a reconnect may be due in between),
 * then hand every lease back and leave, before the close deadline. */
static void goodbye(kb_transport *t)
{
    int64_t deadline = atomic_load(&t->close_deadline_ns);
    for (int tries = 0; tries < 3; tries++) {
        kb__redis_conn_until(&t->kc, deadline);
        kb__redis_settle_send(t);
        if (!t->jobs_unsent && atomic_load(&t->jobs_queued) == 0)
            break;
        int64_t retry = t->kc.next_try_ns;
        if (kb_now_ns() >= deadline || retry >= deadline)
            break;
        kb_signal_wait(t->keeper_wake, is_cut, t, retry);
    }
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next) {
        if (kb__redis_conn_until(&t->kc, deadline) == NULL)
            return;   /* the leases expire after their TTL */
        kb__redis_lease_release_all(t, tt);
        kb__redis_members_leave(t, tt);
    }
}

static void *keeper_main(void *arg)
{
    kb_transport *t = arg;
    int64_t tick = (int64_t)t->lease_ttl_ms * 1000000 / 4;   /* renew 4x per TTL */
    if (tick > 1000000000)
        tick = 1000000000;
    int64_t next_duty = 0, last_pass = 0;
    unsigned rounds = 0;
    members m = {NULL, 0};
    while (!atomic_load(&t->keeper_stop)) {
        if (atomic_load(&t->jobs_queued) > 0 || t->jobs_unsent) {
            if (kb_now_ns() < last_pass + PASS_SPACING_NS &&
                kb_signal_wait(t->keeper_wake, is_stopping, t, last_pass + PASS_SPACING_NS))
                break;   /* goodbye() sends what is queued */
            kb__redis_settle_send(t);
            last_pass = kb_now_ns();
        }
        int64_t now = kb_now_ns();
        bool fresh = atomic_exchange(&t->duties_now, false);
        if (now >= next_duty) {
            duties(t, &m, true, ++rounds % 4 == 0);   /* consumers that left: once per TTL or so */
            next_duty = now + tick;
        } else if (fresh) {
            duties(t, &m, false, false);
        }
        int64_t until = next_duty;
        if (t->jobs_unsent && kb_now_ns() + RETRY_NS < until)
            until = kb_now_ns() + RETRY_NS;
        kb_signal_wait(t->keeper_wake, has_work, t, until);
    }
    goodbye(t);
    for (kb_transport_topic *tt = atomic_load(&t->subscribed); tt != NULL; tt = tt->sub_next)
        kb__redis_lease_free(tt);
    free(m.names);
    atomic_store(&t->keeper_done, true);
    kb_signal_notify(t->keeper_wake);
    return NULL;
}

int kb__redis_keeper_start(kb_transport *t, char *errstr, size_t errlen)
{
    if (kb_thread_start(&t->keeper, "kb-redis-keeper", keeper_main, t) != KB_OK) {
        kb_errf(errstr, errlen, "redis: cannot start the keeper thread: %s", kb_last_error());
        return KB_ENOMEM;
    }
    return KB_OK;
}

/* The keeper's own steps end by the deadline; a call blocked on a server
 * that answers nothing is cut a little after it. */
void kb__redis_keeper_stop(kb_transport *t, int64_t deadline_ns)
{
    if (t->keeper == NULL)
        return;
    atomic_store(&t->close_deadline_ns, deadline_ns);
    atomic_store(&t->keeper_stop, true);
    kb_signal_notify(t->keeper_wake);
    int64_t grace = deadline_ns == INT64_MAX ? INT64_MAX : deadline_ns + 100000000;
    if (!kb_signal_wait(t->keeper_wake, is_done, t, grace)) {
        kb__redis_conn_cut(&t->kc);
        kb_signal_notify(t->keeper_wake);
    }
    kb_thread_join(t->keeper);
    t->keeper = NULL;
}
