/* The feeder thread's state and the parts of it that read from the stream
 * itself (nats_reread.c): deliveries lost on the wire read again, and the
 * bridge, which reads a partition while its consumer has no leader: they
 * read, nats_consume.c hands on. Every function here runs on the feeder
 * thread only. */
#ifndef KB_TRANSPORTS_NATS_FEEDER_H
#define KB_TRANSPORTS_NATS_FEEDER_H

#include "nats_hdr.h"
#include "nats_msg.h"
#include "nats_types.h"

typedef struct kb_nats_feeder {
    kb_transport *t;
    /* subscribed topics by the hash of their name (open addressing) */
    kb_nats_topic **by_name;
    uint32_t slots, known;
    kb_nats_topic **by_id;
    char *key;               /* decoded key buffer */
    size_t key_cap;
    kb_nats_hdrs hdrs;       /* the current event's headers */
    uint32_t serial;         /* of pull requests, for every claim: a late status for an
                                earlier claim's request never matches a newer one's */
    int64_t refill_off_until; /* a read of the stream went unanswered: none till then */
    int64_t refill_window;    /* the second whose refill time is counted ... */
    int64_t refill_spent;     /* ... and that time, ns */
    bool refilling;           /* the message handled now was read again: no pull's */
    bool bridging;            /* ... or read from the stream, never delivered */
    /* a time by which the inbox was read through: whatever the servers sent
     * before it (a heartbeat) was read, so a pull whose deadline came earlier
     * was lost, not queued behind a busy feeder. Seen empty, or the messages
     * queued at a scan (mark_left of them, at mark_ns) all read since. */
    int64_t empty_ns;
    int64_t mark_ns;
    int mark_left;
} kb_nats_feeder;

/* A message the bridge read, for the feeder to hand on as a delivery. */
typedef struct kb_nats_bridged {
    natsMsg *msg;            /* NULL: nothing to hand on; else the caller's */
    kb_nats_meta meta;       /* delivery 0 of the claim's consumer */
    kb_nats_claim *claim;
    long part;               /* its partition; -1: another subject (a wide claim's) */
    const char *last;        /* its subject's last token (in msg) */
} kb_nats_bridged;

/* Deliveries lost on the wire, read again: n messages (the caller's, as the
 * two arrays), in stream order. */
typedef struct kb_nats_refilled {
    natsMsg **msg;
    uint64_t *seq;
    uint64_t n;
    bool unnumbered;         /* their delivery sequences are not known: 0 */
} kb_nats_refilled;

/* nats_reread.c: the bridge */
/* c's pull was lost (or answered "no responders"): read its partition from
 * the stream until the consumer delivers again. */
void kb__nats_bridge_start(kb_transport *t, kb_nats_claim *c, int64_t now);
/* The consumer has caught up with the bridge (a message past what it read,
 * a heartbeat, a 404, or a 408 of a request that brought nothing). */
void kb__nats_bridge_end(kb_nats_claim *c);
/* Ask for the partition's next message when due and there is room. */
void kb__nats_bridge(kb_nats_feeder *f, kb_nats_claim *c, int64_t now);
/* Is m an answer to a bridge read? Then *out says what it brought (the
 * caller keeps m either way). */
bool kb__nats_bridge_reply(kb_nats_feeder *f, natsMsg *m, kb_nats_bridged *out);

/* nats_reread.c: deliveries lost on the wire */
/* Read the deliveries before meta's that never arrived again from the
 * stream, into *out for the caller to hand on; NULL when read, else why not
 * (nothing in *out: the caller then calls kb__nats_lost_in_transit). */
const char *kb__nats_refill(kb_nats_feeder *f, kb_nats_claim *c, const kb_nats_meta *meta,
                            kb_nats_refilled *out);
/* Stop the claim at what it had and restart the partition from its ack
 * floor with a new consumer (logged with `why`). */
void kb__nats_lost_in_transit(kb_nats_feeder *f, kb_nats_claim *c, const kb_nats_meta *meta,
                              const char *why);
/* c's gap a redelivery showed stayed open GAP_OPEN_MAX_MS (nothing came past
 * it): restart the partition from its ack floor, as kb__nats_lost_in_transit. */
void kb__nats_gap_left_open(kb_nats_feeder *f, kb_nats_claim *c);

#endif /* KB_TRANSPORTS_NATS_FEEDER_H */
