/* The consumers of claims. Every claim gets a consumer of its own, named
 * after its lease revision (acks of an earlier owner never reach it), which
 * starts where the earlier consumers of its partitions stopped. Earlier
 * consumers are found by name (the meta leader's list) and read one by one:
 * a listing of every consumer's state waits for each consumer's leader, and
 * timed out while one of them was on a node that was gone. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nats_claim.h"
#include "nats_consumers.h"
#include "nats_kv.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_probe.h"
#include "nats_progress.h"

/* The wait for a consumer's creation, listing or deletion, which need the
 * meta leader: a third of the TTL, at least 2 s (a consumer is created in
 * well under a second, even under ThreadSanitizer), at most 5 s. */
static void call_opts(const kb_transport *t, jsOptions *o)
{
    int64_t ms = t->lease_ttl_ms / 3;
    jsOptions_Init(o);
    o->Wait = ms < 2000 ? 2000 : ms > 5000 ? 5000 : ms;
}

bool kb__nats_listing_load(kb_transport *t, kb_nats_topic *tp, kb_nats_listing *l)
{
    if (l->listed)
        return true;
    jsErrCode jerr = 0;
    jsOptions o;
    call_opts(t, &o);
    natsStatus s = js_ConsumerNames(&l->names, t->js, tp->stream, &o, &jerr);
    if (s != NATS_OK && s != NATS_NOT_FOUND) {
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: listing consumers of %s: %s; claims wait for "
               "the next round", t->url_safe, tp->stream, natsStatus_GetText(s));
        return false;
    }
    int n = l->names != NULL ? l->names->Count : 0;
    if (n > 0 && (l->info = calloc((size_t)n, sizeof *l->info)) == NULL)
        return false;
    l->listed = true;
    return true;
}

void kb__nats_listing_free(kb_nats_listing *l)
{
    for (int i = 0; l->info != NULL && i < l->names->Count; i++)
        jsConsumerInfo_Destroy(l->info[i]);
    free(l->info);
    free(l->pending);
    jsConsumerNamesList_Destroy(l->names);
    memset(l, 0, sizeof *l);
}

static int name_count(const kb_nats_listing *l)
{
    return l->names != NULL ? l->names->Count : 0;
}

bool kb__nats_listing_has(const kb_transport *t, const kb_nats_listing *l, bool wide)
{
    for (int i = 0; i < name_count(l); i++)
        if (wide ? kb__nats_consumer_wide(t, l->names->List[i])
                 : kb__nats_consumer_part(t, l->names->List[i]) >= 0)
            return true;
    return false;
}

/* Does the consumer's ack floor and delivery history carry over to a claim
 * of partition n (n < 0: a wide claim, every partition)? */
static bool covers(const kb_transport *t, const char *consumer, long n)
{
    return kb__nats_consumer_wide(t, consumer) ||
           (n >= 0 && kb__nats_consumer_part(t, consumer) == n);
}

/* Is it the name the partition's claim would take now (n < 0: the wide
 * one)? A creation that timed out is tried again under its name (the server
 * may have made it late): that one is not an earlier consumer. */
static bool own_name(const kb_transport *t, kb_nats_topic *tp, long n, const char *name)
{
    char own[176];
    kb_nats_part *p = &tp->parts[n < 0 ? 0 : n];
    kb__nats_claim_name(t, p, n < 0, kb__nats_claim_rev(p, n < 0), own, sizeof own);
    return strcmp(own, name) == 0;
}

/* Deliveries by earlier consumers, so a redelivery carries its true attempt
 * count although each claim has a fresh consumer (whose own count starts at 1):
 * each mark is the highest sequence one earlier consumer delivered; an event
 * was delivered before once per mark at or above it. The marks travel in the
 * consumer's Description ("kb-seen m1 m2 ..."), across processes. */
static void marks_add(kb_nats_claim *c, uint64_t mark, uint64_t floor)
{
    if (mark > floor && c->nmarks < KB_NATS_MARKS)
        c->marks[c->nmarks++] = mark;
}

/* `finished`: the consumer's own deliveries ran only as its progress record
 * says (kb__nats_progress_final), so its own mark is not taken; else it is
 * `delivered`: what the server delivered to it, or less (an early move's cut). */
