/* Consuming: one feeder thread per topic issues its own pull requests (one
 * open request per owned partition, explicit batch and server-side expiry)
 * and hands messages to the sink in stream order. nats.c's Fetch is not used:
 * see docs/transports-nats.md for its 3.4.1 bugs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/err.h"
#include "nats_int.h"

typedef struct feeder {
    kb_transport *t;
    kb_nats_topic *tp;
    kb_nats_claim **cur;     /* the claim this feeder works on, per partition */
    char *key;               /* decoded key buffer */
    size_t key_cap;
} feeder;

/* Keep up to two pull requests of nats.fetch_batch open per partition: the
 * next one is sent when the open ones have less than a batch left, so the
 * server never waits for a round trip between batches. */
static void pull(feeder *f, kb_nats_claim *c, int64_t now)
{
    kb_transport *t = f->t;
    uint64_t used = atomic_load(&c->tail) - atomic_load(&c->head);
    int64_t room = (int64_t)c->cap - (int64_t)used - (c->pull_open ? c->pull_left : 0);
    int batch = (int)(room < t->fetch_batch ? room : t->fetch_batch);
    if (batch <= 0 || (c->pull_open && batch < t->fetch_batch / 2))
        return;   /* the frontier is full: wait for acks (no dribble of small requests) */
    char body[96], reply[256];
    snprintf(body, sizeof body, "{\"batch\":%d,\"expires\":%lld}", batch,
             (long long)t->fetch_expires_ms * 1000000);
    snprintf(reply, sizeof reply, "%s.%u.%u", f->tp->inbox, c->part->n, ++c->pull_serial);
    if (natsConnection_PublishRequestString(t->nc, c->next_subj, reply, body) != NATS_OK)
        return;
    c->pull_left = (c->pull_open ? c->pull_left : 0) + batch;
    c->pull_open = true;
    /* The server ends the request; this only covers a lost one (reconnect). */
    c->pull_deadline_ns = now + (t->fetch_expires_ms + 2000) * 1000000;
}

/* A status reply (408 expired, 404 nothing, 409 ...) closes its request. */
static void status_msg(feeder *f, natsMsg *m)
{
    const char *subj = natsMsg_GetSubject(m);
    size_t il = strlen(f->tp->inbox);
    unsigned n = 0, serial = 0;
    if (strncmp(subj, f->tp->inbox, il) == 0 && sscanf(subj + il, ".%u.%u", &n, &serial) == 2 &&
        n < f->t->partitions && f->cur[n] != NULL && f->cur[n]->pull_serial == serial) {
        f->cur[n]->pull_open = false;   /* the newest request ended: so did the older */
        f->cur[n]->pull_left = 0;
    }
}

/* An event (or the whole message, when unreadable) goes to the dead letters
 * without reaching a handler. */
static void dead_on_arrival(feeder *f, kb_nats_entry *e, natsMsg *m, const kb_nats_meta *meta,
                            const char *id, const kb_nats_event *ev, const char *why)
{
    kb_log(f->t->bus, 4, "nats %s: message %s on %s goes to the dead letters: %s",
           f->t->url_safe, id, natsMsg_GetSubject(m), why);
    const char *body = natsMsg_GetData(m);
    kb_nats_event whole = {NULL, body ? body : "", 0, (size_t)natsMsg_GetDataLength(m)};
    if (ev == NULL)
        ev = &whole;
    kb_nats_claim *c = e->claim;
    int rc = kb__nats_dlq_publish(f->t, f->tp, natsMsg_GetSubject(m), id, ev->key, ev->key_len,
                                  ev->payload, ev->payload_len, c->part->n,
                                  kb__nats_attempt(c, meta->sseq, meta->delivered), why);
    if (rc != KB_OK && rc != KB_ETIMEDOUT)
        kb_log(f->t->bus, 3, "nats %s: dead letter of %s on %s lost: %s", f->t->url_safe, id,
               natsMsg_GetSubject(m), kb_last_error());
    kb__nats_dlq_settle(f->t, e, rc);
}

