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

#include <keybus/kit.h>

#include "nats_claim.h"
#include "nats_drain.h"
#include "nats_lease.h"
#include "nats_names.h"
#include "nats_publish.h"

#define KB_NATS_DRAIN_POLL_MIN_MS 2     /* the first look after one that found work left */
#define KB_NATS_DRAIN_POLL_MAX_MS 200   /* consumer info at least this often */
#define KB_NATS_DRAIN_CONFIRM_MS 2      /* after our own acks: the server's floor soon */
/* One listing's wait. nats-server 2.9 gathers the consumers' infos for up to
 * 4 s when a consumer's leader is gone; after a node's kill a listing can go
 * unanswered for good: it is asked again after this, not waited on until the
 * drain's deadline. */
#define KB_NATS_DRAIN_ASK_MS 5000

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

/* The first partition of tp still short of its target, and what the group's
 * consumers of it reported: the timeout's log line names what it waited on. */
static void describe_left(kb_transport *t, kb_nats_topic *tp, const uint64_t *target,
                          const jsConsumerInfoList *list, char *left, size_t left_len)
{
    for (uint32_t p = 0; p < t->partitions; p++) {
        if (target[p] == 0)
            continue;
        int w = snprintf(left, left_len, "%s partition %u waits for stream sequence %llu;",
                         tp->stream, p, (unsigned long long)target[p]);
        bool any = false;
        for (int i = 0; list != NULL && i < list->Count && w > 0 && (size_t)w < left_len; i++) {
            const jsConsumerInfo *ci = list->List[i];
            if (kb__nats_consumer_part(t, ci->Name) != (long)p && !kb__nats_consumer_wide(t, ci->Name))
                continue;
            any = true;
            w += snprintf(left + w, left_len - (size_t)w,
                          " consumer %s: floor %llu, delivered %llu, %lld pending acks "
                          "(%llu below its floor), %lld redelivered;", ci->Name,
                          (unsigned long long)kb__nats_floor_of(ci),
                          (unsigned long long)ci->Delivered.Stream, (long long)ci->NumAckPending,
                          (unsigned long long)kb__nats_pending_below_floor(ci),
                          (long long)ci->NumRedelivered);
        }
        if (!any && w > 0 && (size_t)w < left_len)
            snprintf(left + w, left_len - (size_t)w, " no consumer of the group");
        return;
    }
}

/* Clear the targets of tp's partitions that a group consumer's floor on the
 * server reached. A failed listing (server restarting, reconnecting) is not
 * the end of the drain: its reason is kept for the timeout's message. */
