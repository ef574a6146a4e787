/* Partition ownership among processes: members heartbeat a key per topic in
 * a JetStream KV bucket whose TTL is the lease TTL; each partition goes to its
 * member by the kit's fair share (rendezvous ranking bounded by
 * ceil(partitions / members), kb_kit_share). A lease is a KV key created
 * and renewed by puts on its last revision, so a process that lost it learns
 * so on its next renewal (fencing). Every acquisition gets its own consumer
 * (nats_consumers.c), started at the previous consumers' ack floor:
 * redelivered events come first, in stream order. A partition that moves to
 * another member is handed over: its claim stops, its handlers finish and
 * are acked, then the lease is deleted, and the next owner, woken by the
 * delete (nats_watch.c), takes it at once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <keybus/kit.h>

#include "nats_claim.h"
#include "nats_consumers.h"
#include "nats_lease.h"
#include "nats_names.h"
#include "nats_progress.h"
#include "nats_watch.h"

/* How long the partitions of a member that left wait for a replacement. */
#define LEAVE_GRACE_MS 300

/* Does the claim of o cover partition p (its own, or every one: wide)? */
static bool opening_covers(const kb_nats_opening *o, const kb_nats_part *p)
{
    return o->c->wide || p == o->c->part;
}

/* Split. A lone member reads its topic through one wide claim; when a member
 * comes, some partitions rank there. Stopping the wide claim would pause every
 * partition for a consumer's creation (0.3-1 s replicated, on a loaded
 * cluster), also those that stay. Instead the partitions that stay get their
 * own claims while the wide one goes on: the feeder hands each over at a cut
 * (the last sequence of the partition the wide claim fed; nats_consume.c),
 * and each side acks the other's part once the other has handled it
 * (nats_claim.c). The partitions that move are handed over at once, while
 * the wide claim goes on (Early move, below); when one cannot be (a later
 * batch), once every kept partition has taken over and the wide claim has
 * handled up to the cuts, as before (the wide claim stopped, finished and
 * acked, then their leases deleted) — or, when that does not come within
 * SPLIT_MAX_MS, at once. */
#define SPLIT_MAX_MS(t) ((t)->lease_ttl_ms / 2)

/* The topic's wide claim while it is not fenced, or NULL. */
static kb_nats_claim *live_wide(const kb_transport *t, kb_nats_topic *tp)
{
    kb_nats_claim *w = atomic_load(&tp->split_wide);
    if (w != NULL && !atomic_load(&w->fenced))
        return w;
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_claim *c = atomic_load(&tp->parts[i].claim);
        if (c != NULL && c->wide && !atomic_load(&c->fenced))
            return c;
    }
    return NULL;
}

/* Does a partition read through wide claim w rank elsewhere now? */
static bool split_moving(const kb_transport *t, kb_nats_topic *tp, const kb_nats_claim *w)
{
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *p = &tp->parts[i];
        if (p->lease_rev != 0 && atomic_load(&p->claim) == w && (!p->wanted || p->releasing))
            return true;
    }
    return false;
}

/* Has every partition that stays taken over from w, and w handled up to
 * each one's cut? */
static bool split_done(const kb_transport *t, kb_nats_topic *tp, const kb_nats_claim *w)
{
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *p = &tp->parts[i];
        if (p->lease_rev == 0 || !p->wanted || p->releasing)
            continue;
        kb_nats_claim *c = atomic_load(&p->claim);
        if (c == NULL || c == w || p->creating != NULL)
            return false;
        if (atomic_load(&c->split_from) == w && !kb__nats_claim_cut_passed(c, w))
            return false;
    }
    return true;
}

/* May the partitions that stay still take over from w one by one? Not after
 * SPLIT_MAX_MS: the ones that move wait for it. */
static bool split_on(const kb_transport *t, kb_nats_topic *tp)
{
    if (tp->split_since_ns == 0)
        tp->split_since_ns = kb_now_ns();
    return kb_now_ns() - tp->split_since_ns <= SPLIT_MAX_MS(t) * 1000000LL;
}

/* A claim never published gives up: nothing feeds it, and the acker frees
 * it, so the hand-overs of its partitions do not wait for it. */
static void claim_unpublished(kb_nats_claim *c)
{
    atomic_store(&c->fenced, 1);
    atomic_store(&c->feeder_left, 1);
}

typedef struct members {
    const char **keys;   /* into the roster or the watch */
    int n, cap;
    size_t pl;           /* the topic's member prefix: ids are keys + pl */
    char mine[2 * KB_NATS_NAME];
} members;

static void members_add(const char *key, void *arg)
{
    members *ms = arg;
    for (int i = 0; i < ms->n; i++)
        if (strcmp(ms->keys[i], key) == 0)
            return;
    if (ms->n < ms->cap)
        ms->keys[ms->n++] = key;
}

/* The topic's members: the roster's keys under its prefix, less those the
 * watch saw leave since, plus those it saw come since (a roster read just
 * before a write misses it); this process always among them. False when the
 * roster is unknown. */