/* Hand one event to the sink; false when the bus refused it (closing). */
static bool deliver(feeder *f, kb_nats_entry *e, natsMsg *m, const kb_nats_meta *meta,
                    unsigned n, const char *id, const kb_nats_event *ev)
{
    kb_transport *t = f->t;
    uint32_t home = kb_fnv1a32(ev->key, ev->key_len) % t->partitions;
    if (home != n) {
        char why[96];
        snprintf(why, sizeof why, "key belongs to partition %u, not %u", home, n);
        dead_on_arrival(f, e, m, meta, id, ev, why);
        return true;
    }
    uint32_t attempt = kb__nats_attempt(e->claim, meta->sseq, meta->delivered);
    if (attempt > t->max_attempts) {   /* handled max_attempts times already */
        dead_on_arrival(f, e, m, meta, id, ev, "retry.max_attempts reached (redelivered)");
        return true;
    }
    kb_delivery d = {.topic = f->tp->name, .key = ev->key, .key_len = ev->key_len,
                     .payload = ev->payload ? ev->payload : "", .payload_len = ev->payload_len,
                     .partition = n, .attempt = attempt, .id = id, .cookie = e};
    int rc = kb_sink_deliver(f->tp->sink, &d, -1);   /* waits while the lane is full */
    if (rc == KB_OK)
        return true;
    kb__nats_settle(e, false);
    if (rc != KB_ECLOSED)
        kb_log(t->bus, 3, "nats: delivery of %s on %s failed: %s", id, natsMsg_GetSubject(m),
               kb_strerror(rc));
    return false;
}

static void data_msg(feeder *f, natsMsg *m, const kb_nats_meta *meta, unsigned n)
{
    kb_transport *t = f->t;
    kb_nats_claim *c = f->cur[n];
    if (c == NULL || strcmp(c->consumer, meta->consumer) != 0) {
        natsMsg_Destroy(m);   /* an earlier claim's consumer: not ours any more */
        return;
    }
    if (c->pull_left > 0 && --c->pull_left == 0)
        c->pull_open = false;
    if (meta->sseq <= c->delivered_hi) {
        natsMsg_Destroy(m);   /* redelivery of an event still in this process */
        return;
    }
    while (atomic_load(&c->tail) - atomic_load(&c->head) >= c->cap) {
        if (atomic_load(&c->fenced) || atomic_load(&t->stopping)) {
            natsMsg_Destroy(m);
            return;
        }
        kb__nats_sleep_ms(1);
    }
    /* Read the message before it is in the ring: once there, its events may
     * settle (and the acker destroy it) while we still look at it. */
    const char *count = NULL, *why = NULL;
    kb_nats_frame frame = {NULL, NULL, 1};
    kb_nats_event one = {NULL, NULL, 0, 0};
    bool framed = natsMsgHeader_Get(m, KB_NATS_BATCH_HDR, &count) == NATS_OK && count != NULL;
    int bad;
    if (framed) {
        bad = kb__nats_frame_open(m, count, &frame, &why);
    } else {
        int klen = kb__nats_get_key(m, f->key, f->key_cap, &why);
        bad = klen < 0;
        one = (kb_nats_event){f->key, natsMsg_GetData(m), klen < 0 ? 0 : (size_t)klen,
                              (size_t)natsMsg_GetDataLength(m)};
    }
    c->delivered_hi = meta->sseq;
    uint64_t slot = atomic_load(&c->tail);
    kb_nats_entry *e = &c->ring[slot & (c->cap - 1)];
    e->msg = m;
    e->claim = c;
    e->sseq = meta->sseq;
    e->since_ns = kb__nats_now_ns();
    uint32_t events = bad ? 1 : frame.left;
    atomic_store(&e->pending, events);
    atomic_store(&e->released, 0);
    atomic_store(&e->done, 0);
    atomic_store_explicit(&c->tail, slot + 1, memory_order_release);

    /* From here on `m` lives until the last of its events settles: the
     * pending count keeps the acker from destroying it before. The delivery
     * ID is the stream sequence, ".<i>" for the i-th event of a frame. */
    char id[48];
    size_t base = kb__nats_put_u64(id, meta->sseq);
    if (bad) {
        dead_on_arrival(f, e, m, meta, id, NULL, why);
        return;
    }
    for (uint32_t i = 1; i <= events; i++) {
        kb_nats_event ev = one;
        if (framed) {
            kb__nats_frame_next(&frame, &ev);
            id[base] = '.';
            kb__nats_put_u64(id + base + 1, i);
        }
        if (!deliver(f, e, m, meta, n, id, &ev)) {
            for (uint32_t rest = i + 1; rest <= events; rest++)
                kb__nats_settle(e, false);   /* never delivered: released with it */
            return;
        }
    }
}

static void handle(feeder *f, natsMsg *m)
{
    kb_nats_meta meta;
    const char *reply = natsMsg_GetReply(m);
    if (reply == NULL || kb__nats_parse_ack(reply, &meta) != 0) {
        status_msg(f, m);
        natsMsg_Destroy(m);
        return;
    }
    const char *subj = natsMsg_GetSubject(m), *dot = strrchr(subj, '.');
    char *end = NULL;
    unsigned long n = dot ? strtoul(dot + 1, &end, 10) : 0;
    if (dot == NULL || end == dot + 1 || *end != '\0' || n >= f->t->partitions) {
        natsMsg_Destroy(m);
        return;
    }
    data_msg(f, m, &meta, (unsigned)n);
}

