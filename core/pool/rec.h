/* Event records: one allocation holding an event's key, payload and transport
 * ID, recycled through per-thread magazines so the hot path does not allocate
 * for events up to a few hundred bytes. */
#ifndef KB_CORE_REC_H
#define KB_CORE_REC_H

#include <ck_stack.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <keybus/transport.h>

#include "sync.h"

struct kb_topic;

typedef struct kb_rec {
    struct kb_topic *topic;
    void       *cookie;           /* transport's delivery handle */
    const char *dead_reason;      /* static text, set when the handler gives up */
    int64_t     born_ns;          /* published or received (kb__metrics_stamp; 0: not kept) */
    uint32_t    key_len;
    uint32_t    payload_len;
    uint32_t    partition;
    uint32_t    first_attempt;    /* the transport's attempt when it arrived */
    uint16_t    id_len;
    uint8_t     size_class;       /* magazine class, or KB_REC_EXACT */
    uint8_t     n_headers;        /* their block follows the ID's NUL (headers.h) */
    uint8_t     flags;            /* the delivery's KB_DELIVERY_F_* */
    char        data[];           /* key, payload, id, NUL, headers */
} kb_rec;

#define KB_REC_EXACT 0xff

static inline const char *kb__rec_key(const kb_rec *r) { return r->data; }
static inline const char *kb__rec_payload(const kb_rec *r) { return r->data + r->key_len; }
static inline const char *kb__rec_id(const kb_rec *r)
{
    return r->data + r->key_len + r->payload_len;
}
static inline const char *kb__rec_headers(const kb_rec *r)
{
    return kb__rec_id(r) + r->id_len + 1;
}

/* ---- magazines (rec.c); their fast paths are inline: a call per record on
 * both sides of every event cost more than the pop or push itself ---- */

/* Size classes of 128, 512 and 2048 bytes (record included). */
#define KB_REC_CLASSES 3
#define KB_REC_MAG_SIZE 256

struct kb_magazine {
    ck_stack_entry_t link;          /* first: the stack entry is the magazine */
    uint32_t n;
    kb_rec *r[KB_REC_MAG_SIZE];
};

/* This thread's magazine per class (NULL: none yet). */
extern _Thread_local struct kb_magazine *kb__rec_loaded[KB_REC_CLASSES];

/* The class of a record of `bytes` in all, or KB_REC_CLASSES: too large for any. */
static inline unsigned kb__rec_class(size_t bytes)
{
    return bytes <= 128 ? 0 : bytes <= 512 ? 1 : bytes <= 2048 ? 2 : KB_REC_CLASSES;
}

/* kb__rec_alloc and kb__rec_free when this thread's magazine is empty
 * (or full), or the record has no class. */
struct kb_rec *kb__rec_alloc_slow(size_t data_len);
void kb__rec_free_slow(kb_rec *r);

/* A record with room for `data_len` bytes; NULL on out of memory. Thread: any. */
static inline kb_rec *kb__rec_alloc(size_t data_len)
{
    unsigned cls = kb__rec_class(sizeof(kb_rec) + data_len);
    struct kb_magazine *m;
    if (cls == KB_REC_CLASSES || (m = kb__rec_loaded[cls]) == NULL || m->n == 0)
        return kb__rec_alloc_slow(data_len);
    kb_rec *r = m->r[--m->n];
    /* These records were last written on another core: start the ownership
     * transfer a few events before we fill them (every class spans two lines
     * at least). */
    if (m->n >= 4) {
        char *next = (char *)m->r[m->n - 4];
        __builtin_prefetch(next, 1);
        __builtin_prefetch(next + KB_CACHELINE, 1);
    }
    r->size_class = (uint8_t)cls;
    return r;
}

/* Return a record for reuse. Thread: any. */
static inline void kb__rec_free(kb_rec *r)
{
    struct kb_magazine *m;
    if (r == NULL || r->size_class >= KB_REC_CLASSES ||
        (m = kb__rec_loaded[r->size_class]) == NULL || m->n == KB_REC_MAG_SIZE) {
        kb__rec_free_slow(r);
        return;
    }
    m->r[m->n++] = r;
}

/* A record holding key, payload, the ID (id_len bytes and a NUL) and the
 * packed headers (checked by the caller), from `topic`, stamped `born_ns`;
 * NULL on out of memory. Always inlined: a local publish, which has no ID
 * and mostly no headers, then copies nothing for them. */
static inline __attribute__((always_inline)) kb_rec *
kb__rec_new(struct kb_topic *topic, int64_t born_ns, const void *key, size_t key_len,
            const void *payload, size_t payload_len, const char *id, size_t id_len,
            const kb_header *headers, size_t n_headers)
{
    size_t headers_size = n_headers ? kb_headers_packed_size(headers, n_headers) : 0;
    kb_rec *r = kb__rec_alloc(key_len + payload_len + id_len + 1 + headers_size);
    if (r == NULL)
        return NULL;
    r->topic = topic;
    r->cookie = NULL;
    r->dead_reason = NULL;
    r->born_ns = born_ns;
    r->key_len = (uint32_t)key_len;
    r->payload_len = (uint32_t)payload_len;
    r->partition = 0;
    r->first_attempt = 1;
    r->flags = 0;
    r->id_len = (uint16_t)id_len;
    r->n_headers = (uint8_t)n_headers;
    memcpy(r->data, key, key_len);
    if (payload_len > 0)
        memcpy(r->data + key_len, payload, payload_len);
    memcpy(r->data + key_len + payload_len, id, id_len);
    r->data[key_len + payload_len + id_len] = '\0';
    if (n_headers > 0)
        kb_headers_pack(r->data + key_len + payload_len + id_len + 1, headers, n_headers);
    return r;
}

#endif /* KB_CORE_REC_H */
