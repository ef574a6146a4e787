/* The lease thread, kb-nats-lease: lease rounds (heartbeats and renewals,
 * the member roster, hand-overs, acquisitions and their consumers) every
 * third of the lease TTL, at once when kicked (a topic subscribed, a member
 * came or left, a lease was released, a claim reset), sooner after a round
 * the server left unanswered; and while a hand-over waits for its handlers,
 * a look every few milliseconds, so that the next owner starts as soon as
 * the acks are out instead of a round later. */
#include <stdlib.h>

#include "nats_lease.h"
#include "nats_names.h"
#include "nats_watch.h"

/* A round after one the server left unanswered: several fit in the time a
 * lease has left. */
#define ROUND_RETRY(t) ((t)->lease_ttl_ms * 1000000 / 12)
/* How often a waiting hand-over is looked at: the acker's frontier moves
 * every nats.ack_interval_ms (2 ms by default). */
#define HANDOVER_LOOK_NS 5000000

/* Renewals answered "no responders" while the bucket answered others (it
 * just elected a leader) are sent again at once, twice at most: a lease
 * whose local time is nearly out is kept when the bucket is back in time.
 * Only those: one left without an answer may have been stored, and sent
 * again on the same revision it would be refused as another's. */
static void renew_again(kb_transport *t, kb_nats_kv_ops *ops)
{
    for (int tries = 0; tries < 2; tries++) {
        kb_nats_kv_ops again = {NULL, 0, 0, 0};
        bool any = false;
        for (size_t i = 0; i < ops->n; i++)
            any = any || kb__nats_kv_answered(&ops->v[i]);
        for (size_t i = 0; any && i < ops->n; i++)
            if (ops->v[i].p != NULL && ops->v[i].s == NATS_NO_RESPONDERS)
                kb__nats_kv_add(&again, ops->v[i].key, ops->v[i].p, ops->v[i].expect, false);
        if (again.n > 0)
            kb__nats_kv_run(t, &again);
        for (size_t i = 0, j = 0; i < ops->n && j < again.n; i++)
            if (ops->v[i].p == again.v[j].p && ops->v[i].s == NATS_NO_RESPONDERS)
                ops->v[i] = again.v[j++];
        bool sent = again.n > 0;
        free(again.v);
        if (!sent)
            return;
    }
}

/* A renewal refused may have been refused for a put of this very bus that
 * the bucket stored after its answer was given up (a loaded server), or for
 * a passing error of the bucket (an election). The key is read: when its
 * value is still this bus's own put, the lease is kept (its local expiry
 * unchanged: the next renewal extends it); when the read goes unanswered
 * too, an earlier renewal's late answer that gave a newer revision explains
 * the refusal, and the lease is kept as unanswered; otherwise it is
 * another's (a bus of the same consumer name among them), and lost. */
static void refused_check(kb_transport *t, kb_nats_kv_ops *ops)
{
    kb_nats_kv_ops reads = {NULL, 0, 0, 0};
    for (size_t i = 0; i < ops->n; i++)
        if (ops->v[i].p != NULL && ops->v[i].s == NATS_ERR)
            kb__nats_kv_add(&reads, ops->v[i].key, ops->v[i].p, ops->v[i].expect, true);
    if (reads.n > 0)
        kb__nats_kv_run(t, &reads);
    for (size_t i = 0, j = 0; i < ops->n && j < reads.n; i++) {
        kb_nats_kv_op *k = &ops->v[i];
        if (k->p != reads.v[j].p || k->s != NATS_ERR)
            continue;
        kb_nats_kv_op *r = &reads.v[j++];
        bool unread = !kb__nats_kv_answered(r) && r->s != NATS_NOT_FOUND;
        if (r->s == NATS_OK && r->this_bus && r->rev >= k->expect) {
            kb_log(t->bus, KB_LOG_DEBUG, "nats %s: lease of %s: renewal refused, but revision "
                   "%llu is this bus's own put: kept", t->url_safe, r->p->subject,
                   (unsigned long long)r->rev);
            r->p->lease_rev = r->rev;
            k->s = NATS_TIMEOUT;   /* unanswered: kept until its local expiry */
        } else if (unread && k->expect < k->p->lease_rev) {
            k->s = NATS_TIMEOUT;
        }
    }
    free(reads.v);
}

