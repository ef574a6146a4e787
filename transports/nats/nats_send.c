/* Sending. A topic's publishes, frames and single events alike, go through
 * the kit's publish backlog (<keybus/kit.h>): it keeps them in order with
 * their tickets, makes kb_publish wait for room, resends after a backoff
 * (one item of a partition in flight at a time with nats.replicas > 1) and
 * reports each event once. This file is the broker's side: each item is one
 * message with its Nats-Msg-Id (a frame resent whole is stored once),
 * published asynchronously by whichever thread pumps the backlog (a
 * publisher, the acker, a flush at close); its publish ack, on nats.c's
 * ack thread, says how it went; a broken or silent connection has what it
 * left unacked taken back, and the backlog sends it again in order. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nats_flight.h"
#include "nats_frame.h"
#include "nats_hdr.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_send.h"
#include "nats_topic.h"

/* One item of a topic's backlog: the message that carries it. */
typedef struct kb_nats_pub {
    natsMsg *msg;                  /* ours while nats.c does not hold it, else NULL */
    kb_kit_item *item;             /* the kit's, from its first take on */
    kb_nats_topic *tp;
} kb_nats_pub;

static void pub_free(void *data)
{
    kb_nats_pub *p = data;
    natsMsg_Destroy(p->msg);
    free(p);
}

/* A frame's event `index` (from 0) as its consumers name it: "<seq>.<i>"
 * from 1. */
static void event_id(const char *id, uint32_t index, char *out, size_t len)
{
    snprintf(out, len, "%s.%u", id, index + 1);
}

kb_kit_backlog *kb__nats_backlog_new(kb_transport *t, char *errstr, size_t errlen)
{
    kb_kit_backlog_conf c = {
        .size = sizeof c, .bus = t->bus,
        .capacity = (size_t)t->publish_max_pending * t->batch_events,
        .timeout_ms = t->enqueue_timeout_ms,
        .max_attempts = UINT32_MAX,   /* transport trouble: sent again until close */
        .backoff_ms = 1, .max_backoff_ms = t->reconnect_wait_ms,
        .free_data = pub_free,
        /* nothing stored ahead of an earlier publish of its partition when a
         * stream leader is lost (nats_batch.c, held()) */
        .one_in_flight_per_partition = t->replicas > 1,
        .event_id = event_id,
    };
    kb_kit_backlog *b = kb_kit_backlog_new(&c);
    if (b == NULL)
        kb_errf(errstr, errlen, "nats: %s", kb_last_error());
    return b;
}

uint64_t kb__nats_send_close(kb_nats_topic *tp, const char *why)
{
    uint64_t left = kb_kit_backlog_length(tp->backlog);
    kb_kit_backlog_fail_all(tp->backlog, KB_ETRANSPORT, why);
    return left;
}

int kb__nats_msg_event(kb_transport *t, kb_nats_topic *tp, uint32_t n, const void *key,
                       size_t key_len, const void *body, size_t body_len, const kb_header *h,
                       size_t nh, natsMsg **out)
{
    /* Nats-Msg-Id: <bus id>.<topic index>-<counter>: unique per publish,
     * the same for its resends */
    char id[64];
    size_t bl = strlen(t->bus_id);
    memcpy(id, t->bus_id, bl);
    id[bl] = '.';
    bl += 1 + kb__nats_put_u64(id + bl + 1, tp->index);
    id[bl] = '-';
    kb__nats_put_u64(id + bl + 1,
                     atomic_fetch_add_explicit(&t->msg_seq, 1, memory_order_relaxed) + 1);
    natsMsg *msg = NULL;
    if (natsMsg_Create(&msg, tp->subjects[n], NULL, body_len ? body : NULL, (int)body_len) != NATS_OK ||
        (key != NULL && kb__nats_set_key(msg, key, key_len) != KB_OK) ||
        kb__nats_hdr_set(msg, h, nh) != KB_OK ||
        natsMsgHeader_Set(msg, "Nats-Msg-Id", id) != NATS_OK) {
        natsMsg_Destroy(msg);
        kb_errf(NULL, 0, "nats: out of memory for a publish");
        return KB_ENOMEM;
    }
    *out = msg;
    return KB_OK;
}

