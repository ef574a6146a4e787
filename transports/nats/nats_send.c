/* Sending: asynchronous JetStream publishes with a Nats-Msg-Id each, a
 * bounded number in flight, their acks (nats.c's ack thread), and in-order
 * resends after a broken connection. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_frame.h"
#include "nats_hdr.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_send.h"
#include "nats_topic.h"

static uint64_t msg_seq(natsMsg *m)
{
    const char *id = NULL, *dash;
    if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) != NATS_OK || id == NULL ||
        (dash = strrchr(id, '-')) == NULL)
        return 0;
    return strtoull(dash + 1, NULL, 10);
}

/* The partition of tp a publish went to, from the last token of its subject
 * (kb.<topic>.<n>); NULL for another subject of the stream (a dead letter). */
static kb_nats_topic *partition_of(kb_transport *t, kb_nats_topic *tp, natsMsg *msg,
                                   uint32_t *part)
{
    const char *dot = strrchr(natsMsg_GetSubject(msg), '.');
    if (tp == NULL || dot == NULL || dot[1] < '0' || dot[1] > '9')
        return NULL;
    char *end = NULL;
    unsigned long n = strtoul(dot + 1, &end, 10);
    if (*end != '\0' || n >= t->partitions)
        return NULL;
    *part = (uint32_t)n;
    return tp;
}

/* The partition a publish of this process went to (NULL: not ours). */
static kb_nats_topic *published_to(kb_transport *t, natsMsg *msg, uint32_t *part)
{
    const char *id = NULL;
    size_t bl = strlen(t->bus_id);
    if (natsMsgHeader_Get(msg, "Nats-Msg-Id", &id) != NATS_OK || id == NULL ||
        strncmp(id, t->bus_id, bl) != 0 || id[bl] != '.')
        return NULL;
    return partition_of(t, kb__nats_topic_at(t, (uint32_t)strtoul(id + bl + 1, NULL, 10)), msg,
                        part);
}

/* published_to for a publish the server stored in stream `stream`. By its ack
 * the message is cold (up to nats.publish_max_pending publishes ago), and its
 * header table several cache misses away: the topic of the last ack, matched
 * by the stream's name in the ack just parsed, spares that lookup. Topics
 * live as long as the transport. */
static kb_nats_topic *acked_to(kb_transport *t, natsMsg *msg, const char *stream, uint32_t *part)
{
    kb_nats_topic *tp = atomic_load_explicit(&t->acked_topic, memory_order_relaxed);
    if (tp != NULL && stream != NULL && strcmp(stream, tp->stream) == 0)
        return partition_of(t, tp, msg, part);
    if ((tp = published_to(t, msg, part)) != NULL)
        atomic_store_explicit(&t->acked_topic, tp, memory_order_relaxed);
    return tp;
}

/* The partition batch a message this bus published came from, or NULL. */
static kb_nats_batch *batch_of(kb_transport *t, natsMsg *msg)
{
    uint32_t n;
    kb_nats_topic *tp = published_to(t, msg, &n);
    return tp != NULL && tp->batches != NULL ? &tp->batches[n] : NULL;
}

/* The partition's publish is settled (stored, or refused for good): its next
 * may go out (nats_batch.c, held()). */
static void settled(kb_transport *t, kb_nats_batch *b)
{
    if (b != NULL && t->replicas > 1 && atomic_exchange(&b->unconfirmed, false))
        kb_signal_notify(t->resent);
}

/* Count a publish the server will not take, for kb_flush to report; the
 * caller reports it to the delivery callback once it holds no lock. Caller
 * holds resend_lock. */
static void reject(kb_transport *t, natsMsg *m, const char *why)
{
    settled(t, batch_of(t, m));
    uint32_t events = kb__nats_events_in(m);
    atomic_fetch_add(&t->pub_rejected, events);
    snprintf(t->pub_error, sizeof t->pub_error, "%s (%u events): %s", natsMsg_GetSubject(m),
             events, why);
    kb_log(t->bus, KB_LOG_ERROR, "nats %s: publish rejected: %s", t->url_safe, t->pub_error);
}

