/* What an earlier consumer still holds unacked above its ack floor, so that
 * a takeover skips what it acked there instead of handling it again. */
#ifndef KB_TRANSPORTS_NATS_PROBE_H
#define KB_TRANSPORTS_NATS_PROBE_H

#include "nats_types.h"

/* The stream sequences up to its reported last delivery that consumer ci (of
 * `stream`) holds unacked, sorted, into
 * *pending (malloc'd, *n of them; NULL when none). The server reports only a
 * consumer's ack floor, so every sequence between the floor and its last
 * delivery is NAKed (it ignores those it does not hold) and the redeliveries
 * are pulled, never acked. True only when they account for every message it
 * reported pending (those above its reported last delivery, which can lag,
 * counted by asking the consumer again): then each sequence up to its
 * reported last delivery that is not in *pending was acked. Lease thread;
 * costs a pull round trip, waiting at most a second (a sixth of the lease
 * TTL when shorter). */
bool kb__nats_probe_pending(kb_transport *t, const char *stream, const jsConsumerInfo *ci,
                            uint64_t **pending, uint32_t *n);

#endif /* KB_TRANSPORTS_NATS_PROBE_H */
