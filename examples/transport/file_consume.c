/* The reader thread, kb-file-reader: one per bus, feeding every topic
 * subscribed here. Each tick it (1) keeps the leases (file_lease.c) and
 * stores committed offsets, every file.poll_ms, and (2) delivers what was
 * appended to the partitions it owns. With nothing to read it waits on
 * t->wake — an append in this process wakes it at once; appends by other
 * processes are found on the next tick. */
#include <stdio.h>
#include <stdlib.h>

#include "file_int.h"

#define READ_BURST 256   /* records per partition per pass: partitions take turns */

struct reader {
    kb_transport *t;
    struct kb__file_buf buf;
    uint64_t appends_seen;
};

/* Deliver up to READ_BURST records of partition p. Returns how many, or -1
 * once the bus is closing (the sink refused). */
static int read_partition(struct reader *rd, kb_transport_topic *tt, kb_sink *sink,
                          struct kb__file_part *p)
{
    int n = 0;
    while (n < READ_BURST) {
        struct kb__file_read r;
        int rc = kb__file_read_at(p->log_fd, p->read_off, &rd->buf, &r);
        if (rc == KB_ENOTFOUND)
            break;   /* the end for now */
        if (rc != KB_OK) {
            p->stalled = 1;   /* stop here: the next owner meets the same damage */
            kb_log(rd->t->bus, KB_LOG_ERROR, "topic %s: partition %u: %s; reading stopped",
                   tt->name, p->index, kb_last_error());
            break;
        }
        kb_kit_pending *pe;
        if (kb_kit_queue_push(p->queue, r.end, kb_kit_members_generation(tt->members, p->index),
                              &pe) != KB_OK)
            break;   /* try again next tick */
        char id[48];
        snprintf(id, sizeof id, "%u-%llu", p->index, (unsigned long long)r.offset);
        kb_delivery d = {
            .topic = tt->name, .tt = tt,
            .key = r.key, .key_len = r.head.key_len,
            .payload = r.payload, .payload_len = r.head.payload_len,
            .partition = p->index, .attempt = 1, .id = id, .cookie = pe,
            .headers = r.headers, .n_headers = r.head.n_headers,
        };
        /* waits while the lane is full: flow control, we stop reading */
        rc = kb_sink_deliver(sink, &d, -1);
        if (rc == KB_ECLOSED)
            return -1;   /* pe stays unsettled, freed at close */
        if (rc != KB_OK) {
            kb_kit_queue_cancel(p->queue, pe);   /* out of memory: read it again next tick */
            kb_log(rd->t->bus, KB_LOG_WARNING, "topic %s: partition %u: %s", tt->name,
                   p->index, kb_last_error());
            break;
        }
        p->read_off = r.end;
        n++;
    }
    return n;
}

static int woken(void *arg)
{
    struct reader *rd = arg;
    return atomic_load(&rd->t->stopping) || atomic_load(&rd->t->tick_now) ||
           atomic_load_explicit(&rd->t->appends, memory_order_acquire) != rd->appends_seen;
}

static void keep_leases(kb_transport *t)
{
    for (kb_transport_topic *tt = atomic_load(&t->topics); tt != NULL; tt = atomic_load(&tt->next)) {
        if (atomic_load(&tt->sink) == NULL)
            continue;
        kb_kit_members_tick(tt->members, kb_now_ns());   /* fair share, hand-overs */
        for (uint32_t i = 0; i < tt->partitions; i++)
            if (tt->parts[i].lease_fd >= 0 && kb__file_commit_write(&tt->parts[i]) != KB_OK)
                kb_log(t->bus, KB_LOG_WARNING, "topic %s: %s", tt->name, kb_last_error());
    }
}

static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    kb_transport *t = rd->t;
    int64_t next_tick = 0;
    while (!atomic_load(&t->stopping)) {
        if (atomic_exchange(&t->tick_now, 0) || kb_now_ns() >= next_tick) {
            keep_leases(t);
            next_tick = kb_now_ns() + (int64_t)t->poll_ms * 1000000;
        }
        rd->appends_seen = atomic_load_explicit(&t->appends, memory_order_acquire);
        int delivered = 0, closing = 0;
        for (kb_transport_topic *tt = atomic_load(&t->topics); tt != NULL && !closing;
             tt = atomic_load(&tt->next)) {
            kb_sink *sink = atomic_load(&tt->sink);
            for (uint32_t i = 0; sink != NULL && i < tt->partitions && !closing; i++) {
                struct kb__file_part *p = &tt->parts[i];
                if (!kb_kit_members_reading(tt->members, i) || p->stalled)
                    continue;
                int n = read_partition(rd, tt, sink, p);
                closing = n < 0;
                delivered += n > 0 ? n : 0;
            }
        }
        if (closing)
            break;   /* stop() follows; nothing more to deliver */
        if (delivered == 0)
            kb_signal_wait(t->wake, woken, rd, next_tick);
    }
    free(rd->buf.data);
    free(rd);
    return NULL;
}

int kb__file_subscribe(kb_transport *t, kb_transport_topic *tt, kb_sink *sink)
{
    if (kb__file_count_check(tt) != KB_OK)
        return KB_EINVAL;
    char err[256];
    pthread_mutex_lock(&t->topics_lock);
    int rc = kb__file_member_join(tt, err, sizeof err);
    if (rc == KB_OK && t->reader == NULL) {
        struct reader *rd = calloc(1, sizeof *rd);
        rc = rd == NULL ? KB_ENOMEM : KB_OK;
        if (rd != NULL) {
            rd->t = t;
            rc = kb_thread_start(&t->reader, "kb-file-reader", reader_main, rd);
            if (rc != KB_OK)
                free(rd);
        }
        if (rc != KB_OK) {
            snprintf(err, sizeof err, "file: cannot start the reader thread");
            kb__file_member_leave(tt);
        }
    }
    if (rc == KB_OK) {
        atomic_store(&tt->sink, sink);
        atomic_store(&t->tick_now, 1);   /* take leases now, not a file.poll_ms later */
        kb_signal_notify(t->wake);
    }
    pthread_mutex_unlock(&t->topics_lock);
    if (rc != KB_OK) {
        kb_errf(NULL, 0, "%s", err);
        return KB_ETRANSPORT;
    }
    return KB_OK;
}

int kb__file_ack(kb_transport *t, const kb_delivery *d)
{
    (void)t;
    kb_kit_settle(d->cookie);   /* the queue notifies t->settled when the offset moves */
    return KB_OK;
}

/* No kb_sink_deliver after this returns: the reader has exited. */
void kb__file_stop(kb_transport *t)
{
    atomic_store(&t->stopping, 1);
    kb_signal_notify(t->wake);
    pthread_mutex_lock(&t->topics_lock);
    kb_thread *reader = t->reader;
    t->reader = NULL;
    pthread_mutex_unlock(&t->topics_lock);
    kb_thread_join(reader);
}
