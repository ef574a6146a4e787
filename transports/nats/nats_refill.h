/* Stored messages read again from the stream's leader: what a consumer sent
 * that never arrived (the connection broke with it on the wire). Reading a
 * stored message costs the stream leader a lookup; the alternative, a new
 * consumer, waits on the meta group and a new consumer group's election,
 * seconds on a cluster that just lost a node. */
#ifndef KB_TRANSPORTS_NATS_REFILL_H
#define KB_TRANSPORTS_NATS_REFILL_H

#include "nats_types.h"

/* The first message on `subject` at or after stream sequence `from`
 * (STREAM.MSG.GET with next_by_subj, nats-server 2.9): 1 with *out (the
 * caller's to destroy: subject, headers and body as stored, and as its reply
 * the ack subject of delivery `dseq` of `consumer`, as if that consumer had
 * sent it) and its sequence in *seq; 0 when there is none; -1 when no answer
 * came within wait_ms or it could not be read. Blocks the calling thread for
 * at most wait_ms; any thread. */
int kb__nats_stream_next(kb_transport *t, const char *stream, const char *subject, uint64_t from,
                         const char *consumer, uint64_t dseq, int wait_ms, natsMsg **out,
                         uint64_t *seq);

#endif /* KB_TRANSPORTS_NATS_REFILL_H */
