/* kb_drain: every event this process published before the call is handled
 * or dead-lettered by the group, wherever its consumers run. The publish acks
 * give, per partition, the highest stream sequence this process stored; a
 * partition is drained when the server reports an ack floor of the group at
 * or past it. Only the server's answer counts: an ack this process sent may
 * still be on the wire, or lost with a server killed before it stored it.
 * This process's own acks (the acker wakes us) only bring the next look at
 * the server forward; otherwise it is polled with a bounded backoff, for
 * owners in other processes and while nobody owns the partition yet. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"
#include "nats_drain.h"
#include "nats_lease.h"
#include "nats_names.h"
#include "nats_publish.h"

#define KB_NATS_DRAIN_POLL_MAX_MS 200   /* consumer info at least this often */
#define KB_NATS_DRAIN_CONFIRM_MS 2      /* after our own acks: the server's floor soon */

/* Is consumer `name` one of this process's current claims on tp (none when
 * it only publishes to tp)? */
static bool live_claim(const kb_transport *t, kb_nats_topic *tp, const char *name)
{
    for (uint32_t i = 0; atomic_load(&tp->subscribed) && i < t->partitions; i++) {
        kb_nats_claim *c = atomic_load(&tp->parts[i].claim);
        if (c != NULL && !atomic_load(&c->fenced) && strcmp(c->consumer, name) == 0)
            return true;
    }
    return false;
}

/* Have the lease thread look at this process's claims' consumers again (it
 * gives up one with messages pending below its floor), at most once a lease
 * round: a look costs a consumer info per claim. */
static void renudge_ask(kb_transport *t)
{
    int64_t now = kb_now_ns(), last = atomic_load(&t->renudge_asked_ns);
    if (last != 0 && now - last < t->lease_ttl_ms * 1000000 / 3)
        return;
    if (!atomic_compare_exchange_strong(&t->renudge_asked_ns, &last, now))
        return;
    atomic_store(&t->renudge_wanted, 1);
    kb__nats_lease_kick(t);
}

/* Clear the targets of tp's partitions that a group consumer's floor on the
 * server reached. A failed listing (server restarting, reconnecting) is not
 * the end of the drain: its reason is kept for the timeout's message. */
static void poll_floors(kb_transport *t, kb_nats_topic *tp, uint64_t *target, char *why,
                        size_t why_len)
{
    jsConsumerInfoList *list = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Consumers(&list, t->js, tp->stream, NULL, &jerr);
    if (s == NATS_NOT_FOUND)
        return;   /* no consumer yet: wait for one */
    if (s != NATS_OK) {
        snprintf(why, why_len, "listing consumers of %s: %s (jetstream error %d)", tp->stream,
                 kb__nats_reason(s), (int)jerr);
        return;
    }
    for (int i = 0; list != NULL && i < list->Count; i++) {
        const jsConsumerInfo *ci = list->List[i];
        long n = kb__nats_consumer_part(t, ci->Name);
        bool wide = kb__nats_consumer_wide(t, ci->Name);
        if (n < 0 && !wide)
            continue;   /* another group's */
        if (kb__nats_pending_below_floor(ci) > 0) {
            /* its floor vouches for nothing: wait for its successor */
            if (live_claim(t, tp, ci->Name))
                renudge_ask(t);
            continue;
        }
        for (uint32_t p = 0; p < t->partitions; p++)
            if ((wide || (long)p == n) && target[p] != 0 && kb__nats_floor_of(ci) >= target[p])
                target[p] = 0;
    }
    jsConsumerInfoList_Destroy(list);
}

typedef struct drain_wait {
    kb_transport *t;
    const kb_nats_topic *tp;
    const uint64_t *target;
} drain_wait;

/* Did this process's claims ack every target left (the server is then asked
 * at once)? */
static int acked_here(void *arg)
{
    drain_wait *w = arg;
    if (!atomic_load(&w->tp->subscribed))
        return 0;
    for (uint32_t n = 0; n < w->t->partitions; n++)
        if (w->target[n] != 0 && !kb__nats_acked_to(w->tp, n, w->target[n]))
            return 0;
    return 1;
}

static bool all_clear(const kb_transport *t, const uint64_t *target)
{
    for (uint32_t n = 0; n < t->partitions; n++)
        if (target[n] != 0)
            return false;
    return true;
}

/* Wait until the server shows tp's partitions at their targets, or the
 * deadline: asked again soon after this process's acks cover them (the
 * acker notifies t->acked), else on a growing period. */
static int drain_topic(kb_transport *t, kb_nats_topic *tp, uint64_t *target, int64_t deadline,
                       char *why, size_t why_len)
{
    drain_wait w = {t, tp, target};
    int64_t poll_ms = 2;
    for (;;) {
        if (kb_bus_closing(t->bus))
            return KB_ECLOSED;   /* kb_close waits for this call: end it */
        why[0] = '\0';
        poll_floors(t, tp, target, why, why_len);
        if (all_clear(t, target))
            return KB_OK;
        if (kb_now_ns() >= deadline)
            return KB_ETIMEDOUT;
        bool mine = acked_here(&w);
        int64_t next = kb_now_ns() + (mine ? KB_NATS_DRAIN_CONFIRM_MS : poll_ms) * 1000000;
        if (!mine)
            poll_ms = poll_ms * 2 > KB_NATS_DRAIN_POLL_MAX_MS ? KB_NATS_DRAIN_POLL_MAX_MS
                                                             : poll_ms * 2;
        kb_signal_wait(t->acked, mine ? kb__nats_never : acked_here, &w, next < deadline ? next : deadline);
    }
}

static int flush_slice(void *t, int64_t until_ns)
{
    return kb__nats_flush_until(t, until_ns);
}

/* Sent and stored (the targets are then known), in slices: kb_close ends
 * it (KB_ECLOSED), since the drain holds kb_close up until it returns. */
static int settle(kb_transport *t, int64_t deadline)
{
    return kb_bus_wait_sliced(t->bus, deadline, flush_slice, t);
}

int kb__nats_drain(kb_transport *t, int timeout_ms)
{
    int64_t deadline = kb_deadline_ns(timeout_ms);
    int rc = settle(t, deadline);
    if (rc != KB_OK)
        return rc;
    uint64_t refused = kb__nats_refused_take(t);
    if (refused > 0) {
        kb_errf(NULL, 0, "nats %s: %llu published events refused by the server since the last "
                "kb_flush or kb_drain (each reported failed; kb_flush names the latest)",
                t->url_safe, (unsigned long long)refused);
        return KB_ETRANSPORT;
    }
    uint64_t *target = calloc(t->partitions, sizeof *target);
    if (target == NULL)
        return KB_ENOMEM;
    char why[320] = "";
    for (kb_nats_topic *tp = atomic_load(&t->topics); rc == KB_OK && tp; tp = tp->next) {
        bool any = false;
        for (uint32_t n = 0; tp->batches != NULL && n < t->partitions; n++)
            any = (target[n] = atomic_load(&tp->batches[n].stored_seq)) != 0 || any;
        if (any)
            rc = drain_topic(t, tp, target, deadline, why, sizeof why);
    }
    free(target);
    if (rc == KB_ETIMEDOUT && why[0])   /* kb_drain's errstr says only the deadline passed */
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: kb_drain timed out; the server's floors could "
               "not be read: %s", t->url_safe, why);
    return rc;
}
