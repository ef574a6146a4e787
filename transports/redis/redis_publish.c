/* Publishing: kb_publish appends the XADD to the backlog. When nothing older
 * waits to be written and at most one XADD awaits its reply, it writes it
 * itself, without blocking (no hand-off to another thread, which at everyday
 * rates costs a wake-up that waits for a CPU); otherwise, or for what the
 * socket does not take, the sender (redis_sender.c) writes it. No publisher
 * waits for the network. The
 * backlog is bounded by redis.publish_buffer_bytes: when it is full a
 * publisher waits up to pool.enqueue_timeout_ms for the server to confirm
 * older ones, then gets KB_EFULL. kb_flush waits for the confirmations;
 * nothing accepted is dropped while the server is away. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

/* Check the topic's metadata once; a server that is down is asked again at
 * the next publish. Outside pub_lock: other topics' publishers go on. */
static int meta_checked(kb_transport *t, kb_transport_topic *tt)
{
    int rc = atomic_load(&tt->meta_rc);
    if (rc == 1) {
        rc = kb__redis_check_meta(t, tt);
        if (rc != KB_ETRANSPORT)
            atomic_store(&tt->meta_rc, rc);
    }
    return rc;
}

typedef struct room {
    kb_transport *t;
    size_t need;
} room;

/* One record always fits in an empty backlog, however large. */
static int has_room(void *arg)
{
    const room *r = arg;
    size_t held = atomic_load(&r->t->pub_held);
    return held == 0 || held + r->need <= r->t->buffer_bytes;
}

/* Wait for room up to pool.enqueue_timeout_ms; caller holds pub_lock
 * (released while waiting). KB_OK or KB_EFULL. */
static int wait_room(kb_transport *t, kb_transport_topic *tt, size_t need)
{
    room r = {t, need};
    int64_t deadline = kb_deadline_ns(t->enqueue_timeout_ms);
    while (!has_room(&r)) {
        if (kb_now_ns() >= deadline) {
            kb_errf(NULL, 0, "kb_publish %s: %zu bytes of publishes wait for %s to confirm them "
                    "(redis.publish_buffer_bytes %zu) after pool.enqueue_timeout_ms (%d ms)%s%.300s",
                    tt->name, atomic_load(&t->pub_held), t->where, t->buffer_bytes,
                    t->enqueue_timeout_ms, t->pub_lost[0] ? "; connection lost: " : "", t->pub_lost);
            return KB_EFULL;
        }
        pthread_mutex_unlock(&t->pub_lock);
        kb_signal_wait(t->pub_progress, has_room, &r, deadline);
        pthread_mutex_lock(&t->pub_lock);
    }
    return KB_OK;
}

/* Records written and not answered under which a publisher writes what it
 * added itself, at once. */
#define SHALLOW 2