/* Queue m last; caller holds resend_lock. */
static void push(kb_transport *t, natsMsg *m)
{
    kb_nats_resend *r = malloc(sizeof *r);
    if (r == NULL) {
        /* reported by the acker: this may be kb_publish's thread, under pub_lock */
        reject(t, m, "out of memory queueing a resend");
        if (t->n_orphans < KB_NATS_ORPHANS) {
            t->orphans[t->n_orphans++] = m;
        } else {
            kb_log(t->bus, KB_LOG_ERROR, "nats %s: a publish of %s dropped unreported: out of "
                   "memory", t->url_safe, natsMsg_GetSubject(m));
            natsMsg_Destroy(m);
        }
        return;
    }
    r->msg = m;
    r->seq = msg_seq(m);
    r->next = NULL;
    if (t->resend_tail)
        t->resend_tail->next = r;
    else
        t->resend_head = r;
    t->resend_tail = r;
    atomic_fetch_add(&t->resend_len, 1);
}

int kb__nats_msg_event(kb_transport *t, kb_nats_topic *tp, uint32_t n, const void *key,
                       size_t key_len, const void *body, size_t body_len, const kb_header *h,
                       size_t nh, natsMsg **out)
{
    /* Nats-Msg-Id: <bus id>.<topic index>-<counter>; the index takes the
     * publish ack back to its topic without a lookup by name. */
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

/* Merge two lists sorted by publish order; on a tie, a's first. */
static kb_nats_resend *merge(kb_nats_resend *a, kb_nats_resend *b)
{
    kb_nats_resend head = {0}, *tail = &head;
    while (a != NULL && b != NULL) {
        kb_nats_resend **from = b->seq < a->seq ? &b : &a;
        tail->next = *from;
        tail = *from;
        *from = (*from)->next;
    }
    tail->next = a != NULL ? a : b;
    return head.next;
}

/* Merge sort by publish order: no allocation in a disconnect callback. */
static kb_nats_resend *sort_by_seq(kb_nats_resend *l)
{
    if (l == NULL || l->next == NULL)
        return l;
    kb_nats_resend *slow = l, *fast = l->next;
    while (fast != NULL && fast->next != NULL) {
        slow = slow->next;
        fast = fast->next->next;
    }
    kb_nats_resend *second = slow->next;
    slow->next = NULL;
    return merge(sort_by_seq(l), sort_by_seq(second));
}

/* The queue in publish order; caller holds resend_lock. */
static void sort_queue(kb_transport *t)
{
    t->resend_head = sort_by_seq(t->resend_head);
    for (t->resend_tail = t->resend_head; t->resend_tail != NULL && t->resend_tail->next;)
        t->resend_tail = t->resend_tail->next;
}

/* The connection broke: the publishes nats.c has not seen acked (and `also`,
 * unless NULL) join the queue, all in publish order (it may already hold newer
 * publishes and resends of timed-out ones), and new ones queue behind them. */
static void take_back(kb_transport *t, natsMsg *also)
{
    /* Gated before the list leaves nats.c: kb_flush must never see no
     * publish pending in nats.c and none queued while they are in between. */
    atomic_store(&t->gated, 1);
    atomic_fetch_add(&t->take_backs, 1);
    natsMsgList l = {0};
    bool got = t->js != NULL && atomic_load(&t->published_async) &&
               js_PublishAsyncGetPendingList(&l, t->js) == NATS_OK;
    pthread_mutex_lock(&t->resend_lock);
    if (also != NULL)
        push(t, also);
    for (int i = 0; got && i < l.Count; i++) {
        push(t, l.Msgs[i]);
        l.Msgs[i] = NULL;
    }
    if (got)
        atomic_fetch_sub(&t->pub_out, l.Count);
    sort_queue(t);
    pthread_mutex_unlock(&t->resend_lock);
    if (got)
        natsMsgList_Destroy(&l);
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

/* nats.c took a publish: it is out until its ack or a take-back. */
static natsStatus publish_async(kb_transport *t, natsMsg **msg, jsPubOptions *po)
{
    natsStatus s = js_PublishMsgAsync(t->js, msg, po);
    if (s == NATS_OK && atomic_fetch_add(&t->pub_out, 1) <= 0)
        atomic_store(&t->pub_moved_ns, kb_now_ns());
    return s;
}

/* The resend queue has room for one more publish. */
static int queue_room(void *arg)
{
    kb_transport *t = arg;
    return !atomic_load(&t->gated) ||
           atomic_load(&t->resend_len) < (uint64_t)t->max_ack_pending * 16;
}

int kb__nats_send(kb_transport *t, natsMsg *msg)
{
    /* While the connection recovers, keep order: queue behind the resends,
     * waiting for room up to pool.enqueue_timeout_ms. */
    if (!kb_signal_wait(t->resent, queue_room, t, kb_deadline_ns(t->enqueue_timeout_ms))) {
        natsMsg_Destroy(msg);
        kb_errf(NULL, 0, "nats %s: reconnecting, %llu publishes queued", t->url_safe,
                (unsigned long long)atomic_load(&t->resend_len));
        return KB_EFULL;
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = max_wait(t);
    natsStatus s = NATS_OK;
    pthread_rwlock_rdlock(&t->pub_lock);
    if (atomic_load(&t->gated)) {
        pthread_mutex_lock(&t->resend_lock);
        push(t, msg);
        pthread_mutex_unlock(&t->resend_lock);
        msg = NULL;
    } else {
        atomic_store(&t->published_async, 1);
        s = publish_async(t, &msg, &po);
        /* Reconnecting: nats.c has no reconnect buffer (it would send its
         * content before our resends, out of order). Take back the unacked
         * publishes now, not only in kb__nats_disconnected, which runs later
         * on nats.c's callback thread, maybe after the reconnect: the acker
         * must not resend the queue ahead of them. */
        if (s == NATS_INSUFFICIENT_BUFFER) {
            take_back(t, msg);
            msg = NULL;
            s = NATS_OK;
        }
    }
    pthread_rwlock_unlock(&t->pub_lock);
    if (s == NATS_MAX_PAYLOAD) {
        /* The server's limit shrank after it was buffered: the acker's resend
         * rejects it and reports it, off this (maybe kb_publish's) thread. */
        pthread_mutex_lock(&t->resend_lock);
        push(t, msg);
        atomic_store(&t->gated, 1);
        pthread_mutex_unlock(&t->resend_lock);
        return KB_OK;   /* kb_flush reports it */
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

/* The stream sequence a publish was stored at: kb_drain's target for its
 * partition. */
static void note_stored(kb_transport *t, kb_nats_topic *tp, uint32_t part, uint64_t seq)
{
    kb_nats_batch *b = tp != NULL && tp->batches != NULL ? &tp->batches[part] : NULL;
    if (b == NULL)
        return;
    uint64_t cur = atomic_load(&b->stored_seq);
    while (cur < seq && !atomic_compare_exchange_weak(&b->stored_seq, &cur, seq))
        ;
    settled(t, b);
}

/* One delivery report per event of message msg, published to partition
 * `part` of tp, which the server stored at `seq` (error NULL) or that failed
 * for good (`code`, why); IDs as consumers see them ("<seq>", or "<seq>.<i>"
 * from 1 in a frame). No lock held. */
static void report_to(kb_transport *t, kb_nats_topic *tp, uint32_t part, natsMsg *msg,
                      uint64_t seq, int code, const char *error)
{
    if (tp == NULL || !kb_bus_delivery_wanted(t->bus))
        return;
    kb_delivery_report r = {.topic = tp->name, .partition = part,
                            .result = error != NULL ? code : KB_OK,
                            .error = error != NULL ? error : ""};
    char id[48];
    size_t base = kb__nats_put_u64(id, seq);
    const char *count = NULL, *why = NULL;
    kb_nats_frame f;
    kb_frame_event ev;
    if (natsMsgHeader_Get(msg, KB_NATS_BATCH_HDR, &count) == NATS_OK && count != NULL) {
        if (kb__nats_frame_open(msg, count, &f, &why) != 0)
            return;
        for (uint32_t i = 1; kb__nats_frame_next(&f, &ev); i++) {
            id[base] = '.';
            kb__nats_put_u64(id + base + 1, i);
            r.key = ev.key, r.key_len = ev.key_len, r.id = error != NULL ? "" : id;
            kb_bus_delivery_report(t->bus, &r);
        }
        return;
    }
    /* the usual keys fit on the stack; a longer one is read again into its own */
    char small[1024], *key = small;
    int klen = kb__nats_get_key(msg, small, sizeof small, &why);
    if (klen < 0 && (key = malloc(65536)) != NULL)
        klen = kb__nats_get_key(msg, key, 65536, &why);
    r.key = key, r.key_len = klen > 0 ? (size_t)klen : 0, r.id = error != NULL ? "" : id;
    kb_bus_delivery_report(t->bus, &r);
    if (key != small)
        free(key);
}

/* report_to for a message of this bus: its partition read from it. */
static void report_as(kb_transport *t, natsMsg *msg, uint64_t seq, int code, const char *error)
{
    uint32_t part = 0;
    kb_nats_topic *tp = kb_bus_delivery_wanted(t->bus) ? published_to(t, msg, &part) : NULL;
    report_to(t, tp, part, msg, seq, code, error);
}

static void report_delivery(kb_transport *t, natsMsg *msg, uint64_t seq, const char *error)
{
    report_as(t, msg, seq, KB_ETRANSPORT, error);
}

/* Report the publishes push() could not queue (out of memory), failed. */
static void report_orphans(kb_transport *t)
{
    natsMsg *m[KB_NATS_ORPHANS];
    pthread_mutex_lock(&t->resend_lock);
    size_t n = t->n_orphans;
    memcpy(m, t->orphans, n * sizeof *m);
    t->n_orphans = 0;
    pthread_mutex_unlock(&t->resend_lock);
    for (size_t i = 0; i < n; i++) {
        report_as(t, m[i], 0, KB_ENOMEM, "out of memory queueing a resend");
        natsMsg_Destroy(m[i]);
    }
}

/* A publish ack that failed: transport trouble is sent again (the Msg-Id makes
 * it idempotent): KB_OK; a rejection by the server, or no memory for the
 * resend, is counted for kb_flush to report: the code of its failed report,
 * its reason in why. */
static int pub_err(kb_transport *t, jsPubAckErr *pae, char *why, size_t len)
{
    int failed = KB_OK;
    pthread_mutex_lock(&t->resend_lock);
    if (pae->ErrCode == 0 && pae->Err != NATS_INVALID_ARG) {
        natsMsg *c = kb__nats_msg_clone(pae->Msg);
        if (c != NULL) {
            push(t, c);
            atomic_store(&t->gated, 1);
        } else {
            snprintf(why, len, "out of memory copying a resend");
            reject(t, pae->Msg, why);
            failed = KB_ENOMEM;
        }
    } else {
        snprintf(why, len, "%s (jetstream error %d)",
                 pae->ErrText ? pae->ErrText : natsStatus_GetText(pae->Err), (int)pae->ErrCode);
        reject(t, pae->Msg, why);
        failed = KB_ETRANSPORT;
    }
    pthread_mutex_unlock(&t->resend_lock);
    return failed;
}

/* The connection broke (nats.c's callback thread): take back what is not
 * acked, unless a publish did already (kb__nats_send). */
void kb__nats_disconnected(natsConnection *nc, void *closure)
{
    (void)nc;
    kb_transport *t = closure;
    if (atomic_load(&t->closing))
        return;   /* our own natsConnection_Close */
    kb_log(t->bus, KB_LOG_WARNING, "nats %s: disconnected, reconnecting", t->url_safe);
    kb_bus_state_report(t->bus, KB_STATE_DISCONNECTED, "connection lost; reconnecting");
    pthread_rwlock_wrlock(&t->pub_lock);
    take_back(t, NULL);
    pthread_rwlock_unlock(&t->pub_lock);
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
    pthread_rwlock_wrlock(&t->pub_lock);
    take_back(t, NULL);
    pthread_rwlock_unlock(&t->pub_lock);
}

/* Send the queued publishes again, in order, once connected. Acker thread. */
void kb__nats_resend(kb_transport *t)
{
    if (atomic_load_explicit(&t->n_orphans, memory_order_relaxed) > 0)
        report_orphans(t);
    stalled(t);
    if (!atomic_load(&t->gated) || natsConnection_Status(t->nc) != NATS_CONN_STATUS_CONNECTED)
        return;
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = max_wait(t);
    kb_nats_resend *refused = NULL;   /* reported once the locks are released */
    pthread_rwlock_wrlock(&t->pub_lock);
    pthread_mutex_lock(&t->resend_lock);
    /* Publishes that timed out (a cluster's stream leader lost, the connection
     * up) came back in nats.c's order, not ours, behind newer ones queued. */
    sort_queue(t);
    for (int n = 0; n < 4096 && t->resend_head != NULL; n++) {
        kb_nats_resend *r = t->resend_head;
        natsStatus s = publish_async(t, &r->msg, &po);
        if (s != NATS_OK && s != NATS_MAX_PAYLOAD)
            break;   /* stalled or disconnected: next tick */
        t->resend_head = r->next;
        if (t->resend_head == NULL)
            t->resend_tail = NULL;
        atomic_fetch_sub(&t->resend_len, 1);
        if (s == NATS_MAX_PAYLOAD) {   /* never sendable: counted, not retried */
            reject(t, r->msg, "over the server's max_payload");
            r->next = refused;
            refused = r;
        } else {
            free(r);
        }
    }
    if (t->resend_head == NULL)
        atomic_store(&t->gated, 0);
    pthread_mutex_unlock(&t->resend_lock);
    pthread_rwlock_unlock(&t->pub_lock);
    for (kb_nats_resend *next; refused != NULL; refused = next) {
        next = refused->next;
        report_delivery(t, refused->msg, 0, "over the server's max_payload");
        natsMsg_Destroy(refused->msg);
        free(refused);
    }
    kb_signal_notify(t->resent);
}

uint64_t kb__nats_resend_free(kb_transport *t, const char *why)
{
    uint64_t lost = 0;
    report_orphans(t);
    for (kb_nats_resend *r = t->resend_head, *next; r; r = next) {
        next = r->next;
        lost += kb__nats_events_in(r->msg);
        report_delivery(t, r->msg, 0, why);
        natsMsg_Destroy(r->msg);
        free(r);
    }
    t->resend_head = t->resend_tail = NULL;
    natsMsgList l = {0};
    if (t->js != NULL && atomic_load(&t->published_async) &&
        js_PublishAsyncGetPendingList(&l, t->js) == NATS_OK) {
        for (int i = 0; i < l.Count; i++) {
            lost += kb__nats_events_in(l.Msgs[i]);
            report_delivery(t, l.Msgs[i], 0, why);
        }
        natsMsgList_Destroy(&l);
    }
    return lost;
}

void kb__nats_pub_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    (void)js;
    kb_transport *t = closure;
    char why[160];
    atomic_fetch_sub(&t->pub_out, 1);
    atomic_store(&t->pub_moved_ns, kb_now_ns());
    if (pa != NULL && msg != NULL) {
        uint32_t part = 0;
        kb_nats_topic *tp = acked_to(t, msg, pa->Stream, &part);
        note_stored(t, tp, part, pa->Sequence);
        report_to(t, tp, part, msg, pa->Sequence, KB_OK, NULL);
    } else if (pae != NULL) {
        pae->Msg = msg;   /* not set on this path */
        int failed = pub_err(t, pae, why, sizeof why);
        if (failed != KB_OK && msg != NULL)
            report_as(t, msg, 0, failed, why);
    }
    natsMsg_Destroy(msg);
}
