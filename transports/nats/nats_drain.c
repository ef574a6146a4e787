/* kb_drain: every event this process published before the call is handled
 * or dead-lettered by the group, wherever its consumers run. The publish acks
 * give, per partition, the highest stream sequence this process stored; a
 * partition is drained when an ack floor reaches it: one of this process's
 * claims acked up to it (the acker wakes us), or a consumer of the group
 * reports it (polled with a bounded backoff, for owners in other processes
 * and while nobody owns the partition yet). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../core/err.h"
#include "nats_int.h"

#define KB_NATS_DRAIN_POLL_MAX_MS 200   /* consumer info at least this often */

static void note_stored(kb_transport *t, const char *subj, uint64_t seq)
{
    kb_nats_topic *tp = atomic_load(&t->last_acked_topic);
    long n = tp != NULL ? kb__nats_subject_part(t, tp->name, subj) : -1;
    if (n < 0)
        for (tp = atomic_load(&t->topics); tp != NULL; tp = tp->next)
            if ((n = kb__nats_subject_part(t, tp->name, subj)) >= 0)
                break;
    if (n < 0 || tp->batches == NULL)
        return;
    atomic_store(&t->last_acked_topic, tp);
    _Atomic uint64_t *s = &tp->batches[n].stored_seq;
    uint64_t cur = atomic_load(s);
    while (cur < seq && !atomic_compare_exchange_weak(s, &cur, seq))
        ;
}

void kb__nats_pub_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    (void)js;
    kb_transport *t = closure;
    if (pa != NULL && msg != NULL)
        note_stored(t, natsMsg_GetSubject(msg), pa->Sequence);
    else if (pae != NULL) {
        pae->Msg = msg;   /* not set on this path */
        kb__nats_pub_err(t, pae);
    }
    natsMsg_Destroy(msg);
}

void kb__nats_drain_wake(kb_transport *t)
{
    if (atomic_load(&t->drain_waiters) == 0)
        return;
    pthread_mutex_lock(&t->drain_mu);
    pthread_cond_broadcast(&t->drain_cv);
    pthread_mutex_unlock(&t->drain_mu);
}

/* Did one of this process's claims of the partition ack up to seq? */
static bool acked_here(const kb_nats_topic *tp, uint32_t n, uint64_t seq)
{
    if (!atomic_load(&tp->subscribed))
        return false;
    for (kb_nats_claim *c = atomic_load(&tp->parts[n].claims); c; c = c->next)
        if (atomic_load(&c->acked_to) >= seq)
            return true;
    return false;
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
        long n = kb__nats_consumer_part(t, list->List[i]->Name);
        if (n >= 0 && target[n] != 0 && kb__nats_floor_of(list->List[i]) >= target[n])
            target[n] = 0;
    }
    jsConsumerInfoList_Destroy(list);
    return KB_OK;
}

/* Wait until tp's partitions reach their targets, or the deadline. */
static int drain_topic(kb_transport *t, kb_nats_topic *tp, uint64_t *target, int64_t deadline)
{
    int64_t poll_ms = 2, next_poll = 0;
    for (;;) {
        int64_t now = kb__nats_now_ns();
        if (now >= next_poll) {
            int rc = poll_floors(t, tp, target);
            if (rc != KB_OK && rc != KB_ETIMEDOUT)
                return rc;
            next_poll = now + poll_ms * 1000000;
            poll_ms = poll_ms * 2 > KB_NATS_DRAIN_POLL_MAX_MS ? KB_NATS_DRAIN_POLL_MAX_MS
                                                             : poll_ms * 2;
        }
        /* Checked under the lock the acker takes to wake us: no lost wakeup. */
        pthread_mutex_lock(&t->drain_mu);
        bool left = false;
        for (uint32_t n = 0; n < t->partitions; n++) {
            if (target[n] != 0 && acked_here(tp, n, target[n]))
                target[n] = 0;
            left = left || target[n] != 0;
        }
        int rc = !left ? KB_OK : kb__nats_now_ns() >= deadline ? KB_ETIMEDOUT : 1;
        if (rc == 1) {
            int64_t until = next_poll < deadline ? next_poll : deadline;
            int64_t wait = until - kb__nats_now_ns();
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t ns = ts.tv_nsec + (wait > 0 ? wait : 0);
            ts.tv_sec += (time_t)(ns / 1000000000);
            ts.tv_nsec = (long)(ns % 1000000000);
            pthread_cond_timedwait(&t->drain_cv, &t->drain_mu, &ts);
        }
        pthread_mutex_unlock(&t->drain_mu);
        if (rc != 1)
            return rc;
    }
}

int kb__nats_drain(kb_transport *t, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : kb__nats_now_ns() + (int64_t)timeout_ms * 1000000;
    int rc = kb__nats_flush(t, timeout_ms);   /* sent and stored: the targets are known */
    if (rc != KB_OK)
        return rc;
    uint64_t *target = calloc(t->partitions, sizeof *target);
    if (target == NULL)
        return KB_ENOMEM;
    atomic_fetch_add(&t->drain_waiters, 1);
    for (kb_nats_topic *tp = atomic_load(&t->topics); rc == KB_OK && tp; tp = tp->next) {
        bool any = false;
        for (uint32_t n = 0; tp->batches != NULL && n < t->partitions; n++)
            any = (target[n] = atomic_load(&tp->batches[n].stored_seq)) != 0 || any;
        if (any)
            rc = drain_topic(t, tp, target, deadline);
    }
    atomic_fetch_sub(&t->drain_waiters, 1);
    free(target);
    if (rc == KB_ETIMEDOUT)
        kb_errf(NULL, 0, "nats %s: events published here not yet handled by the group",
                 t->url_safe);
    return rc;
}
