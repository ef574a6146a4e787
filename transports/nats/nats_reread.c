/* The feeder's reads of the stream itself (see nats_feeder.h): what a
 * consumer sent that never arrived, read again; and the bridge, which reads
 * a partition while its consumer has no leader. Feeder thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"
#include "nats_feeder.h"
#include "nats_names.h"
#include "nats_refill.h"

/* The bridge. A partition's consumer whose leader's node is gone delivers
 * nothing until its group elects another (4-9 s in nats-server 2.9), and its
 * pulls just go unanswered. Once one is counted lost, the feeder reads the
 * partition's messages from the stream (its leader answers; STREAM.MSG.GET
 * next_by_subj, one read out per partition at a time, answered on the
 * feeder's inbox) and handles them in stream order, as the consumer would
 * have delivered them. When the consumer delivers again, it sends those
 * first: each is known by its stream sequence, dropped, and acked with the
 * entry (or at once when the entry is acked), so the consumer's ack floor
 * catches up with what was handled. Pulls go on meanwhile; the bridge reads
 * on until the consumer has caught up with it: a delivery past what it read,
 * a heartbeat, a 404, or a 408 of a request that brought nothing ends it. A
 * wide claim reads every subject of the topic's stream (its consumer's
 * filter), in stream order. */
#define BRIDGE_WAIT_MS 500    /* a read unanswered this long is asked again */
#define BRIDGE_POLL_MS 20     /* after "no message" (the partition is read up) ... */
#define BRIDGE_POLL_MAX_MS 500 /* ... doubling while nothing comes, up to this */
#define BRIDGE_RETRY_MS 250   /* after an error (the stream's own leader is gone) */

/* A claim whose consumer starts at the stream's end as it was when made
 * (group.start = latest, its last sequence unread) has no known start until
 * it delivers: it is not bridged before. */
void kb__nats_bridge_start(kb_transport *t, kb_nats_claim *c, int64_t now)
{
    if (c->bridging || (c->start_unknown && atomic_load(&c->consumer_hi) == 0))
        return;
    c->bridging = true;
    c->bridge_asked = false;
    c->bridge_next_ns = now;
    c->bridge_poll_ms = BRIDGE_POLL_MS;
    atomic_store(&c->bridge_hi, atomic_load(&c->consumer_hi));
    kb_log(t->bus, KB_LOG_NOTICE, "nats %s: consumer %s delivers nothing; %s%s%s is read from "
           "the stream until it does", t->url_safe, c->consumer, c->wide ? "kb." : "",
           c->wide ? c->part->topic->name : c->part->subject, c->wide ? ".*" : "");
}

void kb__nats_bridge_end(kb_nats_claim *c)
{
    c->bridging = false;
    c->bridge_asked = false;
}

/* Ask for the partition's next message when no read is out and the ring has
 * room beside what the pulls may bring (at least a batch, at most half the
 * ring): entries the bridge read hold the head until the consumer delivers
 * them, so the consumer must always find room for that. */
void kb__nats_bridge(kb_nats_feeder *f, kb_nats_claim *c, int64_t now)
{
    kb_transport *t = f->t;
    if (now < c->bridge_next_ns)
        return;
    uint64_t used = atomic_load(&c->tail) - atomic_load(&c->head);
    int64_t keep = c->pull_open && c->pull_left > t->fetch_batch ? c->pull_left : t->fetch_batch;
    if (keep > (int64_t)c->cap / 2)
        keep = (int64_t)c->cap / 2;
    if ((int64_t)c->cap - (int64_t)used - keep <= 0) {
        c->bridge_next_ns = now + BRIDGE_POLL_MS * 1000000;
        return;
    }
    char reply[256], filter[KB_NATS_NAME];
    snprintf(filter, sizeof filter, "kb.%s.*", c->part->topic->name);
    c->bridge_serial = ++f->serial;
    snprintf(reply, sizeof reply, "%s.g.%u.%u.%u", t->inbox, c->part->topic->sub_id, c->part->n,
             c->bridge_serial);
    bool sent = kb__nats_stream_ask(kb__nats_feed_conn(t), c->part->topic->stream,
                                    c->wide ? filter : c->part->subject,
                                    atomic_load(&c->delivered_hi) + 1, reply);
    c->bridge_asked = sent;
    c->bridge_next_ns = now + (sent ? BRIDGE_WAIT_MS : BRIDGE_RETRY_MS) * 1000000;
}

