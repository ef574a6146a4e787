/* The acker thread, kb-nats-ack: one loop every nats.ack_interval_ms (or a
 * publish linger, when shorter) for the jobs that run on a tick: frontier
 * acks and progress records of every claim (nats_claim.c, nats_progress.c),
 * the publish backlogs' resends and stalls (nats_send.c), and frames a
 * linger old (nats_batch.c). Between ticks it pumps the backlogs a publish
 * ack or a reconnect asks for (pump_wanted: a resend due; nats.c's ack
 * thread must not publish) and those with resends waiting, whose backoff
 * may have ended; close ends it. */
#include "nats_acker.h"
#include "nats_batch.h"
#include "nats_claim.h"
#include "nats_names.h"
#include "nats_send.h"

void kb__nats_ack_pass(kb_transport *t, bool last)
{
    int64_t now = kb_now_ns();
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next) {
        if (atomic_load(&tp->subscribed))
            kb__nats_ack_topic(t, tp, now, last);
    }
}

static int woken(void *arg)
{
    kb_transport *t = arg;
    return atomic_load(&t->closing) || atomic_load(&t->pump_wanted);
}

static void *acker(void *arg)
{
    kb_transport *t = arg;
    /* Frames wait at most a linger (plus this tick) before they go out. */
    int64_t tick_ns = t->ack_interval_ms * 1000000;
    bool frames = t->batch_events > 1 || t->replicas > 1;
    if (frames && t->linger_ns > 0 && t->linger_ns < tick_ns)
        tick_ns = t->linger_ns > 100000 ? t->linger_ns : 100000;
    while (!atomic_load(&t->closing)) {
        int64_t next = kb_now_ns() + tick_ns;
        kb__nats_ack_pass(t, false);
        kb__nats_send_tick(t);
        if (frames)
            kb__nats_batch_send_due(t, false);
        for (;;) {
            kb_signal_wait(t->acker_wake, woken, t, kb__nats_resend_due(t, next));
            if (atomic_load(&t->closing) || kb_now_ns() >= next)
                break;
            atomic_store(&t->pump_wanted, 0);
            kb__nats_pump_wanted(t, true);
        }
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

int kb__nats_acker_start(kb_transport *t, char *errstr, size_t errlen)
{
    return kb__nats_thread_start(&t->acker, "kb-nats-ack", acker, t, errstr, errlen);
}
