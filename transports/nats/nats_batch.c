/* Filling frames: an event goes into its partition's frame, sent when full,
 * at once after a quiet spell, or by the acker once a linger old. The frame
 * layout is nats_frame.c's. The server's work (parse, store, publish ack,
 * delivery, ack) is per message, so a frame divides it among its events. A
 * lone event goes out as a plain message (key in Kb-Key, body = payload, its
 * headers as NATS headers), which any NATS client can read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_batch.h"
#include "nats_frame.h"
#include "nats_hdr.h"
#include "nats_send.h"

/* One unconfirmed publish per partition when nats.replicas > 1. A stream
 * leader killed mid-stream drops the publishes it had not stored yet, and the
 * next leader stores newer ones before the lost ones time out and go out
 * again: per-key order would break. Holding a partition's next frame until
 * the server acked its last publish means nothing is stored ahead of an
 * earlier publish of its partition (a resend of one stored already is
 * dropped as a duplicate by its Nats-Msg-Id). Meanwhile the frame fills (the
 * acks clock the batching); a full one makes kb_publish wait, up to
 * pool.enqueue_timeout_ms. Frames do not grow past nats.publish_batch: a
 * bigger one takes longer to handle and is acked only when all its events
 * are done, so more of it comes again after a lost ack or a takeover. */
static bool held(const kb_transport *t, const kb_nats_batch *b)
{
    return t->replicas > 1 && atomic_load(&b->unconfirmed);
}

static int confirmed(void *arg)
{
    return !atomic_load(&((kb_nats_batch *)arg)->unconfirmed);
}

/* The frame cannot take an event of `need` bytes (or must not, to get v2). */
static bool full(const kb_transport *t, const kb_nats_batch *b, size_t need, size_t budget,
                 bool upgrade)
{
    return b->count > 0 && (b->count >= t->batch_events || b->len + need > budget || upgrade);
}

/* The keys of the frame's events, for their delivery reports, in b->keys
 * (kept for the partition's next frame: the backlog copies them); NULL
 * when the bus wants none, or on out of memory: *rc says which. */
static kb_kit_key *frame_keys(kb_transport *t, kb_nats_batch *b, int *rc)
{
    *rc = KB_OK;
    if (!kb_bus_delivery_wanted(t->bus))
        return NULL;
    void *room = b->keys;
    if (kb_vec_reserve(&room, &b->keys_cap, b->count, sizeof *b->keys) != KB_OK) {
        kb_errf(NULL, 0, "nats: out of memory for a publish");
        *rc = KB_ENOMEM;
        return NULL;
    }
    kb_kit_key *keys = b->keys = room;
    kb_nats_frame f = {b->buf, b->buf + b->len, b->count, b->v2 ? 2 : 1};
    kb_frame_event ev;
    for (uint32_t i = 0; i < b->count && kb__nats_frame_next(&f, &ev); i++)
        keys[i] = (kb_kit_key){ev.key, ev.key_len};
    return keys;
}

/* Hand what partition n has buffered to the topic's backlog; caller holds
 * b->mu. On failure the events stay buffered, in order, for the next
 * attempt. */
static int send_locked(kb_transport *t, kb_nats_topic *tp, uint32_t n, kb_nats_batch *b,
                       int64_t now)
{
    natsMsg *msg = NULL;
    kb_kit_key one, *keys = NULL;
    int rc;
    if (b->count == 1) {
        kb_nats_frame f = {b->buf, b->buf + b->len, 1, b->v2 ? 2 : 1};
        kb_frame_event ev;
        kb__nats_frame_next(&f, &ev);
        kb_nats_hdrs *h = ev.n_headers > 0 ? calloc(1, sizeof *h) : NULL;
        const char *why = NULL;
        if (ev.n_headers > 0 && (h == NULL || kb__nats_hdr_frame(t, &ev, h, &why) != 0)) {
            free(h);   /* checked at kb_publish: only out of memory gets here */
            kb_errf(NULL, 0, "nats: out of memory for a publish");
            return KB_ENOMEM;
        }
        rc = kb__nats_msg_event(t, tp, n, ev.key, ev.key_len, ev.payload,
                                ev.payload_len, h ? h->h : NULL, h ? h->n : 0, &msg);
        free(h);
        one = (kb_kit_key){ev.key, ev.key_len};
        keys = &one;
    } else {
        char count[16];
        snprintf(count, sizeof count, "%u", b->count);
        rc = kb__nats_msg_event(t, tp, n, NULL, 0, b->buf, b->len, NULL, 0, &msg);
        if (rc == KB_OK &&
            ((b->v2 && natsMsgHeader_Set(msg, KB_NATS_FRAME_HDR_NAME, "2") != NATS_OK) ||
             natsMsgHeader_Set(msg, KB_NATS_BATCH_HDR, count) != NATS_OK)) {
            natsMsg_Destroy(msg);
            kb_errf(NULL, 0, "nats: out of memory for a publish");
            rc = KB_ENOMEM;
        }
        if (rc == KB_OK && (keys = frame_keys(t, b, &rc)) == NULL && rc != KB_OK)
            natsMsg_Destroy(msg);
    }
    if (rc == KB_OK && t->replicas > 1)
        atomic_store(&b->unconfirmed, true);   /* before: the ack may come at once */
    if (rc == KB_OK)
        rc = kb__nats_send(t, tp, n, msg, keys, b->count);
    if (rc != KB_OK && t->replicas > 1)
        atomic_store(&b->unconfirmed, false);
    if (rc == KB_OK) {
        b->len = 0;
        b->count = 0;
        b->last_send_ns = now;
        atomic_fetch_sub_explicit(&tp->frames_open, 1, memory_order_relaxed);
    }
    return rc;
}