static void *feed(void *arg)
{
    feeder *f = arg;
    kb_transport *t = f->t;
    while (!atomic_load(&t->stopping)) {
        int64_t now = kb__nats_now_ns();
        for (uint32_t i = 0; i < t->partitions; i++) {
            kb_nats_claim *c = atomic_load(&f->tp->parts[i].claim);
            if (c != f->cur[i] && f->cur[i] != NULL)
                atomic_store(&f->cur[i]->feeder_left, 1);
            f->cur[i] = c;
            if (c == NULL)
                continue;
            if (atomic_load(&c->fenced)) {
                atomic_store(&c->feeder_left, 1);
                f->cur[i] = NULL;
            } else if (!c->pull_open || c->pull_left < t->fetch_batch ||
                       now > c->pull_deadline_ns) {
                if (c->pull_open && now > c->pull_deadline_ns)
                    c->pull_open = false;   /* lost in a reconnect */
                pull(f, c, now);
            }
        }
        natsMsg *m = NULL;
        if (natsSubscription_NextMsg(&m, f->tp->inbox_sub, 20) == NATS_OK)
            handle(f, m);
    }
    for (uint32_t i = 0; i < t->partitions; i++)
        if (f->cur[i] != NULL)
            atomic_store(&f->cur[i]->feeder_left, 1);
    free(f->cur);
    free(f->key);
    free(f);
    nats_ReleaseThreadMemory();
    return NULL;
}

int kb__nats_subscribe(kb_transport *t, const char *topic, kb_sink *sink)
{
    kb_nats_topic *tp = kb__nats_topic(t, topic, true);
    if (tp == NULL)
        return KB_ETRANSPORT;
    if (atomic_load(&tp->subscribed)) {
        kb__errf(NULL, 0, "nats: topic %s already consumed", topic);
        return KB_EINVAL;
    }
    feeder *f = calloc(1, sizeof *f);
    tp->parts = calloc(t->partitions, sizeof *tp->parts);
    natsInbox *inbox = NULL;
    if (f == NULL || tp->parts == NULL || natsInbox_Create(&inbox) != NATS_OK)
        goto nomem;
    f->t = t;
    f->tp = tp;
    f->key_cap = 65536;
    f->key = malloc(f->key_cap);
    f->cur = calloc(t->partitions, sizeof *f->cur);
    if (f->key == NULL || f->cur == NULL)
        goto nomem;
    snprintf(tp->inbox, sizeof tp->inbox, "%s", inbox);
    natsInbox_Destroy(inbox);
    inbox = NULL;
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *p = &tp->parts[i];
        p->topic = tp;
        p->n = i;
        snprintf(p->subject, sizeof p->subject, "kb.%s.%u", topic, i);
        snprintf(p->lease_key, sizeof p->lease_key, "l.%s.%s.%u", tp->stream, t->group, i);
    }
    char all[160];
    snprintf(all, sizeof all, "%s.>", tp->inbox);
    natsStatus s = natsConnection_SubscribeSync(&tp->inbox_sub, t->nc, all);
    if (s == NATS_OK)   /* bounded by the open pull requests, not by the library */
        s = natsSubscription_SetPendingLimits(tp->inbox_sub, -1, -1);
    if (s != NATS_OK) {
        free(f->key);
        free(f->cur);
        free(f);
        return kb__nats_errf("subscribe", s, 0);
    }
    tp->sink = sink;
    atomic_store(&tp->subscribed, 1);
    if (pthread_create(&tp->feeder, NULL, feed, f) != 0) {
        atomic_store(&tp->subscribed, 0);
        kb__errf(NULL, 0, "nats: cannot start the feeder of %s", topic);
        free(f->key);
        free(f->cur);
        free(f);
        return KB_ENOMEM;
    }
    tp->feeder_started = true;
    kb__nats_lease_kick(t);
    return KB_OK;

nomem:
    natsInbox_Destroy(inbox);
    if (f != NULL) {
        free(f->key);
        free(f->cur);
    }
    free(f);
    kb__errf(NULL, 0, "nats: out of memory subscribing %s", topic);
    return KB_ENOMEM;
}

void kb__nats_stop(kb_transport *t)
{
    atomic_store(&t->stopping, 1);
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next)
        if (tp->feeder_started) {
            pthread_join(tp->feeder, NULL);
            tp->feeder_started = false;
        }
}