/* An answer to a bridge read (subject <inbox>.g.<topic>.<partition>.<serial>):
 * false when m is no such answer. The message read is delivery 0 of the
 * claim's consumer (nothing to ack until the consumer delivers it). */
bool kb__nats_bridge_reply(kb_nats_feeder *f, natsMsg *m, kb_nats_bridged *out)
{
    out->msg = NULL;
    kb_transport *t = f->t;
    const char *subj = natsMsg_GetSubject(m);
    size_t il = strlen(t->inbox);
    if (strncmp(subj, t->inbox, il) != 0 || strncmp(subj + il, ".g.", 3) != 0)
        return false;
    unsigned id = 0, n = 0, serial = 0;
    if (sscanf(subj + il + 3, "%u.%u.%u", &id, &n, &serial) != 3 || id >= f->known ||
        n >= t->partitions)
        return true;
    int64_t now = kb_now_ns();
    kb_nats_claim *c = f->by_id[id]->parts[n].feeding;
    kb_nats_claim *w = kb__nats_split_wide(t, &f->by_id[id]->parts[n], now);
    if ((c == NULL || c->bridge_serial != serial) && w != NULL && w->bridge_serial == serial)
        c = w;   /* a split's wide claim: partition 0 bridges for it */
    if (c == NULL || !c->bridging || !c->bridge_asked || c->bridge_serial != serial ||
        kb__nats_claim_fenced(t, c, now))
        return true;
    c->bridge_asked = false;
    kb_nats_topic *tp = c->part->topic;
    natsMsg *got = NULL;
    uint64_t seq = 0;
    char filter[KB_NATS_NAME];
    snprintf(filter, sizeof filter, "kb.%s.*", tp->name);
    int r = kb__nats_stored_read(natsMsg_GetDataLength(m) > 0 ? natsMsg_GetData(m) : NULL,
                                 tp->stream, c->wide ? filter : c->part->subject,
                                 atomic_load(&c->delivered_hi) + 1, c->consumer, 0, &got, &seq);
    int64_t wait_ms = r == 1 ? 0 : r == 0 ? c->bridge_poll_ms : BRIDGE_RETRY_MS;
    c->bridge_next_ns = now + wait_ms * 1000000;
    if (r == 0 && (c->bridge_poll_ms *= 2) > BRIDGE_POLL_MAX_MS)
        c->bridge_poll_ms = BRIDGE_POLL_MAX_MS;
    if (r != 1)
        return true;
    c->bridge_poll_ms = BRIDGE_POLL_MS;
    out->meta = (kb_nats_meta){.delivered = 1, .sseq = seq, .dseq = 0};
    snprintf(out->meta.consumer, sizeof out->meta.consumer, "%s", c->consumer);
    /* a wide claim's message goes where its subject says, as handle()'s */
    out->last = strrchr(natsMsg_GetSubject(got), '.') + 1;
    out->part = c->wide ? kb__nats_part_token(t, out->last) : (long)n;
    out->msg = got;
    out->claim = c;
    return true;
}

/* Nothing above what c had is acked from now on; the lease thread starts a
 * new consumer at the ack floor. */
static void restart_at_floor(kb_nats_feeder *f, kb_nats_claim *c)
{
    atomic_store(&c->ack_limit, c->delivered_hi);
    kb__nats_claim_reset(f->t, c);
}

/* The consumer's delivery sequence skipped: the server sent deliveries that
 * never arrived (the connection broke with them on the wire). It counts them
 * delivered and resends them only after AckWait, past newer events of their
 * keys, so unless kb__nats_refill() read them again the claim stops here:
 * nothing above what it had is acked (an AckAll would cover the lost ones),
 * and the lease thread starts a new consumer at the ack floor, which
 * delivers them again first, in order. */