static bool members_load(kb_transport *t, kb_nats_topic *tp, const kb_nats_roster *r, members *ms)
{
    char pre[2 * KB_NATS_NAME];
    kb__nats_member_prefix(t, tp, pre, sizeof pre);
    kb__nats_member_key(t, tp, ms->mine, sizeof ms->mine);
    ms->pl = strlen(pre);
    ms->n = 0;
    ms->cap = r->n + (int)kb__nats_watch_count(t) + 64;   /* it may grow meanwhile */
    ms->keys = r->ok ? calloc((size_t)ms->cap, sizeof *ms->keys) : NULL;
    if (ms->keys == NULL)
        return false;
    for (int i = 0; i < r->n; i++)
        if (strncmp(r->keys[i], pre, ms->pl) == 0 && kb__nats_watch_member(t, r->keys[i]) != 0)
            members_add(r->keys[i], ms);
    kb__nats_watch_members(t, pre, members_add, ms);
    members_add(ms->mine, ms);
    return true;
}

/* The kit's fair share (as redis:// and file:// rank): each partition, in
 * order, goes to the live member ranked first among those holding fewer than
 * ceil(partitions / members). The topic's hash salts the ranking so that
 * topics do not all rank the same members first. */
void kb__nats_members_rank(kb_transport *t, kb_nats_topic *tp, const kb_nats_roster *r)
{
    members ms;
    if (!members_load(t, tp, r, &ms))
        return;   /* the roster is unknown: the shares stay */
    const char **ids = malloc((size_t)ms.n * sizeof *ids);
    unsigned char *mine = malloc(t->partitions);
    if (ids != NULL && mine != NULL) {
        for (int i = 0; i < ms.n; i++)
            ids[i] = ms.keys[i] + ms.pl;
        kb_kit_share(ids, (size_t)ms.n, ms.mine + ms.pl, t->partitions, tp->hash, mine);
        for (uint32_t i = 0; i < t->partitions; i++)
            tp->parts[i].wanted = mine[i] != 0;
    }
    free(ids);
    free(mine);
    free(ms.keys);
}

/* The partition's claim ends (fenced: its queued events are released, no
 * more deliveries); the lease is another matter. */
static void claim_end(kb_transport *t, kb_nats_part *p)
{
    kb_nats_claim *c = atomic_load(&p->claim);
    if (c != NULL)
        atomic_store(&c->fenced, 1);
    atomic_store(&p->claim, NULL);
    kb_signal_notify(t->acked);   /* a feeder waiting for room in its ring */
}

/* The lease at revision rev, put at sent_ns or later: its local expiry
 * counts from the send, not from the answer (the server's TTL runs from
 * when it stored the put). */
static void lease_taken(kb_transport *t, kb_nats_part *p, uint64_t rev, int64_t sent_ns)
{
    p->lease_rev = rev;
    p->lease_rev_unsure = false;
    p->lease_until_ns = sent_ns + t->lease_ttl_ms * 1000000;
    kb_bus_lease_changed(t->bus, p->subject, p->n, 1);
    kb_log(t->bus, KB_LOG_DEBUG, "nats %s: lease of %s taken (revision %llu)", t->url_safe,
           p->subject, (unsigned long long)rev);
}

static void lease_gone(kb_transport *t, kb_nats_part *p)
{
    claim_end(t, p);
    kb_nats_claim *newest = atomic_load(&p->claims);
    if (newest != NULL)   /* a later owner's claim takes a name of its own */
        newest->name_free = false;
    if (p->lease_rev != 0)
        kb_bus_lease_changed(t->bus, p->subject, p->n, 0);
    p->lease_rev = 0;
    p->releasing = false;
    p->leases_ended++;
}

/* When the lease of p runs out locally: TTL - TTL/6 after its last take or
 * renewal (kb__nats_lease_renewed drops it then). */
static int64_t local_expiry(const kb_transport *t, const kb_nats_part *p)
{
    return p->lease_until_ns - t->lease_ttl_ms * 1000000 / 6;
}

/* Did partition q move out of wide claim c early and hand its lease over? */
static bool moved_out_of(const kb_nats_claim *c, const kb_nats_part *q)
{
    return c->wide && q->lease_rev == 0 && atomic_load(&q->moved_from) == c;
}

/* Claim c stays valid while every lease it covers does (but those of
 * partitions that moved out of it early): a lease round can block past
 * that, and the feeder and executors must stop on their own. */
static void claim_validity(const kb_transport *t, kb_nats_claim *c)
{
    int64_t until = moved_out_of(c, c->part) ? INT64_MAX : local_expiry(t, c->part);
    kb_nats_part *parts = c->part->topic->parts;
    for (uint32_t i = 0; c->wide && i < t->partitions; i++) {
        int64_t e = parts[i].lease_rev != 0 ? local_expiry(t, &parts[i]) : 0;
        if (!moved_out_of(c, &parts[i]) && e < until)
            until = e;
    }
    atomic_store(&c->valid_until_ns, until == INT64_MAX ? 0 : until);
}

void kb__nats_claims_validity(kb_transport *t)
{
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next) {
        if (!atomic_load(&tp->subscribed))
            continue;
        for (uint32_t i = 0; i < t->partitions; i++) {
            kb_nats_claim *c = atomic_load(&tp->parts[i].claim);
            if (c != NULL && c->part == &tp->parts[i])
                claim_validity(t, c);
        }
        /* a split's wide claim, when partition 0 took over from it or
         * moved out of it early */
        kb_nats_claim *w = live_wide(t, tp);
        if (w != NULL && atomic_load(&tp->parts[0].claim) != w)
            claim_validity(t, w);
    }
}