static void marks_inherit(kb_nats_claim *c, const jsConsumerInfo *ci, uint64_t floor,
                          bool finished, uint64_t delivered)
{
    const char *d = ci->Config != NULL ? ci->Config->Description : NULL;
    if (d != NULL && strncmp(d, "kb-seen", 7) == 0)
        for (char *p = (char *)d + 7, *end; *p; p = end) {
            uint64_t m = strtoull(p, &end, 10);
            if (end == p)
                break;
            marks_add(c, m, floor);
        }
    if (!finished)
        marks_add(c, delivered, floor);
}

static void marks_describe(const kb_nats_claim *c, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "kb-seen");
    for (uint32_t i = 0; i < c->nmarks && o + 22 < len; i++) {
        buf[o++] = ' ';
        o += kb__nats_put_u64(buf + o, c->marks[i]);
    }
}

/* This process's own earlier claim of the partition, once finished (its
 * frontier final): what the claim itself knows stands in for its consumer's
 * state, which is not read. Only this process acked on that consumer, and
 * everything up to its last ack was handled here; its delivery marks are the
 * claim's own. This matters when the consumer's leader is gone (its state
 * cannot be read for seconds) and after a lease ran out while the bucket
 * elected a leader: the partition is taken again at once, from where it
 * stopped, without waiting for a consumer nobody else used. A delivery the
 * server counted but that never arrived is no attempt here. NULL otherwise. */
static kb_nats_claim *own_claim(const kb_transport *t, kb_nats_topic *tp, long n,
                                const char *name)
{
    kb_nats_part *p = &tp->parts[n < 0 ? 0 : n];
    kb_nats_claim *c = atomic_load(kb__nats_consumer_wide(t, name) ? &tp->wide_claims : &p->claims);
    while (c != NULL && strcmp(c->consumer, name) != 0)
        c = c->next;
    return c != NULL && atomic_load(&c->freed) ? c : NULL;
}

static jsConsumerInfo *own_finished(const kb_transport *t, kb_nats_topic *tp, long n,
                                    const char *name)
{
    kb_nats_claim *c = own_claim(t, tp, n, name);
    if (c == NULL)
        return NULL;
    char desc[sizeof ((kb_nats_opening *)0)->desc];
    marks_describe(c, desc, sizeof desc);
    jsConsumerInfo *ci = calloc(1, sizeof *ci);
    if (ci == NULL || (ci->Name = strdup(name)) == NULL ||
        (ci->Config = calloc(1, sizeof *ci->Config)) == NULL ||
        (ci->Config->Description = strdup(desc)) == NULL) {
        jsConsumerInfo_Destroy(ci);
        return NULL;
    }
    ci->Config->AckPolicy = js_AckAll;   /* nothing acked above the floor to learn */
    /* handled here is as good as acked: the next claim's consumer is new,
     * and what the bridge read was handled though never acked. Not for a
     * wide claim partitions moved out of early: its handled prefix passed
     * their later messages, which it never ran (nats_lease.c, "Early move") */
    uint64_t acked = atomic_load(&c->acked_to), handled = atomic_load(&c->handled_to);
    if (!(c->wide && c->moved_first != 0))
        acked = handled > acked ? handled : acked;
    ci->AckFloor.Stream = acked > c->start_floor ? acked : c->start_floor;
    ci->Delivered.Stream = atomic_load(&c->delivered_hi);
    return ci;
}

/* The state of every earlier consumer covering partition n; false when one
 * could not be read (one gone meanwhile counts as none). */
static bool read_covering(kb_transport *t, kb_nats_topic *tp, kb_nats_listing *l, long n,
                          const char **unreadable)
{
    for (int i = 0; i < name_count(l); i++) {
        const char *name = l->names->List[i];
        if (l->info[i] != NULL || !covers(t, name, n) || own_name(t, tp, n, name))
            continue;
        if ((l->info[i] = own_finished(t, tp, n, name)) != NULL)
            continue;
        jsOptions o;
        jsOptions_Init(&o);
        o.Wait = kb__nats_round_wait_ms(t);
        natsStatus s = js_GetConsumerInfo(&l->info[i], t->js, tp->stream, name, &o, NULL);
        if (s != NATS_OK && s != NATS_NOT_FOUND) {
            *unreadable = name;
            return false;
        }
    }
    return true;
}

