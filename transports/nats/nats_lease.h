/* Partition leases and membership. The bus's entry points (bucket, lease
 * thread, kick, release at close), then the steps of a lease round that the
 * lease thread (nats_leaser.c) runs from nats_lease.c. */
#ifndef KB_TRANSPORTS_NATS_LEASE_H
#define KB_TRANSPORTS_NATS_LEASE_H

#include "nats_kv.h"
#include "nats_types.h"

/* The lease KV bucket into *out (when not NULL), bound once per bus. With
 * `leases` (subscribe) it is created when missing and nats.lease_ttl_ms is
 * applied to it once: KB_ETRANSPORT naming both TTLs when the server refuses.
 * Without (a read: the owner in partition stats) nothing is created:
 * KB_ENOTFOUND when there is no bucket. Thread: any. */
int kb__nats_lease_bucket(kb_transport *t, bool leases, kvStore **out);
/* Start the lease thread; it runs until t->closing is set and t->lease_wake
 * notified, then sets t->leaser_done. */
int kb__nats_leaser_start(kb_transport *t, char *errstr, size_t errlen);
/* Delete this process's member keys and leases (close, after the lease
 * thread stopped and the last acks went out), by the deadline. */
void kb__nats_lease_release_all(kb_transport *t, int64_t deadline);

/* A round's acquisitions: they stop at `until`, or once the server left a
 * request unanswered (stalled: the next round comes soon). */
typedef struct kb_nats_round {
    int64_t until;
    bool stalled;
    bool again;     /* a claim waits on the server: the next round comes soon */
    int64_t held_until;   /* free leases are taken from then on (0: now) */
    void (*idle)(kb_transport *t);   /* runs while the round waits on consumers */
} kb_nats_round;

/* Which partitions of the topic this process should own, from the roster
 * (corrected by what the watch saw); unknown roster: keep what it has. */
void kb__nats_members_rank(kb_transport *t, kb_nats_topic *tp, const kb_nats_roster *r);
/* The outcome of a lease's renewal; *unanswered set when the server left it
 * without an answer. */
void kb__nats_lease_renewed(kb_transport *t, kb_nats_part *p, natsStatus s, uint64_t rev,
                            int64_t started, bool *unanswered);
/* Every current claim takes its lease's new local expiry. */
void kb__nats_claims_validity(kb_transport *t);
/* Hand over or drop what the partition holds and no longer wants; true while
 * a hand-over waits for its handlers and acks (*feed_down: the acks'
 * connection did not answer; no more waiting on it this round). */
bool kb__nats_part_keep(kb_transport *t, kb_nats_part *p, bool *feed_down);
/* Take the topic's wanted leases and start making their claims' consumers. */
void kb__nats_topic_take(kb_transport *t, kb_nats_topic *tp, kb_nats_round *rd);
/* Claims whose consumers were made take over their partitions (those whose
 * lease ended or that rank elsewhere meanwhile are dropped), and the
 * consumers they replace are deleted. True when a creation finished; *again
 * when one failed (the next round should come soon). Every few milliseconds
 * while t->making is not NULL. */
bool kb__nats_making_collect(kb_transport *t, bool *again);
/* At the lease thread's end: wait for the calls in flight; nothing made is
 * published. */
void kb__nats_making_end(kb_transport *t);
/* After a reconnect, every claim's consumer asked once. */
void kb__nats_renudge_all(kb_transport *t, kb_nats_round *rd);

#endif /* KB_TRANSPORTS_NATS_LEASE_H */
