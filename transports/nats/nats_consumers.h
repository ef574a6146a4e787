/* The JetStream consumers of claims: what earlier consumers of a partition
 * left (floor, deliveries, acks above the floor, progress), a new consumer per
 * claim made from it, and the earlier ones deleted. Called by the lease
 * thread only. */
#ifndef KB_TRANSPORTS_NATS_CONSUMERS_H
#define KB_TRANSPORTS_NATS_CONSUMERS_H

#include "nats_types.h"

/* A topic's consumers as one lease round sees them: their names (the meta
 * leader's list, answered without asking each consumer's leader), and the
 * state of those a claim needs, read one by one when first needed. */
typedef struct kb_nats_listing {
    jsConsumerNamesList *names;
    bool listed;
    jsConsumerInfo **info;         /* per name; NULL: not read (yet) */
    /* a probe takes what it pulls, so the same consumer probed again for the
     * next partition would answer short: once per listing */
    const jsConsumerInfo *probed;
    bool probe_ok;
    uint64_t *pending;
    uint32_t npending;
    /* the stream's last sequence, for a new group starting at the latest:
     * read once per listing (0 unknown, 1 read, -1 could not be read) */
    int last_state;
    uint64_t last_seq;
} kb_nats_listing;

/* The names, once per round; false (logged) when the server did not answer. */
bool kb__nats_listing_load(kb_transport *t, kb_nats_topic *tp, kb_nats_listing *l);
void kb__nats_listing_free(kb_nats_listing *l);
/* Does the listing hold a partition consumer (wide: a wide one) of the group? */
bool kb__nats_listing_has(const kb_transport *t, const kb_nats_listing *l, bool wide);

/* One consumer to create for claim c. */
typedef struct kb_nats_opening {
    kb_nats_claim *c;
    jsConsumerConfig cc;
    char desc[32 + 22 * KB_NATS_MARKS];
    char filter[KB_NATS_NAME];
    bool retried;                  /* its name was tried before, unanswered */
    /* prepared to take over from this live wide claim while it goes on (a
     * split, nats_lease.c): without its progress record or delivery mark */
    kb_nats_claim *split_of;
    uint32_t leases_ended;         /* its partitions' count when it was prepared */
    bool claimed;                  /* made, and its claim took over */
    bool handled;                  /* the lease thread saw how its creation went */
    natsStatus s;
    jsErrCode jerr;
    char why[128];                 /* not made: the server's or nats.c's reason */
    int64_t took_ns;               /* its creation's round trip */
    /* made, but its consumer had no leader yet (the answer to a creation
     * asked again: the server answers from the assignment at once) */
    bool leaderless;
    _Atomic bool made;             /* its call returned: s, jerr, took_ns, leaderless are set */
} kb_nats_opening;

/* Can a claim of p (wide: of its whole topic) start: has the state of every
 * earlier consumer covering it been read? False while one cannot be (its
 * leader being elected): the claim waits for the next round, so that nothing
 * acked is handled again — until it has stayed unreadable for a lease TTL;
 * then the claim starts without it (what it acked above the others' floor
 * comes again: duplicates, never a gap). */
bool kb__nats_earlier_readable(kb_transport *t, kb_nats_part *p, bool wide, kb_nats_listing *l);
/* Fill o for its claim: it starts after the highest floor of the earlier
 * consumers covering its partitions, carries their deliveries and progress,
 * and settles without a handler what they acked above it. */
void kb__nats_opening_prepare(kb_transport *t, kb_nats_opening *o, kb_nats_listing *l);
/* Consumer calls in flight, on threads of their own (at most 16 per batch):
 * a replicated consumer takes the server a few hundred milliseconds to create
 * (its own Raft group), so claims made one after the other would cost their
 * sum, and a lease thread that waited for them could not hand over or take
 * a lease meanwhile. */
typedef struct kb_nats_calls kb_nats_calls;
/* Have the calls all returned? (NULL: none was started.) */
bool kb__nats_calls_done(kb_nats_calls *b);
/* Join a finished batch's threads and free it; a deletion batch's progress
 * records are deleted too. NULL: nothing. */
void kb__nats_calls_end(kb_nats_calls *b);
/* Start creating the consumers of n openings (n > 0), which must stay put
 * until the batch is done; each o->s says how its creation went once o->made
 * (each on its own: one slow creation holds up no other claim). NULL on out
 * of memory (no creation made). */
kb_nats_calls *kb__nats_consumers_start(kb_transport *t, kb_nats_opening *o, size_t n);
/* Start deleting the earlier consumers the claims that took over carry on
 * (partition ones of their partitions; for a wide claim, the earlier wide
 * ones), and those made for claims that did not take over; the listing must
 * stay until the batch ends. NULL when there are none. */
kb_nats_calls *kb__nats_consumers_retire(kb_transport *t, kb_nats_topic *tp, kb_nats_listing *l,
                                         const kb_nats_opening *o, size_t n);
/* Delete the topic's wide consumers once every partition has its own. */
void kb__nats_wide_retire(kb_transport *t, kb_nats_topic *tp);

/* After a reconnect: does the server still hold each claim's consumer as it
 * was? Acks it lost are sent again; a consumer that came back unusable is
 * reset (a new claim next round). Asked in parallel, as creations are, 16 at
 * a time, each waiting a round's wait at most: a consumer whose leader is
 * being elected holds up no other. No batch starts after `until` (a held
 * lease falls due). False when the server could not say for one, or one was
 * not asked (they are all asked again next round). */
bool kb__nats_claims_renudge(kb_transport *t, kb_nats_claim **claims, size_t n, int64_t until,
                             void (*idle)(kb_transport *t));

#endif /* KB_TRANSPORTS_NATS_CONSUMERS_H */
