/* The sender thread (kb-redis-sender) owns the publish connection: it writes
 * the backlog pipelined without blocking, reads the replies as they come and
 * takes each confirmed record off. A connection that breaks, or stays silent
 * for redis.read_timeout_ms while replies are due, is dropped; after the
 * backoff the sender reconnects and writes every unconfirmed record again,
 * oldest first, then the rest (at least once: one the server stored before
 * the loss is stored twice; the copies come in order, but a transient error
 * answered to one XADD while later ones were already written and stored puts
 * their first copies before it: the replies still due are read first, and
 * those of its stream counted and logged). Publishers write their own XADD at everyday
 * rates (redis_publish.c); the sender reads its reply. Only what the server refuses
 * (an error reply, an event over its proto-max-bulk-len: a frame over it is
 * split) counts as failed, per event.
 * With redis.wait_replicas, each time it has written everything it appends a
 * WAIT for the XADDs since the previous one: its answer says how many
 * replicas have them, and a shortfall is kb_flush's error. Each event gets
 * one delivery report (redis_report.c): on its XADD's reply, or with
 * redis.wait_replicas on the WAIT's answer after it. A primary that
 * became a replica (-READONLY, a failover) is left like a broken connection. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "redis_int.h"

#define REPLIES_MAX 256   /* replies applied per pub_lock hold */

/* The answer to a WAIT record (caller holds pub_lock): a shortfall counts
 * its events for kb_flush. True when the replicas confirmed them. */