/* The partition's publish is settled (stored, or refused for good): its next
 * frame may go out (nats_batch.c, held()). Called after the item's done: the
 * kit holds the partition's next item back until then, so a frame handed on
 * earlier would wait for the acker's tick. */
static void settled(kb_transport *t, kb_nats_batch *b)
{
    if (t->replicas > 1 && atomic_exchange(&b->unconfirmed, false))
        kb_signal_notify(t->resent);
}

/* An item the server refused for good (or no memory for its resend): its
 * events fail, counted first for kb_drain and a dead letter's replay
 * (they look once every report came), then its partition settles. */
static void refuse(kb_transport *t, kb_nats_topic *tp, kb_kit_item *item, int code,
                   const char *why)
{
    kb_nats_batch *b = &tp->batches[item->partition];
    atomic_fetch_add(&t->pub_refused, item->events);
    kb_kit_backlog_done(tp->backlog, item, code, 0, NULL, why);
    settled(t, b);
}

/* A publish's MaxWait. For each, nats.c keeps a timer record (an allocation
 * and a string) and, once it passed, delivers a timeout message through the
 * ack thread, acked or not. On one server a publish is acked, refused, or
 * lost with the connection (taken back at the disconnect), so it gets none;
 * stalled() covers a connection that stays up but answers nothing. A
 * cluster's lost stream leader drops publishes with the connection up: each
 * one times out on its own there. */
static int64_t max_wait(const kb_transport *t)
{
    return t->replicas > 1 ? t->publish_timeout_ms : 0;
}

/* Every publish nats.c holds unacked goes back to its backlog, to be sent
 * again (same Nats-Msg-Id) in ticket order. Exclusive of senders: none is
 * between its take and its publish, so none sends a later item of a
 * partition ahead of a resend it has not seen. `mark`: the connection's
 * state it answers (conn_mark; 0: none in particular); one another thread
 * answered already is left alone, since what nats.c holds now went out
 * after that take-back. Returns whether it took back. */
static bool take_back(kb_transport *t, uint64_t mark, const char *why)
{
    natsMsgList l = {0};
    pthread_rwlock_wrlock(&t->pub_lock);
    if (mark != 0 && mark <= atomic_load(&t->taken_mark)) {
        pthread_rwlock_unlock(&t->pub_lock);
        return false;
    }
    if (mark > atomic_load(&t->taken_mark))
        atomic_store(&t->taken_mark, mark);
    bool got = t->js != NULL && atomic_load(&t->published_async) &&
               js_PublishAsyncGetPendingList(&l, t->js) == NATS_OK;
    for (int i = 0; got && i < l.Count; i++) {
        kb_nats_pub *p = kb__nats_flight_take(t->flight, l.Msgs[i]);
        p->msg = l.Msgs[i];
        l.Msgs[i] = NULL;
        atomic_fetch_sub(&t->pub_out, 1);
        atomic_fetch_add(&p->tp->resends, 1);
        kb_kit_backlog_done(p->tp->backlog, p->item, KB_ETRANSPORT, 1, NULL, why);
    }
    pthread_rwlock_unlock(&t->pub_lock);
    if (got)
        natsMsgList_Destroy(&l);
    return true;
}

void kb__nats_take_back_all(kb_transport *t)
{
    take_back(t, 0, "connection closed");
}

/* The connection's state as a number that grows with each break: twice its
 * reconnects, plus 1 while it is not connected (2r+3, the status read while
 * down and the count after the reconnect, may be followed by 2r+2: below
 * taken_mark, no take-back). nats.c counts a reconnect before the new connection is
 * CONNECTED, and reads the status first: a pump that sees a mark above
 * taken_mark has met a connection that lost what it held, or may have, even
 * when nats.c reconnected at once (another server of the pool) and its
 * disconnected callback has not run yet. `st`: the caller's (a pump's is
 * its topic's, under send_mu). */