/* A claim starts at the highest floor of the earlier consumers, but an
 * AckExplicit one (a wide consumer made by keybus before its wide consumers
 * were AckAll) may have acked much above its floor: a held event of one
 * partition keeps the topic's floor while the others go on. Its pending set,
 * learned from the server, tells the new claim which messages above the
 * floor were handled there: they are acked without a handler. The earlier
 * consumer with the most delivered is asked; when it cannot tell,
 * everything above the floor comes again (duplicates, never gaps). */
static void skip_acked(kb_transport *t, kb_nats_claim *c, kb_nats_listing *l, long n,
                       uint64_t floor)
{
    const jsConsumerInfo *best = NULL;
    for (int i = 0; i < name_count(l); i++) {
        const jsConsumerInfo *ci = l->info[i];
        if (ci == NULL || !covers(t, ci->Name, n) || ci->Config == NULL ||
            ci->Config->AckPolicy != js_AckExplicit || ci->Delivered.Stream <= floor ||
            ci->NumAckPending < 0)
            continue;
        uint64_t above = ci->Delivered.Stream - kb__nats_floor_of(ci);
        if ((uint64_t)ci->NumAckPending < above &&
            (best == NULL || ci->Delivered.Stream > best->Delivered.Stream))
            best = ci;
    }
    if (best == NULL)
        return;
    if (l->probed != best) {
        free(l->pending);
        l->pending = NULL;
        l->probed = best;
        l->probe_ok = kb__nats_probe_pending(t, c->part->topic->stream, best, &l->pending,
                                             &l->npending);
    }
    if (l->probe_ok && l->npending > 0 &&
        (c->keep = malloc(l->npending * sizeof *c->keep)) != NULL) {
        memcpy(c->keep, l->pending, l->npending * sizeof *c->keep);
        c->nkeep = l->npending;
    }
    if (!l->probe_ok || (l->npending > 0 && c->keep == NULL)) {
        kb_log(t->bus, KB_LOG_INFO,
               "nats %s: consumer %s: could not learn what %s acked above %llu; its messages "
               "from there come again", t->url_safe, c->consumer, best->Name,
               (unsigned long long)floor);
        return;
    }
    c->skip_to = best->Delivered.Stream;
    kb_log(t->bus, KB_LOG_INFO,
           "nats %s: consumer %s starts at %llu; %s acked every message up to %llu but %u: "
           "the acked ones are not handled again", t->url_safe, c->consumer,
           (unsigned long long)floor + 1, best->Name, (unsigned long long)c->skip_to, c->nkeep);
}

/* An earlier consumer unreadable since when (0: none), per partition: the
 * claim waits for it at most a lease TTL. */
static bool wait_for_unreadable(kb_transport *t, kb_nats_part *p, const char *name)
{
    int64_t now = kb_now_ns();
    if (p->unreadable_since_ns == 0) {
        p->unreadable_since_ns = now;
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: consumer %s of %s: its state cannot be read "
               "(its leader is being elected, or its node is gone); %s waits for it at most "
               "%lld ms", t->url_safe, name, p->topic->stream, p->subject,
               (long long)t->lease_ttl_ms);
    }
    if (now - p->unreadable_since_ns < t->lease_ttl_ms * 1000000)
        return true;
    kb_log(t->bus, KB_LOG_WARNING, "nats %s: consumer %s still cannot be read: %s starts from "
           "the floor of the others; what it acked above that comes again", t->url_safe, name,
           p->subject);
    return false;
}

bool kb__nats_earlier_readable(kb_transport *t, kb_nats_part *p, bool wide, kb_nats_listing *l)
{
    const char *unreadable = NULL;
    if (!read_covering(t, p->topic, l, wide ? -1 : (long)p->n, &unreadable) &&
        wait_for_unreadable(t, p, unreadable))
        return false;
    p->unreadable_since_ns = 0;
    return true;
}

/* Where a new group that starts at the latest event starts: after the
 * stream's last sequence, named as a start sequence rather than asked as
 * DeliverNew, so that the next claim knows this consumer's floor even when it
 * acked nothing (a DeliverNew consumer reports an ack floor of 0, and the
 * next claim would hand the group the whole stream). 0 when it could not be
 * read: DeliverNew then. */
