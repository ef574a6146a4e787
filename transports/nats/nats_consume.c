/* Consuming: one feeder thread per bus issues its own pull requests (up to
 * two open per owned partition, explicit batch and server-side expiry) for
 * every subscribed topic, reads their replies on one inbox subscription, and
 * hands messages to the sinks in stream order. Threads and subscriptions do
 * not grow with the number of topics. nats.c's Fetch is not used: see
 * docs/transports-nats.md for its 3.4.1 bugs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"
#include "nats_connect.h"
#include "nats_consume.h"
#include "nats_feeder.h"
#include "nats_dlq.h"
#include "nats_frame.h"
#include "nats_hdr.h"
#include "nats_lease.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_progress.h"
#include "nats_runs.h"
#include "nats_topic.h"

#define KB_NATS_IDLE_EXPIRES_MS 10000   /* pull expiry of a quiet partition, at most */
#define KB_NATS_SCAN_NS 20000000        /* every partition's pulls checked this often */
#define KB_NATS_CLAIM_SCAN_NS 1000000   /* ... and this often while claims are awaited */
#define KB_NATS_CLAIM_WAIT_NS 2000000000 /* for this long after a subscribe or reconnect */
#define KB_NATS_PULL_GRACE_NS 250000000 /* a request's 408 comes this soon after its expiry */
#define GAP_OPEN_MAX_MS 1000            /* a gap a redelivery showed, open at most (admit) */


/* Keep up to two pull requests of nats.fetch_batch open per partition: the
 * next one is sent when the open ones have less than a batch left, so the
 * server never waits for a round trip between batches. A request that ends
 * with nothing doubles the next one's expiry (up to 10 s), so idle topics
 * cost the server little; messages still come as soon as they are stored.
 * The server sends an idle heartbeat (status 100) on an open request every
 * quarter of its expiry without messages: a request lost with a consumer
 * leader whose node died is known lost after two missed ones, not after its
 * expiry (up to 12 s of a partition's pause); an idle partition costs one
 * heartbeat per 2.5 s. Requests of less than a second (nats.fetch_expires_ms)
 * ask for none.
 * A request past its expiry has ended, whether its 408 came or not:
 * nats-server before 2.9.16 (nats-io/nats-server#3942) drops one that
 * expired when a message comes before its expiry timer runs, with no 408,
 * and delivers nothing more until the next request: the newest request so
 * ended was judged lost 0.75 s after the last message, every 5-10 s on each
 * partition of a steady flow (whose requests all end by expiry; all 22 such
 * pauses of a traced run on 2.9.10: docs/transports-nats.md, "Lapses").
 * So while messages come, the next request goes a tenth of its expiry
 * before the newest ends (keep_pulling), and a request that got nothing is
 * lost KB_NATS_PULL_GRACE_NS after its expiry unless a status ended it, or
 * sooner by its heartbeats.
 * The request sent after one was lost, while the partition is not bridged,
 * asks for them five times as often (50 ms at a 1 s expiry): a healthy
 * consumer answers it at once (a message, or its first heartbeat), one whose
 * leader is gone never does; so it is judged lost 0.35 s after it went, not
 * 0.75, and the bridge starts that much sooner. */
static int64_t heartbeat_ms(const kb_nats_claim *c)
{
    if (c->pull_expires_ms < 1000)
        return 0;
    return c->pull_expires_ms / (!c->answered || (c->lost_again && !c->bridging) ? 20 : 4);
}

/* A new consumer's first request can go unanswered: sent as soon as the
 * server answered the creation, in each `join` run on 2.9.10 one of 9 got
 * nothing until judged lost 0.75 s later (why was not found; the next was
 * answered at once). Until a claim's consumer answered anything, its
 * requests ask for a heartbeat every 50 ms (at a 1 s expiry) and are judged
 * lost FIRST_PULL_GRACE_MS after two missed ones (docs/transports-nats.md,
 * "Pull requests carry idle heartbeats"). */
#define FIRST_PULL_GRACE_MS 100

/* When the newest request counts as lost unless a heartbeat or a message
 * comes first: measured by the heartbeat that request asked for, whatever
 * the next one will ask. */
static int64_t pull_deadline(const kb_nats_claim *c, int64_t now)
{
    int64_t hb = c->pull_hb_ms, grace = c->answered ? 250 : FIRST_PULL_GRACE_MS;
    return now + (hb > 0 ? 2 * hb + grace : c->pull_expires_ms + 2000) * 1000000;
}

static void pull(kb_nats_feeder *f, kb_nats_claim *c, int64_t now)
{
    kb_transport *t = f->t;
    uint64_t used = atomic_load(&c->tail) - atomic_load(&c->head);
    int64_t room = (int64_t)c->cap - (int64_t)used - (c->pull_open ? c->pull_left : 0);
    int batch = (int)(room < t->fetch_batch ? room : t->fetch_batch);
    if (batch <= 0 || (c->pull_open && batch < t->fetch_batch / 2))
        return;   /* the frontier is full: wait for acks (no dribble of small requests) */
    if (c->pull_expires_ms == 0)
        c->pull_expires_ms = t->fetch_expires_ms;
    char body[128], reply[256];
    int64_t hb = heartbeat_ms(c);
    int n = snprintf(body, sizeof body, "{\"batch\":%d,\"expires\":%lld", batch,
                     (long long)c->pull_expires_ms * 1000000);
    if (hb > 0)
        n += snprintf(body + n, sizeof body - (size_t)n, ",\"idle_heartbeat\":%lld",
                      (long long)hb * 1000000);
    snprintf(body + n, sizeof body - (size_t)n, "}");
    c->pull_serial = ++f->serial;
    snprintf(reply, sizeof reply, "%s.%u.%u.%u", t->inbox, c->part->topic->sub_id, c->part->n,
             c->pull_serial);
    if (natsConnection_PublishRequestString(kb__nats_feed_conn(t), c->next_subj, reply, body) != NATS_OK)
        return;
    c->pull_left = (c->pull_open ? c->pull_left : 0) + batch;
    c->pull_open = true;
    c->pull_got = false;
    c->pull_hb_ms = hb;
    /* The server ends the request; this only covers a lost one. */
    c->pull_deadline_ns = pull_deadline(c, now);
    int64_t expires_ns = c->pull_expires_ms * 1000000;
    c->pull_ends_ns = now + expires_ns;
    c->pull_renew_ns = now + expires_ns - expires_ns / 10;
}