/* A refused renewal is a lost lease, even when the key names this consumer:
 * the name is shared by every bus of the process and by a restarted process
 * beside a hung old one. An unanswered one is not: the lease is kept until
 * it runs out locally, since nobody can take it from a bucket that answers
 * nobody. */
void kb__nats_lease_renewed(kb_transport *t, kb_nats_part *p, natsStatus s, uint64_t rev,
                            int64_t started, bool *unanswered)
{
    /* no responders: not stored (no leader took it) */
    p->lease_rev_unsure = s != NATS_OK && s != NATS_ERR && s != NATS_NO_RESPONDERS;
    if (s == NATS_OK) {
        p->lease_rev = rev;
        p->lease_until_ns = started + t->lease_ttl_ms * 1000000;
        return;
    }
    int64_t margin = t->lease_ttl_ms * 1000000 / 6;
    if (s == NATS_ERR || kb_now_ns() > p->lease_until_ns - margin) {
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: lease of %s lost (%s); taken again when it "
               "ranks here and the bucket answers", t->url_safe, p->subject,
               s == NATS_ERR ? "another member holds it" : "the bucket did not answer in time");
        lease_gone(t, p);
    } else {
        *unanswered = true;
    }
}

/* The leases' revisions for their deletes. After a renewal left unanswered
 * the bucket may have stored it: a delete on the older revision would be
 * refused and the next owner would wait for the key to run out (a TTL). Such
 * keys are read, in one batch, and a value that is this bus's own put gives
 * the revision. */
static void current_revs(kb_transport *t, kb_nats_part **parts, size_t n)
{
    kb_nats_kv_ops reads = {NULL, 0, 0, 0};
    for (size_t i = 0; i < n; i++)
        if (parts[i]->lease_rev_unsure)
            kb__nats_kv_add(&reads, parts[i]->lease_key, parts[i], parts[i]->lease_rev, true);
    if (reads.n > 0)
        kb__nats_kv_run(t, &reads);
    for (size_t i = 0; i < reads.n; i++) {
        kb_nats_kv_op *r = &reads.v[i];
        if (r->s == NATS_OK && r->this_bus && r->rev > r->p->lease_rev)
            r->p->lease_rev = r->rev;
        r->p->lease_rev_unsure = false;
    }
    free(reads.v);
}

/* The final progress records of the partition's last claim and of the
 * wide claims, stored before the lease goes: the next owner then settles
 * what they handled and takes the rest as first deliveries
 * (kb__nats_progress_final). One not stored costs it only time. */
static void final_records(kb_transport *t, kb_nats_part *p)
{
    kb_nats_claim *last = atomic_load(&p->claims);
    if (last != NULL)
        kb__nats_progress_final(t, last);
    /* a wide claim whose consumer creation timed out left its name to the
     * next: only the newest claim of a name speaks for that consumer */
    for (kb_nats_claim *c = atomic_load(&p->topic->wide_claims); c; c = c->next) {
        bool newer_of_name = false;
        for (kb_nats_claim *n = atomic_load(&p->topic->wide_claims); n != c && !newer_of_name;
             n = n->next)
            newer_of_name = strcmp(n->consumer, c->consumer) == 0;
        if (!newer_of_name)
            kb__nats_progress_final(t, c);
    }
}

/* Early move. The partitions that move need not wait for the split: each
 * is cut where the wide claim last fed it, its later messages there are
 * pushed "moved" (done, never acked: the wide claim's acks stop for good at
 * the first), and once the wide claim acked past the cut (its handlers done,
 * the wide consumer's floor there) the lease is handed over while the wide
 * claim goes on for the partitions that stay. Their wait was the kept
 * partitions' consumers' creation (a Raft campaign, 0.1-0.8 s) before their
 * own. Every partition of the topic that moves out of w now does so in one
 * batch, cut together by the feeder. */
static void move_out(kb_transport *t, kb_nats_topic *tp, kb_nats_claim *w)
{
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *q = &tp->parts[i];
        if (q->lease_rev == 0 || atomic_load(&q->claim) != w || (q->wanted && !q->releasing) ||
            atomic_load(&q->moved_from) == w)
            continue;
        atomic_store(&q->moved_from, w);
        q->releasing = true;
        if (q->creating != NULL)   /* never published (nor will it be) */
            claim_unpublished(q->creating);
    }
    w->moved_out = true;
    atomic_fetch_add(&tp->move_gen, 1);
}

/* Once every partition moving out of w has its cut (or was refused one),
 * the cuts are recorded for the next owners (kb__nats_progress_moved_store),
 * before any of their leases goes; again when a later batch adds cuts. */
static bool cuts_recorded(kb_transport *t, kb_nats_topic *tp, kb_nats_claim *w)
{
    uint32_t cuts = 0;
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *q = &tp->parts[i];
        if (atomic_load(&q->moved_from) != w || atomic_load(&q->move_refused_for) == w)
            continue;
        if (atomic_load(&q->move_cut_for) != w)
            return false;
        cuts++;
    }
    if (cuts != w->moved_recorded) {
        if (!kb__nats_progress_moved_store(t, w))
            kb_log(t->bus, KB_LOG_INFO, "nats %s: the cuts of partitions moving out of %s "
                   "were not stored: their next owners count its deliveries past them as "
                   "attempts", t->url_safe, w->consumer);
        w->moved_recorded = cuts;
    }
    return true;
}