static uint64_t stream_last(kb_transport *t, kb_nats_topic *tp, kb_nats_listing *l)
{
    if (l->last_state == 0) {
        jsStreamInfo *si = NULL;
        jsOptions o;
        jsOptions_Init(&o);
        o.Wait = kb__nats_round_wait_ms(t);
        l->last_state = js_GetStreamInfo(&si, t->js, tp->stream, &o, NULL) == NATS_OK ? 1 : -1;
        l->last_seq = si != NULL ? si->State.LastSeq : 0;
        jsStreamInfo_Destroy(si);
    }
    return l->last_state > 0 ? l->last_seq : 0;
}

/* A creation asked again under its name (the first went unanswered; the
 * server may have made the consumer late) must ask for the start the first
 * asked for: with another one the server refuses it (error 10012: "start
 * sequence can not be updated"; a description it updates), the name is given
 * up and a second consumer is made a round later. A floor that moved
 * meanwhile (a wide claim acking on during a split, another owner's last
 * acks) moves the start no more: the first ask's is kept, and what lies
 * between its floor and today's *floor, acked since and so handled, is passed
 * over as redeliveries of acked events (acked again). A new group's "floor"
 * is the stream's last sequence, nothing acked: it stays the first's. */
static void pin_first(kb_nats_opening *o, uint64_t *floor, bool acked)
{
    kb_nats_claim *c = o->c, *first = o->retried ? c->next : NULL;
    if (first == NULL || strcmp(first->consumer, c->consumer) != 0)
        return;
    o->cc.DeliverPolicy = first->asked_policy;
    o->cc.OptStartSeq = first->asked_start;
    if (!acked || first->start_floor > *floor)
        *floor = first->start_floor;
}

void kb__nats_opening_prepare(kb_transport *t, kb_nats_opening *o, kb_nats_listing *l)
{
    kb_nats_claim *c = o->c;
    kb_nats_part *p = c->part;
    kb_nats_topic *tp = p->topic;
    long n = c->wide ? -1 : (long)p->n;
    uint64_t floor = 0;
    bool new_group = true;   /* no earlier consumer of the group covers the partition */
    for (int i = 0; i < name_count(l); i++) {
        if (!covers(t, l->names->List[i], n) || own_name(t, tp, n, l->names->List[i]))
            continue;
        new_group = false;
        if (l->info[i] != NULL && kb__nats_floor_of(l->info[i]) > floor)
            floor = kb__nats_floor_of(l->info[i]);
    }
    bool acked = !(floor == 0 && new_group && t->start_latest);   /* floor: acked below */
    if (!acked)
        floor = stream_last(t, tp, l);
    for (int i = 0; i < name_count(l); i++)
        if (l->info[i] != NULL && covers(t, l->names->List[i], n)) {
            const char *name = l->names->List[i];
            /* the wide claim this one is to take over from while it goes on
             * (a split, nats_lease.c): what it handled stays below the cut,
             * and its deliveries above it are no attempts */
            kb_nats_claim *w = atomic_load(&p->claim);
            bool splits = w != NULL && w->wide && !atomic_load(&w->fenced) &&
                          strcmp(w->consumer, name) == 0;
            if (splits)
                o->split_of = w;
            bool finished = splits ||
                            kb__nats_progress_inherit(t, c, name, l->info[i]->Delivered.Stream);
            /* this process's own finished claim: what it released after a
             * run is all it could leave uncounted */
            kb_nats_claim *own = own_claim(t, tp, n, name);
            if (own != NULL && !atomic_load(&own->released_ran))
                finished = true;
            /* a wide consumer the partition moved out of early (another
             * process's, still going on): what it delivered of the partition
             * past the cut never ran */
            uint64_t delivered = l->info[i]->Delivered.Stream, cut = 0;
            if (!finished && n >= 0 && kb__nats_consumer_wide(t, name) &&
                kb__nats_progress_moved_cut(t, tp, name, p->n, &cut) && cut < delivered)
                delivered = cut;
            marks_inherit(c, l->info[i], floor, finished, delivered);
        }
    skip_acked(t, c, l, n, floor);
    marks_describe(c, o->desc, sizeof o->desc);
    snprintf(o->filter, sizeof o->filter, "kb.%s.*", tp->name);   /* the stream's, dead letters too */
    jsConsumerConfig *cc = &o->cc;
    jsConsumerConfig_Init(cc);
    cc->Durable = c->consumer;
    cc->Description = o->desc;
    /* one ack covers the finished prefix (AckExplicit wide consumers of
     * earlier versions are still read by skip_acked) */
    cc->AckPolicy = js_AckAll;
    cc->AckWait = t->ack_wait_ms * 1000000;
    cc->MaxAckPending = t->max_ack_pending * (c->wide ? t->partitions : 1);
    cc->MaxDeliver = -1;         /* retries are the bus's; the server never gives up */
    cc->FilterSubject = c->wide ? o->filter : p->subject;
    cc->DeliverPolicy = floor > 0                        ? js_DeliverByStartSequence
                        : new_group && t->start_latest ? js_DeliverNew
                                                       : js_DeliverAll;
    cc->OptStartSeq = floor > 0 ? floor + 1 : 0;
    pin_first(o, &floor, acked);
    c->asked_policy = cc->DeliverPolicy;
    c->asked_start = cc->OptStartSeq;
    c->delivered_hi = floor;   /* a wide claim's first gap starts here (nats_consume.c) */
    /* what its consumer reports delivered until it delivers: below the floor
     * when the start was pinned (a reconnect's look must not take that for
     * a consumer that came back behind) */
    c->consumer_hi = cc->OptStartSeq > 0 ? cc->OptStartSeq - 1 : 0;
    c->start_unknown = cc->DeliverPolicy == js_DeliverNew;
    c->start_floor = floor;
}