static uint64_t conn_mark(kb_transport *t, natsStatistics *st)
{
    bool up = natsConnection_Status(t->nc) == NATS_CONN_STATUS_CONNECTED;
    uint64_t reconnects = 0;
    if (natsConnection_GetStats(t->nc, st) == NATS_OK)
        natsStatistics_GetCounts(st, NULL, NULL, NULL, NULL, &reconnects);
    return 2 * reconnects + !up;
}

#define PUMP_BATCH 64

/* One take of tp's backlog, published; what could not go is done here
 * (under the locks for a resend: a later item of its partition must not be
 * taken before it waits again). Returns the items taken; *lost: the
 * connection is down (take everything back); refused[] the items over the
 * server's max_payload, to fail once the locks are released — only on a
 * thread that may report (`reporter`): else they wait for the acker. */
static size_t pump_once(kb_transport *t, kb_nats_topic *tp, bool reporter, bool *lost,
                        kb_kit_item **refused, size_t *nrefused)
{
    kb_kit_item *items[PUMP_BATCH];
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = max_wait(t);
    size_t n = kb_kit_backlog_take(tp->backlog, items, PUMP_BATCH, kb_now_ns());
    bool stop = false;
    for (size_t k = 0; k < n; k++) {
        kb_nats_pub *p = items[k]->data;
        p->item = items[k];
        if (items[k]->attempts > 1)   /* a resend, taken again */
            atomic_fetch_sub(&tp->resends, 1);
        natsMsg *m = p->msg;
        natsStatus s = NATS_NO_MEMORY;
        if (!stop && kb__nats_flight_put(t->flight, m, p) == KB_OK) {
            atomic_store(&t->published_async, 1);
            p->msg = NULL;   /* nats.c's from here on: its ack may come at once */
            s = js_PublishMsgAsync(t->js, &m, &po);
            if (s == NATS_OK) {
                if (atomic_fetch_add(&t->pub_out, 1) <= 0)
                    atomic_store(&t->pub_moved_ns, kb_now_ns());
                continue;
            }
            kb__nats_flight_take(t->flight, m);
            p->msg = m;   /* not taken: still ours */
        }
        if (!stop && s == NATS_MAX_PAYLOAD && reporter) {   /* never sendable: failed */
            refused[(*nrefused)++] = items[k];
            continue;
        }
        /* Reconnecting (nats.c has no reconnect buffer: it would send its
         * content before our resends, out of order), stalled or out of
         * memory: this one and the rest of the take wait for a resend. */
        if (!stop && s == NATS_INSUFFICIENT_BUFFER)
            *lost = true;
        stop = true;
        atomic_fetch_add(&tp->resends, 1);
        kb_kit_backlog_done(tp->backlog, items[k], KB_ETRANSPORT, 1, NULL,
                            natsStatus_GetText(s));
    }
    return stop ? 0 : n;
}