/* Has partition p moved out of live wide claim w far enough to be handed
 * over: the feeder set its cut, w acked past it (so its handlers are done
 * and the wide consumer's floor is there: the next owner starts after it),
 * and every earlier claim of p is finished? */
static bool moved_out_done(const kb_nats_part *p, kb_nats_claim *w)
{
    return atomic_load(&p->move_cut_for) == w &&
           atomic_load(&w->acked_to) >= atomic_load(&p->move_cut) && kb__nats_claims_done(p, w);
}

/* Hand a partition over without duplicates: stop feeding, let the handlers
 * finish and the frontier be acked, then delete the lease. The acks wait in
 * the consumer's connection, the delete goes on nc: the PING answered on the
 * former says the server has the acks before the next owner can start. Not
 * answered: the lease stays until a later try, and this one waits on that
 * connection no more (*feed_down). True while it waits. */
static bool release_step(kb_transport *t, kb_nats_part *p, bool *feed_down)
{
    kb_nats_claim *w = atomic_load(&p->moved_from);
    bool early = w != NULL && atomic_load(&p->claim) == w;
    if (early && !atomic_load(&w->fenced) && !split_on(t, p->topic))
        kb__nats_claim_reset(t, w);   /* held past SPLIT_MAX_MS (a slow handler): as before */
    if (early && atomic_load(&w->fenced)) {
        claim_end(t, p);   /* the split ended meanwhile: as any hand-over */
        early = false;
    }
    if (early && atomic_load(&p->move_refused_for) == w) {
        p->releasing = false;   /* it waits for the split after all */
        return true;
    }
    if (early ? !cuts_recorded(t, p->topic, w) || !moved_out_done(p, w)
              : !kb__nats_claims_done(p, NULL))
        return true;
    if (*feed_down)
        return true;
    if (natsConnection_FlushTimeout(kb__nats_feed_conn(t), kb__nats_round_wait_ms(t)) !=
        NATS_OK) {
        *feed_down = true;
        return true;
    }
    final_records(t, p);
    current_revs(t, &p, 1);
    kb__nats_kv_delete(t, p->lease_key, p->lease_rev);
    kb_log(t->bus, KB_LOG_DEBUG, "nats %s: lease of %s handed over%s", t->url_safe, p->subject,
           early ? " ahead of its wide claim's split" : "");
    if (early)
        atomic_store(&p->claim, NULL);   /* the wide claim goes on for the others */
    lease_gone(t, p);
    return false;
}

/* A member that left is often replaced within moments (a rolling deploy).
 * For LEAVE_GRACE_MS after a leave the shares wait: its partitions are not
 * taken, and none held here starts moving to another member (the bound
 * spreads a leaver's partitions over every member left, so a few move
 * between members that stay, and the replacement's coming would move them
 * back); the ranking of then decides, instead of partitions moving twice.
 * Returns the grace's end, or 0 when none runs. */
static int64_t leave_grace_end(kb_nats_topic *tp)
{
    int64_t left = atomic_load(&tp->member_left_ns), end = left + LEAVE_GRACE_MS * 1000000LL;
    return left != 0 && kb_now_ns() < end ? end : 0;
}

bool kb__nats_part_keep(kb_transport *t, kb_nats_part *p, bool *feed_down)
{
    if (p->lease_rev == 0)
        return false;
    if (!p->releasing && p->wanted)
        return false;
    if (!p->releasing && !atomic_load(&t->stopping) && leave_grace_end(p->topic) != 0)
        return false;   /* the round after the grace (acquire_all's held_until) looks again */
    if (!p->releasing) {
        kb_nats_claim *w = atomic_load(&p->claim);
        if (w != NULL && w->wide && !atomic_load(&w->fenced) && split_on(t, p->topic) &&
            !split_done(t, p->topic, w)) {
            if (atomic_load(&p->move_refused_for) == w)
                return true;   /* the partitions that stay take over first (Split) */
            move_out(t, p->topic, w);
            return release_step(t, p, feed_down);
        }
        claim_end(t, p);
        p->releasing = true;
        /* a claim whose consumer is still being made is given up at once
         * (its consumer is deleted when made): the lease goes now, not when
         * the server has made a consumer nobody will read */
        if (p->creating != NULL)   /* never published (nor will it be) */
            claim_unpublished(p->creating);
    }
    return release_step(t, p, feed_down);
}

/* A consumer is named after its lease revision. When a claim of that
 * revision existed already (one reset while the lease stayed), the lease is
 * renewed first for a new revision: a new consumer must never take over an
 * earlier one's name, and with it its delivery state. */
static bool fresh_revision(kb_transport *t, kb_nats_part *p, kb_nats_claim *earlier,
                           kb_nats_round *rd)
{
    bool used = false;
    for (kb_nats_claim *c = earlier; c != NULL && !used; c = c->next)
        used = c->rev == p->lease_rev && !c->name_free;
    if (!used)
        return true;
    uint64_t rev = 0;
    int64_t sent = 0;
    natsStatus s = kb__nats_lease_put(t, p, p->lease_rev, &rev, &sent);
    p->lease_rev_unsure = s != NATS_OK && s != NATS_ERR && s != NATS_NO_RESPONDERS;
    if (s != NATS_OK) {   /* next round: a renewal will tell whether it is still ours */
        rd->stalled = rd->stalled || s != NATS_ERR;
        return false;
    }
    p->lease_rev = rev;
    p->lease_until_ns = sent + t->lease_ttl_ms * 1000000;
    return true;
}

