/* Broker names (streams, subjects, consumers), nats.c status texts and thread
 * starts: the bottom helpers every other file of the transport may use. */
#ifndef KB_TRANSPORTS_NATS_NAMES_H
#define KB_TRANSPORTS_NATS_NAMES_H

#include "nats_types.h"

/* The error of a failed nats.c call, with nats.c's own reason
 * (nats_GetLastError) into kb_last_error: KB_ENOMEM, KB_ETIMEDOUT or
 * KB_ETRANSPORT. */
int kb__nats_errf(const char *what, natsStatus s, jsErrCode jerr);
/* nats.c's reason for the last failure on this thread (without its source
 * location), or the status text. */
const char *kb__nats_reason(natsStatus s);
/* Stream names may not hold '.': KB_<topic, dots as '_'>_<fnv1a32 of the topic>. */
void kb__nats_stream_name(char *out, size_t len, const char *topic);
/* The partition a subject's last token names (decimal as keybus writes it,
 * below nats.partitions), or -1: one rule for what is a partition subject. */
long kb__nats_part_token(const kb_transport *t, const char *s);
/* Partition of a partition subject kb.<topic>.<n>, or -1 (the dead letters,
 * another topic). */
long kb__nats_subject_part(const kb_transport *t, const char *topic, const char *subj);
/* Partition of one of the group's partition consumers (<group>_<n>_<rev>), or -1. */
long kb__nats_consumer_part(const kb_transport *t, const char *name);
/* Is it one of the group's wide consumers (<group>_w_<rev>: every partition)? */
bool kb__nats_consumer_wide(const kb_transport *t, const char *name);
/* Where a consumer of the partition stopped: everything up to it is acked. */
uint64_t kb__nats_floor_of(const jsConsumerInfo *ci);
/* Messages the consumer holds pending at or below its ack floor (more
 * pending than lie between the floor and its last delivery): the state an
 * AckAll consumer of nats-server 2.9 can come back with from a kill. No ack
 * reaches them, so its floor vouches for nothing; 0 when none. */
uint64_t kb__nats_pending_below_floor(const jsConsumerInfo *ci);

/* The topic's member keys' prefix in the lease bucket, m.<stream>.<group>.,
 * and this process's member key of the topic (its name made a valid key). */
void kb__nats_member_prefix(const kb_transport *t, const kb_nats_topic *tp, char *buf, size_t len);
void kb__nats_member_key(const kb_transport *t, const kb_nats_topic *tp, char *buf, size_t len);

/* The connection of pull requests, deliveries and acks: feed_nc once the
 * first subscribe made it, nc before. */
natsConnection *kb__nats_feed_conn(kb_transport *t);

/* Wake the lease thread now (a topic subscribed, a member came or left, a
 * lease was released, a claim reset). Thread: any. */
void kb__nats_lease_kick(kb_transport *t);

/* A kb_signal_wait condition that is never met: a wait that only a notify
 * or its deadline ends. */
int kb__nats_never(void *arg);

/* kb_thread_start, with "cannot start thread <name>" in errstr on failure. */
int kb__nats_thread_start(kb_thread **th, const char *name, void *(*fn)(void *), void *arg,
                          char *errstr, size_t errlen);

#endif /* KB_TRANSPORTS_NATS_NAMES_H */
