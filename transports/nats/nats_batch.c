/* Frames: up to nats.publish_batch events of one partition in one JetStream
 * message. The server's work (parse, store, publish ack, delivery, ack) is per
 * message, so a frame divides it among its events. Body layout, per event in
 * publish order:
 *     u32 key length (little endian) | key | u32 payload length | payload
 * with the header `Kb-Batch: <events>`. A lone event goes out as a plain
 * message (key in Kb-Key, body = payload), which any NATS client can read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/err.h"
#include "nats_int.h"

static void put_u32(char *p, uint32_t v)
{
    p[0] = (char)v;
    p[1] = (char)(v >> 8);
    p[2] = (char)(v >> 16);
    p[3] = (char)(v >> 24);
}

static uint32_t get_u32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
}

bool kb__nats_frame_next(kb_nats_frame *f, kb_nats_event *ev)
{
    if (f->left == 0 || f->end - f->p < 4)
        return false;
    uint32_t klen = get_u32(f->p);
    if (klen == 0 || (size_t)(f->end - f->p - 4) < (size_t)klen + 4)
        return false;
    uint32_t plen = get_u32(f->p + 4 + klen);
    if ((size_t)(f->end - f->p - 8 - klen) < plen)
        return false;
    ev->key = f->p + 4;
    ev->key_len = klen;
    ev->payload = f->p + 8 + klen;
    ev->payload_len = plen;
    f->p += 8 + (size_t)klen + plen;
    f->left--;
    return true;
}

int kb__nats_frame_open(natsMsg *m, const char *count, kb_nats_frame *f, const char **why)
{
    char *end = NULL;
    unsigned long n = strtoul(count, &end, 10);
    if (end == count || *end != '\0' || n < 2 || n > KB_NATS_BATCH_MAX) {
        *why = "malformed Kb-Batch header";
        return -1;
    }
    const char *body = natsMsg_GetData(m);
    kb_nats_frame probe = {body, body + natsMsg_GetDataLength(m), (uint32_t)n};
    *f = probe;
    kb_nats_event ev;
    while (kb__nats_frame_next(&probe, &ev))
        ;
    if (probe.left != 0 || probe.p != probe.end) {
        *why = "malformed Kb-Batch frame (lengths do not add up)";
        return -1;
    }
    return 0;
}

int kb__nats_batch_init(kb_transport *t, kb_nats_topic *tp)
{
    tp->batches = calloc(t->partitions, sizeof *tp->batches);
    if (tp->batches == NULL)
        return KB_ENOMEM;
    for (uint32_t i = 0; i < t->partitions; i++)
        pthread_mutex_init(&tp->batches[i].mu, NULL);
    return KB_OK;
}

uint64_t kb__nats_batch_free(kb_transport *t, kb_nats_topic *tp)
{
    if (tp->batches == NULL)
        return 0;
    uint64_t lost = 0;
    for (uint32_t i = 0; i < t->partitions; i++) {
        lost += tp->batches[i].count;
        free(tp->batches[i].buf);
        pthread_mutex_destroy(&tp->batches[i].mu);
    }
    free(tp->batches);
    tp->batches = NULL;
    return lost;
}

uint32_t kb__nats_events_in(natsMsg *m)
{
    const char *count = NULL;
    if (natsMsgHeader_Get(m, KB_NATS_BATCH_HDR, &count) != NATS_OK || count == NULL)
        return 1;
    unsigned long n = strtoul(count, NULL, 10);
    return n > 0 && n <= KB_NATS_BATCH_MAX ? (uint32_t)n : 1;
}

/* Send what partition n has buffered; caller holds b->mu. On failure the
 * events stay buffered, in order, for the next attempt. */
