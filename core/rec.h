/* Event records: one allocation holding an event's key, payload and transport
 * ID, recycled through per-thread magazines so the hot path does not allocate
 * for events up to a few hundred bytes. */
#ifndef KB_CORE_REC_H
#define KB_CORE_REC_H

#include <stddef.h>
#include <stdint.h>

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

/* A record with room for `data_len` bytes; NULL on out of memory. Thread: any. */
kb_rec *kb__rec_alloc(size_t data_len);

/* Return a record for reuse. Thread: any. */
void kb__rec_free(kb_rec *r);

#endif /* KB_CORE_REC_H */
