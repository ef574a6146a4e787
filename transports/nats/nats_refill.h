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

/* The same read without waiting: asks for the first message on `subject` (or
 * any "a.b.<token>" for a subject "a.b.*") at or after `from`, its answer to
 * go to `reply` (a subscription of the caller's); false when it could not be
 * sent. Any thread. */
bool kb__nats_stream_ask(natsConnection *nc, const char *stream, const char *subject,
                         uint64_t from, const char *reply);

/* Such an answer's text `d` (NUL-terminated; NULL or empty for a status
 * reply), read as kb__nats_stream_next says: 1 with *out and *seq, 0 for
 * "no message found", -1 for anything else (an error, a subject `subject`
 * does not take, a sequence below `from`, fields that do not decode); *out
 * carries the stored subject. Pure: no I/O. */
int kb__nats_stored_read(const char *d, const char *stream, const char *subject, uint64_t from,
                         const char *consumer, uint64_t dseq, natsMsg **out, uint64_t *seq);

#endif /* KB_TRANSPORTS_NATS_REFILL_H */
