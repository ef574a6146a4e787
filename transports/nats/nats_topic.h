/* Topics: the per-topic state the bus hands to every per-topic hook, its
 * index (publish acks name their topic by it) and its stream. */
#ifndef KB_TRANSPORTS_NATS_TOPIC_H
#define KB_TRANSPORTS_NATS_TOPIC_H

#include "nats_types.h"

/* A topic's state, without waiting for the broker (topic_open); it takes
 * `backlog` (its publishes: nats_send.c) in every case. */
int kb__nats_topic_new(kb_transport *t, const char *name, kb_kit_backlog *backlog,
                       kb_nats_topic **out, char *errstr, size_t errlen);
/* Create the topic's stream unless it is there, with the partition count in
 * its Description, and check the count (once per topic; a round trip or two
 * the first time). KB_OK; KB_EINVAL naming both counts when the stream states
 * another; KB_ETRANSPORT or KB_ENOMEM with nats.c's reason. */
int kb__nats_topic_ready(kb_transport *t, kb_nats_topic *tp);
/* The partition count a stream's Description states ("keybus partitions=N",
 * anywhere in it), or 0 when it states none. */
uint32_t kb__nats_stated_partitions(const char *desc);
/* KB_EINVAL, the errstr naming the stream's count `stated` and this process's. */
int kb__nats_parts_mismatch(kb_transport *t, kb_nats_topic *tp, uint32_t stated);
/* Does the topic's stream exist? Creates nothing (read-only calls). KB_OK,
 * KB_ENOTFOUND, or KB_ETRANSPORT / KB_ENOMEM with nats.c's reason. */
int kb__nats_topic_exists(kb_transport *t, kb_nats_topic *tp);
/* Free it and its backlog (close only, once the backlog reported every
 * event); returns the events still buffered in its frames. */
uint64_t kb__nats_topic_free(kb_transport *t, kb_nats_topic *tp);

#endif /* KB_TRANSPORTS_NATS_TOPIC_H */
