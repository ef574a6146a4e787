/* The frame layout (docs/formats.md, "Redis frames"): several events of one
 * partition in one stream entry with the fields
 *     f = "1" (the layout's version), n = <events>, b = <body>
 * where the body holds, per event in publish order (integers little endian):
 *     u32 key length | key | u32 payload length | payload |
 *     u16 header count | per header: u8 name length | name | u32 value length | value
 * This file reads and writes that layout; pure (no server, no lock). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

static void put_le(char *p, uint32_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (char)(v >> (8 * i));
}

static uint32_t get_le(const char *p, int bytes)
{
    const unsigned char *u = (const unsigned char *)p;
    uint32_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | u[i];
    return v;
}

size_t kb__redis_frame_event_size(const kb_msg *m)
{
    size_t n = 10 + m->key_len + m->payload_len;
    for (size_t i = 0; i < m->n_headers; i++)
        n += 5 + strlen(m->headers[i].name) + m->headers[i].value_len;
    return n;
}

void kb__redis_frame_event_put(char *p, const kb_msg *m)
{
    put_le(p, (uint32_t)m->key_len, 4);
    memcpy(p + 4, m->key, m->key_len);
    p += 4 + m->key_len;
    put_le(p, (uint32_t)m->payload_len, 4);
    if (m->payload_len > 0)
        memcpy(p + 4, m->payload, m->payload_len);
    p += 4 + m->payload_len;
    put_le(p, (uint32_t)m->n_headers, 2);
    p += 2;
    for (size_t i = 0; i < m->n_headers; i++) {
        size_t nl = strlen(m->headers[i].name);
        *p = (char)nl;
        memcpy(p + 1, m->headers[i].name, nl);
        put_le(p + 1 + nl, (uint32_t)m->headers[i].value_len, 4);
        if (m->headers[i].value_len > 0)
            memcpy(p + 5 + nl, m->headers[i].value, m->headers[i].value_len);
        p += 5 + nl + m->headers[i].value_len;
    }
}

bool kb__redis_frame_next(kb_redis_frame *f, kb_redis_fevent *ev)
{
    size_t left = (size_t)(f->end - f->p);
    if (f->left == 0 || left < 4)
        return false;
    size_t klen = get_le(f->p, 4);
    if (left - 4 < klen + 4)
        return false;
    size_t plen = get_le(f->p + 4 + klen, 4);
    if (left - 8 - klen < plen + 2)
        return false;
    const char *q = f->p + 8 + klen + plen;
    uint32_t nh = get_le(q, 2);
    q += 2;
    ev->hdrs = q;
    for (uint32_t i = 0; i < nh; i++) {
        if (f->end - q < 1 || (size_t)(f->end - q) < 5 + (size_t)(unsigned char)q[0])
            return false;
        size_t nl = (unsigned char)q[0];
        size_t vl = get_le(q + 1 + nl, 4);
        if ((size_t)(f->end - q) - 5 - nl < vl)
            return false;
        q += 5 + nl + vl;
    }
    ev->key = f->p + 4;
    ev->key_len = klen;
    ev->payload = f->p + 8 + klen;
    ev->payload_len = plen;
    ev->nh = nh;
    f->p = q;
    f->left--;
    return true;
}

int kb__redis_frame_headers(const kb_redis_fevent *ev, kb_header *out, size_t max, char *names)
{
    if (ev->nh > max)
        return -1;
    const char *q = ev->hdrs;
    for (uint32_t i = 0; i < ev->nh; i++) {
        size_t nl = (unsigned char)q[0];
        if (nl == 0 || nl > KB_MAX_HEADER_NAME)
            return -1;
        char *name = names + (size_t)i * (KB_MAX_HEADER_NAME + 1);
        memcpy(name, q + 1, nl);
        name[nl] = '\0';
        out[i] = (kb_header){name, q + 5 + nl, get_le(q + 1 + nl, 4)};
        q += 5 + nl + out[i].value_len;
    }
    return (int)ev->nh;
}

bool kb__redis_is_frame(const redisReply *fields)
{
    return kb__redis_field(fields, "k") == NULL && kb__redis_field(fields, "f") != NULL;
}

int kb__redis_frame_open(const redisReply *fields, kb_redis_frame *f, char *why, size_t len)
{
    const redisReply *v = kb__redis_field(fields, "f"), *n = kb__redis_field(fields, "n"),
                     *b = kb__redis_field(fields, "b");
    if (v == NULL || v->len != 1 || v->str[0] != '1') {
        snprintf(why, len, "malformed frame: unknown version in field \"f\" (1 is known)");
        return -1;
    }
    uint32_t count = kb__redis_number_below(n, KB_REDIS_BATCH_MAX + 1, 0);
    if (count == 0 || b == NULL) {
        snprintf(why, len, "malformed frame: field \"n\" is not a count of 1..%d, or no field \"b\"",
                 KB_REDIS_BATCH_MAX);
        return -1;
    }
    kb_redis_frame probe = {b->str, b->str + b->len, count};
    *f = probe;
    kb_redis_fevent ev;
    while (kb__redis_frame_next(&probe, &ev))
        ;
    if (probe.left != 0 || probe.p != probe.end) {
        snprintf(why, len, "malformed frame: the lengths in field \"b\" do not add up to %u events",
                 count);
        return -1;
    }
    return 0;
}