/* Keep claim c's pulls going (and its bridge, when its consumer is silent). */
static void keep_pulling(kb_nats_feeder *f, kb_nats_claim *c, int64_t now)
{
    kb_transport *t = f->t;
    /* made without a leader: it delivers nothing until one is elected
     * (seconds, on a loaded cluster), so the bridge reads meanwhile */
    if (c->born_leaderless && !c->answered)
        kb__nats_bridge_start(t, c, now);
    bool renew = c->pull_open && c->pull_got && now >= c->pull_renew_ns;
    int64_t was = c->pull_deadline_ns, deadline = was;
    if (c->pull_open && c->pull_ends_ns + KB_NATS_PULL_GRACE_NS < deadline)
        deadline = c->pull_ends_ns + KB_NATS_PULL_GRACE_NS;
    bool lost = c->pull_open && !renew && now > deadline && f->empty_ns > deadline;
    if (!c->pull_open || c->pull_left < t->fetch_batch || lost || renew) {
        if (lost) {   /* the next request is judged sooner (heartbeat_ms) */
            if (!c->answered)
                kb_log(t->bus, KB_LOG_DEBUG, "nats %s: consumer %s did not answer its first "
                       "request; asked again", t->url_safe, c->consumer);
            c->pull_open = false;
            if (c->lost_again)
                kb__nats_bridge_start(t, c, now);
            c->lost_again = true;
        }
        if (renew)   /* the open requests end in a moment, with what they got */
            c->pull_open = false;
        pull(f, c, now);
        if (renew && c->pull_deadline_ns > was)
            c->pull_deadline_ns = was;   /* a leader gone meanwhile is seen as soon */
    }
    if (c->gap_open_ns != 0 && now - c->gap_open_ns > (int64_t)GAP_OPEN_MAX_MS * 1000000 &&
        !atomic_load(&c->fenced))
        kb__nats_gap_left_open(f, c);
    if (c->bridging)
        kb__nats_bridge(f, c, now);
}

/* Follow the partition's current claim and keep its pulls going. A fenced
 * claim is left for good: once fenced nothing goes into its ring, so a wide
 * claim left through one partition is safe from the others. A live wide
 * claim a partition left by a split is fed on for the others (its entries
 * of the partition wait on the partition's claim): leave_fenced marks it
 * left once it is fenced. */
/* Early moves (nats_lease.c): a wide claim fed each partition of the batch
 * up to here; its later messages of them are pushed moved (read_msg). One
 * is refused when an earlier batch's moved entries stop the claim's acks
 * below its cut. */
static void move_cuts(kb_transport *t, kb_nats_topic *tp)
{
    uint32_t gen = atomic_load(&tp->move_gen);
    if (gen == tp->move_gen_seen)
        return;
    tp->move_gen_seen = gen;
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *p = &tp->parts[i];
        kb_nats_claim *w = atomic_load(&p->moved_from);
        if (w == NULL || atomic_load(&p->move_cut_for) == w ||
            atomic_load(&p->move_refused_for) == w)
            continue;
        uint64_t cut = p->wide_fed_by == w ? p->wide_fed : 0;
        if (w->moved_first != 0 && cut >= w->moved_first) {
            atomic_store(&p->move_refused_for, w);
            continue;
        }
        atomic_store(&p->move_cut, cut);
        atomic_store(&p->move_cut_for, w);
    }
}

static void tend(kb_nats_feeder *f, kb_nats_part *p, int64_t now)
{
    kb_transport *t = f->t;
    move_cuts(t, p->topic);
    kb_nats_claim *c = atomic_load(&p->claim), *was = p->feeding;
    /* A live wide claim goes on without this partition only for a claim
     * split from it, or when the partition moved out of it early: else its
     * later messages of the partition would be dropped here while its acks
     * of other partitions' messages passed them (the split claim was
     * fenced before the feeder saw it). */
    kb_nats_claim *from = c != NULL ? atomic_load(&c->split_from) : NULL;
    if (c != was && was != NULL) {
        if (was->wide && !atomic_load(&was->fenced) && from != was &&
            atomic_load(&p->move_cut_for) != was)
            kb__nats_claim_reset(t, was);
        if (!was->wide || atomic_load(&was->fenced))
            atomic_store(&was->feeder_left, 1);
    }
    if (c != was && from != NULL && !atomic_load(&c->cut_set)) {
        /* the wide claim fed the partition up to here; from now on it
         * feeds nothing of it (split_wide) */
        atomic_store(&c->cut, p->wide_fed_by == from ? p->wide_fed : 0);
        atomic_store(&c->cut_set, true);
        p->split_to = c;
    }
    p->feeding = c;
    kb_nats_claim *w = kb__nats_split_wide(f->t, p, now);
    if (w != NULL && w->part == p && w != c)
        keep_pulling(f, w, now);   /* partition 0 pulls for the wide claim still */
    if (c == NULL)
        return;
    if (kb__nats_claim_fenced(t, c, now)) {
        atomic_store(&c->feeder_left, 1);
        p->feeding = NULL;
    } else if (c->part != p) {
        return;   /* a wide claim: partition 0 pulls for all */
    } else {
        keep_pulling(f, c, now);
    }
}

/* Every partition was just tended, so no partition feeds a fenced claim:
 * mark those the feeder never looked at (fenced before it came by) as left
 * too, or their rings are never freed and a hand-over waits for ever. */
static void leave_fenced(kb_transport *t, kb_nats_topic *tp)
{
    for (uint32_t i = 0; i <= t->partitions; i++)
        for (kb_nats_claim *c = atomic_load(i < t->partitions ? &tp->parts[i].claims
                                                              : &tp->wide_claims);
             c != NULL; c = c->next)
            if (atomic_load(&c->fenced) && !atomic_load(&c->feeder_left))
                atomic_store(&c->feeder_left, 1);
}

/* The claim's consumer has no leader ("no responders": its leader's node is
 * gone and the rest of its group has not elected another, which nats-server
 * does after 4-9 s). Pulls are tried again every LEADERLESS_RETRY_MS; after
 * LEADERLESS_RESET_MS the claim is reset, and the next one, a new consumer
 * (created in well under a second), starts from this claim's own frontier. */