static int send_locked(kb_transport *t, kb_nats_topic *tp, uint32_t n, kb_nats_batch *b,
                       int64_t now)
{
    natsMsg *msg = NULL;
    int rc;
    if (b->count == 1) {
        kb_nats_frame f = {b->buf, b->buf + b->len, 1};
        kb_nats_event ev;
        kb__nats_frame_next(&f, &ev);
        rc = kb__nats_msg_event(t, tp->subjects[n], ev.key, ev.key_len, ev.payload,
                                ev.payload_len, &msg);
    } else {
        char count[16];
        snprintf(count, sizeof count, "%u", b->count);
        rc = kb__nats_msg_event(t, tp->subjects[n], NULL, 0, b->buf, b->len, &msg);
        if (rc == KB_OK && natsMsgHeader_Set(msg, KB_NATS_BATCH_HDR, count) != NATS_OK) {
            natsMsg_Destroy(msg);
            kb__errf(NULL, 0, "nats: out of memory for a publish");
            rc = KB_ENOMEM;
        }
    }
    if (rc == KB_OK)
        rc = kb__nats_send(t, msg);
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
    size_t need = 8 + m->key_len + m->payload_len;
    if (b->len + need > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + need)
            cap *= 2;
        char *buf = realloc(b->buf, cap);
        if (buf == NULL) {
            kb__errf(NULL, 0, "nats: out of memory buffering a publish");
            return KB_ENOMEM;
        }
        b->buf = buf;
        b->cap = cap;
    }
    char *p = b->buf + b->len;
    put_u32(p, (uint32_t)m->key_len);
    memcpy(p + 4, m->key, m->key_len);
    put_u32(p + 4 + m->key_len, (uint32_t)m->payload_len);
    if (m->payload_len)
        memcpy(p + 8 + m->key_len, m->payload, m->payload_len);
    b->len += need;
    b->count++;
    return KB_OK;
}

/* An event goes into its partition's frame. The frame is sent when it is full,
 * or at once when the partition was quiet for the linger (sparse traffic pays
 * no delay); otherwise the acker sends it once it is a linger old. */
int kb__nats_batch_add(kb_transport *t, kb_nats_topic *tp, const kb_msg *m)
{
    uint32_t n = m->hash % t->partitions;
    kb_nats_batch *b = &tp->batches[n];
    size_t need = 8 + m->key_len + m->payload_len;
    int64_t now = kb__nats_now_ns();
    int rc = KB_OK;
    pthread_mutex_lock(&b->mu);
    size_t budget = atomic_load_explicit(&t->batch_bytes, memory_order_relaxed);
    if (b->count > 0 && (b->count >= t->batch_events || b->len + need > budget))
        rc = send_locked(t, tp, n, b, now);   /* failed: this event is not taken */
    if (rc == KB_OK)
        rc = append(b, m);
    if (rc == KB_OK) {
        if (b->count == 1) {
            b->first_ns = now;
            atomic_fetch_add_explicit(&tp->frames_open, 1, memory_order_relaxed);
        }
        if (b->count >= t->batch_events || b->len >= budget ||
            now - b->last_send_ns >= t->linger_ns)
            send_locked(t, tp, n, b, now);   /* failed: stays buffered for the acker */
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* Send frames at least a linger old (all of them when `all`). KB_OK when
 * nothing is left buffered. */
int kb__nats_batch_send_due(kb_transport *t, bool all)
{
    int rc = KB_OK;
    int64_t now = kb__nats_now_ns();
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next)
        for (uint32_t i = 0; atomic_load_explicit(&tp->frames_open, memory_order_relaxed) > 0 &&
                             tp->batches != NULL && i < t->partitions;
             i++) {
            kb_nats_batch *b = &tp->batches[i];
            pthread_mutex_lock(&b->mu);
            if (b->count > 0 && (all || now - b->first_ns >= t->linger_ns)) {
                int r = send_locked(t, tp, i, b, now);
                if (r != KB_OK && rc == KB_OK)
                    rc = r;
            }
            pthread_mutex_unlock(&b->mu);
        }
    return rc;
}
