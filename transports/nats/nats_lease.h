/* Partition leases and membership: the lease thread (kb-nats-lease). */
#ifndef KB_TRANSPORTS_NATS_LEASE_H
#define KB_TRANSPORTS_NATS_LEASE_H

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
/* Wake the lease thread now (a topic subscribed). */
void kb__nats_lease_kick(kb_transport *t);
/* Delete this process's member keys and leases (close, after the lease
 * thread stopped and the last acks went out), by the deadline. */
void kb__nats_lease_release_all(kb_transport *t, int64_t deadline);

#endif /* KB_TRANSPORTS_NATS_LEASE_H */
