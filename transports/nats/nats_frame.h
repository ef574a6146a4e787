/* The frame layout (several events of one partition in one message): reading
 * and writing it. Helpers on bytes and nats.c messages only. */
#ifndef KB_TRANSPORTS_NATS_FRAME_H
#define KB_TRANSPORTS_NATS_FRAME_H

#include "nats_types.h"

/* A frame's events are kb_frame_event_read's (version 2: with their header
 * block). */
typedef struct kb_nats_frame {
    const char *p, *end;
    uint32_t left;                 /* events not yet read */
    int version;                   /* 1, or 2 with Kb-Frame: 2 */
} kb_nats_frame;
/* Check a frame whose Kb-Batch header is `count` (and its Kb-Frame version);
 * -1 with *why when malformed. */
int kb__nats_frame_open(natsMsg *m, const char *count, kb_nats_frame *f, const char **why);
/* The next event of a checked frame; false at its end. */
static inline bool kb__nats_frame_next(kb_nats_frame *f, kb_frame_event *ev)
{
    const char *next =
        f->left > 0 ? kb_frame_event_read(f->p, f->end, f->version == 2, ev) : NULL;
    if (next == NULL || ev->key_len == 0)   /* an event of a frame has a key */
        return false;
    f->p = next;
    f->left--;
    return true;
}
/* Events in a message: its Kb-Batch count, or 1. */
uint32_t kb__nats_events_in(natsMsg *m);

#endif /* KB_TRANSPORTS_NATS_FRAME_H */
