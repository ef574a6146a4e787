/* The lease bucket (a JetStream KV bucket) as the lease thread uses it:
 * pipelined puts and reads, the member roster, a lease key's holder. Every
 * call waits at most a round's wait (kb__nats_round_wait_ms): none creates a
 * consumer, so none waits on a node that is gone. */
#ifndef KB_TRANSPORTS_NATS_KV_H
#define KB_TRANSPORTS_NATS_KV_H

#include "nats_types.h"

/* How long the lease thread waits for one answer of the server: a sixth of
 * the TTL, at most nats.c's own 5 s. */
int kb__nats_round_wait_ms(const kb_transport *t);

/* One operation of a pipelined batch: a put of `key` (a lease's on revision
 * `expect`, 0 creating it; a member heartbeat when p is NULL), or with `get`
 * a read of its last value. */
typedef struct kb_nats_kv_op {
    char key[2 * KB_NATS_NAME];
    kb_nats_part *p;
    uint64_t expect;
    bool get;
    /* NATS_OK; NATS_ERR: a put refused (wrong revision); NATS_NOT_FOUND: a
     * read of a key that is absent or deleted; else unanswered */
    natsStatus s;
    uint64_t rev;                  /* the key's (new) revision; a delete's, 0 when absent */
    bool ours;                     /* a read: the value is this process's name */
    bool this_bus;                 /* a read: the value was put by this very bus */
} kb_nats_kv_op;

typedef struct kb_nats_kv_ops {
    kb_nats_kv_op *v;
    size_t n, cap;
    int64_t sent_ns;               /* when kb__nats_kv_run sent them (monotonic) */
} kb_nats_kv_ops;

/* Append one operation (NULL on out of memory); free the batch's v. */
kb_nats_kv_op *kb__nats_kv_add(kb_nats_kv_ops *ops, const char *key, kb_nats_part *p,
                               uint64_t expect, bool get);
/* Did the bucket answer it (stored, or refused: not left unanswered)? */
bool kb__nats_kv_answered(const kb_nats_kv_op *k);
/* Fill k's answer (s, rev, ours, this_bus) from the bucket's reply m to it.
 * The reply may come from anyone who can publish to the inbox, the value and
 * headers from anyone who can write the bucket. */
void kb__nats_kv_reply(const kb_transport *t, kb_nats_kv_op *k, natsMsg *m);
/* Send every operation at once and collect the replies on one inbox until
 * all came or a round's wait passed: one wait for the whole batch instead of
 * a round trip per key. A renewal left unanswered is remembered for a TTL:
 * its answer, when it comes in a later batch, still renews the lease.
 * Thread: the lease thread. */
void kb__nats_kv_run(kb_transport *t, kb_nats_kv_ops *ops);
/* Read the answers to earlier rounds' renewals that came since (a renewal
 * stored renews its lease from when it was sent), before a round reads
 * the leases' revisions. Thread: the lease thread. */
void kb__nats_kv_late_answers(kb_transport *t);
/* One put of the partition's lease key on revision `expect` (0: create). */
natsStatus kb__nats_lease_put(kb_transport *t, kb_nats_part *p, uint64_t expect, uint64_t *rev,
                              int64_t *sent_ns);

/* Every live member key of the bucket ("m.>"): the stream's subjects under
 * it, then each one's last value read in one pipelined batch (a member that
 * left wrote a delete). ok is false when the server did not answer. */
typedef struct kb_nats_roster {
    char **keys;
    int n;
    bool ok;
} kb_nats_roster;
void kb__nats_roster_load(kb_transport *t, kb_nats_roster *r);
void kb__nats_roster_free(kb_nats_roster *r);

/* A delete of `key` as a plain publish: no round trip, so close releases
 * every lease within its deadline. With `expect` (not 0) only while the key
 * is at that revision: a lease this bus lost meanwhile is another's, and its
 * delete must not take it from them. */
void kb__nats_kv_delete(kb_transport *t, const char *key, uint64_t expect);

#endif /* KB_TRANSPORTS_NATS_KV_H */
