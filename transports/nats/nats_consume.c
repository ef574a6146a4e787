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

static void dead_on_arrival(feeder *f, kb_nats_entry *e, natsMsg *m, const kb_nats_meta *meta,
                            const void *key, size_t key_len, const char *why)
{
    kb_log(f->t->bus, 4, "nats %s: message %llu on %s goes to the dead letters: %s",
           f->t->url_safe, (unsigned long long)meta->sseq, natsMsg_GetSubject(m), why);
    int rc = kb__nats_dlq_publish(f->t, f->tp, m, key, key_len, e->claim->part->n, meta->sseq,
                                  (uint32_t)meta->delivered, why);
    kb__nats_settle(e, rc == KB_OK);
    if (rc != KB_OK)
        kb__nats_claim_reset(f->t, e->claim);   /* redelivered to a fresh claim */
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
    c->delivered_hi = meta->sseq;
    uint64_t slot = atomic_load(&c->tail);
    kb_nats_entry *e = &c->ring[slot & (c->cap - 1)];
    e->msg = m;
    e->claim = c;
    e->sseq = meta->sseq;
    e->since_ns = kb__nats_now_ns();
    atomic_store(&e->done, 0);
    atomic_store_explicit(&c->tail, slot + 1, memory_order_release);

    const char *why = NULL;
    int klen = kb__nats_get_key(m, f->key, f->key_cap, &why);
    if (klen < 0) {
        dead_on_arrival(f, e, m, meta, NULL, 0, why);
        return;
    }
    uint32_t home = kb_fnv1a32(f->key, (size_t)klen) % t->partitions;
    if (home != n) {
        char buf[96];
        snprintf(buf, sizeof buf, "key belongs to partition %u, not %u", home, n);
        dead_on_arrival(f, e, m, meta, f->key, (size_t)klen, buf);
        return;
    }
    char id[24], *ip = id + sizeof id;
    *--ip = '\0';
    uint64_t v = meta->sseq;
    do
        *--ip = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    kb_delivery d = {.topic = f->tp->name, .key = f->key, .key_len = (size_t)klen,
                     .payload = natsMsg_GetData(m), .payload_len = (size_t)natsMsg_GetDataLength(m),
                     .partition = n, .attempt = (uint32_t)meta->delivered, .id = ip, .cookie = e};
    if (d.payload == NULL)
        d.payload = "";
    int rc = kb_sink_deliver(f->tp->sink, &d, -1);   /* waits while the lane is full */
    if (rc != KB_OK) {
        kb__nats_settle(e, false);
        if (rc != KB_ECLOSED)
            kb_log(t->bus, 3, "nats: delivery of %s on %s failed: %s", ip, natsMsg_GetSubject(m),
                   kb_strerror(rc));
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
