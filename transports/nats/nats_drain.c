/* kb_drain: every event this process published before the call is handled
 * or dead-lettered by the group, wherever its consumers run. The publish acks
 * give, per partition, the highest stream sequence this process stored; a
 * partition is drained when an ack floor reaches it: one of this process's
 * claims acked up to it (the acker wakes us), or a consumer of the group
 * reports it (polled with a bounded backoff, for owners in other processes
 * and while nobody owns the partition yet). */
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"
#include "nats_drain.h"
#include "nats_names.h"
#include "nats_publish.h"

#define KB_NATS_DRAIN_POLL_MAX_MS 200   /* consumer info at least this often */

/* Did one of this process's claims of the partition ack up to seq? */
static bool acked_here(const kb_nats_topic *tp, uint32_t n, uint64_t seq)
{
    return atomic_load(&tp->subscribed) && kb__nats_acked_to(tp, n, seq);
}

/* Mark the partitions of tp whose group consumers' floors reached their
 * targets (target set to 0). */
static int poll_floors(kb_transport *t, kb_nats_topic *tp, uint64_t *target)
{
    jsConsumerInfoList *list = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Consumers(&list, t->js, tp->stream, NULL, &jerr);
    if (s == NATS_NOT_FOUND)
        return KB_OK;   /* no consumer yet: wait for one */
    if (s != NATS_OK)
        return kb__nats_errf("consumers", s, jerr);
    for (int i = 0; list != NULL && i < list->Count; i++) {
        const jsConsumerInfo *ci = list->List[i];
        long n = kb__nats_consumer_part(t, ci->Name);
        bool wide = kb__nats_consumer_wide(t, ci->Name);
        for (uint32_t p = 0; p < t->partitions; p++)
            if ((wide || (long)p == n) && target[p] != 0 && kb__nats_floor_of(ci) >= target[p])
                target[p] = 0;
    }
    jsConsumerInfoList_Destroy(list);
    return KB_OK;
}

typedef struct drain_wait {
    kb_transport *t;
    const kb_nats_topic *tp;
    uint64_t *target;
} drain_wait;

/* Clear the targets this process's claims acked up to; true when none is left. */
static int acked_all(void *arg)
{
    drain_wait *w = arg;
    bool left = false;
    for (uint32_t n = 0; n < w->t->partitions; n++) {
        if (w->target[n] != 0 && acked_here(w->tp, n, w->target[n]))
            w->target[n] = 0;
        left = left || w->target[n] != 0;
    }
    return !left;
}

/* Wait until tp's partitions reach their targets, or the deadline: woken by
 * the acker (t->acked), polling the group's consumers on a growing period. */
static int drain_topic(kb_transport *t, kb_nats_topic *tp, uint64_t *target, int64_t deadline)
{
    drain_wait w = {t, tp, target};
    int64_t poll_ms = 2;
    for (;;) {
        if (kb_bus_closing(t->bus))
            return KB_ECLOSED;   /* kb_close waits for this call: end it */
        int rc = poll_floors(t, tp, target);
        if (rc != KB_OK && rc != KB_ETIMEDOUT)
            return rc;
        int64_t next_poll = kb_now_ns() + poll_ms * 1000000;
        poll_ms = poll_ms * 2 > KB_NATS_DRAIN_POLL_MAX_MS ? KB_NATS_DRAIN_POLL_MAX_MS : poll_ms * 2;
        if (kb_signal_wait(t->acked, acked_all, &w, next_poll < deadline ? next_poll : deadline))
            return KB_OK;
        if (kb_now_ns() >= deadline)
            return KB_ETIMEDOUT;
    }
}

/* Sent and stored (the targets are then known), in slices: kb_close ends
 * it (KB_ECLOSED), since the drain holds kb_close up until it returns. */
static int settle(kb_transport *t, int64_t deadline)
{
    for (;;) {
        int64_t slice = kb_now_ns() + 100000000;
        int rc = kb__nats_flush_until(t, slice < deadline ? slice : deadline);
        if (rc != KB_ETIMEDOUT || kb_now_ns() >= deadline)
            return rc;
        if (kb_bus_closing(t->bus))
            return KB_ECLOSED;
    }
}

int kb__nats_drain(kb_transport *t, int timeout_ms)
{
    int64_t deadline = kb_deadline_ns(timeout_ms);
    int rc = settle(t, deadline);
    if (rc != KB_OK)
        return rc;
    uint64_t *target = calloc(t->partitions, sizeof *target);
    if (target == NULL)
        return KB_ENOMEM;
    for (kb_nats_topic *tp = atomic_load(&t->topics); rc == KB_OK && tp; tp = tp->next) {
        bool any = false;
        for (uint32_t n = 0; tp->batches != NULL && n < t->partitions; n++)
            any = (target[n] = atomic_load(&tp->batches[n].stored_seq)) != 0 || any;
        if (any)
            rc = drain_topic(t, tp, target, deadline);
    }
    free(target);
    if (rc == KB_ETIMEDOUT)
        kb_errf(NULL, 0, "nats %s: events published here not yet handled by the group",
                 t->url_safe);
    return rc;
}