static bool wait_answered(kb_transport *t, const kb_redis_pubrec *rec, const redisReply *r)
{
    if (r->type == REDIS_REPLY_INTEGER && !rec->lost && r->integer >= t->wait_replicas)
        return true;
    t->wait_short += rec->events;   /* a WAIT's: the events of the XADDs before it */
    if (rec->lost)
        snprintf(t->wait_error, sizeof t->wait_error, "the connection was lost before %d replicas "
                 "confirmed", t->wait_replicas);
    else if (r->type == REDIS_REPLY_INTEGER)
        snprintf(t->wait_error, sizeof t->wait_error, "%lld of %d replicas confirmed within %d ms",
                 (long long)r->integer, t->wait_replicas, t->wait_timeout_ms);
    else
        snprintf(t->wait_error, sizeof t->wait_error, "WAIT refused: %.200s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "not a number");
    return false;
}

/* Hand the batch to the application with pub_lock released (its callback
 * may publish); caller holds pub_lock, held again on return. */
static void reports_flush(kb_transport *t)
{
    pthread_mutex_unlock(&t->pub_lock);
    kb__redis_reports_send(t, &t->reports);
    pthread_mutex_lock(&t->pub_lock);
}

/* Keep the report of the oldest record, about to be popped (caller holds
 * pub_lock). A batch that cannot grow is sent first: an empty one has room. */
static void report_oldest(kb_transport *t, kb_redis_part *p, int result, const char *id,
                          const char *why)
{
    const kb_redis_backlog *bl = &t->backlog;
    while (!kb__redis_report_keep(&t->reports, p, kb__redis_backlog_oldest(bl),
                                  bl->rec[bl->first].len, result, id, why))
        reports_flush(t);
}

/* The oldest record's XADD was stored: reported now, or with
 * redis.wait_replicas once the next WAIT answered (caller holds pub_lock). */
static void stored(kb_transport *t, kb_redis_part *p, const char *id)
{
    const kb_redis_backlog *bl = &t->backlog;
    if (t->wait_replicas == 0)
        report_oldest(t, p, KB_OK, id, "");
    else if (!kb__redis_report_keep(&t->unvouched, p, kb__redis_backlog_oldest(bl),
                                    bl->rec[bl->first].len, KB_OK, id, ""))
        report_oldest(t, p, KB_ENOMEM, "", "stored, but out of memory to wait for the replicas");
}

/* A WAIT answered: the stored XADDs before it are reported, stored when the
 * replicas confirmed them; those confirmed on a connection lost since, or
 * all after a shortfall, failed (caller holds pub_lock). */
static void vouched(kb_transport *t, bool confirmed)
{
    char lost[120];
    snprintf(lost, sizeof lost, "the connection was lost before %d replicas confirmed",
             t->wait_replicas);
    kb_redis_reports *u = &t->unvouched;
    uint64_t failed = 0;
    for (size_t i = 0; i < u->n; i++) {
        bool ok = confirmed && i >= t->unvouched_lost;
        while (!kb__redis_reports_fits(&t->reports, u, i))
            reports_flush(t);
        kb__redis_reports_move(&t->reports, u, i, ok ? KB_OK : KB_ETRANSPORT,
                               i < t->unvouched_lost ? lost : t->wait_error);
        failed += !ok;
    }
    /* kb_flush counts what was reported failed */
    if (confirmed && failed > 0) {
        t->wait_short += failed;
        snprintf(t->wait_error, sizeof t->wait_error, "%s", lost);
    }
    u->n = u->len = 0;
    t->unvouched_lost = 0;
}

/* A reply after a transient refusal (caller holds pub_lock): nothing is
 * taken off any more, the connection is left once every record written is
 * answered (false then), and a record stored although an earlier one of its
 * stream was refused is counted: its first copy precedes that one in the
 * stream. Redis runs each pipelined XADD on its own, so one refused while
 * the server could not write (a script, its replicas, loading) does not
 * stop the later ones once it can. */
static bool refused_reply(kb_transport *t, const redisReply *r)
{
    kb_redis_backlog *bl = &t->backlog;
    if (t->refusal.answered < bl->n) {
        kb_redis_part *p = bl->rec[(bl->first + t->refusal.answered) % bl->rcap].p;
        if (p != NULL && r->type == REDIS_REPLY_ERROR && kb__redis_transient(r)) {
            p->refused = true;
        } else if (p != NULL && p->refused && r->type == REDIS_REPLY_STRING) {
            t->refusal.ahead += bl->rec[(bl->first + t->refusal.answered) % bl->rcap].events;
            t->refusal.stream = p->stream;
        }
    }
    return ++t->refusal.answered < t->refusal.due;
}

/* Replies to the oldest records: IDs noted, refusals counted, reports kept
 * and sent once pub_lock is released. A protocol error (the server closes
 * after it) is explained by the argument's size. At a transient error that
 * record and the ones after it stay unconfirmed, to be written again in
 * order on a new connection; false once the replies due on this one are
 * read (refused_reply). */
static bool apply(kb_transport *t, redisReply **r, size_t n)
{
    size_t proto_big = 0;
    bool ok = true;
    bool wanted = kb_bus_delivery_wanted(t->bus);
    pthread_mutex_lock(&t->pub_lock);
    t->direct_since_ns = 0;   /* the server answered since: it is timed from now */
    for (size_t i = 0; i < n && t->backlog.n > 0 && ok; i++) {
        if (!t->refusal.on && r[i]->type == REDIS_REPLY_ERROR &&
            strstr(r[i]->str, "Protocol error") != NULL &&
            t->backlog.rec[t->backlog.first].events > 1) {
            /* a frame over the server's limit: it closes the connection,
             * lose() splits the frame (its events are not refused) */
            snprintf(t->pub_lost, sizeof t->pub_lost, "%.200s", r[i]->str);
            ok = false;
            break;
        }
        if (!t->refusal.on && r[i]->type == REDIS_REPLY_ERROR && kb__redis_transient(r[i])) {
            snprintf(t->pub_lost, sizeof t->pub_lost, "%.200s", r[i]->str);
            t->refusal.on = true;
            t->refusal.due = kb__redis_backlog_written(&t->backlog);   /* nothing is written now */
            t->pub_direct = false;   /* publishers write nothing more to it */
        }
        if (t->refusal.on) {
            ok = refused_reply(t, r[i]);
            continue;
        }
        kb_redis_part *p = t->backlog.rec[t->backlog.first].p;
        bool is_id = r[i]->type == REDIS_REPLY_STRING;
        if (wanted && p != NULL && is_id)
            stored(t, p, r[i]->str);
        else if (wanted && p != NULL)
            report_oldest(t, p, KB_ETRANSPORT, "",
                          r[i]->type == REDIS_REPLY_ERROR ? r[i]->str : "unexpected reply");
        kb_redis_pubrec rec = kb__redis_backlog_pop(&t->backlog);
        if (rec.p != NULL && is_id && t->pub_careful) {   /* stored: pipeline again */
            t->pub_careful = false;
            t->pub_direct = !atomic_load(&t->sender_stop);
        }
        if (rec.p == NULL) {
            bool confirmed = wait_answered(t, &rec, r[i]);
            if (wanted)
                vouched(t, confirmed);
            t->wait_pending = 0;
        } else if (is_id) {
            kb__redis_note_last(rec.p, r[i]->str);
            t->wait_pending += t->wait_replicas > 0;
        } else if (r[i]->type == REDIS_REPLY_ERROR) {
            t->pub_failed += rec.events;
            snprintf(t->pub_error, sizeof t->pub_error, "XADD refused: %s", r[i]->str);
            if (strstr(r[i]->str, "Protocol error") != NULL)
                proto_big = rec.big;
        }
    }
    atomic_store(&t->pub_held, t->backlog.held + t->frames_bytes);
    pthread_mutex_unlock(&t->pub_lock);
    if (proto_big > 0) {   /* explained before kb_flush can see the refusal */
        char cause[600];
        kb__redis_limit_explain(t, proto_big, cause, sizeof cause);
        pthread_mutex_lock(&t->pub_lock);
        char refused[sizeof t->pub_error];
        snprintf(refused, sizeof refused, "%s", t->pub_error);
        snprintf(t->pub_error, sizeof t->pub_error, "%.600s%.400s", cause, refused);
        pthread_mutex_unlock(&t->pub_lock);
    }
    /* reported before kb_flush can see them confirmed */
    kb__redis_reports_send(t, &t->reports);
    pthread_mutex_lock(&t->pub_lock);
    kb__redis_pub_counts(t);
    pthread_mutex_unlock(&t->pub_lock);
    for (size_t i = 0; i < n; i++)
        kb__redis_reply_free(r[i]);
    kb_signal_notify(t->pub_progress);
    return ok;
}

/* Read what arrived and apply every complete reply; false when the
 * connection broke (c->errstr says why) or the server answered "not now"
 * (*retry). */
static bool read_replies(kb_transport *t, redisContext *c, bool *retry)
{
    if (redisBufferRead(c) != REDIS_OK)
        return false;
    for (;;) {
        redisReply *r[REPLIES_MAX];
        size_t n = 0;
        void *one = NULL;
        int rc = REDIS_OK;
        while (n < REPLIES_MAX && (rc = redisGetReplyFromReader(c, &one)) == REDIS_OK && one != NULL) {
            r[n++] = one;
            one = NULL;
        }
        if (n > 0 && !apply(t, r, n)) {   /* apply frees the replies */
            *retry = true;
            return false;
        }
        if (n < REPLIES_MAX)
            return rc == REDIS_OK;
    }
}

/* Everything is written: a WAIT after the XADDs since the last one, when
 * redis.wait_replicas asks for it (caller holds pub_lock). True when queued. */
static bool queue_wait(kb_transport *t)
{
    kb_redis_backlog *bl = &t->backlog;
    uint32_t events = 0;
    if (t->wait_replicas == 0)
        return false;
    for (size_t i = bl->n; i > 0 && bl->rec[(bl->first + i - 1) % bl->rcap].p != NULL; i--)
        events += bl->rec[(bl->first + i - 1) % bl->rcap].events;
    if (events == 0)
        return false;
    char replicas[16], ms[16];
    snprintf(replicas, sizeof replicas, "%d", t->wait_replicas);
    snprintf(ms, sizeof ms, "%d", t->wait_timeout_ms);
    const char *argv[] = {"WAIT", replicas, ms};
    const size_t lens[] = {4, strlen(replicas), strlen(ms)};
    if (!kb__redis_backlog_add(bl, NULL, 0, 3, argv, lens))
        return false;   /* out of memory: the next batch's WAIT covers these too */
    bl->rec[(bl->first + bl->n - 1) % bl->rcap].events = events;
    kb__redis_pub_counts(t);
    return true;
}

/* What of the `len` bytes unsent may be written now (caller holds
 * pub_lock): none while a refusal's replies are read; after a refusal only
 * the oldest record, until the server stored one. A server that switches
 * from refusing to storing in the middle of a pipeline stores its later
 * records ahead of its earlier ones; one record at a time cannot be split
 * so, and the retries after a refusal are when it switches. */
static size_t writable(const kb_transport *t, size_t len)
{
    const kb_redis_backlog *bl = &t->backlog;
    if (t->refusal.on)
        return 0;
    if (!t->pub_careful || bl->n == 0)
        return len;
    size_t end = bl->head + bl->rec[bl->first].len;   /* the oldest record is in oldest */
    if (bl->sending != bl->oldest || bl->sent >= end)
        return 0;
    return len < end - bl->sent ? len : end - bl->sent;
}

/* Open frames a linger old into the backlog, then write what the socket
 * takes now; the errno that broke it, or 0. *frame_due: when the next open
 * frame is due (INT64_MAX: none). `idle`: the sender awaited nothing, so a
 * publisher's write since is the oldest reply due. */
static int write_some(kb_transport *t, redisContext *c, bool idle, bool *unsent, bool *due,
                      int64_t *quiet_since, int64_t *frame_due)
{
    int err = 0;
    pthread_mutex_lock(&t->pub_lock);
    if (idle && t->direct_since_ns != 0)
        *quiet_since = t->direct_since_ns;
    t->direct_since_ns = 0;
    kb_redis_backlog *bl = &t->backlog;
    /* open frames a linger old go now, and all of them when nothing is in
     * flight: the frames fill while the server works on what was written */
    const char *bytes;
    size_t len;
    kb__redis_backlog_unsent(bl, &len);
    *frame_due = kb__redis_frames_due(t, len == 0 && !kb__redis_backlog_due(bl));
    kb__redis_pub_counts(t);
    for (;;) {
        bytes = kb__redis_backlog_unsent(bl, &len);
        if ((len = writable(t, len)) == 0) {
            if (!t->refusal.on && !t->pub_careful && queue_wait(t))
                continue;   /* the WAIT just queued */
            break;
        }
        ssize_t w = send(c->fd, bytes, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            kb__redis_backlog_wrote(bl, (size_t)w);
            *quiet_since = kb_now_ns();
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else {
            if (w == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
                err = w == 0 ? EPIPE : errno;
            break;
        }
    }
    kb__redis_backlog_unsent(bl, &len);
    *unsent = writable(t, len) > 0;
    *due = kb__redis_backlog_due(bl);
    t->sender_busy = *unsent || *due;
    pthread_mutex_unlock(&t->pub_lock);
    return err;
}

/* The publish connection went down or came back: once each way to the
 * application's state callback (reconnect attempts that fail say nothing). */
static void state_changed(kb_transport *t, bool down, const char *why)
{
    if (t->pub_down == down)
        return;
    t->pub_down = down;
    kb_bus_state_report(t->bus, down ? KB_STATE_DISCONNECTED : KB_STATE_RECONNECTED, why);
}

/* drop_over's verdict on a record over the server's limit (caller holds
 * pub_lock): its report is kept, else (the batch cannot grow under the
 * lock) it stays, to be tried again. */
struct over {
    kb_transport *t;
    char why[sizeof ((kb_transport *)0)->pub_error];
};

static bool report_over(void *arg, const kb_redis_pubrec *rec, const char *xadd)
{
    struct over *o = arg;
    return kb__redis_report_keep(&o->t->reports, rec->p, xadd, rec->len, KB_ETOOBIG, "", o->why);
}

/* The connection is gone: everything unconfirmed is written again on the
 * next one. An argument over the server's limit (it drops the connection
 * rather than answer) is never resent for ever: a frame is split into
 * entries within the limit (in order, where they were), and only an event
 * over it is refused. */
static void lose(kb_transport *t, const char *why_now)
{
    char why[256];
    snprintf(why, sizeof why, "%s", why_now);   /* it may point into the context */
    size_t big = 0;
    pthread_mutex_lock(&t->pub_lock);
    kb_redis_backlog *bl = &t->backlog;
    kb__redis_backlog_rewind(bl);
    t->sender_busy = false;   /* it may nap now: publishers kick it again */
    t->pub_direct = false;    /* and write nothing to this connection any more */
    uint32_t held = 0;   /* XADDs still held since the previous WAIT */
    for (size_t i = 0; i < bl->n; i++) {
        kb_redis_pubrec *rec = &bl->rec[(bl->first + i) % bl->rcap];
        if (rec->big > big)
            big = rec->big;
        held += rec->p != NULL ? rec->events : 0;
        if (rec->p == NULL && held < rec->events)
            rec->lost = true;   /* some of its XADDs were confirmed on the lost connection */
        if (rec->p == NULL)
            held = 0;
    }
    t->unvouched_lost = t->unvouched.n;   /* a WAIT on the next connection cannot vouch for them */
    snprintf(t->pub_lost, sizeof t->pub_lost, "%s", why);
    uint64_t ahead = t->refusal.ahead, total = t->refusal.total += ahead;
    const char *stream = t->refusal.stream;
    t->pub_careful = t->pub_careful || t->refusal.on;
    for (size_t i = 0; i < bl->n && t->refusal.on; i++) {
        kb_redis_part *p = bl->rec[(bl->first + i) % bl->rcap].p;
        if (p != NULL)
            p->refused = false;
    }
    t->refusal.on = false;
    t->refusal.answered = 0;
    t->refusal.ahead = 0;
    pthread_mutex_unlock(&t->pub_lock);
    if (ahead > 0)
        kb_log(t->bus, KB_LOG_WARNING, "redis: %llu events stored on %s ahead of an earlier event "
               "of that stream the server refused for now (%.200s): their first copies precede it, "
               "out of per-key order where they share its key; they are written again after it "
               "(%llu events stored ahead of a refused one since kb_open)",
               (unsigned long long)ahead, stream, why, (unsigned long long)total);
    kb__redis_conn_fail(&t->pub, why);
    state_changed(t, true, why);
    char cause[600];
    size_t max = kb__redis_limit_explain(t, big, cause, sizeof cause);
    if (max == SIZE_MAX)
        return;
    static _Thread_local struct over o;   /* the sender's: too big for its stack */
    o.t = t;
    snprintf(o.why, sizeof o.why, "%.600sconnection to %.200s lost: %.200s", cause, t->where, why);
    pthread_mutex_lock(&t->pub_lock);
    kb__redis_frames_due(t, true);   /* frames still filling were sized to the old budget */
    bool split = kb__redis_frames_split(t, max);
    if (split)
        t->frame_max = max;   /* later frames stay within what the server took */
    uint64_t dropped = kb__redis_backlog_drop_over(bl, max, kb_bus_delivery_wanted(t->bus) ?
                                                   report_over : NULL, &o);
    if (dropped > 0) {
        t->pub_failed += dropped;
        snprintf(t->pub_error, sizeof t->pub_error, "%s", o.why);
    }
    kb__redis_pub_counts(t);
    pthread_mutex_unlock(&t->pub_lock);
    if (split)
        kb_log(t->bus, KB_LOG_WARNING, "redis: %.600sframes over %zu bytes are sent again as entries "
               "within it, and frames stay within it from now", cause, max);
    kb__redis_reports_send(t, &t->reports);
    kb_signal_notify(t->pub_progress);
}

/* Empty the wake pipe; kicks from now on write to it again. */
static void woken(kb_transport *t)
{
    char buf[64];
    while (read(t->sender_wake[0], buf, sizeof buf) > 0)
        ;
    atomic_store(&t->sender_kicked, false);
}

/* Sleep until kicked or `until` (INT64_MAX: no limit). */
static void nap(kb_transport *t, int64_t until)
{
    struct pollfd p = {t->sender_wake[0], POLLIN, 0};
    if (poll(&p, 1, kb_deadline_left_ms(until)) > 0)
        woken(t);
}

/* Does the server take writes on this new connection? A server still
 * loading its data answers LOADING to an XADD while it loads, then stores
 * the ones pipelined after it: resending that XADD would put it behind
 * them. So nothing is resent before a probe (a read, which loading refuses
 * too) is answered; until then the connection is dropped and tried again. */
static bool serving(kb_transport *t, redisContext *c)
{
    redisReply *r = redisCommand(c, "EXISTS %s", "kb:probe");
    bool ok = r != NULL && !(r->type == REDIS_REPLY_ERROR && kb__redis_transient(r));
    if (!ok)
        lose(t, r != NULL ? r->str : c->errstr[0] ? c->errstr : "connection closed");
    kb__redis_reply_free(r);
    return ok;
}

/* A connection, or NULL while there is nothing to send or it is down. */
static redisContext *connection(kb_transport *t)
{
    if (t->pub.c != NULL)
        return t->pub.c;
    if (atomic_load(&t->pub_unconfirmed) == 0) {
        nap(t, INT64_MAX);
        return NULL;
    }
    if (kb_now_ns() < t->pub.next_try_ns) {
        nap(t, t->pub.next_try_ns);
        return NULL;
    }
    t->pub.deadline_ns = atomic_load(&t->sender_deadline_ns);   /* close bounds connects */
    redisContext *c = kb__redis_conn_get(&t->pub, NULL, 0);
    if (c != NULL && !serving(t, c))
        return NULL;
    if (c != NULL) {
        pthread_mutex_lock(&t->pub_lock);
        kb__redis_backlog_rewind(&t->backlog);   /* the unconfirmed ones first, in order */
        t->pub_direct = !t->pub_careful;
        pthread_mutex_unlock(&t->pub_lock);
        state_changed(t, false, t->where);
    }
    return c;
}

static void *sender_main(void *arg)
{
    kb_transport *t = arg;
    const int64_t patience = (int64_t)t->read_timeout_ms * 1000000;
    int64_t quiet_since = 0;   /* the server's last sign of life while it owed replies */
    bool busy = false;
    while (!atomic_load(&t->sender_stop)) {
        redisContext *c = connection(t);
        if (c == NULL) {
            busy = false;
            continue;
        }
        if (!busy)
            quiet_since = kb_now_ns();
        bool unsent, due;
        int64_t frame_due;
        int err = write_some(t, c, !busy, &unsent, &due, &quiet_since, &frame_due);
        if (err != 0) {
            lose(t, strerror(err));
            busy = false;
            continue;
        }
        busy = unsent || due;
        struct pollfd p[2] = {{t->sender_wake[0], POLLIN, 0},
                              {c->fd, (short)(POLLIN | (unsent ? POLLOUT : 0)), 0}};
        /* idle, it still looks within redis.read_timeout_ms: a publisher
         * may have written meanwhile, and its reply is timed too */
        int ms = t->read_timeout_ms;
        if (busy) {
            int64_t left = quiet_since + patience - kb_now_ns();
            ms = left <= 0 ? 0 : (int)((left + 999999) / 1000000);
        }
        if (frame_due != INT64_MAX) {   /* back when the next open frame is due */
            int64_t left = frame_due - kb_now_ns();
            int fms = left <= 0 ? 0 : (int)((left + 999999) / 1000000);
            ms = ms < 0 || fms < ms ? fms : ms;
        }
        if (poll(p, 2, ms) < 0)
            continue;   /* EINTR */
        if (p[0].revents != 0)
            woken(t);
        if ((p[1].revents & (POLLIN | POLLERR | POLLHUP)) != 0) {
            bool retry = false;
            if (!read_replies(t, c, &retry)) {
                /* pub_lost is written only on this thread */
                lose(t, retry ? t->pub_lost : c->errstr[0] ? c->errstr : "connection closed");
                busy = false;
                continue;
            }
            quiet_since = kb_now_ns();
        }
        if (busy && kb_now_ns() - quiet_since >= patience) {
            lose(t, "no reply within redis.read_timeout_ms");
            busy = false;
        }
    }
    return NULL;
}

int kb__redis_sender_start(kb_transport *t)
{
    size_t keys = t->lim.key > t->lim.payload ? t->lim.key : t->lim.payload;   /* a frame's are in its body */
    if (kb_bus_delivery_wanted(t->bus) &&
        !kb__redis_reports_init(&t->reports, keys, (size_t)t->publish_batch)) {
        kb_errf(NULL, 0, "redis: cannot start the sender: out of memory");
        return KB_ENOMEM;
    }
    if (pipe2(t->sender_wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        kb_errf(NULL, 0, "redis: cannot start the sender: pipe: %s", strerror(errno));
        t->sender_wake[0] = t->sender_wake[1] = -1;
        return KB_ENOMEM;
    }
    if (kb_thread_start(&t->sender, "kb-redis-sender", sender_main, t) != KB_OK) {
        kb_errf(NULL, 0, "redis: cannot start the sender thread: %s", kb_last_error());
        close(t->sender_wake[0]);
        close(t->sender_wake[1]);
        t->sender_wake[0] = t->sender_wake[1] = -1;
        t->sender = NULL;
        return KB_ENOMEM;
    }
    return KB_OK;
}

bool kb__redis_sender_write_now(kb_transport *t)
{
    if (!t->pub_direct)
        return false;
    kb_redis_backlog *bl = &t->backlog;
    bool idle = !t->sender_busy, all = true;
    const char *bytes;
    size_t len;
    while ((bytes = kb__redis_backlog_unsent(bl, &len)), len > 0) {
        ssize_t w = send(t->pub.c->fd, bytes, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            kb__redis_backlog_wrote(bl, (size_t)w);
            if (idle && t->direct_since_ns == 0)
                t->direct_since_ns = kb_now_ns();
        } else if (!(w < 0 && errno == EINTR)) {
            all = false;   /* full or broken: the sender's to write or to find lost */
            break;
        }
    }
    if (all)
        t->sender_busy = true;   /* the replies bring it back */
    return all;
}

void kb__redis_sender_kick(kb_transport *t)
{
    if (!atomic_exchange(&t->sender_kicked, true)) {
        ssize_t w = write(t->sender_wake[1], "", 1);
        (void)w;   /* full: it is awake already */
    }
}

void kb__redis_sender_stop(kb_transport *t)
{
    if (t->sender == NULL)
        return;
    atomic_store(&t->sender_stop, true);
    pthread_mutex_lock(&t->pub_lock);
    t->pub_direct = false;
    pthread_mutex_unlock(&t->pub_lock);
    if (atomic_load(&t->pub_unconfirmed) > 0)
        kb__redis_conn_cut(&t->pub);   /* close gave it until its deadline: a silent server */
    ssize_t w = write(t->sender_wake[1], "", 1);
    (void)w;
    kb_thread_join(t->sender);
    t->sender = NULL;
}