static void poll_floors(kb_transport *t, kb_nats_topic *tp, uint64_t *target, int64_t deadline,
                        char *why, size_t why_len, char *short_of, size_t short_len)
{
    jsConsumerInfoList *list = NULL;
    jsErrCode jerr = 0;
    jsOptions o;
    jsOptions_Init(&o);
    int left = kb_deadline_left_ms(deadline);   /* -1: no deadline */
    o.Wait = left < 0 || left > KB_NATS_DRAIN_ASK_MS ? KB_NATS_DRAIN_ASK_MS : left > 0 ? left : 1;
    int64_t asked = kb_now_ns();
    natsStatus s = js_Consumers(&list, t->js, tp->stream, &o, &jerr);
    /* for timelines: a drain that outlives its last event waits here (a
     * consumer whose leader is gone answers the listing late or never) */
    long long took_ms = (long long)((kb_now_ns() - asked) / 1000000);
    if (s != NATS_OK || took_ms >= 100)
        kb_log(t->bus, KB_LOG_DEBUG, "nats %s: kb_drain: consumers of %s listed in %lld ms: %s",
               t->url_safe, tp->stream, took_ms, s == NATS_OK ? "ok" : kb__nats_reason(s));
    if (s == NATS_NOT_FOUND) {   /* no consumer yet: wait for one */
        describe_left(t, tp, target, NULL, short_of, short_len);
        return;
    }
    if (s != NATS_OK) {
        snprintf(why, why_len, "listing consumers of %s: %s (jetstream error %d, wait %lld ms)",
                 tp->stream, kb__nats_reason(s), (int)jerr, (long long)o.Wait);
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
    describe_left(t, tp, target, list, short_of, short_len);
    jsConsumerInfoList_Destroy(list);
}

/* One kb_drain's state, for the kit's callbacks: per topic this process
 * published to, the stream sequence each partition must be settled past
 * (0: nothing to wait for there). */
typedef struct drain {
    kb_transport *t;
    size_t topics;
    kb_nats_topic **tp;
    uint64_t *target;   /* topics x partitions */
    char why[320];      /* the last failed listing, for the timeout's log line */
    char left[512];     /* the last ask's first partition short of its target, too */
} drain;

static uint64_t *targets_of(drain *d, size_t i)
{
    return d->target + i * d->t->partitions;
}

static bool all_clear(const kb_transport *t, const uint64_t *target)
{
    for (uint32_t n = 0; n < t->partitions; n++)
        if (target[n] != 0)
            return false;
    return true;
}

static int drain_targets(void *arg)
{
    drain *d = arg;
    kb_transport *t = d->t;
    uint64_t refused = kb__nats_refused_take(t);
    if (refused > 0) {
        kb_errf(NULL, 0, "nats %s: %llu published events refused by the server since the last "
                "kb_flush or kb_drain (each reported failed; kb_flush names the latest)",
                t->url_safe, (unsigned long long)refused);
        return KB_ETRANSPORT;
    }
    /* topics are added at the head: one read of it is one list */
    kb_nats_topic *head = atomic_load(&t->topics);
    size_t n = 0;
    for (kb_nats_topic *tp = head; tp; tp = tp->next)
        n++;
    d->tp = calloc(n > 0 ? n : 1, sizeof *d->tp);
    d->target = calloc(n > 0 ? n * t->partitions : 1, sizeof *d->target);
    if (d->tp == NULL || d->target == NULL) {
        kb_errf(NULL, 0, "kb_drain: out of memory");
        return KB_ENOMEM;
    }
    /* topics opened since are not in this drain: nothing was published to
     * them before it */
    for (kb_nats_topic *tp = head; tp; tp = tp->next) {
        uint64_t *target = targets_of(d, d->topics);
        for (uint32_t p = 0; tp->batches != NULL && p < t->partitions; p++)
            target[p] = atomic_load(&tp->batches[p].stored_seq);
        d->tp[d->topics++] = tp;
    }
    return KB_OK;
}

/* Ask the server about every topic with targets left, each listing within
 * the drain's deadline; the rest waits for the next ask once it passed or
 * kb_close began. */
static int drain_settled(void *arg, int64_t deadline)
{
    drain *d = arg;
    bool clear = true, asked = false;
    for (size_t i = 0; i < d->topics; i++) {
        uint64_t *target = targets_of(d, i);
        if (all_clear(d->t, target) || kb_now_ns() >= deadline || kb_bus_closing(d->t->bus)) {
            clear = clear && all_clear(d->t, target);
            continue;
        }
        if (!asked) {   /* what the last ask found stays for the timeout's log line */
            d->why[0] = '\0';
            d->left[0] = '\0';
            asked = true;
        }
        poll_floors(d->t, d->tp[i], target, deadline, d->why, sizeof d->why, d->left,
                        sizeof d->left);
        clear = clear && all_clear(d->t, target);
    }
    return clear;
}

/* Did this process's claims ack every target left (the server is then asked
 * again soon: the acker notifies t->acked)? */
static int acked_here(void *arg)
{
    drain *d = arg;
    for (size_t i = 0; i < d->topics; i++) {
        const uint64_t *target = targets_of(d, i);
        if (all_clear(d->t, target))
            continue;
        if (!atomic_load(&d->tp[i]->subscribed))
            return 0;
        for (uint32_t n = 0; n < d->t->partitions; n++)
            if (target[n] != 0 && !kb__nats_acked_to(d->tp[i], n, target[n]))
                return 0;
    }
    return 1;
}

static int flush_slice(void *arg, int64_t until_ns)
{
    drain *d = arg;
    int rc = kb__nats_flush_until(d->t, until_ns);
    if (rc == KB_ETIMEDOUT)
        snprintf(d->left, sizeof d->left, "publishes of this process were still not acked");
    return rc;
}

int kb__nats_drain(kb_transport *t, int timeout_ms)
{
    drain d = {.t = t};
    kb_kit_drain_conf c = {.size = sizeof c, .opaque = &d, .flush = flush_slice,
                           .targets = drain_targets, .settled = drain_settled,
                           .progress = t->acked, .local = acked_here,
                           .poll_min_ms = KB_NATS_DRAIN_POLL_MIN_MS,
                           .poll_max_ms = KB_NATS_DRAIN_POLL_MAX_MS,
                           .confirm_ms = KB_NATS_DRAIN_CONFIRM_MS};
    int rc = kb_kit_drain(t->bus, timeout_ms, &c);
    free(d.tp);
    free(d.target);
    /* the details are long (consumers, floors): logged; kb_drain's text says
     * the deadline passed */
    if (rc == KB_ETIMEDOUT && d.why[0])
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: kb_drain timed out; the server's floors could "
               "not be read: %s", t->url_safe, d.why);
    if (rc == KB_ETIMEDOUT && d.left[0])
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: kb_drain timed out; at the last look %s",
               t->url_safe, d.left);
    return rc;
}