/* The puts of a batch that went through take their leases; false when the
 * server answered none of it. */
static bool taken(kb_transport *t, const kb_nats_kv_ops *ops)
{
    size_t answered = 0;
    for (size_t i = 0; i < ops->n; i++) {
        answered += kb__nats_kv_answered(&ops->v[i]);
        if (ops->v[i].s == NATS_OK)
            lease_taken(t, ops->v[i].p, ops->v[i].rev, ops->sent_ns);
    }
    return ops->n == 0 || answered > 0;
}

/* Take the topic's wanted leases in three pipelined batches: a create of
 * each (a key never written or expired); for those refused, a read of the
 * key; then a put on its last revision where it is free (a delete: a
 * hand-over, a clean leave) or ours from before (a restart of this consumer
 * name, a renewal whose answer was lost). This process is the only writer of
 * its own name, each put on the revision before: a key still naming it was
 * never another's since. A batch costs one wait, not a round trip per
 * partition. */
static void acquire_all(kb_transport *t, kb_nats_topic *tp, kb_nats_round *rd)
{
    kb_nats_kv_ops creates = {NULL, 0, 0, 0}, reads = {NULL, 0, 0, 0}, puts = {NULL, 0, 0, 0};
    int64_t held = leave_grace_end(tp);   /* the shares wait for a replacement */
    if (held != 0) {
        rd->held_until = held;
        return;
    }
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *p = &tp->parts[i];
        if (p->wanted && p->lease_rev == 0 && !p->releasing)
            kb__nats_kv_add(&creates, p->lease_key, p, 0, false);
    }
    if (creates.n > 0)
        kb__nats_kv_run(t, &creates);
    bool answered = taken(t, &creates);
    for (size_t i = 0; i < creates.n; i++)
        if (creates.v[i].s == NATS_ERR)
            kb__nats_kv_add(&reads, creates.v[i].key, creates.v[i].p, 0, true);
    if (reads.n > 0)
        kb__nats_kv_run(t, &reads);
    for (size_t i = 0; i < reads.n; i++) {
        kb_nats_kv_op *r = &reads.v[i];
        if ((r->s == NATS_NOT_FOUND && r->rev != 0) || (r->s == NATS_OK && r->ours))
            kb__nats_kv_add(&puts, r->key, r->p, r->rev, false);
        answered = answered && (r->s == NATS_OK || r->s == NATS_NOT_FOUND);
    }
    if (puts.n > 0)
        kb__nats_kv_run(t, &puts);
    answered = taken(t, &puts) && answered;
    rd->stalled = rd->stalled || !answered;
    free(creates.v);
    free(reads.v);
    free(puts.v);
}

/* Does the partition need a claim this round (its lease held, no claim)? */
static bool needs_claim(kb_transport *t, kb_nats_part *p, kb_nats_round *rd)
{
    if (p->releasing || p->creating != NULL || atomic_load(&t->stopping) || p->lease_rev == 0)
        return false;
    kb_nats_claim *c = atomic_load(&p->claim);
    /* once a split began, every partition that stays takes over, so that
     * the wide claim can end even when the member that came went again */
    bool split = c != NULL && c->wide && !atomic_load(&c->fenced) && p->wanted &&
                 (split_moving(t, p->topic, c) || atomic_load(&p->topic->split_wide) == c ||
                  c->moved_out) &&
                 split_on(t, p->topic);
    return (c == NULL || atomic_load(&c->fenced) || split) &&
           fresh_revision(t, p, atomic_load(&p->claims), rd);
}

/* The times the leases o covers ended (lost or released) so far. */
static uint32_t leases_ended(const kb_transport *t, const kb_nats_opening *o)
{
    uint32_t ended = 0;
    kb_nats_part *parts = o->c->part->topic->parts;
    for (uint32_t i = 0; i < t->partitions; i++)
        if (opening_covers(o, &parts[i]))
            ended += parts[i].leases_ended;
    return ended;
}

/* May the claim of o take over now that its consumer is made? Not when a
 * lease it covers ended meanwhile (another owner may have handled past its
 * floor), nor when one of its partitions ranks elsewhere now or is being
 * handed over (the next owner would only wait for it). */
static bool still_wanted(const kb_transport *t, const kb_nats_opening *o)
{
    if (leases_ended(t, o) != o->leases_ended)
        return false;
    kb_nats_part *parts = o->c->part->topic->parts;
    for (uint32_t i = 0; i < t->partitions; i++)
        if (opening_covers(o, &parts[i]) &&
            (parts[i].lease_rev == 0 || !parts[i].wanted || parts[i].releasing))
            return false;
    return true;
}

/* Did o's creation wait a second or more for an answer that never came?
 * The server has often made the consumer meanwhile. A "timeout" that came
 * early (a write that stalled) is no sign of it: asking again at once would
 * spin. */
static bool unanswered(const kb_nats_opening *o)
{
    return o->s == NATS_TIMEOUT && o->took_ns >= 1000000000LL;
}

/* The claim of o takes over its partitions if its consumer was made and
 * they are still this process's to take; else it gives up (*again: its
 * consumer was not made, so the partition is claimed again soon; *refused:
 * the server said why). */
