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
        rc = kb__nats_msg_event(t, tp, kb_partition_of_hash(m->hash, t->partitions), m->key, m->key_len, m->payload,
                                m->payload_len, m->headers, m->n_headers, &msg);
        if (rc == KB_OK)
            rc = kb__nats_send(t, msg);
    }
    if (rc == KB_OK)
        atomic_fetch_add_explicit(&tp->published, 1, memory_order_relaxed);
    return rc;
}

/* Nothing waits for a resend; or, at close (the acker has stopped), the
 * connection is back so the caller can resend itself. */
static int resends_done(void *arg)
{
    kb_transport *t = arg;
    if (!atomic_load(&t->gated))
        return 1;
    return atomic_load(&t->closing) &&
           natsConnection_Status(t->nc) == NATS_CONN_STATUS_CONNECTED;
}

int kb__nats_flush_until(kb_transport *t, int64_t deadline)
{
    for (;;) {
        if (atomic_load(&t->closing))
            kb__nats_resend(t);   /* the acker has stopped */
        int sent = kb__nats_batch_send_due(t, true);
        int left = kb_deadline_left_ms(deadline);
        jsPubOptions po;
        jsPubOptions_Init(&po);
        /* A take-back empties nats.c's list without waking this wait: look
         * again every 100 ms. */
        po.MaxWait = left < 0 || left > 100 ? 100 : left > 1 ? left : 1;
        /* A take-back that began after these loads moved publishes out of
         * nats.c's list while we waited: its count tells, even once the
         * acker has sent them again and opened the gate. */
        uint64_t take_backs = atomic_load(&t->take_backs);
        int gated_before = atomic_load(&t->gated);
        natsStatus s = js_PublishAsyncComplete(t->js, &po);
        if (sent == KB_OK && s == NATS_OK && !gated_before && !atomic_load(&t->gated) &&
            atomic_load(&t->resend_len) == 0 && atomic_load(&t->take_backs) == take_backs)
            break;
        if (s != NATS_OK && s != NATS_TIMEOUT)
            return kb__nats_errf("waiting for publish acks", s, 0);
        /* A frame that failed to go out (out of memory) stays buffered: with
         * no ack to wait for, try again in 10 ms, not at once. */
        if (sent != KB_OK && sent != KB_EFULL && s == NATS_OK && !atomic_load(&t->gated)) {
            int64_t retry = kb_now_ns() + 10000000;
            kb_signal_wait(t->resent, kb__nats_never, NULL, retry < deadline ? retry : deadline);
        }
        /* Resends go out on the acker's tick (or above, at close), which
         * notifies t->resent; reconnecting notifies it too. */
        if (kb_now_ns() >= deadline ||
            (atomic_load(&t->gated) && !kb_signal_wait(t->resent, resends_done, t, deadline))) {
            kb_errf(NULL, 0, "nats %s: publishes not acked within the deadline", t->url_safe);
            return KB_ETIMEDOUT;
        }
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

int kb__nats_flush(kb_transport *t, int timeout_ms)
{
    int rc = kb__nats_flush_until(t, kb_deadline_ns(timeout_ms));
    if (rc == KB_ETIMEDOUT)
        kb_errf(NULL, 0, "nats %s: publishes not acked within %d ms", t->url_safe, timeout_ms);
    return rc;
}