void kb__nats_lost_in_transit(kb_nats_feeder *f, kb_nats_claim *c, const kb_nats_meta *meta,
                              const char *why)
{
    kb_log(f->t->bus, KB_LOG_WARNING,
           "nats %s: consumer %s: deliveries %llu..%llu never arrived (%s); restarting the "
           "partition from its ack floor", f->t->url_safe, c->consumer,
           (unsigned long long)c->dseq_hi + 1, (unsigned long long)meta->dseq - 1, why);
    restart_at_floor(f, c);
}

void kb__nats_gap_left_open(kb_nats_feeder *f, kb_nats_claim *c)
{
    kb_log(f->t->bus, KB_LOG_WARNING,
           "nats %s: consumer %s: deliveries lost before a redelivery, and no later message came "
           "to show which; restarting the partition from its ack floor", f->t->url_safe,
           c->consumer);
    restart_at_floor(f, c);
}

/* Bounds of kb__nats_refill() (below): lost deliveries one gap may read again; time
 * its reads may take for one gap, and in any second (they block the feeder);
 * no reads for this long after one went unanswered. */
#define REFILL_MAX 1024
#define REFILL_WAIT_MS 500
#define REFILL_BUDGET_MS 250
#define REFILL_OFF_MS 5000

/* Why kb__nats_refill() cannot read the lost deliveries again, or NULL when it may. */
static const char *refill_refused(kb_nats_feeder *f, const kb_nats_claim *c,
                                  const kb_nats_meta *meta, int64_t now)
{
    if (c->wide)
        return "a wide claim";
    /* a consumer started at the stream's end as it was when made (no known
     * start: the claim had nothing yet) went past nothing before it */
    if (c->start_unknown && atomic_load(&c->consumer_hi) == 0)
        return "the consumer's start is not known";
    if (meta->delivered == 1 && c->gap_open_ns == 0 && meta->dseq - c->dseq_hi - 1 > REFILL_MAX)
        return "too many";
    if (now < f->refill_off_until)
        return "a read of the stream went unanswered just before";
    if (now - f->refill_window >= 1000000000) {
        f->refill_window = now;
        f->refill_spent = 0;
    }
    if (f->refill_spent >= (int64_t)REFILL_BUDGET_MS * 1000000)
        return "reads of the stream used this second's time";
    return NULL;
}

/* Read the partition's messages after the last one the claim had up to
 * meta's (not included) into got/seq (*k of them), at most `most`, each with
 * the delivery sequence it would have had when `numbered` (else 0): 0 when
 * the window is read, -1 no answer (or an unreadable one) by `deadline`, -2
 * more than `most`, -3 "no message" before meta's: the answering store does
 * not hold meta's message yet (a stream leader just elected), -4 `deadline`
 * passed between answered reads. */
static int read_window(kb_transport *t, kb_nats_claim *c, const kb_nats_meta *meta, bool numbered,
                       uint64_t most, int64_t deadline, natsMsg **got, uint64_t *seq, uint64_t *k)
{
    uint64_t from = c->delivered_hi + 1;
    for (;;) {
        natsMsg *m = NULL;
        uint64_t s = 0;
        int left = kb_deadline_left_ms(deadline);
        if (left <= 0)
            return -4;   /* every read answered, the window longer than its time */
        int r = kb__nats_stream_next(t, c->part->topic->stream, c->part->subject, from,
                                     c->consumer, numbered ? c->dseq_hi + 1 + *k : 0, left, &m, &s);
        if (r != 1)
            return r == 0 ? -3 : r;
        if (s >= meta->sseq || *k == most) {
            natsMsg_Destroy(m);
            return s >= meta->sseq ? 0 : -2;
        }
        got[*k] = m;
        seq[(*k)++] = s;
        from = s + 1;
    }
}

