/* The events of a frame (docs/formats.md): the body layout redis:// and
 * nats:// share, written and read in one place so the two cannot drift.
 * Pure: bytes in, bytes out, no lock. */
#include <string.h>

#include <keybus/transport.h>

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

size_t kb_frame_event_size(const kb_msg *m, bool with_headers)
{
    size_t n = 8 + m->key_len + m->payload_len;
    if (with_headers) {
        n += 2;
        for (size_t i = 0; i < m->n_headers; i++)
            n += 5 + strlen(m->headers[i].name) + m->headers[i].value_len;
    }
    return n;
}

void kb_frame_event_put(char *p, const kb_msg *m, bool with_headers)
{
    put_u32(p, (uint32_t)m->key_len);
    memcpy(p + 4, m->key, m->key_len);
    put_u32(p + 4 + m->key_len, (uint32_t)m->payload_len);
    if (m->payload_len > 0)
        memcpy(p + 8 + m->key_len, m->payload, m->payload_len);
    if (!with_headers)
        return;
    p += 8 + m->key_len + m->payload_len;
    *p++ = (char)m->n_headers;
    *p++ = (char)(m->n_headers >> 8);
    for (size_t i = 0; i < m->n_headers; i++) {
        size_t nl = strlen(m->headers[i].name);
        *p++ = (char)nl;
        memcpy(p, m->headers[i].name, nl);
        put_u32(p + nl, (uint32_t)m->headers[i].value_len);
        if (m->headers[i].value_len > 0)
            memcpy(p + nl + 4, m->headers[i].value, m->headers[i].value_len);
        p += nl + 4 + m->headers[i].value_len;
    }
}

/* The end of a block of n headers at p, or NULL when one runs past end. */
static const char *hdr_block_end(const char *p, const char *end, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (end - p < 5 || (size_t)(end - p) < 5 + (size_t)(unsigned char)p[0])
            return NULL;
        size_t nl = (unsigned char)p[0];
        uint32_t vl = get_u32(p + 1 + nl);
        if ((size_t)(end - p) - 5 - nl < vl)
            return NULL;
        p += 5 + nl + vl;
    }
    return p;
}

const char *kb_frame_event_read(const char *p, const char *end, bool with_headers,
                                kb_frame_event *ev)
{
    /* Each bound subtracts from left only what is known to fit, so none
     * wraps where size_t is 32 bits wide. */
    size_t left = (size_t)(end - p);
    if (left < 8)
        return NULL;
    uint32_t klen = get_u32(p);
    if (klen > left - 8)
        return NULL;
    uint32_t plen = get_u32(p + 4 + klen);
    if (plen > left - 8 - klen)
        return NULL;
    const char *after = p + 8 + (size_t)klen + plen;
    ev->key = p + 4;
    ev->key_len = klen;
    ev->payload = p + 8 + klen;
    ev->payload_len = plen;
    ev->header_block = NULL;
    ev->n_headers = 0;
    if (!with_headers)
        return after;
    if (end - after < 2)
        return NULL;
    uint32_t nh = (uint32_t)(unsigned char)after[0] | (uint32_t)(unsigned char)after[1] << 8;
    const char *next = hdr_block_end(after + 2, end, nh);
    if (next == NULL)
        return NULL;
    ev->header_block = after + 2;
    ev->n_headers = nh;
    return next;
}

int kb_frame_event_headers(const kb_frame_event *ev, kb_header *out, size_t max, char *names)
{
    if (ev->n_headers > max)
        return -1;
    const char *q = ev->header_block;
    for (uint32_t i = 0; i < ev->n_headers; i++) {
        size_t nl = (unsigned char)q[0];
        if (nl == 0 || nl > KB_MAX_HEADER_NAME)
            return -1;
        char *name = names + (size_t)i * (KB_MAX_HEADER_NAME + 1);
        memcpy(name, q + 1, nl);
        name[nl] = '\0';
        out[i] = (kb_header){name, q + 5 + nl, get_u32(q + 1 + nl)};
        q += 5 + nl + out[i].value_len;
    }
    return (int)ev->n_headers;
}
