/* Publishing appends to the key's partition log at once: a local write, no
 * round trip, so there is nothing to buffer. kb_flush makes what was written
 * durable (fsync, unless file.fsync = never); kb_drain waits for the group's
 * committed offsets to pass this process's last append in every partition. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "file_int.h"

int kb__file_publish(kb_transport *t, kb_transport_topic *tt, const kb_msg *m)
{
    int checked = kb__file_count_check(tt);
    if (checked != KB_OK)
        return checked;
    struct kb__file_part *p = &tt->parts[kb_partition_of_hash(m->hash, tt->partitions)];
    struct kb__file_rec head = {.partition = p->index, .attempts = 1};
    uint64_t end;
    int rc = kb__file_append(p->log_fd, &head, m, NULL, &end);
    if (rc != KB_OK)
        return rc;
    uint64_t seen = atomic_load_explicit(&p->published_end, memory_order_relaxed);
    while (seen < end && !atomic_compare_exchange_weak(&p->published_end, &seen, end))
        ;
    atomic_store_explicit(&p->dirty, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&tt->published, 1, memory_order_relaxed);
    /* a consumer in this process need not wait for file.poll_ms */
    atomic_fetch_add_explicit(&t->appends, 1, memory_order_release);
    kb_signal_notify(t->wake);
    return KB_OK;
}

int kb__file_flush(kb_transport *t, int timeout_ms)
{
    int64_t deadline = kb_deadline_ns(timeout_ms);
    if (!t->fsync_on_flush)
        return KB_OK;   /* written is all this setting promises */
    for (kb_transport_topic *tt = atomic_load(&t->topics); tt != NULL; tt = atomic_load(&tt->next))
        for (uint32_t i = 0; i < tt->partitions; i++) {
            struct kb__file_part *p = &tt->parts[i];
            if (!atomic_exchange(&p->dirty, 0))
                continue;
            if (fdatasync(p->log_fd) != 0) {
                atomic_store(&p->dirty, 1);
                kb_errf(NULL, 0, "file: topic %s: fsync of partition %u: %s", tt->name, i,
                        strerror(errno));
                return KB_ETRANSPORT;
            }
            if (kb_now_ns() > deadline)
                return KB_ETIMEDOUT;
        }
    return KB_OK;
}

/* Every partition this process appended to is settled past its last append. */
static int all_settled(void *arg)
{
    kb_transport *t = arg;
    for (kb_transport_topic *tt = atomic_load(&t->topics); tt != NULL; tt = atomic_load(&tt->next))
        for (uint32_t i = 0; i < tt->partitions; i++) {
            struct kb__file_part *p = &tt->parts[i];
            uint64_t end = atomic_load(&p->published_end);
            if (end > 0 && kb__file_committed(p) < end)   /* 0: nothing published here */
                return 0;
        }
    return 1;
}

static int settled(void *t, int64_t deadline_ns)
{
    (void)deadline_ns;   /* local files: no wait */
    return all_settled(t);
}

static int flush_slice(void *t, int64_t until_ns)
{
    return kb__file_flush(t, kb_deadline_left_ms(until_ns));
}

/* Our executors notify t->settled; a consumer in another process only
 * writes its offset file, so look again every file.poll_ms as well. */
int kb__file_drain(kb_transport *t, int timeout_ms)
{
    kb_kit_drain_conf c = {
        .size = sizeof c,
        .opaque = t,
        .flush = flush_slice,
        .settled = settled,
        .progress = t->settled,
        .local = all_settled,
        .poll_min_ms = t->poll_ms,
        .poll_max_ms = t->poll_ms,
    };
    return kb_kit_drain(t->bus, timeout_ms, &c);
}
