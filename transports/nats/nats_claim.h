/* Claims (one ownership period of one partition, its own consumer) and their
 * completion frontiers; the bus's ack, release and still_owned hooks. */
#ifndef KB_TRANSPORTS_NATS_CLAIM_H
#define KB_TRANSPORTS_NATS_CLAIM_H

#include "nats_msg.h"
#include "nats_types.h"

/* A claim of partition p, or with `wide` of all of p's topic (p is then
 * partition 0); NULL on out of memory. Lease thread. */
/* The consumer name of a claim of p (wide: of its topic) at lease revision rev. */
void kb__nats_claim_name(const kb_transport *t, const kb_nats_part *p, bool wide, uint64_t rev,
                         char *buf, size_t len);
/* The revision a new claim of p (wide: of its topic) is named after: the
 * lease's, or the newest claim's when its consumer's creation went
 * unanswered (the same name is tried again). Thread: the lease thread. */
uint64_t kb__nats_claim_rev(const kb_nats_part *p, bool wide);
kb_nats_claim *kb__nats_claim_new(kb_transport *t, kb_nats_part *p, uint64_t rev, bool wide);
/* Stop feeding a claim and wake the lease thread, which starts a fresh one
 * if it still holds the lease. */
void kb__nats_claim_reset(kb_transport *t, kb_nats_claim *c);
/* Ack the finished prefix of the claim's frontier (AckAll), keep a long
 * handler's message from redelivery, free the ring of a finished fenced
 * claim. The acker thread, or close once the acker has stopped. */
void kb__nats_claim_ack(kb_transport *t, kb_nats_claim *c, int64_t now);
/* Send the claim's last AckAll again (the server lost it in a restart), with
 * a delivery sequence above the server's ack floor's server_dseq; false
 * when it could not be sent. The lease thread. */
bool kb__nats_claim_reack(kb_transport *t, kb_nats_claim *c, uint64_t server_dseq);
/* A redelivery of stream sequence meta->sseq (at most the highest the claim
 * was delivered): true when the claim acked it (to be acked again); else
 * its entry takes the newer delivery sequence for its ack. The feeder, which
 * alone moves the tail. */
bool kb__nats_claim_redelivered(kb_nats_claim *c, const kb_nats_meta *meta);
/* Was sseq acked by an earlier consumer (skip_to, keep)? Then it comes to
 * this claim only because the claim starts at the floor below it. */
bool kb__nats_claim_skips(const kb_nats_claim *c, uint64_t sseq);
/* Ask the server to redeliver now whatever consumer `consumer` holds
 * unacked between stream sequences from and to: a NAK per sequence with
 * the consumer's last delivery sequence dseq (the server checks only that
 * it is in range, and ignores sequences it does not hold), queued on the
 * consumer's connection (kb__nats_feed_conn). Nothing when the range is
 * over KB_NATS_NAK_MAX (AckWait redelivers them then). False unless every
 * NAK was queued. */
#define KB_NATS_NAK_MAX (1u << 20)
bool kb__nats_nak_range(kb_transport *t, const char *stream, const char *consumer, uint64_t from,
                        uint64_t to, uint64_t dseq);
/* kb__nats_claim_ack and the progress record for every claim of the topic
 * (the acker thread; `last`: close, after it). */
void kb__nats_ack_topic(kb_transport *t, kb_nats_topic *tp, int64_t now, bool last);
/* Did a claim of this process covering partition n ack up to seq? */
bool kb__nats_acked_to(const kb_nats_topic *tp, uint32_t n, uint64_t seq);
/* Is every claim that covered partition p finished (handled, acked, freed),
 * but wide claim `but` (NULL: none; one p moved out of early goes on)? */
bool kb__nats_claims_done(const kb_nats_part *p, const kb_nats_claim *but);
/* Free every claim of the topic (close). */
void kb__nats_claims_free(kb_nats_topic *tp, uint32_t partitions);
/* Deliveries of stream sequence sseq so far: this consumer's count plus one
 * per earlier consumer of the partition that delivered it. */
uint32_t kb__nats_attempt(const kb_nats_claim *c, uint64_t sseq, uint64_t delivered);
/* One event of the entry is finished with; the last one settles the entry,
 * done only when none was released unhandled. */
void kb__nats_settle(kb_nats_entry *e, bool done);
/* The bus's hooks (executor threads). */
int kb__nats_ack(kb_transport *t, const kb_delivery *d);
void kb__nats_release(kb_transport *t, const kb_delivery *d);
int kb__nats_still_owned(kb_transport *t, const kb_delivery *d);

/* Is partition claim c one that took over from a wide claim (a split) that
 * stopped before it had handled what it was given up to the cut? Then c
 * must stop too: the wide claim's released events come again only from the
 * floors. */
bool kb__nats_claim_orphaned(const kb_nats_claim *c);
/* Has wide claim w handled everything it fed of c's partition (up to c's
 * cut, which the feeder has set)? */
bool kb__nats_claim_cut_passed(const kb_nats_claim *c, const kb_nats_claim *w);

/* The live wide claim partition p was split from (nats_lease.c, "Split") or
 * moved out of early ("Early move"), which partition 0 still pulls and
 * bridges for when it left itself; NULL when there is none. The feeder
 * (p->split_to is its own). */
kb_nats_claim *kb__nats_split_wide(kb_transport *t, const kb_nats_part *p, int64_t now);

/* Is claim c fenced? One whose lease ran out locally (the lease thread
 * blocked past it) is fenced here, and the lease thread woken. Feeder. */
bool kb__nats_claim_fenced(kb_transport *t, kb_nats_claim *c, int64_t now);

#endif /* KB_TRANSPORTS_NATS_CLAIM_H */