#define LEADERLESS_RETRY_MS 100
#define LEADERLESS_RESET_MS 1000
static void leaderless(kb_transport *t, kb_nats_claim *c, int64_t now)
{
    if (c->leaderless_since_ns == 0)
        c->leaderless_since_ns = now;
    kb__nats_bridge_start(t, c, now);
    if (now - c->leaderless_since_ns < LEADERLESS_RESET_MS * 1000000) {
        c->pull_open = true;   /* the next pull after the retry delay */
        c->pull_deadline_ns = now + LEADERLESS_RETRY_MS * 1000000;
        return;
    }
    kb_log(t->bus, KB_LOG_NOTICE, "nats %s: consumer %s has had no leader for %d ms; %s starts "
           "again from its frontier with a new consumer", t->url_safe, c->consumer,
           LEADERLESS_RESET_MS, c->part->subject);
    kb__nats_claim_reset(t, c);
}

/* A status reply: 100, an idle heartbeat, says the request is alive; 408
 * (expired), 404 (nothing), 409, 503 (no leader) close it. Only a request
 * that expired empty doubles the next one's expiry. */
static void status_msg(kb_nats_feeder *f, natsMsg *m)
{
    const char *subj = natsMsg_GetSubject(m);
    size_t il = strlen(f->t->inbox);
    unsigned id = 0, n = 0, serial = 0;
    if (strncmp(subj, f->t->inbox, il) != 0 ||
        sscanf(subj + il, ".%u.%u.%u", &id, &n, &serial) != 3 || id >= f->known ||
        n >= f->t->partitions)
        return;
    kb_nats_part *p = &f->by_id[id]->parts[n];
    kb_nats_claim *c = p->feeding, *w = kb__nats_split_wide(f->t, p, kb_now_ns());
    if ((c == NULL || c->pull_serial != serial) && w != NULL && w->pull_serial == serial)
        c = w;
    if (c == NULL || c->pull_serial != serial)
        return;
    const char *status = NULL;
    bool has_status = natsMsgHeader_Get(m, "Status", &status) == NATS_OK && status != NULL;
    int64_t now = kb_now_ns();
    c->answered = true;
    if (has_status && strcmp(status, "100") == 0) {
        c->lost_again = false;
        c->pull_deadline_ns = pull_deadline(c, now);
        c->leaderless_since_ns = 0;
        kb__nats_bridge_end(c);   /* the consumer has a leader again */
        return;
    }
    c->pull_open = false;   /* the newest request ended: so did the older */
    c->pull_left = 0;
    if (has_status && strcmp(status, "503") == 0) {
        leaderless(f->t, c, now);
        return;
    }
    c->leaderless_since_ns = 0;
    c->lost_again = false;   /* its leader answered: the next request is judged as usual */
    /* The consumer's leader ended the request with nothing left to send
     * (404), or let it expire empty: it has caught up with the bridge. A
     * request that expired after some messages may have left it behind. */
    if (has_status && (strcmp(status, "404") == 0 ||
                       (strcmp(status, "408") == 0 && !c->pull_got)))
        kb__nats_bridge_end(c);
    if (!c->pull_got && has_status && strcmp(status, "408") == 0) {
        c->pull_expires_ms *= 2;
        if (c->pull_expires_ms > KB_NATS_IDLE_EXPIRES_MS)
            c->pull_expires_ms = KB_NATS_IDLE_EXPIRES_MS;
    }
    tend(f, c->part, now);
}

/* An event (or the whole message, when unreadable) goes to the dead letters
 * without reaching a handler, with its headers when they could be read. */
static void dead_on_arrival(kb_nats_feeder *f, kb_nats_entry *e, natsMsg *m, unsigned n,
                            const char *id, const kb_frame_event *ev, const kb_nats_hdrs *h,
                            const char *why, uint32_t attempts)
{
    kb_log(f->t->bus, KB_LOG_WARNING, "nats %s: message %s on %s goes to the dead letters: %s",
           f->t->url_safe, id, natsMsg_GetSubject(m), why);
    const char *body = natsMsg_GetData(m);
    kb_frame_event whole = {NULL, body ? body : "", 0, (size_t)natsMsg_GetDataLength(m)};
    if (ev == NULL)
        ev = &whole;
    kb_nats_claim *c = e->claim;
    kb_nats_dead d = {
        .orig_subject = natsMsg_GetSubject(m), .orig_id = id,
        .key = ev->key, .key_len = ev->key_len, .payload = ev->payload,
        .payload_len = ev->payload_len, .headers = h ? h->h : NULL, .n_headers = h ? h->n : 0,
        .partition = n, .attempts = attempts, .reason = why,
    };
    int rc = kb__nats_dlq_publish(f->t, c->part->topic, &d);
    if (rc != KB_OK && rc != KB_ETIMEDOUT)
        kb_log(f->t->bus, KB_LOG_ERROR, "nats %s: dead letter of %s on %s lost: %s", f->t->url_safe, id,
               natsMsg_GetSubject(m), kb_last_error());
    kb__nats_dlq_settle(f->t, e, rc);
}

/* Hand one event (its headers in f->hdrs) to the sink, or to the dead letters
 * when it came on a subject that is not its partition (`foreign` says why);
 * false when the bus refused it (closing). */