/* After a reconnect the server may hold as pending messages this process
 * acked: it was killed before it stored the acks (nats-server 2.9's file
 * store writes consumer state behind the acks). It would redeliver them only
 * after AckWait, and kb_drain waits for them till then. The claim's last
 * AckAll, sent again, acks them all. But the state an AckAll consumer comes
 * back with after a kill can hold messages pending at or below its ack
 * floor, which no AckAll reaches (more pending than lie between the floor
 * and the last delivery), or a delivery point below what the claim had,
 * which an AckAll would pass: such a consumer is given up, and the claim
 * starts again from its floor with a fresh one. False when the server could not
 * say (not ready yet after its restart): next round. */
static bool claim_renudge(kb_transport *t, kb_nats_claim *c)
{
    jsConsumerInfo *ci = NULL;
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = kb__nats_round_wait_ms(t);   /* a consumer whose leader is being elected: next round */
    /* what the claim had before it asked: deliveries keep coming while the
     * answer travels, and a healthy consumer's answer is at least this */
    uint64_t acked = atomic_load(&c->acked_to), had = atomic_load(&c->consumer_hi);
    if (js_GetConsumerInfo(&ci, t->js, c->part->topic->stream, c->consumer, &o, NULL) !=
        NATS_OK)
        return false;
    uint64_t below = kb__nats_pending_below_floor(ci);
    bool ok = true;
    if (below > 0) {
        kb_log(t->bus, KB_LOG_WARNING,
               "nats %s: consumer %s came back from the server's restart with %llu messages "
               "pending below its ack floor %llu; starting again from there with a new consumer",
               t->url_safe, c->consumer, (unsigned long long)below,
               (unsigned long long)ci->AckFloor.Stream);
        kb__nats_claim_reset(t, c);
    } else if (ci->Delivered.Stream < acked && acked >= had && had == atomic_load(&c->bridge_hi) &&
               ci->AckFloor.Stream <= ci->Delivered.Stream &&
               atomic_load(&c->consumer_hi) == had && atomic_load(&c->acked_to) == acked) {
        /* A consumer whose leader's node was lost (the bridge read around
         * it, and it delivered nothing since) comes back under a new leader
         * whose delivery point lags the old one's by the last deliveries
         * not yet replicated. Each of those the claim already acked: what
         * the new leader delivers again is acked as it comes, at its own
         * delivery sequence, and no AckAll of the old leader's is left to
         * pass its point. Nothing is sent again (that AckAll would). Read
         * again after the answer: a delivery or an ack of the old leader's
         * handled while it travelled would be such an AckAll (then the
         * consumer is replaced, below). A later look re-acks from the
         * server's own delivery sequence, not the old leader's. */
        uint64_t old_dseq = atomic_load(&c->acked_dseq);
        atomic_compare_exchange_strong(&c->acked_dseq, &old_dseq, 0);
        kb_log(t->bus, KB_LOG_NOTICE,
               "nats %s: consumer %s has a new leader that had delivered up to %llu, below the "
               "%llu this process acked; kept: what it delivers again is acked as it comes",
               t->url_safe, c->consumer, (unsigned long long)ci->Delivered.Stream,
               (unsigned long long)acked);
    } else if (ci->Delivered.Stream < (acked > had ? acked : had)) {
        /* nats-server 2.9 takes an AckAll past its delivery point: the
         * floor would pass it and what it delivers again stay pending */
        kb_log(t->bus, KB_LOG_WARNING,
               "nats %s: consumer %s came back from the server's restart having delivered up "
               "to %llu, below the %llu this process had; starting again from its ack floor "
               "with a new consumer", t->url_safe, c->consumer,
               (unsigned long long)ci->Delivered.Stream,
               (unsigned long long)(acked > had ? acked : had));
        kb__nats_claim_reset(t, c);
    } else if (ci->AckFloor.Stream < acked) {
        ok = kb__nats_claim_reack(t, c, ci->AckFloor.Consumer);
    }
    jsConsumerInfo_Destroy(ci);
    return ok;
}