static void claim_publish(kb_transport *t, kb_nats_opening *o, bool *again, bool *refused)
{
    kb_nats_claim *c = o->c;
    bool made = o->s == NATS_OK, wanted = made && still_wanted(t, o);
    if (!made)
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: consumer %s: %s (error %d: %s); %s is "
               "claimed again %s", t->url_safe, c->consumer, natsStatus_GetText(o->s),
               (int)o->jerr, o->why, c->part->subject,
               unanswered(o)            ? "at once, under the same name"
               : o->s == NATS_TIMEOUT ? "next round, under the same name"
                                      : "next round");
    else if (!wanted)
        kb_log(t->bus, KB_LOG_DEBUG, "nats %s: consumer %s made, but %s is no longer this "
               "process's to take: not claimed", t->url_safe, c->consumer, c->part->subject);
    if (!wanted) {
        claim_unpublished(c);
        *again = *again || !made;
        *refused = *refused || (!made && !unanswered(o));
        return;
    }
    /* prepared as a split, it takes over as one even when the wide claim
     * stopped meanwhile: it then counts as orphaned and is claimed again
     * from the floors, with the progress record it was prepared without */
    kb_nats_claim *w = o->split_of;
    bool split = w != NULL && atomic_load(&c->part->claim) == w;
    kb_log(t->bus, KB_LOG_DEBUG, "nats %s: %s claimed by consumer %s (created in %lld ms%s)%s%s",
           t->url_safe, c->wide ? c->part->topic->stream : c->part->subject, c->consumer,
           (long long)(o->took_ns / 1000000), o->leaderless ? ", no leader yet" : "",
           split ? "; it takes over from " : "", split ? w->consumer : "");
    o->claimed = true;
    c->born_leaderless = o->leaderless;
    claim_validity(t, c);
    if (c->wide) {
        /* partition 0 pulls for all: it learns of the claim last, so
         * every partition knows it before its first message can come */
        kb_nats_part *parts = c->part->topic->parts;
        for (uint32_t j = t->partitions; j-- > 0;) {
            claim_end(t, &parts[j]);
            atomic_store(&parts[j].claim, c);
        }
    } else {
        if (split) {
            /* a split: the wide claim goes on; the feeder sets the cut */
            atomic_store(&c->split_from, w);
            atomic_store(&c->part->topic->split_wide, w);
        } else {
            claim_end(t, c->part);
        }
        atomic_store(&c->part->claim, c);
    }
}

/* A new claim of p (wide: of its topic) for opening o; false on out of memory. */
static bool opening_new(kb_transport *t, kb_nats_part *p, bool wide, kb_nats_opening *o)
{
    kb_nats_claim *prev = atomic_load(wide ? &p->topic->wide_claims : &p->claims);
    o->retried = prev != NULL && prev->name_free;
    o->c = kb__nats_claim_new(t, p, kb__nats_claim_rev(p, wide), wide);
    return o->c != NULL;
}

/* A claim whose consumer's creation went unanswered leaves its name to the
 * next claim of its revision (the server may have made the consumer late):
 * never a second consumer for one claim. */
static void name_free(const kb_transport *t, kb_nats_opening *o)
{
    /* not when the lease ended meanwhile: the next claim is another owner's
     * revision's, and takes a name of its own */
    o->c->name_free = o->s == NATS_TIMEOUT && leases_ended(t, o) == o->leases_ended;
}

/* At most this many consumers being made at once: the meta leader orders
 * them anyway, and hundreds of new topics should not start hundreds of
 * threads. A batch's threads are joined when its last creation returns, so
 * with some left unanswered, finished threads of up to MAKING_MAX batches
 * wait to be joined (their stacks kept) for a creation's timeout at most. */
#define MAKING_MAX 16

/* Claims whose consumers are being made, with the listing they were prepared
 * from (the consumers they replace are found in it). While the server makes
 * them (0.2-0.9 s each on a three-node cluster, replicated; a creation the
 * meta group leaves unanswered times out after seconds) the lease thread
 * goes on: renewals, a member that came, a lease handed over to it. Each
 * claim takes over once its own consumer is made; the consumers they replace
 * are deleted once the whole batch was answered. */
typedef struct kb_nats_making {
    struct kb_nats_making *next;
    kb_nats_topic *tp;
    kb_nats_opening *o;
    size_t n;
    kb_nats_listing l;
    kb_nats_calls *creating, *deleting;
    bool created;   /* every creation answered */
} kb_nats_making;

/* The partitions of o marked while its consumer is being made. */
static void creating_mark(kb_transport *t, kb_nats_opening *o, bool on)
{
    kb_nats_part *parts = o->c->part->topic->parts;
    for (uint32_t i = 0; i < t->partitions; i++)
        if (opening_covers(o, &parts[i]))
            parts[i].creating = on ? o->c : NULL;
}

/* Start making the n openings' consumers; takes o and the listing (*l
 * emptied). False on out of memory (o and *l stay the caller's; the
 * openings' claims are fenced). */