void kb__nats_pump(kb_transport *t, kb_nats_topic *tp, bool reporter)
{
    for (;;) {
        kb_kit_item *refused[PUMP_BATCH];
        size_t nrefused = 0, n = 0;
        bool lost = false;
        pthread_rwlock_rdlock(&t->pub_lock);
        if (pthread_mutex_trylock(&tp->send_mu) != 0) {
            /* The holder takes again once it unlocked; or it unlocked just
             * now, before it could see the flag: then this thread goes. */
            atomic_store(&tp->pump_again, true);
            if (pthread_mutex_trylock(&tp->send_mu) != 0) {
                pthread_rwlock_unlock(&t->pub_lock);
                return;
            }
        }
        atomic_store(&tp->pump_again, false);
        /* A broken connection (once each time it breaks and reconnects):
         * what it held goes back before anything newer goes out. */
        uint64_t mark = conn_mark(t, tp->conn_stats);
        bool behind = mark > atomic_load(&t->taken_mark);
        if (!behind && mark % 2 == 0)
            n = pump_once(t, tp, reporter, &lost, refused, &nrefused);
        pthread_mutex_unlock(&tp->send_mu);
        pthread_rwlock_unlock(&t->pub_lock);
        if (behind) {
            take_back(t, mark, "connection lost");
            continue;   /* connected: send now; else the next pass returns */
        }
        if (mark % 2 == 1)
            return;   /* the acker's tick sends it once reconnected */
        for (size_t k = 0; k < nrefused; k++) {
            kb_nats_pub *p = refused[k]->data;
            kb_log(t->bus, KB_LOG_ERROR, "nats %s: publish rejected: %s (%u events): over "
                   "the server's max_payload", t->url_safe, natsMsg_GetSubject(p->msg),
                   refused[k]->events);
            refuse(t, tp, refused[k], KB_ETRANSPORT, "over the server's max_payload");
        }
        if (nrefused > 0)
            kb_signal_notify(t->resent);   /* a flush looks again: reported */
        if (lost)
            take_back(t, 0, "connection lost");
        if (n < PUMP_BATCH && !atomic_load(&tp->pump_again))
            return;
    }
}

int kb__nats_send(kb_transport *t, kb_nats_topic *tp, uint32_t n, natsMsg *msg,
                  const kb_kit_key *keys, uint32_t events)
{
    kb_nats_pub *p = malloc(sizeof *p);
    if (p == NULL) {
        natsMsg_Destroy(msg);
        kb_errf(NULL, 0, "nats: out of memory for a publish");
        return KB_ENOMEM;
    }
    *p = (kb_nats_pub){.msg = msg, .tp = tp};
    int rc = kb_kit_backlog_add_frame(tp->backlog, p, tp->name, n, keys, events, NULL);
    if (rc != KB_OK) {
        pub_free(p);
        return rc;
    }
    kb__nats_pump(t, tp, false);   /* maybe kb_publish's thread: no report here */
    return KB_OK;
}

/* The stream sequence a publish was stored at: kb_drain's target for its
 * partition, set before the report (kb_drain reads it once flushed). */
static void note_stored(kb_nats_batch *b, uint64_t seq)
{
    uint64_t cur = atomic_load(&b->stored_seq);
    while (cur < seq && !atomic_compare_exchange_weak(&b->stored_seq, &cur, seq))
        ;
}

bool kb__nats_cb_begin(kb_transport *t)
{
    atomic_fetch_add(&t->pub_cbs_in, 1);
    if (!atomic_load(&t->pub_cbs_off))
        return true;
    atomic_fetch_sub(&t->pub_cbs_in, 1);
    return false;
}

void kb__nats_cb_end(kb_transport *t)
{
    atomic_fetch_sub(&t->pub_cbs_in, 1);   /* the last touch of t */
}

