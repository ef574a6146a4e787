/* Event headers (kb_header) on NATS messages and in frames. */
#ifndef KB_TRANSPORTS_NATS_HDR_H
#define KB_TRANSPORTS_NATS_HDR_H

#include "nats_frame.h"

typedef struct kb_nats_hdrs {
    kb_header h[KB_MAX_HEADERS];
    size_t n;
    char names[KB_MAX_HEADERS][KB_MAX_HEADER_NAME + 1];
    char *vals;                    /* values decoded from base64 */
    size_t cap;
} kb_nats_hdrs;
/* Bytes the headers take on a message (header lines and Kb-Headers). */
size_t kb__nats_hdr_len(const kb_header *h, size_t n);
int kb__nats_hdr_set(natsMsg *m, const kb_header *h, size_t n);
/* Headers of a message (keybus's, or another client's other than Kb-* and
 * Nats-*, by name), checked against the limits; -1 with *why when malformed.
 * They point into m and out. */
int kb__nats_hdr_get(const kb_transport *t, natsMsg *m, kb_nats_hdrs *out, const char **why);
/* The same for one event of a version 2 frame (the block is checked). */
int kb__nats_hdr_frame(const kb_transport *t, const kb_frame_event *ev, kb_nats_hdrs *out,
                       const char **why);
void kb__nats_hdrs_free(kb_nats_hdrs *h);

#endif /* KB_TRANSPORTS_NATS_HDR_H */
