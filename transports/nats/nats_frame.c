/* Frames: up to nats.publish_batch events of one partition in one JetStream
 * message. Body layout, per event in publish order (integers little endian):
 *     u32 key length | key | u32 payload length | payload
 * with the header `Kb-Batch: <events>`; a frame holding an event with headers
 * also has `Kb-Frame: 2`, and then every entry continues with
 *     u16 header count | per header: u8 name length | name | u32 value length | value
 * This file reads and writes that layout; nats_batch.c fills frames. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_frame.h"

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

uint32_t kb__nats_events_in(natsMsg *m)
{
    const char *count = NULL;
    if (natsMsgHeader_Get(m, KB_NATS_BATCH_HDR, &count) != NATS_OK || count == NULL)
        return 1;
    unsigned long n = strtoul(count, NULL, 10);
    return n > 0 && n <= KB_NATS_BATCH_MAX ? (uint32_t)n : 1;
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

void kb__nats_entry_put(char *p, const kb_msg *m, bool v2)
{
    put_u32(p, (uint32_t)m->key_len);
    memcpy(p + 4, m->key, m->key_len);
    put_u32(p + 4 + m->key_len, (uint32_t)m->payload_len);
    if (m->payload_len)
        memcpy(p + 8 + m->key_len, m->payload, m->payload_len);
    if (!v2)
        return;
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
