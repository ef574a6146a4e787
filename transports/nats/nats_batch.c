/* Frames: up to nats.publish_batch events of one partition in one JetStream
 * message. The server's work (parse, store, publish ack, delivery, ack) is per
 * message, so a frame divides it among its events. Body layout, per event in
 * publish order (integers little endian):
 *     u32 key length | key | u32 payload length | payload
 * with the header `Kb-Batch: <events>`; a frame holding an event with headers
 * also has `Kb-Frame: 2`, and then every entry continues with
 *     u16 header count | per header: u8 name length | name | u32 value length | value
 * A lone event goes out as a plain message (key in Kb-Key, body = payload,
 * its headers as NATS headers), which any NATS client can read. */
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

/* Length of the header block of n headers at p, or 0 when it runs past end. */
static size_t hdr_block(const char *p, const char *end, uint32_t n)
{
    const char *q = p;
    for (uint32_t i = 0; i < n; i++) {
        if (end - q < 1 || (size_t)(end - q) < 5 + (size_t)(unsigned char)q[0])
            return 0;
        size_t nl = (unsigned char)q[0];
        uint32_t vl = get_u32(q + 1 + nl);
        if ((size_t)(end - q) - 5 - nl < vl)
            return 0;
        q += 5 + nl + vl;
    }
    return (size_t)(q - p);
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
    const char *after = f->p + 8 + (size_t)klen + plen;
    ev->key = f->p + 4;
    ev->key_len = klen;
    ev->payload = f->p + 8 + klen;
    ev->payload_len = plen;
    ev->hdrs = NULL;
    ev->nh = 0;
    if (f->version == 2) {
        if (f->end - after < 2)
            return false;
        uint32_t nh = (uint32_t)(unsigned char)after[0] | (uint32_t)(unsigned char)after[1] << 8;
        size_t hl = hdr_block(after + 2, f->end, nh);
        if (nh > 0 && hl == 0)
            return false;
        ev->hdrs = after + 2;
        ev->nh = nh;
        after += 2 + hl;
    }
    f->p = after;
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
    const char *ver = NULL;
    int version = 1;
    if (natsMsgHeader_Get(m, KB_NATS_FRAME_HDR_NAME, &ver) == NATS_OK && ver != NULL) {
        if (strcmp(ver, "2") != 0) {
            *why = "unknown Kb-Frame version";
            return -1;
        }
        version = 2;
    }
    const char *body = natsMsg_GetData(m);
    kb_nats_frame probe = {body, body + natsMsg_GetDataLength(m), (uint32_t)n, version};
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
        kb_nats_frame f = {b->buf, b->buf + b->len, 1, b->v2 ? 2 : 1};
        kb_nats_event ev;
        kb__nats_frame_next(&f, &ev);
        kb_nats_hdrs *h = ev.nh > 0 ? calloc(1, sizeof *h) : NULL;
        const char *why = NULL;
        if (ev.nh > 0 && (h == NULL || kb__nats_hdr_frame(t, &ev, h, &why) != 0)) {
            free(h);   /* checked at kb_publish: only out of memory gets here */
            kb_errf(NULL, 0, "nats: out of memory for a publish");
            return KB_ENOMEM;
        }
        rc = kb__nats_msg_event(t, tp->subjects[n], ev.key, ev.key_len, ev.payload,
                                ev.payload_len, h ? h->h : NULL, h ? h->n : 0, &msg);
        free(h);
    } else {
        char count[16];
        snprintf(count, sizeof count, "%u", b->count);
        rc = kb__nats_msg_event(t, tp->subjects[n], NULL, 0, b->buf, b->len, NULL, 0, &msg);
        if (rc == KB_OK &&
            ((b->v2 && natsMsgHeader_Set(msg, KB_NATS_FRAME_HDR_NAME, "2") != NATS_OK) ||
             natsMsgHeader_Set(msg, KB_NATS_BATCH_HDR, count) != NATS_OK)) {
            natsMsg_Destroy(msg);
            kb_errf(NULL, 0, "nats: out of memory for a publish");
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

size_t kb__nats_entry_size(const kb_msg *m, bool v2)
{
    size_t n = 8 + m->key_len + m->payload_len;
    if (v2) {
        n += 2;
        for (size_t i = 0; i < m->n_headers; i++)
            n += 5 + strlen(m->headers[i].name) + m->headers[i].value_len;
    }
    return n;
}

static int append(kb_nats_batch *b, const kb_msg *m)
{
    size_t need = kb__nats_entry_size(m, b->v2);
    if (b->len + need > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + need)
            cap *= 2;
        char *buf = realloc(b->buf, cap);
        if (buf == NULL) {
            kb_errf(NULL, 0, "nats: out of memory buffering a publish");
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
    if (b->v2) {
        p += 8 + m->key_len + m->payload_len;
        *p++ = (char)m->n_headers;
        *p++ = (char)(m->n_headers >> 8);
        for (size_t i = 0; i < m->n_headers; i++) {
            size_t nl = strlen(m->headers[i].name);
            *p++ = (char)nl;
            memcpy(p, m->headers[i].name, nl);
            put_u32(p + nl, (uint32_t)m->headers[i].value_len);
            if (m->headers[i].value_len)
                memcpy(p + nl + 4, m->headers[i].value, m->headers[i].value_len);
            p += nl + 4 + m->headers[i].value_len;
        }
    }
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
    int64_t now = kb__nats_now_ns();
    int rc = KB_OK;
    pthread_mutex_lock(&b->mu);
    size_t budget = atomic_load_explicit(&t->batch_bytes, memory_order_relaxed);
    /* A version 1 frame cannot take headers: send it, the next one is v2. */
    bool upgrade = m->n_headers > 0 && !b->v2;
    size_t need = kb__nats_entry_size(m, b->v2 || upgrade);
    if (b->count > 0 && (b->count >= t->batch_events || b->len + need > budget || upgrade))
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