/* At most this many threads per batch of consumer calls; a bigger batch's
 * calls share them. */
#define CALLS_AT_ONCE 16

typedef struct call {
    kb_transport *t;
    const char *stream;
    kb_nats_opening *open;     /* a creation, or */
    const char *del;           /* a deletion of this consumer, or */
    kb_nats_claim *renudge;    /* a look at this claim's consumer after a reconnect */
    bool ok;                   /* the look's answer came */
} call;

/* A creation unanswered this long is asked again, the same request, until
 * call_opts' wait is used up. A new R3 consumer answers once its group elected
 * a leader (nats-server 2.9: a campaign of 100-800 ms, more on a loaded
 * machine); an answer lost on the way (the client's node killed, its
 * connection moved) would otherwise hold the claim for the whole wait, where
 * the same ask again is answered by the consumer made meanwhile in
 * milliseconds. An identical ask is safe whatever became of the first: the
 * server finds the consumer (made, or its creation pending) and answers. */
#define ASK_AGAIN_MS 1200
#define ASK_LEAST_MS 100     /* no ask with less time than this left */
#define NOT_SENT_PAUSE_NS 50000000   /* the connection being made again: a pause, then ask */

/* nats.c's ways of saying an ask got no answer: sent and unanswered
 * (NATS_TIMEOUT), not sent because the connection is being made again
 * (keybus gives nats.c no reconnect buffer: nats_connect.c), or no server
 * took it. */
static bool no_answer(natsStatus s)
{
    return s == NATS_TIMEOUT || s == NATS_INSUFFICIENT_BUFFER ||
           s == NATS_CONNECTION_DISCONNECTED || s == NATS_NO_RESPONDERS;
}

/* Create k's consumer within wait_ms, asking again while unanswered (see
 * ASK_AGAIN_MS). NATS_TIMEOUT when an ask went out and no answer came (the
 * server may have made the consumer: its name is kept), else the last
 * status. */
static natsStatus create_asking_again(call *k, jsConsumerInfo **ci, int64_t wait_ms)
{
    int64_t ends = kb_now_ns() + wait_ms * 1000000;
    natsStatus s = NATS_TIMEOUT;
    bool sent = false;   /* an ask went out and was not answered */
    for (int64_t left_ms = wait_ms; left_ms >= ASK_LEAST_MS;
         left_ms = (ends - kb_now_ns()) / 1000000) {
        jsOptions o;
        jsOptions_Init(&o);
        o.Wait = left_ms < ASK_AGAIN_MS ? left_ms : ASK_AGAIN_MS;
        int64_t asked = kb_now_ns();
        s = js_AddConsumer(ci, k->t->js, k->stream, &k->open->cc, &o, &k->open->jerr);
        if (!no_answer(s))
            return s;
        sent = sent || s == NATS_TIMEOUT;
        if (kb_now_ns() - asked < o.Wait * 1000000 / 2)   /* not sent: no spin */
            nanosleep(&(struct timespec){0, NOT_SENT_PAUSE_NS}, NULL);
    }
    return sent ? NATS_TIMEOUT : s;
}