static bool deliver(kb_nats_feeder *f, kb_nats_entry *e, natsMsg *m, const kb_nats_meta *meta,
                    unsigned n, const char *id, const kb_frame_event *ev, const char *foreign)
{
    kb_transport *t = f->t;
    const kb_nats_hdrs *h = &f->hdrs;
    if (ev->key_len > t->max_key_bytes || ev->payload_len > t->max_payload_bytes) {
        /* another client's, over the limits: a reference (ID, size, reason),
         * not a copy, and never a handler's */
        bool key = ev->key_len > t->max_key_bytes;
        char why[200];
        snprintf(why, sizeof why, "%s: %s of %zu bytes is over the limit (%zu); not copied",
                 key ? "limits.max_key_bytes" : "limits.max_payload_bytes", key ? "key" : "payload",
                 key ? ev->key_len : ev->payload_len, key ? t->max_key_bytes : t->max_payload_bytes);
        kb_frame_event ref = {"", NULL, 0, ev->payload_len};
        dead_on_arrival(f, e, m, n, id, &ref, NULL, why,
                        kb__nats_attempt(e->claim, meta->sseq, meta->delivered));
        return true;
    }
    uint32_t home = kb_partition_of(ev->key, ev->key_len, t->partitions);
    if (foreign != NULL || home != n) {
        char why[160];
        snprintf(why, sizeof why, "key belongs to partition %u, not %u", home, n);
        dead_on_arrival(f, e, m, n, id, ev, h, foreign != NULL ? foreign : why,
                        kb__nats_attempt(e->claim, meta->sseq, meta->delivered));
        return true;
    }
    kb_nats_topic *tp = e->claim->part->topic;
    uint32_t attempt = kb__nats_attempt(e->claim, meta->sseq, meta->delivered);
    unsigned flags = 0;
    if (attempt > 1) {   /* delivered before: what counts is how often it ran */
        flags = KB_DELIVERY_F_REDELIVERED;
        attempt = kb__nats_runs_attempt(t, tp, meta->sseq, id, attempt);
    }
    if (attempt > t->max_attempts) {   /* handlers ran it max_attempts times already */
        dead_on_arrival(f, e, m, n, id, ev, h, "retry.max_attempts reached (redelivered)",
                        attempt - 1);
        return true;
    }
    kb_delivery d = {.topic = tp->name, .tt = tp, .key = ev->key, .key_len = ev->key_len,
                     .payload = ev->payload ? ev->payload : "", .payload_len = ev->payload_len,
                     .partition = n, .attempt = attempt, .id = id, .cookie = e,
                     .headers = h->n ? h->h : NULL, .n_headers = h->n, .flags = flags};
    int rc = kb_sink_deliver(tp->sink, &d, -1);   /* waits while the lane is full */
    if (rc == KB_OK)
        return true;
    if (attempt > 1 || flags != 0)   /* delivered before: no final record of this claim */
        atomic_store(&e->claim->released_ran, true);
    kb__nats_progress_released(e->claim, meta->sseq, id, NULL, 0);   /* and the frame's rest */
    kb__nats_settle(e, false);
    if (rc != KB_ECLOSED)
        kb_log(t->bus, KB_LOG_ERROR, "nats: delivery of %s on %s failed: %s", id, natsMsg_GetSubject(m),
               kb_strerror(rc));
    return false;
}

typedef struct ring_wait {
    kb_transport *t;
    kb_nats_claim *c;
} ring_wait;

/* Room in the claim's ring, or a reason to give up waiting for it. */
static int ring_room(void *arg)
{
    ring_wait *w = arg;
    return atomic_load(&w->c->tail) - atomic_load(&w->c->head) < w->c->cap ||
           atomic_load(&w->c->fenced) || atomic_load(&w->t->stopping);
}

/* The claim of partition p that delivered a message (by its consumer name),
 * or NULL: an earlier claim's consumer, not ours any more, or one fenced
 * (leave_fenced may have let the acker free its ring while p->feeding still
 * names it). */
static kb_nats_claim *claim_of(kb_nats_feeder *f, kb_nats_part *p, const kb_nats_meta *meta)
{
    kb_nats_claim *c = p->feeding;
    if (c == NULL || strcmp(c->consumer, meta->consumer) != 0) {
        tend(f, p, kb_now_ns());   /* a wide claim's partitions learn of it here */
        c = p->feeding;
    }
    if (c == NULL || strcmp(c->consumer, meta->consumer) != 0 ||
        atomic_load(&c->feeder_left) || kb__nats_claim_fenced(f->t, c, kb_now_ns()))
        return NULL;
    return c;
}

/* The claim whose consumer delivered a message of partition p: the
 * partition's own (claim_of), or the live wide claim it was split from,
 * which goes on for the others; NULL when neither. */
static kb_nats_claim *delivered_by(kb_nats_feeder *f, kb_nats_part *p, const kb_nats_meta *meta)
{
    kb_nats_claim *c = claim_of(f, p, meta);
    if (c != NULL)
        return c;
    kb_nats_claim *w = kb__nats_split_wide(f->t, p, kb_now_ns());
    return w != NULL && strcmp(w->consumer, meta->consumer) == 0 ? w : NULL;
}

/* A wide claim sees every message of its stream, so a gap between two of its
 * deliveries is messages removed unread: by the stream's limits (MaxMsgs,
 * MaxAge, MaxBytes set on it) when they lie below its first sequence, else
 * deleted one by one (a replayed dead letter). The first are counted in
 * broker_trimmed and logged by sequence; the gap costs one stream info. */
static void gap(kb_nats_feeder *f, kb_nats_claim *c, uint64_t from, uint64_t to)
{
    kb_transport *t = f->t;
    kb_nats_topic *tp = c->part->topic;
    jsStreamInfo *si = NULL;
    if (js_GetStreamInfo(&si, t->js, tp->stream, NULL, NULL) != NATS_OK)
        return;
    uint64_t first = si->State.FirstSeq;
    jsStreamInfo_Destroy(si);
    uint64_t last = to < first ? to : first - 1;
    if (first == 0 || last < from)
        return;
    atomic_fetch_add(&tp->trimmed, last - from + 1);
    kb_log(t->bus, KB_LOG_WARNING,
           "nats %s: messages %llu..%llu of %s were removed by the stream's limits before "
           "they were handled", t->url_safe, (unsigned long long)from, (unsigned long long)last,
           tp->stream);
}

static void read_msg(kb_nats_feeder *f, kb_nats_claim *c, natsMsg *m, const kb_nats_meta *meta,
                     unsigned n, uint32_t part, const char *foreign);

/* Deliveries read again (kb__nats_refill), handed on in stream order under
 * the delivery sequences they were sent with (none when unnumbered). */
static void hand_refilled(kb_nats_feeder *f, kb_nats_claim *c, const kb_nats_meta *meta,
                          kb_nats_refilled *rf)
{
    f->refilling = true;
    for (uint64_t i = 0; i < rf->n; i++) {
        kb_nats_meta one = *meta;
        one.delivered = 1;
        one.sseq = rf->seq[i];
        one.dseq = rf->unnumbered ? 0 : c->dseq_hi + 1;
        read_msg(f, c, rf->msg[i], &one, c->part->n, c->part->n, NULL);
    }
    f->refilling = false;
    free(rf->msg);
    free(rf->seq);
}