int kb__redis_publish(kb_transport *t, kb_transport_topic *tt, const kb_msg *m)
{
    kb_redis_part *p = &tt->parts[kb_partition_of_hash(m->hash, t->partitions)];
    /* the core checked the headers: at most KB_MAX_HEADERS, names of the rules */
    kb_redis_args a;
    int n = 0;
    size_t need;
    if (t->publish_batch == 1) {
        n = kb__redis_xadd_args(t, p, m, &a);
        need = kb__redis_backlog_cmd_bytes(n, a.lens);
    } else {
        need = kb_frame_event_size(m, true);
    }
    size_t big = m->key_len > m->payload_len ? m->key_len : m->payload_len;

    int rc = meta_checked(t, tt);
    if (rc != KB_OK)
        return rc;   /* the metadata check said why */
    pthread_mutex_lock(&t->pub_lock);
    /* over the server's limit: it would drop the connection */
    if ((rc = kb__redis_limit_check(t, tt->name, m)) == KB_OK && t->sender == NULL)
        rc = kb__redis_sender_start(t);
    if (rc == KB_OK)
        rc = wait_room(t, tt, need);
    /* A sender that owes replies or a write comes back to the backlog when
     * they arrive, and writes this with what follows: no wake-up (a pipe
     * write and a poll) per publish, and fuller writes for the server. */
    bool kick = !t->sender_busy, opened = false;
    if (rc == KB_OK) {
        size_t records = t->backlog.n, unsent;
        kb__redis_backlog_unsent(&t->backlog, &unsent);
        if (t->publish_batch > 1)
            rc = kb__redis_batch_add(t, p, m, &opened);
        else if (!kb__redis_backlog_add(&t->backlog, p, big, n, a.argv, a.lens))
            rc = KB_ENOMEM;
        if (rc == KB_OK) {
            /* At most one entry awaits its reply (everyday rates) and no
             * replica is waited for (the sender queues each WAIT behind
             * the XADDs it writes): what this publish added goes on the
             * wire now, from this thread, and the open frames with it; a
             * frame held for that reply would still hold this one event, a
             * round trip later. With more in flight the sender writes what
             * came meanwhile in one go when the replies arrive, and the
             * frames fill. */
            bool shallow = unsent == 0 && records < SHALLOW && t->pub_direct &&
                           t->wait_replicas == 0;   /* a WAIT follows the sender's writes */
            if (opened && shallow) {
                kb__redis_frames_due(t, true);
                opened = t->frames_open > 0;   /* out of memory: left to the sender */
            }
            bool added = t->backlog.n != records;
            if (added && shallow && kb__redis_sender_write_now(t))
                kick = false;   /* written: its replies bring the sender back */
            /* an open frame waits for the sender's timer only when nothing
             * else brings it back to the backlog */
            kick = kick && (opened || added);
            kb__redis_pub_counts(t);
            atomic_fetch_add_explicit(&tt->published, 1, memory_order_relaxed);
        } else {
            kb_errf(NULL, 0, "kb_publish %s: out of memory", tt->name);
        }
    }
    pthread_mutex_unlock(&t->pub_lock);
    if (rc == KB_OK && kick)
        kb__redis_sender_kick(t);
    return rc;
}

void kb__redis_pub_note(kb_transport *t, kb_transport_topic *tt, uint32_t part, const char *id)
{
    pthread_mutex_lock(&t->pub_lock);
    atomic_fetch_add_explicit(&tt->published, 1, memory_order_relaxed);
    kb__redis_note_last(&tt->parts[part], id);
    pthread_mutex_unlock(&t->pub_lock);
}

static int all_confirmed(void *arg)
{
    return atomic_load(&((kb_transport *)arg)->pub_unconfirmed) == 0;
}

/* Every open frame into the backlog, now: flush, drain and close wait for
 * no linger. */
static void frames_out(kb_transport *t)
{
    pthread_mutex_lock(&t->pub_lock);
    bool any = t->frames_open > 0;
    if (any) {
        kb__redis_frames_due(t, true);
        kb__redis_pub_counts(t);
    }
    pthread_mutex_unlock(&t->pub_lock);
    if (any)
        kb__redis_sender_kick(t);
}

int kb__redis_pub_confirmed(kb_transport *t, int64_t deadline_ns, const char *who)
{
    frames_out(t);
    kb_signal_wait(t->pub_progress, all_confirmed, t, deadline_ns);
    pthread_mutex_lock(&t->pub_lock);
    int rc = KB_OK;
    char shortfall[800] = "";
    if (t->wait_short > 0)
        snprintf(shortfall, sizeof shortfall, "%s%llu publishes stored on %s but not on its "
                 "replicas: %.300s (redis.wait_replicas)", t->pub_failed > 0 ? "; " : "",
                 (unsigned long long)t->wait_short, t->where, t->wait_error);
    if (t->pub_failed > 0) {
        kb_errf(NULL, 0, "%s: %llu publishes to %s failed: %s%s", who,
                 (unsigned long long)t->pub_failed, t->where, t->pub_error, shortfall);
        rc = KB_ETRANSPORT;
    } else if (t->wait_short > 0) {
        kb_errf(NULL, 0, "%s: %s", who, shortfall);
        rc = KB_ETRANSPORT;
    } else if (t->backlog.n > 0) {
        kb_errf(NULL, 0, "%s: %llu publishes not yet confirmed by %s, kept to be sent again%s%.300s",
                who, (unsigned long long)kb__redis_backlog_events(&t->backlog), t->where,
                t->pub_lost[0] ? "; connection lost: " : "", t->pub_lost);
        rc = KB_ETIMEDOUT;
    }
    t->pub_failed = 0;
    t->wait_short = 0;
    pthread_mutex_unlock(&t->pub_lock);
    return rc;
}