/* Heartbeats of every topic's member key and the renewals that are due, in
 * one pipelined batch; *retry when a renewal went unanswered. False when
 * the bucket answered nothing (no leader): no listing, no takes. */
static bool heartbeat(kb_transport *t, int64_t started, int64_t renew_ns, bool *retry,
                      bool *heartbeat_failing)
{
    kb_nats_kv_ops ops = {NULL, 0, 0, 0};
    kb__nats_kv_late_answers(t);   /* renew on the newest revision known */
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp && !atomic_load(&t->closing);
         tp = tp->next) {
        if (!atomic_load(&tp->subscribed))
            continue;
        char mine[2 * KB_NATS_NAME];
        kb__nats_member_key(t, tp, mine, sizeof mine);
        kb__nats_kv_add(&ops, mine, NULL, 0, false);
        for (uint32_t i = 0; i < t->partitions; i++) {
            kb_nats_part *p = &tp->parts[i];
            /* due now or within a twelfth of the TTL: renewing a little early
             * keeps the leases' renewals together in one batch */
            if (p->lease_rev != 0 && started + t->lease_ttl_ms * 1000000 / 12 >=
                                         p->lease_until_ns - renew_ns)
                kb__nats_kv_add(&ops, p->lease_key, p, p->lease_rev, false);
        }
    }
    kb__nats_kv_run(t, &ops);
    renew_again(t, &ops);
    refused_check(t, &ops);
    bool failed = false;
    size_t n_answered = 0;
    for (size_t i = 0; i < ops.n; i++) {
        kb_nats_kv_op *k = &ops.v[i];
        n_answered += kb__nats_kv_answered(k);
        if (k->p != NULL)
            kb__nats_lease_renewed(t, k->p, k->s, k->rev, started, retry);
        else
            failed = failed || k->s != NATS_OK;
    }
    if (failed && !*heartbeat_failing)   /* once, not every retry */
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: membership heartbeat failed; leases are kept "
               "until they run out and the round is tried again every %lld ms", t->url_safe,
               (long long)(ROUND_RETRY(t) / 1000000));
    else if (!failed && *heartbeat_failing)
        kb_log(t->bus, KB_LOG_NOTICE, "nats %s: membership heartbeat answered again", t->url_safe);
    *heartbeat_failing = failed;
    *retry = *retry || failed;
    bool any = ops.n == 0 || n_answered > 0;
    free(ops.v);
    return any;
}

/* Hand-overs: true while one waits for its handlers and acks. */
static bool keep_all(kb_transport *t)
{
    bool feed_down = false, waiting = false;
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp && !atomic_load(&t->closing);
         tp = tp->next)
        for (uint32_t i = 0; atomic_load(&tp->subscribed) && i < t->partitions; i++)
            waiting = kb__nats_part_keep(t, &tp->parts[i], &feed_down) || waiting;
    return waiting;
}

/* Hand-overs go on while the round waits on consumers (the looks after a
 * reconnect): the next owner waits for them, not for this process. */
static void keep_while_waiting(kb_transport *t)
{
    keep_all(t);
}

/* One lease round: heartbeats and renewals first, for every topic, then the
 * member roster, hand-overs, then acquisitions until a held lease falls due.
 * Taking a partition costs a KV create and a consumer, so hundreds of new
 * topics take several rounds; renewing first keeps that from letting held
 * leases run out. The wait before the next round: 0 when acquisitions are
 * left, ROUND_RETRY when the server left something unanswered. *handing_over
 * while a hand-over waits. */