/* Count the message against its pull and wait for room in the claim's ring;
 * false (message destroyed) for a redelivery of one still here, or when the
 * claim or the bus stopped. */
static bool admit(kb_nats_feeder *f, kb_nats_claim *c, natsMsg *m, const kb_nats_meta *meta,
                  int64_t now)
{
    kb_transport *t = f->t;
    if (!f->refilling && !f->bridging) {   /* read again or bridged: came on no pull */
        c->pull_got = true;
        c->answered = true;
        c->pull_expires_ms = t->fetch_expires_ms;
        c->lost_again = false;
        c->pull_deadline_ns = pull_deadline(c, now);
        c->leaderless_since_ns = 0;
        if (c->pull_left > 0 && --c->pull_left == 0)
            c->pull_open = false;
        /* The consumer delivers again: from its new leader's delivery
         * point, which lags what the bridge read (its old leader's last
         * deliveries, and every message the bridge read since). Until it
         * delivers past the bridge, the bridge reads on: those deliveries
         * only give their entries a delivery sequence, and sending them
         * again takes a new leader on a loaded cluster seconds. */
        if (meta->sseq > c->delivered_hi)
            kb__nats_bridge_end(c);
    }
    /* A partition's consumer first sends its subject's messages in stream
     * order, so every message of the subject between the claim's last one
     * and a delivery past the next (a first delivery or a redelivery) was
     * sent before it and never came: it is read again from the stream
     * (kb__nats_refill) when the delivery sequences show a gap, or one is
     * open. None is missing before a first delivery of the next one, or of
     * one the bridge read up to (a consumer whose leader changed can skip
     * delivery sequences so). A redelivery (or a message sent again) tells
     * nothing of what may have been lost after it: the gap is left open until
     * the next first delivery past the claim's last message (or a bridge
     * read: the partition's next message) reads its own window; meanwhile
     * nothing is taken past the claim's last message without that read, so
     * no AckAll (by stream sequence) passes a lost message. A gap open
     * GAP_OPEN_MAX_MS (a partition gone quiet, whose lost messages would wait
     * for AckWait) restarts the partition. */
    const char *why = NULL;
    kb_nats_refilled rf = {NULL, NULL, 0, false};
    bool first_past = meta->delivered == 1 && meta->sseq > c->delivered_hi;
    bool none_missing = f->bridging ||
                        (meta->delivered == 1 && (meta->sseq == c->delivered_hi + 1 ||
                                                  (c->bridged && meta->sseq <= c->delivered_hi)));
    bool lost = meta->dseq > c->dseq_hi + 1 ||
                (c->gap_open_ns != 0 && meta->sseq > c->delivered_hi + 1);
    if (lost && !atomic_load(&c->fenced) && !none_missing) {
        /* a wide claim's refill is refused: it restarts */
        if ((c->wide || meta->sseq > c->delivered_hi + 1) &&
            (why = kb__nats_refill(f, c, meta, &rf)) != NULL) {
            kb__nats_lost_in_transit(f, c, meta, why);
            natsMsg_Destroy(m);
            return false;
        }
        if ((meta->delivered != 1 || meta->sseq <= c->delivered_hi) && !c->wide &&
            c->gap_open_ns == 0)
            c->gap_open_ns = now;
    }
    if (first_past)
        c->gap_open_ns = 0;
    if (rf.msg != NULL)
        hand_refilled(f, c, meta, &rf);
    if (meta->dseq > c->dseq_hi)
        c->dseq_hi = meta->dseq;
    if (meta->dseq != 0 && meta->sseq > c->consumer_hi)
        atomic_store(&c->consumer_hi, meta->sseq);
    if (f->bridging && meta->sseq <= c->delivered_hi) {
        natsMsg_Destroy(m);   /* the consumer delivered it meanwhile */
        return false;
    }
    if (meta->sseq <= c->delivered_hi) {
        /* A redelivery: of an event still in this process (nothing to do),
         * or of one it acked, whose ack the server lost (killed before it
         * stored it): ack it again, it was handled. */
        if (kb__nats_claim_redelivered(c, meta))
            natsConnection_PublishString(kb__nats_feed_conn(t), natsMsg_GetReply(m), "+ACK");
        natsMsg_Destroy(m);
        return false;
    }
    /* The ring is full only when the pulls overran it: wait for the acker
     * to move the frontier (it notifies t->acked), or for a fence or stop. */
    ring_wait w = {t, c};
    if (!kb_signal_wait(t->acked, ring_room, &w, INT64_MAX) || atomic_load(&c->fenced) ||
        atomic_load(&t->stopping)) {
        natsMsg_Destroy(m);
        return false;
    }
    if (c->wide && meta->sseq > c->delivered_hi + 1)
        gap(f, c, c->delivered_hi + 1, meta->sseq - 1);
    c->bridged = f->bridging || (f->refilling && c->bridged);
    return true;
}

/* The message's entry at the end of the ring, `events` of it to settle (0:
 * nothing to handle, done at once), delivered at `now`; acked only once
 * claim `after` (NULL: none) has handled up to it, never when `moved`. */
static kb_nats_entry *push(kb_nats_claim *c, natsMsg *m, const kb_nats_meta *meta,
                           uint32_t part, uint32_t events, int64_t now, kb_nats_claim *after,
                           bool moved)
{
    c->delivered_hi = meta->sseq;
    uint64_t slot = atomic_load(&c->tail);
    kb_nats_entry *e = &c->ring[slot & (c->cap - 1)];
    e->msg = m;
    e->claim = c;
    e->sseq = meta->sseq;
    e->part = part;
    e->after = after;
    atomic_store_explicit(&e->dseq, meta->dseq, memory_order_relaxed);
    atomic_store_explicit(&e->runs, false, memory_order_relaxed);
    e->since_ns = now;
    atomic_store(&e->pending, events);
    e->moved = moved;   /* before the tail: the acker reads it after */
    atomic_store(&e->released, 0);
    atomic_store(&e->done, events == 0);
    atomic_store_explicit(&c->tail, slot + 1, memory_order_release);
    if (events == 0)
        atomic_fetch_add_explicit(&c->settled, 1, memory_order_acq_rel);
    return e;
}

