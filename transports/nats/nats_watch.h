/* Membership as it changes: a subscription on the lease bucket's subjects
 * sees every member heartbeat and every delete the moment a process sends
 * it, and wakes the lease thread for a joiner, a leaver or a released lease. */
#ifndef KB_TRANSPORTS_NATS_WATCH_H
#define KB_TRANSPORTS_NATS_WATCH_H

#include "nats_types.h"

/* What the watch saw of one member key (monotonic ns; 0: never). */
typedef struct kb_nats_seen {
    char *key;
    int64_t put_ns;
    int64_t del_ns;
} kb_nats_seen;

/* Subscribe, once per bus (the lease thread's first round). */
natsStatus kb__nats_watch_start(kb_transport *t);
/* Forget what was last seen more than two lease TTLs ago (lease thread). */
void kb__nats_watch_prune(kb_transport *t);
/* Is `key` a member as far as the watch saw within the last lease TTL:
 * 1 (a heartbeat, no delete after it), 0 (a delete after its last
 * heartbeat), -1 (nothing recent: the roster decides). */
int kb__nats_watch_member(kb_transport *t, const char *key);
/* How many member keys the watch holds (a bound on what
 * kb__nats_watch_members calls fn for, until the next prune). */
size_t kb__nats_watch_count(kb_transport *t);
/* Call fn for every key under `prefix` the watch counts as a member. */
void kb__nats_watch_members(kb_transport *t, const char *prefix,
                            void (*fn)(const char *key, void *arg), void *arg);
/* Has its last callback returned (close: after the connection is closed,
 * before anything the callback uses goes)? True when it never started. */
bool kb__nats_watch_done(const kb_transport *t);
/* Free what it saw (close, once kb__nats_watch_done). */
void kb__nats_watch_free(kb_transport *t);

#endif /* KB_TRANSPORTS_NATS_WATCH_H */