static void call_run(call *k)
{
    jsOptions o;
    call_opts(k->t, &o);
    if (k->open != NULL) {
        jsConsumerInfo *ci = NULL;
        int64_t start = kb_now_ns();
        k->open->s = create_asking_again(k, &ci, o.Wait);
        k->open->took_ns = kb_now_ns() - start;
        k->open->leaderless = k->open->s == NATS_OK && ci != NULL && ci->Cluster != NULL &&
                              (ci->Cluster->Leader == NULL || ci->Cluster->Leader[0] == '\0');
        if (k->open->s != NATS_OK)   /* this thread's last error: read it here */
            snprintf(k->open->why, sizeof k->open->why, "%s", kb__nats_reason(k->open->s));
        jsConsumerInfo_Destroy(ci);
        atomic_store_explicit(&k->open->made, true, memory_order_release);
    } else if (k->del != NULL) {
        js_DeleteConsumer(k->t->js, k->stream, k->del, &o, NULL);
        kb__nats_progress_forget(k->t, k->stream, k->del);
    } else {
        k->ok = claim_renudge(k->t, k->renudge);
    }
}

/* A batch of calls in flight: its threads take the calls in order. */
struct kb_nats_calls {
    kb_transport *t;
    call *k;
    size_t n;
    const char **names;        /* a deletion batch's consumers (borrowed strings) */
    int64_t start_by;          /* no call starts after it (0: no bound) */
    _Atomic size_t next;       /* the next call to take */
    _Atomic size_t left;       /* threads still running */
    pthread_t th[CALLS_AT_ONCE];
    size_t nth;
};

static void *calls_thread(void *arg)
{
    kb_nats_calls *b = arg;
    for (size_t i; (i = atomic_fetch_add(&b->next, 1)) < b->n;)
        if (b->start_by == 0 || kb_now_ns() < b->start_by)
            call_run(&b->k[i]);
    nats_ReleaseThreadMemory();
    atomic_fetch_sub(&b->left, 1);
    return NULL;
}

/* Start the calls (the batch owns k), each batch on threads of its own
 * even for one call: the caller goes on. NULL on out of memory (k freed, no
 * call made). A thread that cannot be started leaves its share to the
 * others, or, with none started, to the caller's thread at once. */
static kb_nats_calls *calls_start(kb_transport *t, call *k, size_t n, const char **names,
                                  int64_t start_by)
{
    kb_nats_calls *b = k != NULL ? calloc(1, sizeof *b) : NULL;
    if (b == NULL) {
        free(k);
        free(names);
        return NULL;
    }
    *b = (kb_nats_calls){.t = t, .k = k, .n = n, .names = names, .start_by = start_by};
    size_t want = n < CALLS_AT_ONCE ? n : CALLS_AT_ONCE;
    atomic_store(&b->left, want);
    for (size_t i = 0; i < want; i++)
        if (pthread_create(&b->th[b->nth], NULL, calls_thread, b) == 0)
            b->nth++;
        else
            atomic_fetch_sub(&b->left, 1);
    if (b->nth == 0 && n > 0) {
        atomic_store(&b->left, 1);
        calls_thread(b);
    }
    return b;
}

bool kb__nats_calls_done(kb_nats_calls *b)
{
    return b == NULL || atomic_load(&b->left) == 0;
}

void kb__nats_calls_end(kb_nats_calls *b)
{
    if (b == NULL)
        return;
    for (size_t i = 0; i < b->nth; i++)
        pthread_join(b->th[i], NULL);
    free(b->names);
    free(b->k);
    free(b);
}

/* Wait for the calls; `idle` (may be NULL) runs every few milliseconds
 * meanwhile. */