int kb__redis_flush(kb_transport *t, int timeout_ms)
{
    return kb__redis_pub_confirmed(t, kb_deadline_ns(timeout_ms), "kb_flush");
}

struct given_up {
    kb_transport *t;
    char why[700];
};

static void report_given_up(void *arg, const kb_redis_pubrec *r, const char *xadd)
{
    struct given_up *g = arg;
    if (r->p != NULL)   /* not a WAIT */
        kb__redis_report_now(g->t, r->p, xadd, r->len, KB_ETRANSPORT, g->why);
}

static void report_unsent(void *arg, kb_redis_part *p, const kb_frame_event *ev)
{
    struct given_up *g = arg;
    kb__redis_report_key(g->t, p, ev->key, ev->key_len, KB_ETRANSPORT, g->why);
}

/* What close gives up on is reported failed before it returns: the events
 * still held, and those stored but not yet vouched for by a WAIT. The
 * sender has stopped and the bus lets no publisher in any more: nothing
 * moves the backlog, and no lock is held while the callback runs. */
static void report_held(kb_transport *t)
{
    if (!kb_bus_delivery_wanted(t->bus))
        return;
    struct given_up g = {t, ""};
    snprintf(g.why, sizeof g.why, "kb_close gave up: not confirmed by %s before its deadline%s%.300s",
             t->where, t->pub_lost[0] ? "; connection lost: " : "", t->pub_lost);
    kb__redis_backlog_each(&t->backlog, report_given_up, &g);
    kb__redis_frames_each(t, report_unsent, &g);   /* frames out of memory to go out */
    snprintf(g.why, sizeof g.why, "kb_close gave up: stored on %s, but no WAIT confirmed it on %d "
             "replicas before its deadline", t->where, t->wait_replicas);
    kb__redis_reports_fail(t, &t->unvouched, KB_ETRANSPORT, g.why);
}

int kb__redis_pub_close(kb_transport *t, int64_t deadline_ns)
{
    if (t->sender != NULL) {
        frames_out(t);
        atomic_store(&t->sender_deadline_ns, deadline_ns);
        kb__redis_sender_kick(t);
        kb_signal_wait(t->pub_progress, all_confirmed, t, deadline_ns);
        kb__redis_sender_stop(t);
        report_held(t);
    }
    pthread_mutex_lock(&t->pub_lock);
    uint64_t held = kb__redis_backlog_events(&t->backlog);
    int rc = KB_OK;
    if (held > 0 || t->pub_failed > 0) {
        /* accepted by kb_publish, not stored, not reported by a kb_flush yet */
        kb_errf(NULL, 0, "redis: %llu published events never sent to %s (%llu unconfirmed at "
                "close%s%.300s, %llu failed since the last kb_flush%s%s)",
                (unsigned long long)(held + t->pub_failed), t->where, (unsigned long long)held,
                held > 0 && t->pub_lost[0] ? ": " : "", held > 0 ? t->pub_lost : "",
                (unsigned long long)t->pub_failed, t->pub_failed > 0 ? ": " : "",
                t->pub_failed > 0 ? t->pub_error : "");
        kb_log(t->bus, KB_LOG_ERROR, "%s", kb_last_error());
        rc = KB_ETRANSPORT;
    } else if (t->wait_pending > 0) {
        /* reported failed: the close's result says so too */
        kb_errf(NULL, 0, "redis: %llu published events stored on %s but not confirmed on %d "
                "replicas: kb_close gave up before a WAIT answered (redis.wait_replicas)",
                (unsigned long long)t->wait_pending, t->where, t->wait_replicas);
        kb_log(t->bus, KB_LOG_ERROR, "%s", kb_last_error());
        rc = KB_ETRANSPORT;
    }
    pthread_mutex_unlock(&t->pub_lock);
    return rc;
}
