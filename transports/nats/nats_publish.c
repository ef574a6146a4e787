/* Publishing: asynchronous JetStream publishes with a Nats-Msg-Id each, a
 * bounded number in flight, and in-order resends after a broken connection. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/err.h"
#include "nats_int.h"

static uint64_t msg_seq(natsMsg *m)
{
    const char *id = NULL, *dash;
    if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) != NATS_OK || id == NULL ||
        (dash = strrchr(id, '-')) == NULL)
        return 0;
    return strtoull(dash + 1, NULL, 10);
}

static int by_seq(const void *a, const void *b)
{
    uint64_t x = msg_seq(*(natsMsg *const *)a), y = msg_seq(*(natsMsg *const *)b);
    return x < y ? -1 : x > y;
}

/* Caller holds resend_lock. */
static void push(kb_transport *t, natsMsg *m, bool front)
{
    kb_nats_resend *r = malloc(sizeof *r);
    if (r == NULL) {
        atomic_fetch_add(&t->pub_rejected, 1);
        snprintf(t->pub_error, sizeof t->pub_error, "out of memory queueing a resend");
        natsMsg_Destroy(m);
        return;
    }
    r->msg = m;
    r->next = NULL;
    if (front) {
        r->next = t->resend_head;
        t->resend_head = r;
        if (t->resend_tail == NULL)
            t->resend_tail = r;
    } else {
        if (t->resend_tail)
            t->resend_tail->next = r;
        else
            t->resend_head = r;
        t->resend_tail = r;
    }
    atomic_fetch_add(&t->resend_len, 1);
}

/* Count a publish the server will not take, for kb_flush to report. Caller
 * holds resend_lock. */
static void reject(kb_transport *t, natsMsg *m, const char *why)
{
    uint32_t events = kb__nats_events_in(m);
    atomic_fetch_add(&t->pub_rejected, events);
    snprintf(t->pub_error, sizeof t->pub_error, "%s (%u events): %s", natsMsg_GetSubject(m),
             events, why);
    kb_log(t->bus, 3, "nats %s: publish rejected: %s", t->url_safe, t->pub_error);
}

