/* Publishing: kb_publish's hook (checks what the server would refuse, then
 * frames or a plain message) and kb_flush's. */
#include <stdio.h>

#include "nats_batch.h"
#include "nats_frame.h"
#include "nats_hdr.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_publish.h"
#include "nats_send.h"
#include "nats_topic.h"

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
                    kb_frame_event_size(m, v2) - m->payload_len;
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

int kb__nats_publish(kb_transport *t, kb_nats_topic *tp, const kb_msg *m)
{
    int rc = check_fits(t, m);
    if (rc != KB_OK)
        return rc;
    if ((rc = kb__nats_topic_ready(t, tp)) != KB_OK)
        return rc;   /* another partition count: KB_EINVAL naming both */
    if (t->batch_events > 1 || t->replicas > 1) {   /* replicas: nats_batch.c, held() */
        rc = kb__nats_batch_add(t, tp, m);
    } else {
        natsMsg *msg = NULL;
        uint32_t n = kb_partition_of_hash(m->hash, t->partitions);
        kb_kit_key key = {m->key, m->key_len};
        rc = kb__nats_msg_event(t, tp, n, m->key, m->key_len, m->payload, m->payload_len,
                                m->headers, m->n_headers, &msg);
        if (rc == KB_OK)
            rc = kb__nats_send(t, tp, n, msg, &key, 1);
    }
    if (rc == KB_OK)
        atomic_fetch_add_explicit(&tp->published, 1, memory_order_relaxed);
    return rc;
}

/* A flush's wait: one topic's events up to `ticket` reported, or a pump
 * wanted (a publish ack may have made a resend due, a reconnect). */
typedef struct flush_wait {
    kb_transport *t;
    kb_kit_backlog *b;
    uint64_t ticket;
} flush_wait;

static bool flushed(const flush_wait *w)
{
    return kb_kit_backlog_flush(w->b, w->ticket, 0) == KB_OK;
}

static int flushed_or_wanted(void *arg)
{
    flush_wait *w = arg;
    return flushed(w) || atomic_load(&w->t->pump_wanted);
}

/* Every event published before it has its report: frames still filling are
 * handed on, then each topic of the list as it was at the start is flushed
 * by its last ticket, read when the flush gets to it (again, from the first,
 * once no frame is buffered: a held one filled since counts too). Each call
 * reads anew: kb_flush's slices wait for publishes made meanwhile. It pumps itself,
 * again whenever a publish ack or a reconnect asks or a resend's backoff
 * ends (a flush at close: the acker has stopped), and at close notices a
 * stall. A failed event is no error here: its report counted it, and
 * kb_flush says so. */
int kb__nats_flush_until(kb_transport *t, int64_t deadline)
{
    kb_nats_topic *first = atomic_load(&t->topics), *tp = first;
    flush_wait w = {t, NULL, 0};
    bool handed = false;   /* no frame buffered: each one filling at the start has its tickets */
    for (;;) {
        int sent = kb__nats_batch_send_due(t, true);
        if (!handed && sent == KB_OK) {
            handed = true;
            tp = first;   /* tickets read before may have missed frames */
            w.b = NULL;
        }
        atomic_store(&t->pump_wanted, 0);
        if (atomic_load(&t->closing))
            kb__nats_send_tick(t);
        else
            kb__nats_pump_all(t, false);
        for (; tp != NULL; tp = tp->next) {
            if (w.b != tp->backlog) {
                w.b = tp->backlog;
                w.ticket = kb_kit_backlog_last_ticket(w.b);
            }
            if (!flushed(&w))
                break;
        }
        if (tp == NULL && handed)
            return KB_OK;
        int64_t now = kb_now_ns();
        if (now >= deadline) {
            kb_errf(NULL, 0, "nats %s: publishes not acked within the deadline", t->url_safe);
            return KB_ETIMEDOUT;
        }
        if (tp == NULL) {
            /* only a frame that failed to go out (out of memory) or held
             * behind its partition's unconfirmed publish: try again in 10 ms */
            int64_t retry = now + 10000000;
            kb_signal_wait(t->resent, kb__nats_never, NULL, retry < deadline ? retry : deadline);
            continue;
        }
        int64_t slice = kb__nats_resend_due(t, now + 100000000);
        kb_signal_wait(t->resent, flushed_or_wanted, &w, slice < deadline ? slice : deadline);
    }
}

uint64_t kb__nats_refused_take(kb_transport *t)
{
    /* refused_told only moves forward: a kb_flush and a kb_drain at once
     * each take a share, never a wrapped count */
    uint64_t now = atomic_load(&t->pub_refused);
    uint64_t told = atomic_load(&t->refused_told);
    while (told < now && !atomic_compare_exchange_weak(&t->refused_told, &told, now))
        ;
    return told < now ? now - told : 0;
}

int kb__nats_flush(kb_transport *t, int timeout_ms)
{
    int rc = kb__nats_flush_until(t, kb_deadline_ns(timeout_ms));
    if (rc == KB_ETIMEDOUT)
        kb_errf(NULL, 0, "nats %s: publishes not acked yet", t->url_safe);   /* the bus names the deadline */
    if (rc == KB_OK)
        kb__nats_refused_take(t);   /* kb_flush reports them: the bus counted each */
    return rc;
}