bool kb__nats_pub_cbs_end(kb_transport *t, int64_t deadline)
{
    atomic_store(&t->pub_cbs_off, 1);
    bool warned = false;
    for (;;) {
        /* running ones first: a late one counts itself in before it looks
         * at pub_cbs_off, and leaves pub_out last */
        if (atomic_load(&t->pub_cbs_in) == 0) {
            if (atomic_load(&t->pub_out) <= 0)
                return true;
            if (kb_now_ns() >= deadline)
                return false;
        } else if (!warned && kb_now_ns() >= deadline) {
            kb_log(t->bus, KB_LOG_WARNING, "nats %s: kb_close waits past its deadline for a "
                   "publish ack's or connection callback to return", t->url_safe);
            warned = true;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

/* The connection broke (nats.c's callback thread, maybe after the reconnect:
 * a pump that met it took back already, see conn_mark): take back what is
 * not acked first, unless a pump did for this break, then tell; connected
 * again, the resends go now (nobody else asks). Our own
 * natsConnection_Close (a closed connection) leaves it to close; a break
 * during close's flush does not. */
void kb__nats_disconnected(natsConnection *nc, void *closure)
{
    kb_transport *t = closure;
    if (!kb__nats_cb_begin(t))
        return;
    if (!natsConnection_IsClosed(nc)) {
        natsStatistics *st = NULL;
        uint64_t mark = natsStatistics_Create(&st) == NATS_OK ? conn_mark(t, st) : 0;
        natsStatistics_Destroy(st);
        if (take_back(t, mark, "connection lost") && mark % 2 == 0 &&
            natsConnection_Status(nc) == NATS_CONN_STATUS_CONNECTED)
            kb__nats_send_reconnected(t);
    }
    if (!atomic_load(&t->closing)) {
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: disconnected, reconnecting", t->url_safe);
        kb_bus_state_report(t->bus, KB_STATE_DISCONNECTED, "connection lost; reconnecting");
    }
    kb__nats_cb_end(t);
}

/* Messages the connection has read so far (0 if it cannot tell). */
static uint64_t in_msgs(kb_transport *t)
{
    natsStatistics *st = NULL;
    uint64_t n = 0;
    if (natsStatistics_Create(&st) == NATS_OK && natsConnection_GetStats(t->nc, st) == NATS_OK)
        natsStatistics_GetCounts(st, &n, NULL, NULL, NULL, NULL);
    natsStatistics_Destroy(st);
    return n;
}

/* Publishes out without MaxWait, no ack for nats.publish_timeout_ms and
 * nothing read at all for as long with the connection up: take them all
 * back, to be sent again in order. A connection still reading may have acks
 * queued behind a starved ack thread, so reading postpones the verdict; but
 * a subscribing process reads lease answers all the time, so four such spells
 * without an ack are a stall all the same. */
static void stalled(kb_transport *t)
{
    int64_t now = kb_now_ns(), quiet = t->publish_timeout_ms * 1000000;
    if (max_wait(t) > 0 || atomic_load(&t->pub_out) <= 0 ||
        now - atomic_load(&t->pub_moved_ns) < quiet ||
        natsConnection_Status(t->nc) != NATS_CONN_STATUS_CONNECTED)
        return;
    uint64_t seen = in_msgs(t);
    if (seen != t->stall_in_msgs) {
        t->stall_in_msgs = seen;
        t->stall_read_ns = now;
    }
    if (now - t->stall_read_ns < quiet && now - atomic_load(&t->pub_moved_ns) < 4 * quiet)
        return;
    kb_log(t->bus, KB_LOG_WARNING, "nats %s: no publish ack for %lld ms; sending %lld publishes again",
           t->url_safe, (long long)t->publish_timeout_ms, (long long)atomic_load(&t->pub_out));
    take_back(t, 0, "no publish ack");
}

void kb__nats_pump_all(kb_transport *t, bool reporter)
{
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next)
        if (kb_kit_backlog_length(tp->backlog) > 0)
            kb__nats_pump(t, tp, reporter);
}

void kb__nats_send_tick(kb_transport *t)
{
    stalled(t);
    kb__nats_pump_all(t, true);
}

/* Topics a publish ack or a reconnect asked for, and those with resends
 * waiting (a backoff may have ended). */
void kb__nats_pump_wanted(kb_transport *t, bool reporter)
{
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next) {
        bool asked = atomic_exchange(&tp->pump_wanted, false);
        if ((asked || atomic_load(&tp->resends) > 0) && kb_kit_backlog_length(tp->backlog) > 0)
            kb__nats_pump(t, tp, reporter);
    }
}

int64_t kb__nats_resend_due(kb_transport *t, int64_t until)
{
    if (natsConnection_Status(t->nc) != NATS_CONN_STATUS_CONNECTED)
        return until;   /* not sendable before a reconnect (which asks) */
    bool any = false;
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next) {
        if (atomic_load(&tp->resends) <= 0)
            continue;
        any = true;
        int64_t due = kb_kit_backlog_next_due(tp->backlog);
        if (due < until)
            until = due;
    }
    if (!any)
        return until;
    /* at least a moment: a pump that found another thread sending left the
     * item to it */
    int64_t soonest = kb_now_ns() + 200000;
    return until > soonest ? until : soonest;
}