/* A message on a subject of the stream that is not a partition, delivered to
 * a wide claim, whose filter covers the whole stream. A dead letter
 * (kb.<topic>.dlq) joins the frontier as done, acked unread; anything else
 * (kb.<topic>.9 of 8 partitions: another client, or a process configured with
 * more partitions) goes to the dead letters saying so, event by event. */
static void unread_msg(kb_nats_feeder *f, kb_nats_topic *tp, natsMsg *m,
                          const kb_nats_meta *meta, const char *last)
{
    kb_nats_claim *c = delivered_by(f, &tp->parts[0], meta);
    if (c == NULL || !c->wide) {
        natsMsg_Destroy(m);
        return;
    }
    if (strcmp(natsMsg_GetSubject(m), tp->dlq_subject) == 0) {
        int64_t now = kb_now_ns();
        if (admit(f, c, m, meta, now))
            push(c, m, meta, UINT32_MAX, 0, now, NULL, false);
        return;
    }
    char why[160];
    size_t digits = strspn(last, "0123456789");
    unsigned long num = digits > 0 && digits <= 9 && last[digits] == '\0' ? strtoul(last, NULL, 10)
                                                                           : 0;
    snprintf(why, sizeof why, "subject %.40s%s is not a partition of the topic (partitions=%u)",
             last, strlen(last) > 40 ? "..." : "", f->t->partitions);
    read_msg(f, c, m, meta, (unsigned)num, UINT32_MAX, why);
}

static void data_msg(kb_nats_feeder *f, kb_nats_topic *tp, natsMsg *m, const kb_nats_meta *meta,
                     unsigned n)
{
    kb_nats_claim *c = delivered_by(f, &tp->parts[n], meta);
    if (c == NULL) {
        natsMsg_Destroy(m);
        return;
    }
    read_msg(f, c, m, meta, n, n, NULL);
}

/* The message's events to the sink (or all to the dead letters, `foreign`
 * saying why); its entry in claim c's ring counts for partition `part`. */
static void read_msg(kb_nats_feeder *f, kb_nats_claim *c, natsMsg *m,
                        const kb_nats_meta *meta, unsigned n, uint32_t part, const char *foreign)
{
    kb_transport *t = f->t;
    int64_t now = kb_now_ns();   /* one clock read per message */
    if (!admit(f, c, m, meta, now))
        return;
    /* A split (nats_lease.c): what the wide claim fed of the partition is
     * its to handle, the rest the partition claim's; each acks the other's
     * part once the other has handled it. */
    kb_nats_part *pp = part < t->partitions ? &c->part->topic->parts[part] : NULL;
    kb_nats_claim *from = atomic_load(&c->split_from);
    if (from != NULL && meta->sseq <= atomic_load(&c->cut)) {
        push(c, m, meta, part, 0, now, from, false);
        return;
    }
    if (c->wide && pp != NULL) {
        /* moved out early (nats_lease.c): past its cut, another process's */
        if (atomic_load(&pp->move_cut_for) == c && meta->sseq > atomic_load(&pp->move_cut)) {
            if (c->moved_first == 0)
                c->moved_first = meta->sseq;
            push(c, m, meta, part, 0, now, NULL, true);
            return;
        }
        if (pp->split_to != NULL && atomic_load(&pp->split_to->split_from) == c) {
            push(c, m, meta, part, 0, now, pp->split_to, false);
            return;
        }
        pp->wide_fed_by = c;
        pp->wide_fed = meta->sseq;
    }
    /* handled under an earlier consumer: another process's (its pending set
     * says so), or one of this process's, whose acks a restarted server lost */
    if (kb__nats_claim_skips(c, meta->sseq) ||
        (part != UINT32_MAX && kb__nats_acked_to(c->part->topic, part, meta->sseq))) {
        push(c, m, meta, part, 0, now, NULL, false);
        return;
    }
    /* Read the message before it is in the ring: once there, its events may
     * settle (and the acker destroy it) while we still look at it. */
    const char *count = NULL, *why = NULL;
    kb_nats_frame frame = {NULL, NULL, 1};
    kb_frame_event one = {NULL, NULL, 0, 0};
    bool framed = natsMsgHeader_Get(m, KB_NATS_BATCH_HDR, &count) == NATS_OK && count != NULL;
    int bad;
    if (framed) {
        bad = kb__nats_frame_open(m, count, &frame, &why);
    } else {
        int klen = kb__nats_get_key(m, f->key, f->key_cap, &why);
        bad = klen < 0 || kb__nats_hdr_get(t, m, &f->hdrs, &why) != 0;
        one = (kb_frame_event){f->key, natsMsg_GetData(m), klen < 0 ? 0 : (size_t)klen,
                               (size_t)natsMsg_GetDataLength(m)};
    }
    uint32_t events = bad ? 1 : frame.left;
    kb__nats_progress_ready(c);   /* before the first delivery: executors note into it */
    kb_nats_entry *e = push(c, m, meta, part, events, now, NULL, false);

    /* From here on `m` lives until the last of its events settles: the
     * pending count keeps the acker from destroying it before. The delivery
     * ID is the stream sequence, ".<i>" for the i-th event of a frame. */
    char id[48];
    size_t base = kb__nats_put_u64(id, meta->sseq);
    if (bad) {
        dead_on_arrival(f, e, m, n, id, NULL, NULL, foreign != NULL ? foreign : why,
                        kb__nats_attempt(e->claim, meta->sseq, meta->delivered));
        return;
    }
    for (uint32_t i = 1; i <= events; i++) {
        kb_frame_event ev = one;
        if (framed) {
            kb__nats_frame_next(&frame, &ev);
            id[base] = '.';
            kb__nats_put_u64(id + base + 1, i);
            if (kb__nats_hdr_frame(t, &ev, &f->hdrs, &why) != 0) {
                dead_on_arrival(f, e, m, n, id, &ev, NULL, why,
                                kb__nats_attempt(e->claim, meta->sseq, meta->delivered));
                continue;
            }
        }
        /* handled by an earlier consumer's handlers, which got past it on its key */
        if (foreign == NULL &&
            kb__nats_progress_covers(c, ev.key, ev.key_len, meta->sseq, framed ? i : 0)) {
            kb__nats_settle(e, true);
            continue;
        }
        if (!deliver(f, e, m, meta, n, id, &ev, foreign)) {
            for (uint32_t rest = i + 1; rest <= events; rest++)
                kb__nats_settle(e, false);   /* never delivered: released with it */
            return;
        }
    }
}