static bool making_start(kb_transport *t, kb_nats_topic *tp, kb_nats_opening *o, size_t n,
                         kb_nats_listing *l)
{
    kb_nats_making *m = calloc(1, sizeof *m);
    if (m == NULL) {
        for (size_t i = 0; i < n; i++)
            claim_unpublished(o[i].c);
        return false;
    }
    *m = (kb_nats_making){t->making, tp, o, n, *l, NULL, NULL, false};
    memset(l, 0, sizeof *l);
    for (size_t i = 0; i < n; i++) {
        o[i].leases_ended = leases_ended(t, &o[i]);
        creating_mark(t, &o[i], true);
    }
    m->creating = kb__nats_consumers_start(t, o, n);
    t->making = m;
    t->making_n += n;
    return true;
}

/* Opening i of m is answered (or, all: the batch is over): its claim takes
 * over now, whatever the others of its batch wait for. */
static void making_answered(kb_transport *t, kb_nats_making *m, size_t i, bool *again,
                            bool *refused)
{
    kb_nats_opening *o = &m->o[i];
    o->handled = true;
    t->making_n--;
    creating_mark(t, o, false);
    claim_publish(t, o, again, refused);
    name_free(t, o);
}

bool kb__nats_making_collect(kb_transport *t, bool *again, bool *refused)
{
    bool finished = false;
    for (kb_nats_making **at = &t->making; *at != NULL;) {
        kb_nats_making *m = *at;
        if (!m->created) {
            bool all = kb__nats_calls_done(m->creating);
            for (size_t i = 0; i < m->n; i++)
                if (!m->o[i].handled &&
                    (all || atomic_load_explicit(&m->o[i].made, memory_order_acquire))) {
                    making_answered(t, m, i, again, refused);
                    finished = true;
                }
            if (all) {
                kb__nats_calls_end(m->creating);
                m->created = true;
                m->deleting = kb__nats_consumers_retire(t, m->tp, &m->l, m->o, m->n);
                bool claimed = false;
                for (size_t i = 0; i < m->n; i++)
                    claimed = claimed || m->o[i].claimed;
                if (claimed && !m->o[0].c->wide && kb__nats_listing_has(t, &m->l, true) &&
                    live_wide(t, m->tp) == NULL)
                    kb__nats_wide_retire(t, m->tp);   /* rare: a topic leaving its wide consumer */
            }
        }
        if (m->created && kb__nats_calls_done(m->deleting)) {
            kb__nats_calls_end(m->deleting);
            kb__nats_listing_free(&m->l);
            free(m->o);
            *at = m->next;
            free(m);
            continue;
        }
        at = &m->next;
    }
    return finished;
}

bool kb__nats_making_room(const kb_transport *t)
{
    return t->making_capped && t->making_n <= MAKING_MAX / 2;
}

void kb__nats_making_end(kb_transport *t)
{
    for (kb_nats_making *m = t->making; m != NULL; m = m->next)
        for (size_t i = 0; !m->created && i < m->n; i++)
            if (!m->o[i].handled) {
                claim_unpublished(m->o[i].c);
                m->o[i].leases_ended = UINT32_MAX;   /* never published */
            }
    while (t->making != NULL) {
        bool again = false, refused = false;
        kb__nats_making_collect(t, &again, &refused);
        if (t->making != NULL)
            nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
}

/* One consumer for the whole topic when this process takes every partition
 * at once and the group has no partition consumers on it (a topic seen first,
 * or a lone member's restart): a consumer costs the server about a
 * millisecond to create (far more when replicated), and 1,000 topics of 8
 * partitions took 8,000 of them. When another member comes, the wide claim
 * is dropped like any other and each partition gets its own consumer from
 * its floor. True when the topic's claims are settled for this round. */
static bool wide_take(kb_transport *t, kb_nats_topic *tp, kb_nats_listing *l, kb_nats_round *rd)
{
    if (!t->topic_consumer || t->partitions < 2 || atomic_load(&t->stopping))
        return false;
    if (t->making_n >= MAKING_MAX) {
        t->making_capped = true;
        return true;   /* this topic waits for a place */
    }
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *p = &tp->parts[i];
        kb_nats_claim *c = atomic_load(&p->claim);
        if (p->releasing || p->creating != NULL || !p->wanted ||
            (c != NULL && !atomic_load(&c->fenced)))
            return false;
    }
    for (uint32_t i = 0; i < t->partitions; i++)
        if (tp->parts[i].lease_rev == 0)
            return false;
    if (!fresh_revision(t, &tp->parts[0], atomic_load(&tp->wide_claims), rd))
        return true;   /* next round */
    if (!kb__nats_listing_load(t, tp, l)) {
        rd->stalled = true;
        return true;
    }
    if (kb__nats_listing_has(t, l, false))
        return false;
    if (!kb__nats_earlier_readable(t, &tp->parts[0], true, l)) {
        rd->again = true;
        return true;
    }
    kb_nats_opening *o = calloc(1, sizeof *o);
    if (o == NULL || !opening_new(t, &tp->parts[0], true, o)) {
        free(o);
        return false;   /* one partition at a time, then */
    }
    kb__nats_opening_prepare(t, o, l);
    if (!making_start(t, tp, o, 1, l))
        free(o);
    return true;
}

/* A split with no partition left to move (every one that stays took over,
 * or the member that came went again): the wide claim stops once nothing
 * waits on it, and its consumer goes when every partition has its own. */