void kb__nats_send_reconnected(kb_transport *t)
{
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next)
        atomic_store(&tp->pump_wanted, true);
    atomic_store(&t->pump_wanted, 1);
    kb_signal_notify(t->acker_wake);
    kb_signal_notify(t->resent);
}

/* A done while its topic's resends wait may have made one due (the next of
 * its partition waits for the one before to be done): the acker pumps that
 * topic, or a flush waiting. Never here: nats.c's publish would wait on this
 * thread's own acks when its limit of pending publishes is reached. Other
 * topics' acks ask nothing: a topic whose resends keep failing does not make
 * every ack wake the acker. */
static void want_pump(kb_transport *t, kb_nats_topic *tp)
{
    if (atomic_load(&tp->resends) > 0) {
        atomic_store(&tp->pump_wanted, true);   /* before: the acker clears t's first */
        if (!atomic_load(&t->pump_wanted) && !atomic_exchange(&t->pump_wanted, 1))
            kb_signal_notify(t->acker_wake);
    }
    kb_signal_notify(t->resent);   /* a flush looks again: reported, or one to send */
}

/* A publish ack that failed: transport trouble is sent again (the Msg-Id makes
 * it idempotent); a rejection by the server, or no memory for the resend,
 * fails its events. */
static void pub_err(kb_transport *t, kb_nats_pub *p, natsMsg *msg, jsPubAckErr *pae)
{
    char why[160];
    int code = KB_ETRANSPORT;
    if (pae->ErrCode == 0 && pae->Err != NATS_INVALID_ARG) {
        if ((p->msg = kb__nats_msg_clone(msg)) != NULL) {
            atomic_fetch_add(&p->tp->resends, 1);
            kb_kit_backlog_done(p->tp->backlog, p->item, KB_ETRANSPORT, 1, NULL,
                                natsStatus_GetText(pae->Err));
            return;
        }
        code = KB_ENOMEM;
        snprintf(why, sizeof why, "out of memory copying a resend");
    } else {
        snprintf(why, sizeof why, "%s (jetstream error %d)",
                 pae->ErrText ? pae->ErrText : natsStatus_GetText(pae->Err), (int)pae->ErrCode);
    }
    kb_log(t->bus, KB_LOG_ERROR, "nats %s: publish rejected: %s (%u events): %s", t->url_safe,
           natsMsg_GetSubject(msg), p->item->events, why);
    refuse(t, p->tp, p->item, code, why);
}

void kb__nats_pub_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    (void)js;
    kb_transport *t = closure;
    if (!kb__nats_cb_begin(t)) {
        /* close counts this call in pub_out: leaving it is the last touch of t */
        natsMsg_Destroy(msg);
        atomic_fetch_sub(&t->pub_out, 1);
        return;
    }
    atomic_fetch_sub(&t->pub_out, 1);
    atomic_store(&t->pub_moved_ns, kb_now_ns());
    kb_nats_pub *p = msg != NULL ? kb__nats_flight_take(t->flight, msg) : NULL;
    kb_nats_topic *tp = p != NULL ? p->tp : NULL;   /* p goes with the item's done */
    if (p != NULL && pa != NULL) {
        kb_kit_item *item = p->item;   /* p goes with the item's done */
        kb_nats_batch *b = &tp->batches[item->partition];
        char id[24];
        id[kb__nats_put_u64(id, pa->Sequence)] = '\0';
        note_stored(b, pa->Sequence);
        kb_kit_backlog_done(tp->backlog, item, KB_OK, 0, id, NULL);
        settled(t, b);
    } else if (p != NULL && pae != NULL) {
        pub_err(t, p, msg, pae);
    }
    if (p != NULL)
        want_pump(t, tp);
    natsMsg_Destroy(msg);
    kb__nats_cb_end(t);
}