static int64_t pass(kb_transport *t, bool *heartbeat_failing, bool *handing_over)
{
    int64_t started = kb_now_ns();
    /* back-to-back rounds (acquisitions left over) renew only when due */
    int64_t renew_ns = t->lease_ttl_ms * 1000000 * 2 / 3;
    bool retry = false;
    kb_nats_round rd = {0, false, false, 0, keep_while_waiting};
    t->making_capped = false;
    if (kb__nats_watch_start(t) != NATS_OK)
        retry = true;   /* no early news of members: rounds still come */
    kb__nats_watch_prune(t);
    rd.stalled = !heartbeat(t, started, renew_ns, &retry, heartbeat_failing);
    kb__nats_claims_validity(t);
    kb_nats_roster r = {NULL, 0, false};
    if (!rd.stalled)
        kb__nats_roster_load(t, &r);
    for (kb_nats_topic *tp = atomic_load(&t->topics); r.ok && tp && !atomic_load(&t->closing);
         tp = tp->next)
        if (atomic_load(&tp->subscribed))
            kb__nats_members_rank(t, tp, &r);
    retry = retry || (!rd.stalled && !r.ok);
    kb__nats_roster_free(&r);
    /* the consumer looks and acquisitions stop when a held lease falls due:
     * a take's slowest call (TTL/3) then still ends before the lease runs
     * out locally */
    rd.until = kb_now_ns() + t->lease_ttl_ms * 1000000 / 3;
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp && !atomic_load(&t->closing); tp = tp->next)
        for (uint32_t i = 0; atomic_load(&tp->subscribed) && i < t->partitions; i++) {
            kb_nats_part *p = &tp->parts[i];
            if (p->lease_rev != 0 && p->lease_until_ns - renew_ns < rd.until)
                rd.until = p->lease_until_ns - renew_ns;
        }
    kb__nats_renudge_all(t, &rd);
    *handing_over = keep_all(t);
    for (kb_nats_topic *tp = atomic_load(&t->topics);
         tp && !atomic_load(&t->closing) && !rd.stalled && kb_now_ns() <= rd.until;
         tp = tp->next)
        if (atomic_load(&tp->subscribed))
            kb__nats_topic_take(t, tp, &rd);
    int64_t held = rd.held_until - kb_now_ns();
    if (rd.stalled || rd.again || retry)
        return held > 0 && held < ROUND_RETRY(t) ? held : ROUND_RETRY(t);
    if (held > 0 && held < rd.until - kb_now_ns())
        return held;
    /* the next round comes when the next renewal falls due at the latest: a
     * round woken early (a member came) must not push renewals back */
    int64_t left = rd.until - kb_now_ns();
    return left > 0 ? left : 0;
}

static int kicked(void *arg)
{
    kb_transport *t = arg;
    return atomic_load(&t->lease_kick) || atomic_load(&t->closing);
}

static void *leaser(void *arg)
{
    kb_transport *t = arg;
    bool heartbeat_failing = false, handing_over = false;
    int64_t next_round = 0;
    while (!atomic_load(&t->closing)) {
        int64_t now = kb_now_ns();
        if (now >= next_round || atomic_exchange(&t->lease_kick, 0))
            next_round = kb_now_ns() + pass(t, &heartbeat_failing, &handing_over);
        else if (handing_over)
            handing_over = keep_all(t);
        bool failed = false, refused = false;
        /* consumers made: the next round at once when a creation went
         * unanswered (the server has often made it by then, and its second
         * ask under the same name returns at once: a round later would add
         * most of a second to the partition's pause) or when claims wait
         * for a place and half the places are free (a round per claim
         * answered would list the topic's consumers again each time), soon
         * when the server refused one */
        if (t->making != NULL && kb__nats_making_collect(t, &failed, &refused)) {
            bool room = kb__nats_making_room(t);
            int64_t soon = (failed && !refused) || room ? kb_now_ns()
                           : failed                     ? kb_now_ns() + ROUND_RETRY(t)
                                                        : INT64_MAX;
            next_round = soon < next_round ? soon : next_round;
        }
        int64_t until = (handing_over || t->making != NULL) && next_round > now + HANDOVER_LOOK_NS
                            ? kb_now_ns() + HANDOVER_LOOK_NS
                            : next_round;
        if (until > kb_now_ns())
            kb_signal_wait(t->lease_wake, kicked, t, until);
    }
    kb__nats_making_end(t);
    nats_ReleaseThreadMemory();
    atomic_store(&t->leaser_done, 1);
    kb_signal_notify(t->lease_wake);
    return NULL;
}

int kb__nats_leaser_start(kb_transport *t, char *errstr, size_t errlen)
{
    return kb__nats_thread_start(&t->leaser, "kb-nats-lease", leaser, t, errstr, errlen);
}