static void split_end(kb_transport *t, kb_nats_topic *tp)
{
    kb_nats_claim *w = live_wide(t, tp);
    if (w == NULL || split_moving(t, tp, w)) {
        if (w == NULL)
            tp->split_since_ns = 0;
        return;
    }
    /* after an early move the split goes on: its acks stopped for good at
     * the moved partitions' entries, so past SPLIT_MAX_MS the partitions
     * still on it are claimed again from the floors */
    bool late = w->moved_out && !split_on(t, tp);
    if (!w->moved_out)
        tp->split_since_ns = 0;
    for (uint32_t i = 0; i < t->partitions; i++)
        if (atomic_load(&tp->parts[i].claim) == w) {
            if (late)
                kb__nats_claim_reset(t, w);
            return;   /* it still reads some partition */
        }
    if (!split_done(t, tp, w)) {
        if (late)
            kb__nats_claim_reset(t, w);
        return;
    }
    tp->split_since_ns = 0;
    atomic_store(&w->fenced, 1);
    kb_signal_notify(t->acked);
    kb__nats_wide_retire(t, tp);
}

void kb__nats_topic_take(kb_transport *t, kb_nats_topic *tp, kb_nats_round *rd)
{
    kb_nats_listing l = {0};
    split_end(t, tp);
    if (!atomic_load(&t->stopping))
        acquire_all(t, tp, rd);
    if (!wide_take(t, tp, &l, rd)) {
        kb_nats_opening *o = calloc(t->partitions, sizeof *o);
        size_t n = 0;
        for (uint32_t i = 0; o != NULL && i < t->partitions && !rd->stalled &&
                             kb_now_ns() <= rd->until;
             i++) {
            kb_nats_part *p = &tp->parts[i];
            if (!needs_claim(t, p, rd))
                continue;
            if (t->making_n + n >= MAKING_MAX) {
                t->making_capped = true;   /* the rest when a place is free */
                break;
            }
            if (!kb__nats_listing_load(t, tp, &l)) {
                rd->stalled = true;
                break;
            }
            if (!kb__nats_earlier_readable(t, p, false, &l)) {
                rd->again = true;   /* the other partitions go on */
                continue;
            }
            if (opening_new(t, p, false, &o[n]))
                kb__nats_opening_prepare(t, &o[n++], &l);
        }
        if (n == 0 || !making_start(t, tp, o, n, &l))
            free(o);
    }
    kb__nats_listing_free(&l);
}

void kb__nats_renudge_all(kb_transport *t, kb_nats_round *rd)
{
    uint32_t rc = atomic_load(&t->reconnects);
    if (rc == t->reconnects_renudged && !atomic_exchange(&t->renudge_wanted, 0))
        return;
    size_t n = 0, cap = 0;
    kb_nats_claim **claims = NULL;
    bool ok = true;
    for (kb_nats_topic *tp = atomic_load(&t->topics); ok && tp && !atomic_load(&t->closing);
         tp = tp->next)
        for (uint32_t i = 0; ok && atomic_load(&tp->subscribed) && i < t->partitions; i++) {
            kb_nats_claim *c = atomic_load(&tp->parts[i].claim);
            if (c == NULL || c->part != &tp->parts[i] || atomic_load(&c->fenced))
                continue;   /* a wide claim once, on partition 0 */
            if (n == cap) {
                kb_nats_claim **more = realloc(claims, (cap = cap ? 2 * cap : 16) * sizeof *more);
                ok = more != NULL;
                claims = ok ? more : claims;
            }
            if (ok)
                claims[n++] = c;
        }
    ok = ok && kb__nats_claims_renudge(t, claims, n, rd->until, rd->idle);
    free(claims);
    if (ok)
        t->reconnects_renudged = rc;
    rd->again = rd->again || !ok;   /* asked again soon; acquisitions go on */
}

void kb__nats_lease_release_all(kb_transport *t, int64_t deadline)
{
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next) {
        if (!atomic_load(&tp->subscribed))
            continue;
        int left = kb_deadline_left_ms(deadline);
        kb_nats_part **held = malloc(t->partitions * sizeof *held);
        size_t n = 0;
        for (uint32_t i = 0; held != NULL && i < t->partitions; i++)
            if (tp->parts[i].lease_rev != 0)
                held[n++] = &tp->parts[i];
        if (left < 0 || left > 2 * kb__nats_round_wait_ms(t)) {
            for (size_t i = 0; i < n; i++)   /* while time is left for the deletes */
                if (kb_deadline_left_ms(deadline) < 0 ||
                    kb_deadline_left_ms(deadline) > 2 * kb__nats_round_wait_ms(t))
                    final_records(t, held[i]);
            current_revs(t, held, n);   /* else each delete on what it has */
        }
        free(held);
        char mine[2 * KB_NATS_NAME];
        kb__nats_member_key(t, tp, mine, sizeof mine);
        kb__nats_kv_delete(t, mine, 0);
        for (uint32_t i = 0; i < t->partitions; i++)
            if (tp->parts[i].lease_rev != 0) {
                kb__nats_kv_delete(t, tp->parts[i].lease_key, tp->parts[i].lease_rev);
                kb_bus_lease_changed(t->bus, tp->parts[i].subject, tp->parts[i].n, 0);
                tp->parts[i].lease_rev = 0;
            }
    }
    int left = kb_deadline_left_ms(deadline);
    natsConnection_FlushTimeout(t->nc, left < 0 ? 5000 : left > 0 ? left : 1);
}
