/* Dead letters: storing them (the bus's dead_letter hook, and events that
 * never reach a handler), listing and replaying them. */
#ifndef KB_TRANSPORTS_NATS_DLQ_H
#define KB_TRANSPORTS_NATS_DLQ_H

#include "nats_hdr.h"
#include "nats_types.h"

/* One event (or an unreadable message) to the dead letters; orig_id is the
 * delivery ID: the stream sequence, ".<n>" for the n-th event of a frame. */
typedef struct kb_nats_dead {
    const char *orig_subject, *orig_id;
    const void *key, *payload;    /* payload NULL, payload_len > 0: a body not copied (over
                                   * the limits): stored as its size, like one omitted */
    size_t key_len, payload_len;
    const kb_header *headers;
    size_t n_headers;
    uint32_t partition, attempts;
    const char *reason;
} kb_nats_dead;
/* KB_ETIMEDOUT when the server did not answer, another error when it refused. */
int kb__nats_dlq_publish(kb_transport *t, kb_nats_topic *tp, const kb_nats_dead *d);
/* Settle an event after its dead letter was tried (rc from dlq_publish). A
 * dead letter the server refused is lost, and the partition moves on: a retry
 * would be refused again and hold the partition for ever (a poison frame).
 * KB_ETIMEDOUT (no answer): the claim is reset and the event comes again,
 * with its attempt count, straight to the dead letters. */
void kb__nats_dlq_settle(kb_transport *t, kb_nats_entry *e, int rc);
/* The bus's hooks. */
int kb__nats_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason);
#define KB_NATS_DLQ_KEY_CAP 65536   /* a dead letter's key, read back: any header holds it */
/* A message of the dead-letter subject as kb_dead_letter, its Kb-* headers
 * range-checked (anyone may publish there): key read into `key`
 * (KB_NATS_DLQ_KEY_CAP bytes), headers into h; strings point into m, key, h.
 * Pure (tests/fuzz/fuzz_nats_frame.c). */
kb_dead_letter kb__nats_dead_letter_of(const kb_transport *t, natsMsg *m, const char *id,
                                      char *key, kb_nats_hdrs *h);
int kb__nats_dead_letters(kb_transport *t, kb_nats_topic *tp, const char *after_id, size_t max,
                          kb_dead_letter_fn fn, void *opaque);
int kb__nats_dead_letter_replay(kb_transport *t, kb_nats_topic *tp, const char *id);
int kb__nats_dead_letter_delete(kb_transport *t, kb_nats_topic *tp, const char *id);

#endif /* KB_TRANSPORTS_NATS_DLQ_H */
