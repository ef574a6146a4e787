/* The frame layout (several events of one partition in one message): reading
 * and writing it. Helpers on bytes and nats.c messages only. */
#ifndef KB_TRANSPORTS_NATS_FRAME_H
#define KB_TRANSPORTS_NATS_FRAME_H

#include "nats_types.h"

typedef struct kb_nats_event {
    const char *key, *payload;
    size_t key_len, payload_len;
    const char *hdrs;              /* version 2: the entry's header block */
    uint32_t nh;                   /* headers in it */
} kb_nats_event;
typedef struct kb_nats_frame {
    const char *p, *end;
    uint32_t left;                 /* events not yet read */
    int version;                   /* 1, or 2 with Kb-Frame: 2 */
} kb_nats_frame;
/* Check a frame whose Kb-Batch header is `count` (and its Kb-Frame version);
 * -1 with *why when malformed. */
int kb__nats_frame_open(natsMsg *m, const char *count, kb_nats_frame *f, const char **why);
bool kb__nats_frame_next(kb_nats_frame *f, kb_nats_event *ev);
/* Events in a message: its Kb-Batch count, or 1. */
uint32_t kb__nats_events_in(natsMsg *m);
/* Bytes of m's frame entry (version 2: with its header block). */
size_t kb__nats_entry_size(const kb_msg *m, bool v2);
/* Write m's entry at p (kb__nats_entry_size bytes). */
void kb__nats_entry_put(char *p, const kb_msg *m, bool v2);

#endif /* KB_TRANSPORTS_NATS_FRAME_H */