static int append(kb_nats_batch *b, const kb_msg *m)
{
    size_t need = kb_frame_event_size(m, b->v2);
    void *buf = b->buf;
    if (kb_vec_reserve(&buf, &b->cap, b->len + need, 1) != KB_OK) {
        kb_errf(NULL, 0, "nats: out of memory buffering a publish");
        return KB_ENOMEM;
    }
    b->buf = buf;
    kb_frame_event_put(b->buf + b->len, m, b->v2);
    b->len += need;
    b->count++;
    return KB_OK;
}

/* An event goes into its partition's frame. The frame is sent when it is full,
 * or at once when the partition was quiet for the linger (sparse traffic pays
 * no delay); otherwise the acker sends it once it is a linger old. */
int kb__nats_batch_add(kb_transport *t, kb_nats_topic *tp, const kb_msg *m)
{
    uint32_t n = kb_partition_of_hash(m->hash, t->partitions);
    kb_nats_batch *b = &tp->batches[n];
    int64_t now = kb_now_ns();
    int rc = KB_OK;
    pthread_mutex_lock(&b->mu);
    size_t budget = atomic_load_explicit(&t->batch_bytes, memory_order_relaxed);
    /* A version 1 frame cannot take headers: send it, the next one is v2. */
    bool upgrade = m->n_headers > 0 && !b->v2;
    size_t need = kb_frame_event_size(m, b->v2 || upgrade);
    /* full while its partition's last publish is unconfirmed: wait */
    int64_t deadline = 0;
    while (full(t, b, need, budget, upgrade) && held(t, b)) {
        if (deadline == 0)
            deadline = kb_deadline_ns(t->enqueue_timeout_ms);
        if (kb_now_ns() >= deadline) {
            kb_errf(NULL, 0, "nats %s: a publish of partition %u unconfirmed for %d ms",
                    t->url_safe, n, t->enqueue_timeout_ms);
            pthread_mutex_unlock(&b->mu);
            return KB_EFULL;
        }
        pthread_mutex_unlock(&b->mu);
        kb_signal_wait(t->resent, confirmed, b, deadline);
        pthread_mutex_lock(&b->mu);
        upgrade = m->n_headers > 0 && !b->v2;   /* the acker may have sent it meanwhile */
        need = kb_frame_event_size(m, b->v2 || upgrade);
        now = kb_now_ns();
    }
    if (full(t, b, need, budget, upgrade))
        rc = send_locked(t, tp, n, b, now);   /* failed: this event is not taken */
    if (rc == KB_OK && b->count == 0)
        b->v2 = m->n_headers > 0;   /* an empty buffer starts plain again */
    if (rc == KB_OK)
        rc = append(b, m);
    if (rc == KB_OK) {
        if (b->count == 1) {
            b->first_ns = now;
            atomic_fetch_add_explicit(&tp->frames_open, 1, memory_order_relaxed);
        }
        /* held: the acker sends it once the partition's last publish is acked */
        if (!held(t, b) && (t->replicas > 1 || b->count >= t->batch_events ||
                            b->len >= budget || now - b->last_send_ns >= t->linger_ns))
            send_locked(t, tp, n, b, now);   /* failed: stays buffered for the acker */
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* Send frames at least a linger old (all of them when `all`; with
 * nats.replicas > 1 each one whose partition has no publish unconfirmed).
 * KB_OK when nothing is left buffered. */
int kb__nats_batch_send_due(kb_transport *t, bool all)
{
    int rc = KB_OK;
    int64_t now = kb_now_ns();
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next)
        for (uint32_t i = 0; atomic_load_explicit(&tp->frames_open, memory_order_relaxed) > 0 &&
                             tp->batches != NULL && i < t->partitions;
             i++) {
            kb_nats_batch *b = &tp->batches[i];
            pthread_mutex_lock(&b->mu);
            if (b->count > 0 && held(t, b)) {
                rc = rc == KB_OK ? KB_EFULL : rc;
            } else if (b->count > 0 &&
                       (all || t->replicas > 1 || now - b->first_ns >= t->linger_ns)) {
                int r = send_locked(t, tp, i, b, now);
                if (r != KB_OK && rc == KB_OK)
                    rc = r;
            }
            pthread_mutex_unlock(&b->mu);
        }
    return rc;
}

void kb__nats_batch_give_up(kb_transport *t, const char *why)
{
    bool wanted = kb_bus_delivery_wanted(t->bus);
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next)
        for (uint32_t i = 0; tp->batches != NULL && i < t->partitions; i++) {
            kb_nats_batch *b = &tp->batches[i];
            kb_nats_frame f = {b->buf, b->buf + b->len, b->count, b->v2 ? 2 : 1};
            kb_frame_event ev;
            while (wanted && kb__nats_frame_next(&f, &ev)) {
                kb_delivery_report r = {.topic = tp->name, .key = ev.key, .key_len = ev.key_len,
                                        .partition = i, .result = KB_ETRANSPORT, .id = "",
                                        .error = why};
                kb_bus_delivery_report(t->bus, &r);
            }
        }
}
