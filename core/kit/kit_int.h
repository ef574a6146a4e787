/* The consumer-group kit, a floor of its own between the bus and the
 * transports: it sees <keybus/kit.h> and <keybus/transport.h> only, and
 * transports (in the tree or plugins) call it by its public names.
 *
 * Files, top-down (a file calls only files below it):
 *   members.c   the lease manager: ticks, takes, renewals, hand-overs
 *   share.c     the fair share: bounded rendezvous ranking of partitions
 *   queue.c     the settled-prefix pending queue (members.c asks it if idle)
 *   backlog.c   the publish backlog, tickets and reports (stands alone)
 *   drain.c     kb_drain's wait: flush, targets, asks (stands alone)
 *
 * Threads: none of its own. A queue is fed by one thread and settled by any;
 * the lease manager runs on the transport's thread (tick) and answers
 * still_owned on executors; the backlog takes publishes from any thread and
 * sends on the transport's sender thread. */
#ifndef KB_KIT_INT_H
#define KB_KIT_INT_H

#include <keybus/kit.h>

/* kb_kit_backlog_conf as the kit released it before, frozen: a caller built
 * then passes its sizeof (tail padding included, which differs from the
 * offset of the first later field on an ABI that aligns int64_t to 8 on a
 * 32-bit target), and kb_kit_backlog_new still takes it. Never edit them:
 * v1 is the first release, v2 the second (one_in_flight_per_partition,
 * event_id), before capacity_bytes. */
#define KB__KIT_BACKLOG_CONF_V1_FIELDS                                                       \
    size_t size;                                                                           \
    kb_bus *bus;                                                                           \
    size_t capacity;                                                                       \
    int timeout_ms;                                                                        \
    uint32_t max_attempts;                                                                 \
    int64_t backoff_ms, max_backoff_ms;                                                    \
    void (*free_data)(void *data);
struct kb__kit_backlog_conf_v1 {
    KB__KIT_BACKLOG_CONF_V1_FIELDS
};
struct kb__kit_backlog_conf_v2 {
    KB__KIT_BACKLOG_CONF_V1_FIELDS
    int one_in_flight_per_partition;
    void (*event_id)(const char *id, uint32_t index, char *out, size_t len);
};

#endif /* KB_KIT_INT_H */
