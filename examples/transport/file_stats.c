/* Broker figures, read from the files, so any process sees them (a monitor
 * that never subscribed too). Counting walks the record heads: cheap for an
 * example, linear in the log's length. */
#include <stdlib.h>

#include "file_int.h"

struct counts {
    uint64_t length;      /* records in the log */
    uint64_t unsettled;   /* records at or past the group's committed offset */
    uint64_t replayed;    /* dead letters only */
};

static int count_records(int fd, uint64_t committed, struct counts *c)
{
    struct kb__file_buf buf = {0};
    struct kb__file_read r;
    int rc;
    for (uint64_t off = 0; (rc = kb__file_read_at(fd, off, &buf, &r)) == KB_OK; off = r.end) {
        c->length++;
        c->unsettled += off >= committed;
        c->replayed += r.head.replayed != 0;
    }
    free(buf.data);
    return rc == KB_ENOTFOUND ? KB_OK : rc;
}

/* Delivered here and not settled yet. */
static uint64_t pending_here(struct kb__file_part *p)
{
    return kb_kit_queue_outstanding(p->queue);
}

int kb__file_stats(kb_transport *t, kb_transport_topic *tt, kb_topic_stats *out)
{
    (void)t;
    out->published = atomic_load(&tt->published);
    out->partitions = tt->partitions;
    for (uint32_t i = 0; i < tt->partitions; i++) {
        struct kb__file_part *p = &tt->parts[i];
        out->partitions_owned += (uint32_t)atomic_load(&p->owned);
        struct counts c = {0};
        int rc = count_records(p->log_fd, kb__file_committed(p), &c);
        if (rc != KB_OK)
            return rc;
        uint64_t pending = pending_here(p);
        out->broker_length += c.length;
        out->broker_pending += pending;
        out->broker_lag += c.unsettled > pending ? c.unsettled - pending : 0;
    }
    struct counts dlq = {0};
    int rc = count_records(tt->dlq_fd, 0, &dlq);
    out->dlq_length = dlq.length - dlq.replayed;
    return rc;
}

int kb__file_partition_stats(kb_transport *t, kb_transport_topic *tt, uint32_t partition,
                             kb_partition_stats *out)
{
    (void)t;
    if (partition >= tt->partitions) {
        kb_errf(NULL, 0, "file: topic %s has partitions 0..%u, not %u", tt->name,
                tt->partitions - 1, partition);
        return KB_ENOTFOUND;
    }
    struct kb__file_part *p = &tt->parts[partition];
    struct counts c = {0};
    int rc = count_records(p->log_fd, kb__file_committed(p), &c);
    if (rc != KB_OK)
        return rc;
    out->partition = partition;
    out->length = c.length;
    out->pending = pending_here(p);
    out->lag = c.unsettled > out->pending ? c.unsettled - out->pending : 0;
    kb__file_lease_owner(tt, partition, out->owner, sizeof out->owner);
    out->consumers = kb__file_members(tt);
    return KB_OK;
}