/* A partition's consumer first sends its subject's messages in stream order,
 * so what never arrived before `meta` (a delivery past the message after the
 * last one the claim had, first or again) is every message of the
 * partition's subject between the two: the consumer went past each only by
 * sending it. When meta is a first delivery and the stream holds
 * exactly as many there as deliveries were lost, each is handled under the
 * delivery sequence it was sent with (its ack and progress say the
 * consumer's own numbers). When it holds more or fewer (the consumer's
 * numbers skipped otherwise: a delivery nats-server 2.9 found no pull
 * request for and sent again under a new number, a leader change), they are
 * handled unnumbered, and so they are after a bridge or a redelivery, or in
 * an open gap (the count lost counts redeliveries then): as the bridge
 * reads them, bounded by the ring's room (an entry without a delivery
 * sequence holds the head until one with a sequence comes after it); meta's
 * AckAll covers them. None there: nothing is missing. Either way the claim carries on with its consumer: a new one
 * costs seconds on a cluster that just lost a node, the node this process
 * was connected to. The reads block the feeder, every partition's: at most
 * REFILL_WAIT_MS for one gap, REFILL_BUDGET_MS in any second, and none for
 * REFILL_OFF_MS after one went unanswered (a stream electing its leader
 * stalls the feeder once). NULL when done; else why not, and the caller
 * restarts the claim. */
const char *kb__nats_refill(kb_nats_feeder *f, kb_nats_claim *c, const kb_nats_meta *meta,
                            kb_nats_refilled *out)
{
    kb_transport *t = f->t;
    int64_t started = kb_now_ns();
    const char *why = refill_refused(f, c, meta, started);
    if (why != NULL)
        return why;
    uint64_t lost = meta->dseq > c->dseq_hi + 1 ? meta->dseq - c->dseq_hi - 1 : 0, k = 0;
    /* unnumbered: after a bridge (a consumer whose leader changed may number
     * the window otherwise), a redelivery or an open gap (the count lost
     * counts redeliveries) */
    bool gap = c->gap_open_ns != 0 || meta->delivered != 1, unnumbered = c->bridged || gap;
    uint64_t used = atomic_load(&c->tail) - atomic_load(&c->head);
    uint64_t room = used + 1 < c->cap ? c->cap - used - 1 : 0;   /* meta too */
    uint64_t most = unnumbered || room > lost ? room : lost;
    natsMsg **got = malloc((size_t)(most > 0 ? most : 1) * sizeof *got);
    uint64_t *seq = malloc((size_t)(most > 0 ? most : 1) * sizeof *seq);
    int64_t deadline = started + (int64_t)REFILL_WAIT_MS * 1000000;
    int r = got != NULL && seq != NULL
                ? read_window(t, c, meta, !unnumbered, most, deadline, got, seq, &k)
                : -1;
    bool numbered = !unnumbered && r == 0 && k == lost;
    if (r == 0 && !numbered && k > room)
        r = -2;
    int64_t now = kb_now_ns();
    f->refill_spent += now - started;
    if (r == -1 && now >= deadline)
        f->refill_off_until = now + (int64_t)REFILL_OFF_MS * 1000000;
    why = r == -2                      ? "more than the claim's ring has room for"
          : r == -3                    ? "the stream's leader does not hold them yet"
          : r == -4                    ? "more than its time allows"
          : r == -1 && now >= deadline ? "the stream did not answer in time"
          : r == -1                    ? "the stream's answer could not be read"
                                       : NULL;
    if (why == NULL && gap)
        kb_log(t->bus, KB_LOG_NOTICE, "nats %s: consumer %s: deliveries lost before a "
               "redelivery: %llu messages of the partition before stream sequence %llu, read "
               "again from the stream", t->url_safe, c->consumer, (unsigned long long)k,
               (unsigned long long)meta->sseq);
    else if (why == NULL)
        kb_log(t->bus, KB_LOG_NOTICE, "nats %s: consumer %s: deliveries %llu..%llu never arrived; %s",
               t->url_safe, c->consumer, (unsigned long long)c->dseq_hi + 1,
               (unsigned long long)meta->dseq - 1,
               numbered || c->bridged ? "read again from the stream"
               : k == 0 ? "no message of the partition is there: none missing"
                        : "the stream holds another number of them there: read again, unnumbered");
    if (why != NULL) {
        for (uint64_t i = 0; i < k; i++)
            natsMsg_Destroy(got[i]);
        free(got);
        free(seq);
        return why;
    }
    *out = (kb_nats_refilled){got, seq, k, !numbered};
    return NULL;
}