/* The subscribed topic named `name` (len bytes), or NULL. */
static kb_nats_topic *topic_of(kb_nats_feeder *f, const char *name, size_t len)
{
    if (f->slots == 0)
        return NULL;
    for (uint32_t i = kb_fnv1a32(name, len) & (f->slots - 1);; i = (i + 1) & (f->slots - 1)) {
        kb_nats_topic *tp = f->by_name[i];
        if (tp == NULL || (strncmp(tp->name, name, len) == 0 && tp->name[len] == '\0'))
            return tp;
    }
}

/* Index the topics subscribed since the last look; false when out of memory
 * (the new ones wait for the next look). */
static bool learn(kb_nats_feeder *f, uint32_t nsubs)
{
    uint32_t slots = 16;
    while (slots < 2 * nsubs)
        slots *= 2;
    kb_nats_topic **by_name = calloc(slots, sizeof *by_name);
    kb_nats_topic **by_id = calloc(nsubs, sizeof *by_id);
    if (by_name == NULL || by_id == NULL) {
        free(by_name);
        free(by_id);
        return false;
    }
    for (kb_nats_topic *tp = atomic_load(&f->t->topics); tp; tp = tp->next) {
        if (!atomic_load(&tp->subscribed) || tp->sub_id >= nsubs)
            continue;
        by_id[tp->sub_id] = tp;
        uint32_t i = kb_fnv1a32(tp->name, strlen(tp->name)) & (slots - 1);
        while (by_name[i] != NULL)
            i = (i + 1) & (slots - 1);
        by_name[i] = tp;
    }
    free(f->by_name);
    free(f->by_id);
    f->by_name = by_name;
    f->by_id = by_id;
    f->slots = slots;
    f->known = nsubs;
    return true;
}

/* A message the bridge read, handed on as its consumer would have delivered
 * it; then the claim's next read. */
static void hand_bridged(kb_nats_feeder *f, kb_nats_bridged *br)
{
    kb_nats_claim *c = br->claim;
    f->bridging = true;
    if (br->part >= 0)
        read_msg(f, c, br->msg, &br->meta, (unsigned)br->part, (uint32_t)br->part, NULL);
    else
        unread_msg(f, c->part->topic, br->msg, &br->meta, br->last);
    f->bridging = false;
    if (c->bridging)
        kb__nats_bridge(f, c, kb_now_ns());
}

static void handle(kb_nats_feeder *f, natsMsg *m)
{
    kb_nats_meta meta;
    const char *reply = natsMsg_GetReply(m);
    kb_nats_bridged br;
    if (reply == NULL && kb__nats_bridge_reply(f, m, &br)) {
        natsMsg_Destroy(m);
        if (br.msg != NULL)
            hand_bridged(f, &br);
        return;
    }
    if (reply == NULL || kb__nats_parse_ack(reply, &meta) != 0) {
        status_msg(f, m);
        natsMsg_Destroy(m);
        return;
    }
    /* kb.<topic>.<n>, n in decimal as keybus writes it; a wide claim also
     * gets kb.<topic>.dlq and whatever else another client put there */
    const char *subj = natsMsg_GetSubject(m), *dot = strrchr(subj, '.');
    long n = dot != NULL ? kb__nats_part_token(f->t, dot + 1) : -1;
    kb_nats_topic *tp = dot != NULL && dot > subj + 3 && strncmp(subj, "kb.", 3) == 0
                            ? topic_of(f, subj + 3, (size_t)(dot - subj - 3))
                            : NULL;
    if (tp == NULL) {
        natsMsg_Destroy(m);
        return;
    }
    if (n < 0) {
        unread_msg(f, tp, m, &meta, dot + 1);
        tend(f, &tp->parts[0], kb_now_ns());
        return;
    }
    data_msg(f, tp, m, &meta, (unsigned)n);
    kb_nats_part *p = &tp->parts[n];
    int64_t now = kb_now_ns();
    tend(f, p, now);
    kb_nats_claim *w = kb__nats_split_wide(f->t, p, now);
    if (p->feeding != NULL && p->feeding->part != p)
        tend(f, p->feeding->part, now);   /* a wide claim pulls on partition 0 */
    else if (w != NULL && w->part != p)
        tend(f, w->part, now);            /* ... also one the partition was split from */
}

