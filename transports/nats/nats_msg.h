/* Message plumbing: numbers and base64 without snprintf, the key header, the
 * $JS.ACK reply subject, copies of messages. Helpers on nats.c messages only. */
#ifndef KB_TRANSPORTS_NATS_MSG_H
#define KB_TRANSPORTS_NATS_MSG_H

#include "nats_types.h"

/* v in decimal at out (room for 21 bytes), NUL-terminated; returns its length.
 * No snprintf: it runs per message and per event. */
size_t kb__nats_put_u64(char *out, uint64_t v);
/* Base64 of len bytes at out (4 * ceil(len / 3) + 1 bytes); returns its length. */
size_t kb__nats_b64_encode(const void *src, size_t len, char *out);
/* Decoded length, -1 when malformed, -2 when over cap. */
long kb__nats_b64_decode(const char *v, size_t n, char *buf, size_t cap);
/* A stream sequence as text (a dead letter's ID): 1 to 20 decimal digits, not
 * 0, within 64 bits; false otherwise. */
bool kb__nats_seq_parse(const char *s, uint64_t *out);
int kb__nats_set_key(natsMsg *m, const void *key, size_t len);
/* Bytes of the header line kb__nats_set_key writes for this key. */
size_t kb__nats_key_hdr_len(const void *key, size_t len);
/* Key of a message into buf (cap bytes); length, or -1 with *why set. */
int kb__nats_get_key(natsMsg *m, char *buf, size_t cap, const char **why);
/* Fields of a $JS.ACK reply subject. */
typedef struct kb_nats_meta {
    char consumer[176];
    uint64_t delivered, sseq;
    uint64_t dseq;        /* the consumer's delivery sequence: +1 per delivery */
} kb_nats_meta;
/* 0, or -1 when `reply` is not a $JS.ACK subject (a status reply). */
int kb__nats_parse_ack(const char *reply, kb_nats_meta *out);
/* The ack subject of stream sequence sseq, delivery dseq, of a consumer
 * ($JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>:
 * the server reads only the consumer, sseq and dseq) into subj (cap bytes);
 * false when too long. */
bool kb__nats_ack_subject(char *subj, size_t cap, const char *stream, const char *consumer,
                          uint64_t sseq, uint64_t dseq);
natsMsg *kb__nats_msg_clone(natsMsg *m);
/* The value of JSON string field `name` (at most 12 characters) in d, a
 * JetStream API reply, or NULL: only for fields that hold no escapes
 * (subjects, base64, names). Not NUL-terminated: *len says its length. */
const char *kb__nats_json_str(const char *d, const char *name, size_t *len);

#endif /* KB_TRANSPORTS_NATS_MSG_H */