int kb__nats_msg_event(kb_transport *t, const char *subject, const void *key, size_t key_len,
                       const void *body, size_t body_len, const kb_header *h, size_t nh,
                       natsMsg **out)
{
    /* Nats-Msg-Id: <bus id>-<counter> */
    char id[64];
    size_t bl = strlen(t->bus_id);
    memcpy(id, t->bus_id, bl);
    id[bl] = '-';
    kb__nats_put_u64(id + bl + 1,
                     atomic_fetch_add_explicit(&t->msg_seq, 1, memory_order_relaxed) + 1);
    natsMsg *msg = NULL;
    if (natsMsg_Create(&msg, subject, NULL, body_len ? body : NULL, (int)body_len) != NATS_OK ||
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

int kb__nats_send(kb_transport *t, natsMsg *msg)
{
    /* While the connection recovers, keep order: queue behind the resends. */
    int64_t until = kb__nats_now_ns() + (int64_t)t->enqueue_timeout_ms * 1000000;
    while (atomic_load(&t->gated) && atomic_load(&t->resend_len) >= (uint64_t)t->max_ack_pending * 16) {
        if (kb__nats_now_ns() >= until) {
            natsMsg_Destroy(msg);
            kb_errf(NULL, 0, "nats %s: reconnecting, %llu publishes queued", t->url_safe,
                     (unsigned long long)atomic_load(&t->resend_len));
            return KB_EFULL;
        }
        kb__nats_sleep_ms(1);
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = t->publish_timeout_ms;
    natsStatus s = NATS_OK;
    pthread_rwlock_rdlock(&t->pub_lock);
    if (atomic_load(&t->gated)) {
        pthread_mutex_lock(&t->resend_lock);
        push(t, msg, false);
        pthread_mutex_unlock(&t->resend_lock);
        msg = NULL;
    } else {
        atomic_store(&t->published_async, 1);
        s = js_PublishMsgAsync(t->js, &msg, &po);
    }
    pthread_rwlock_unlock(&t->pub_lock);
    if (s == NATS_MAX_PAYLOAD) {   /* the server's limit shrank after it was buffered */
        pthread_mutex_lock(&t->resend_lock);
        reject(t, msg, "over the server's max_payload");
        pthread_mutex_unlock(&t->resend_lock);
        natsMsg_Destroy(msg);
        return KB_OK;   /* not sendable again: kb_flush reports it */
    }
    natsMsg_Destroy(msg);   /* NULL when the library or the queue took it */
    if (s == NATS_TIMEOUT) {
        kb_errf(NULL, 0, "nats: nats.publish_max_pending publishes in flight for %d ms",
                 t->enqueue_timeout_ms);
        return KB_EFULL;
    }
    if (s != NATS_OK)
        return kb__nats_errf("publish", s, 0);
    return KB_OK;
}

/* Refuse what the server would refuse once it is buffered, and its dead
 * letter too: the formulas are in docs/transports-nats.md, "Limits". An event
 * goes out as a plain message (key in a header) or in a frame (key in the
 * body, Kb-Batch header): it must fit both ways. */
static int check_fits(kb_transport *t, const kb_msg *m)
{
    size_t key_hdr = kb__nats_key_hdr_len(m->key, m->key_len);
    size_t user_hdr = kb__nats_hdr_len(m->headers, m->n_headers);
    if (KB_NATS_HDR_BASE + key_hdr + user_hdr + KB_NATS_DLQ_ROOM > KB_NATS_HDR_MAX) {
        kb_errf(NULL, 0, "nats %s: a key of %zu bytes and %zu headers do not fit the server's "
                 "64 KiB header limit: they take %zu + %zu bytes of header lines, and a dead "
                 "letter adds up to %d bytes of other headers", t->url_safe, m->key_len,
                 m->n_headers, key_hdr, user_hdr, KB_NATS_HDR_BASE + KB_NATS_DLQ_ROOM);
        return KB_ETOOBIG;
    }
    size_t plain = KB_NATS_HDR_BASE + key_hdr + user_hdr;
    bool v2 = m->n_headers > 0;
    size_t framed = KB_NATS_HDR_BASE + KB_NATS_FRAME_HDR + (v2 ? KB_NATS_FRAME_V2_HDR : 0) +
                    kb__nats_entry_size(m, v2) - m->payload_len;
    size_t room = plain > framed ? plain : framed;
    size_t maxp = atomic_load_explicit(&t->max_payload, memory_order_relaxed);
    if (room > maxp || m->payload_len > maxp - room) {
        kb_errf(NULL, 0, "nats %s: a payload of %zu bytes does not fit the server's max_payload "
                 "of %zu bytes: with this %zu-byte key and %zu headers, %zu bytes go to headers "
                 "and framing (at most %zu bytes of payload)", t->url_safe, m->payload_len, maxp,
                 m->key_len, m->n_headers, room, room > maxp ? 0 : maxp - room);
        return KB_ETOOBIG;
    }
    return KB_OK;
}

int kb__nats_publish(kb_transport *t, const char *topic, const kb_msg *m)
{
    int rc = check_fits(t, m);
    if (rc != KB_OK)
        return rc;
    kb_nats_topic *tp = kb__nats_topic(t, topic, true);
    if (tp == NULL)
        return KB_ETRANSPORT;
    if (t->batch_events > 1) {
        rc = kb__nats_batch_add(t, tp, m);
    } else {
        natsMsg *msg = NULL;
        rc = kb__nats_msg_event(t, tp->subjects[m->hash % t->partitions], m->key, m->key_len,
                                m->payload, m->payload_len, m->headers, m->n_headers, &msg);
        if (rc == KB_OK)
            rc = kb__nats_send(t, msg);
    }
    if (rc == KB_OK)
        atomic_fetch_add_explicit(&tp->published, 1, memory_order_relaxed);
    return rc;
}

/* A publish ack that failed: transport trouble is sent again (the Msg-Id makes
 * it idempotent); a rejection by the server is counted for kb_flush to report. */
void kb__nats_pub_err(kb_transport *t, jsPubAckErr *pae)
{
    pthread_mutex_lock(&t->resend_lock);
    if (pae->ErrCode == 0 && pae->Err != NATS_INVALID_ARG) {
        natsMsg *c = kb__nats_msg_clone(pae->Msg);
        if (c != NULL) {
            push(t, c, false);
            atomic_store(&t->gated, 1);
        } else {
            atomic_fetch_add(&t->pub_rejected, 1);
            snprintf(t->pub_error, sizeof t->pub_error, "out of memory copying a resend");
        }
    } else {
        char why[160];
        snprintf(why, sizeof why, "%s (jetstream error %d)",
                 pae->ErrText ? pae->ErrText : natsStatus_GetText(pae->Err), (int)pae->ErrCode);
        reject(t, pae->Msg, why);
    }
    pthread_mutex_unlock(&t->resend_lock);
}

/* The connection broke: take back every publish not yet acked (in publish
 * order) and queue new ones behind them until they are resent. */
void kb__nats_disconnected(natsConnection *nc, void *closure)
{
    (void)nc;
    kb_transport *t = closure;
    if (atomic_load(&t->closing))
        return;   /* our own natsConnection_Close */
    kb_log(t->bus, 4, "nats %s: disconnected, reconnecting", t->url_safe);
    pthread_rwlock_wrlock(&t->pub_lock);
    natsMsgList l = {0};
    if (t->js != NULL && atomic_load(&t->published_async) &&
        js_PublishAsyncGetPendingList(&l, t->js) == NATS_OK) {
        qsort(l.Msgs, (size_t)l.Count, sizeof *l.Msgs, by_seq);
        pthread_mutex_lock(&t->resend_lock);
        for (int i = l.Count - 1; i >= 0; i--) {
            push(t, l.Msgs[i], true);
            l.Msgs[i] = NULL;
        }
        pthread_mutex_unlock(&t->resend_lock);
        natsMsgList_Destroy(&l);
    }
    atomic_store(&t->gated, 1);
    pthread_rwlock_unlock(&t->pub_lock);
}

/* Send the queued publishes again, in order, once connected. Acker thread. */
void kb__nats_resend(kb_transport *t)
{
    if (!atomic_load(&t->gated) || natsConnection_Status(t->nc) != NATS_CONN_STATUS_CONNECTED)
        return;
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = t->publish_timeout_ms;
    pthread_rwlock_wrlock(&t->pub_lock);
    pthread_mutex_lock(&t->resend_lock);
    for (int n = 0; n < 4096 && t->resend_head != NULL; n++) {
        kb_nats_resend *r = t->resend_head;
        natsStatus s = js_PublishMsgAsync(t->js, &r->msg, &po);
        if (s == NATS_MAX_PAYLOAD) {   /* never sendable: counted, not retried */
            reject(t, r->msg, "over the server's max_payload");
            natsMsg_Destroy(r->msg);
        } else if (s != NATS_OK) {
            break;   /* stalled or disconnected: next tick */
        }
        t->resend_head = r->next;
        if (t->resend_head == NULL)
            t->resend_tail = NULL;
        atomic_fetch_sub(&t->resend_len, 1);
        free(r);
    }
    if (t->resend_head == NULL)
        atomic_store(&t->gated, 0);
    pthread_mutex_unlock(&t->resend_lock);
    pthread_rwlock_unlock(&t->pub_lock);
}

uint64_t kb__nats_resend_free(kb_transport *t)
{
    uint64_t lost = 0;
    for (kb_nats_resend *r = t->resend_head, *next; r; r = next) {
        next = r->next;
        lost += kb__nats_events_in(r->msg);
        natsMsg_Destroy(r->msg);
        free(r);
    }
    t->resend_head = t->resend_tail = NULL;
    natsMsgList l = {0};
    if (t->js != NULL && atomic_load(&t->published_async) &&
        js_PublishAsyncGetPendingList(&l, t->js) == NATS_OK) {
        for (int i = 0; i < l.Count; i++)
            lost += kb__nats_events_in(l.Msgs[i]);
        natsMsgList_Destroy(&l);
    }
    return lost;
}

int kb__nats_flush(kb_transport *t, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : kb__nats_now_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        int sent = kb__nats_batch_send_due(t, true);
        int64_t left = deadline == INT64_MAX ? 60000 : (deadline - kb__nats_now_ns()) / 1000000;
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MaxWait = left > 1 ? left : 1;
        natsStatus s = js_PublishAsyncComplete(t->js, &po);
        if (sent == KB_OK && s == NATS_OK && !atomic_load(&t->gated) &&
            atomic_load(&t->resend_len) == 0)
            break;
        if (kb__nats_now_ns() >= deadline) {
            kb_errf(NULL, 0, "nats %s: publishes not acked within %d ms", t->url_safe, timeout_ms);
            return KB_ETIMEDOUT;
        }
        if (atomic_load(&t->closing))
            kb__nats_resend(t);   /* the acker has stopped */
        kb__nats_sleep_ms(1);
    }
    uint64_t rejected = atomic_exchange(&t->pub_rejected, 0);
    if (rejected) {
        pthread_mutex_lock(&t->resend_lock);
        kb_errf(NULL, 0, "nats %s: %llu published events rejected; last: %s", t->url_safe,
                 (unsigned long long)rejected, t->pub_error);
        pthread_mutex_unlock(&t->resend_lock);
        return KB_ETRANSPORT;
    }
    return KB_OK;
}