static void *feed(void *arg)
{
    kb_nats_feeder *f = arg;
    kb_transport *t = f->t;
    int64_t next_scan = 0, claims_awaited_until = 0;
    uint32_t reconnects = atomic_load(&t->reconnects);
    while (!atomic_load(&t->stopping)) {
        uint32_t nsubs = atomic_load(&t->nsubs);
        int64_t now = kb_now_ns();
        if (nsubs != f->known && learn(f, nsubs))
            claims_awaited_until = now + KB_NATS_CLAIM_WAIT_NS;
        uint32_t rc = atomic_load(&t->reconnects);
        if (rc != reconnects)
            claims_awaited_until = now + KB_NATS_CLAIM_WAIT_NS;
        if (now >= next_scan || rc != reconnects) {
            int queued = 0, bytes = 0;
            if (f->mark_left == 0 &&
                natsSubscription_GetPending(t->inbox_sub, &queued, &bytes) == NATS_OK) {
                if (queued == 0)
                    f->empty_ns = now;
                f->mark_ns = now;
                f->mark_left = queued;
            }
            bool unclaimed = false;
            for (uint32_t id = 0; id < f->known; id++) {
                kb_nats_topic *tp = f->by_id[id];
                for (uint32_t i = 0; i < t->partitions; i++) {
                    kb_nats_claim *c = tp->parts[i].feeding;
                    kb_nats_claim *w = kb__nats_split_wide(f->t, &tp->parts[i], now);
                    if (c != NULL && c->part == &tp->parts[i] && rc != reconnects)
                        c->pull_open = false;   /* requests do not survive a reconnect */
                    if (w != NULL && w->part == &tp->parts[i] && rc != reconnects)
                        w->pull_open = false;   /* ... nor do a split's wide claim's */
                    tend(f, &tp->parts[i], now);
                    unclaimed |= tp->parts[i].feeding == NULL;
                }
                leave_fenced(t, tp);
            }
            reconnects = rc;
            /* The lease thread makes a new claim a round trip or so after a
             * subscribe: its first pull should not wait a whole scan. (A
             * partition another member owns stays unclaimed here; the window
             * bounds that.) Scans of many topics are spaced, 1 µs per
             * partition (a look at one costs tens of ns): a thousand topics
             * are scanned every 8 ms, not every 1. */
            int64_t fast = (int64_t)f->known * t->partitions * 1000;
            if (fast < KB_NATS_CLAIM_SCAN_NS)
                fast = KB_NATS_CLAIM_SCAN_NS;
            next_scan = now + (unclaimed && now < claims_awaited_until && fast < KB_NATS_SCAN_NS
                                   ? fast
                                   : KB_NATS_SCAN_NS);
        }
        int64_t wait_ms = (next_scan - now + 999999) / 1000000;
        natsMsg *m = NULL;
        natsStatus s = natsSubscription_NextMsg(&m, t->inbox_sub,
                                                wait_ms < 1 ? 1 : wait_ms > 20 ? 20 : wait_ms);
        if (s == NATS_OK) {
            handle(f, m);
            if (f->mark_left > 0 && --f->mark_left == 0)
                f->empty_ns = f->mark_ns;
        } else if (s == NATS_TIMEOUT) {
            f->empty_ns = kb_now_ns();
            f->mark_left = 0;
        }
    }
    for (uint32_t id = 0; id < f->known; id++)
        for (uint32_t i = 0; i < t->partitions; i++)
            if (f->by_id[id]->parts[i].feeding != NULL)
                atomic_store(&f->by_id[id]->parts[i].feeding->feeder_left, 1);
    free(f->by_name);
    free(f->by_id);
    free(f->key);
    kb__nats_hdrs_free(&f->hdrs);
    free(f);
    nats_ReleaseThreadMemory();
    return NULL;
}

/* The bus's inbox subscription and feeder thread, at the first subscribe. */
static int start_feeder(kb_transport *t)
{
    if (t->feeder != NULL)
        return KB_OK;
    int rc = kb__nats_feed_connect(t);
    if (rc != KB_OK)
        return rc;
    kb_nats_feeder *f = calloc(1, sizeof *f);
    natsInbox *inbox = NULL;
    if (f == NULL || (f->key = malloc(65536)) == NULL || natsInbox_Create(&inbox) != NATS_OK) {
        if (f != NULL)
            free(f->key);
        free(f);
        kb_errf(NULL, 0, "nats: out of memory starting the consumer");
        return KB_ETRANSPORT;
    }
    f->t = t;
    f->key_cap = 65536;
    snprintf(t->inbox, sizeof t->inbox, "%s", inbox);
    natsInbox_Destroy(inbox);
    char all[160];
    snprintf(all, sizeof all, "%s.>", t->inbox);
    natsStatus s = natsConnection_SubscribeSync(&t->inbox_sub, atomic_load(&t->feed_nc), all);
    if (s == NATS_OK)   /* bounded by the open pull requests, not by the library */
        s = natsSubscription_SetPendingLimits(t->inbox_sub, -1, -1);
    if (s != NATS_OK) {
        natsSubscription_Destroy(t->inbox_sub);
        t->inbox_sub = NULL;
        free(f->key);
        free(f);
        rc = kb__nats_errf("subscribing the pull inbox", s, 0);
        return rc == KB_ENOMEM ? rc : KB_ETRANSPORT;
    }
    if (kb__nats_thread_start(&t->feeder, "kb-nats-feed", feed, f, NULL, 0) != KB_OK) {
        natsSubscription_Destroy(t->inbox_sub);
        t->inbox_sub = NULL;
        free(f->key);
        free(f);
        return KB_ETRANSPORT;
    }
    return KB_OK;
}

int kb__nats_subscribe(kb_transport *t, kb_nats_topic *tp, kb_sink *sink)
{
    const char *topic = tp->name;
    int ready = kb__nats_topic_ready(t, tp);   /* another partition count: KB_EINVAL */
    if (ready == KB_OK)
        ready = kb__nats_lease_bucket(t, true, NULL);
    if (ready != KB_OK)
        return ready;
    pthread_mutex_lock(&t->sub_lock);
    int rc = KB_OK;
    if (atomic_load(&tp->subscribed)) {
        kb_errf(NULL, 0, "nats: topic %s already consumed", topic);
        rc = KB_EINVAL;
    } else if ((tp->parts = calloc(t->partitions, sizeof *tp->parts)) == NULL) {
        kb_errf(NULL, 0, "nats: out of memory subscribing %s", topic);
        rc = KB_ENOMEM;
    } else if ((rc = kb__nats_runs_open(t, NULL, 0)) == KB_OK) {
        rc = start_feeder(t);   /* the runs bucket and journal first: nothing is delivered yet */
    }
    if (rc != KB_OK) {
        free(tp->parts);
        tp->parts = NULL;
        pthread_mutex_unlock(&t->sub_lock);
        return rc;
    }
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *p = &tp->parts[i];
        p->topic = tp;
        p->n = i;
        snprintf(p->subject, sizeof p->subject, "kb.%s.%u", topic, i);
        snprintf(p->lease_key, sizeof p->lease_key, "l.%s.%s.%u", tp->stream, t->group, i);
    }
    tp->sink = sink;
    tp->sub_id = atomic_load(&t->nsubs);
    atomic_store(&tp->subscribed, 1);
    atomic_store(&t->nsubs, tp->sub_id + 1);   /* after: the feeder indexes it */
    pthread_mutex_unlock(&t->sub_lock);
    kb__nats_lease_kick(t);
    return KB_OK;
}

void kb__nats_stop(kb_transport *t)
{
    atomic_store(&t->stopping, 1);
    kb_signal_notify(t->acked);   /* a feeder waiting for ring space */
    kb_thread_join(t->feeder);
    t->feeder = NULL;
}