static void calls_wait(kb_nats_calls *b, void (*idle)(kb_transport *t))
{
    while (!kb__nats_calls_done(b)) {
        if (idle != NULL)
            idle(b->t);
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
}

kb_nats_calls *kb__nats_consumers_start(kb_transport *t, kb_nats_opening *o, size_t n)
{
    call *k = calloc(n, sizeof *k);
    for (size_t i = 0; i < n; i++) {
        o[i].s = NATS_NO_MEMORY;
        if (k != NULL)
            k[i] = (call){t, o[i].c->part->topic->stream, &o[i], NULL, NULL, false};
    }
    return calls_start(t, k, n, NULL, 0);
}

/* Does a claim made now carry on consumer `name`: an earlier partition
 * consumer of its partition, or (a wide claim) an earlier wide one? Wide
 * consumers a partition claim carries on stay until every partition has its
 * own (kb__nats_wide_retire). */
static bool replaced_by(const kb_transport *t, const char *name, const kb_nats_opening *o, size_t n)
{
    long part = kb__nats_consumer_part(t, name);
    bool wide = kb__nats_consumer_wide(t, name);
    for (size_t i = 0; i < n; i++)
        if (o[i].claimed && strcmp(name, o[i].c->consumer) != 0 &&
            (o[i].c->wide ? wide : (long)o[i].c->part->n == part))
            return true;
    return false;
}

/* The deletions of the consumers in names (an array the batch takes). */
static kb_nats_calls *deletions_start(kb_transport *t, kb_nats_topic *tp, const char **names,
                                      size_t n)
{
    call *k = calloc(n + 1, sizeof *k);
    for (size_t i = 0; k != NULL && i < n; i++)
        k[i] = (call){t, tp->stream, NULL, names[i], NULL, false};
    return calls_start(t, k, n, names, 0);
}

/* Delete the consumers, and their progress records, and wait. */
static void delete_all(kb_transport *t, kb_nats_topic *tp, const char **names, size_t n)
{
    kb_nats_calls *b = deletions_start(t, tp, names, n);
    calls_wait(b, NULL);
    kb__nats_calls_end(b);
}

kb_nats_calls *kb__nats_consumers_retire(kb_transport *t, kb_nats_topic *tp, kb_nats_listing *l,
                                         const kb_nats_opening *o, size_t n)
{
    const char **names = calloc((size_t)name_count(l) + n + 1, sizeof *names);
    size_t m = 0;
    for (int i = 0; names != NULL && i < name_count(l); i++)
        if (replaced_by(t, l->names->List[i], o, n))
            names[m++] = l->names->List[i];
    /* a refused creation under a name tried before (the server made it late,
     * with what was then the floor): the name is given up, and its consumer
     * with it, so that no consumer is left behind holding messages */
    for (size_t i = 0; names != NULL && i < n; i++)
        if (o[i].s != NATS_OK && o[i].s != NATS_TIMEOUT && o[i].retried)
            names[m++] = o[i].c->consumer;
    /* made, but its partition went elsewhere meanwhile: never read */
    for (size_t i = 0; names != NULL && i < n; i++)
        if (o[i].s == NATS_OK && !o[i].claimed)
            names[m++] = o[i].c->consumer;
    if (m == 0) {
        free(names);
        return NULL;
    }
    return deletions_start(t, tp, names, m);
}

void kb__nats_wide_retire(kb_transport *t, kb_nats_topic *tp)
{
    jsConsumerNamesList *list = NULL;
    jsOptions o;
    call_opts(t, &o);
    if (js_ConsumerNames(&list, t->js, tp->stream, &o, NULL) != NATS_OK)
        return;
    uint32_t owned = 0;
    bool *has = calloc(t->partitions, sizeof *has);
    const char **wide = calloc((size_t)list->Count + 1, sizeof *wide);
    size_t nwide = 0;
    for (int i = 0; has != NULL && wide != NULL && i < list->Count; i++) {
        long n = kb__nats_consumer_part(t, list->List[i]);
        if (n >= 0 && !has[n]) {
            has[n] = true;
            owned++;
        }
        if (kb__nats_consumer_wide(t, list->List[i]))
            wide[nwide++] = list->List[i];
    }
    if (owned == t->partitions && nwide > 0)
        delete_all(t, tp, wide, nwide);   /* takes `wide` */
    else
        free(wide);
    free(has);
    jsConsumerNamesList_Destroy(list);
}

bool kb__nats_claims_renudge(kb_transport *t, kb_nats_claim **claims, size_t n, int64_t until,
                             void (*idle)(kb_transport *t))
{
    if (n == 0)
        return true;
    call *k = calloc(n, sizeof *k);
    for (size_t i = 0; k != NULL && i < n; i++)
        k[i] = (call){t, claims[i]->part->topic->stream, NULL, NULL, claims[i], false};
    kb_nats_calls *b = calls_start(t, k, n, NULL, until);
    calls_wait(b, idle);
    bool ok = b != NULL;
    for (size_t i = 0; ok && i < n; i++)
        ok = b->k[i].ok;
    kb__nats_calls_end(b);
    return ok;
}
