/* baseline:nats-raw, the NATS JetStream limit for this workload: plain nats.c,
 * no keybus. One producer thread async-publishes (js_PublishMsgAsync) every
 * event to one subject of its own stream, with the key in a `Kb-Key` header as
 * keybus writes it; a consumer thread on its own connection pulls from one
 * durable pull consumer (AckExplicit) and acks every message on its own
 * (`+ACK` to its reply subject, fire and forget: no round trip), after handing
 * it to the same checker as every runner. One subject keeps every aggregate
 * in order, so the order check applies as to the other runners.
 *
 * Pull requests are sent by hand ($JS.API.CONSUMER.MSG.NEXT, two of RAW_BATCH
 * kept open) instead of natsSubscription_Fetch: Debian's nats.c 3.4.1 has a
 * Fetch timeout bug and a `_fetch` overflow (docs/transports-nats.md). The
 * stream has the storage keybus uses by default (file). Run only for nats://
 * URLs. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>
#include <keybus/keybus.h>

#include "bench.h"

#ifndef RAW_BATCH
#define RAW_BATCH 1024          /* messages per pull request; two are kept open */
#endif
#ifndef RAW_MAX_PENDING
#define RAW_MAX_PENDING 16384   /* async publishes in flight */
#endif
#define RAW_EXPIRES_NS 1000000000LL
#define RAW_REQS 2

struct raw_req {
    unsigned serial;
    int left;               /* messages this request may still bring */
    int64_t expires_ns;     /* the server drops it then: a request that brought some
                             * messages may end without a status (paced, at 1k/s) */
};

struct raw_ctx {
    natsConnection *pub_nc, *sub_nc;
    jsCtx *js;
    char stream[64], subject[64], consumer[32], next[160], inbox[64];
    natsSubscription *sub;
    atomic_int pub_error;
    atomic_int stop;
    int sub_error;
};

static void pub_err(jsCtx *js, jsPubAckErr *pae, void *closure)
{
    (void)js;
    struct raw_ctx *c = closure;
    if (atomic_exchange(&c->pub_error, 1) == 0)
        fprintf(stderr, "baseline:nats-raw: publish: %s\n",
                pae->ErrText ? pae->ErrText : natsStatus_GetText(pae->Err));
}

static int publish(void *opaque, const void *key, size_t key_len, const void *payload, size_t len)
{
    struct raw_ctx *c = opaque;
    if (atomic_load_explicit(&c->pub_error, memory_order_relaxed))
        return KB_ETRANSPORT;
    char k[KB_BENCH_KEY_MAX + 1];
    if (key_len > KB_BENCH_KEY_MAX)
        key_len = KB_BENCH_KEY_MAX;
    memcpy(k, key, key_len);
    k[key_len] = '\0';
    natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, c->subject, NULL, payload, (int)len);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Kb-Key", k);
    if (s == NATS_OK)
        s = js_PublishMsgAsync(c->js, &m, NULL);   /* waits (StallWait) when full */
    natsMsg_Destroy(m);                            /* NULL once the library took it */
    if (s == NATS_TIMEOUT)
        return KB_EFULL;                           /* kb_drive retries */
    if (s != NATS_OK) {
        fprintf(stderr, "baseline:nats-raw: publish: %s\n", natsStatus_GetText(s));
        return KB_ETRANSPORT;
    }
    return KB_OK;
}

static int pull(struct raw_ctx *c, struct raw_req *r, unsigned serial)
{
    char body[64], reply[96];
    snprintf(body, sizeof body, "{\"batch\":%d,\"expires\":%lld}", RAW_BATCH, RAW_EXPIRES_NS);
    snprintf(reply, sizeof reply, "%s.%u", c->inbox, serial);
    if (natsConnection_PublishRequestString(c->sub_nc, c->next, reply, body) != NATS_OK)
        return -1;
    r->serial = serial;
    r->left = RAW_BATCH;
    r->expires_ns = kb_now_ns() + RAW_EXPIRES_NS;
    return 0;
}

static void *consume(void *opaque)
{
    struct raw_ctx *c = opaque;
    struct raw_req reqs[RAW_REQS] = {{0, 0}};
    unsigned serial = 0;
    size_t il = strlen(c->inbox);
    while (!atomic_load_explicit(&c->stop, memory_order_relaxed)) {
        int64_t now = kb_now_ns();
        for (int i = 0; i < RAW_REQS; i++)
            if ((reqs[i].left <= 0 || now >= reqs[i].expires_ns) && pull(c, &reqs[i], ++serial) != 0) {
                fprintf(stderr, "baseline:nats-raw: pull request failed\n");
                c->sub_error = 1;
                return NULL;
            }
        natsMsg *m = NULL;
        natsStatus s = natsSubscription_NextMsg(&m, c->sub, 100);
        if (s == NATS_TIMEOUT)
            continue;
        if (s != NATS_OK) {
            fprintf(stderr, "baseline:nats-raw: next message: %s\n", natsStatus_GetText(s));
            c->sub_error = 1;
            return NULL;
        }
        const char *subj = natsMsg_GetSubject(m), *reply = natsMsg_GetReply(m);
        if (reply != NULL && strncmp(reply, "$JS.ACK.", 8) == 0) {
            kb_collect_event(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
            natsConnection_Publish(c->sub_nc, reply, "+ACK", 4);   /* ack per message */
            /* Data keeps its stream subject: the server fills the oldest request first. */
            struct raw_req *r = NULL;
            for (int i = 0; i < RAW_REQS; i++)
                if (reqs[i].left > 0 && (r == NULL || reqs[i].serial < r->serial))
                    r = &reqs[i];
            if (r != NULL)
                r->left--;
        } else {   /* a status (408 expired, 404, 409) on <inbox>.<serial> ends its request */
            unsigned ser = 0;
            if (strncmp(subj, c->inbox, il) == 0 && sscanf(subj + il, ".%u", &ser) == 1)
                for (int i = 0; i < RAW_REQS; i++)
                    if (reqs[i].serial == ser)
                        reqs[i].left = 0;
        }
        natsMsg_Destroy(m);
    }
    return NULL;
}

static int setup(struct raw_ctx *c, const char *url)
{
    static unsigned run_no;
    unsigned run = run_no++;
    snprintf(c->stream, sizeof c->stream, "KBRAW_%ld_%u", (long)getpid(), run);
    snprintf(c->subject, sizeof c->subject, "kbraw.%ld.%u", (long)getpid(), run);
    snprintf(c->consumer, sizeof c->consumer, "raw");
    snprintf(c->next, sizeof c->next, "$JS.API.CONSUMER.MSG.NEXT.%s.%s", c->stream, c->consumer);
    natsStatus s = natsConnection_ConnectTo(&c->pub_nc, url);
    if (s == NATS_OK)
        s = natsConnection_ConnectTo(&c->sub_nc, url);
    if (s != NATS_OK) {
        fprintf(stderr, "baseline:nats-raw: connect: %s\n", natsStatus_GetText(s));
        return -1;
    }
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = RAW_MAX_PENDING;
    jo.PublishAsync.ErrHandler = pub_err;
    jo.PublishAsync.ErrHandlerClosure = c;
    jo.PublishAsync.StallWait = 1000;
    s = natsConnection_JetStream(&c->js, c->pub_nc, &jo);
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    const char *subjects[] = {c->subject};
    sc.Name = c->stream;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    jsErrCode jerr = 0;
    if (s == NATS_OK)
        s = js_AddStream(NULL, c->js, &sc, NULL, &jerr);
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = c->consumer;
    cc.AckPolicy = js_AckExplicit;
    cc.MaxAckPending = 4 * RAW_BATCH * RAW_REQS;
    if (s == NATS_OK)
        s = js_AddConsumer(NULL, c->js, c->stream, &cc, NULL, &jerr);
    natsInbox *inbox = NULL;
    if (s == NATS_OK)
        s = natsInbox_Create(&inbox);
    if (s == NATS_OK) {
        snprintf(c->inbox, sizeof c->inbox, "%s", inbox);
        natsInbox_Destroy(inbox);
        char all[80];
        snprintf(all, sizeof all, "%s.*", c->inbox);
        s = natsConnection_SubscribeSync(&c->sub, c->sub_nc, all);
    }
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(c->sub, -1, -1);
    if (s != NATS_OK) {
        fprintf(stderr, "baseline:nats-raw: stream %s: %s (jetstream error %d)\n", c->stream,
                natsStatus_GetText(s), (int)jerr);
        return -1;
    }
    return 0;
}

void kb_run_nats_raw(const kb_plan *plan, const char *url, kb_result *r)
{
    kb_plan p = *plan;
    p.producers = 1;   /* by definition: one async producer, one pull consumer */
    snprintf(r->transport, sizeof r->transport, "baseline:nats-raw");
    r->threads = 1;
    struct raw_ctx *c = calloc(1, sizeof *c);
    if (c == NULL || kb_collect_begin(&p) != 0) {
        kb_result_plan(r, &p);
        free(c);
        r->error = KB_EINVAL;
        return;
    }
    pthread_t consumer;
    if (setup(c, url) != 0 || pthread_create(&consumer, NULL, consume, c) != 0) {
        r->error = KB_ETRANSPORT;
    } else {
        kb_drive(&p, publish, NULL, c, r);
        atomic_store(&c->stop, 1);
        pthread_join(consumer, NULL);
        if (atomic_load(&c->pub_error) || c->sub_error)
            r->error = KB_ETRANSPORT;
    }
    kb_collect_end(&p, r);
    if (c->js != NULL) {
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MaxWait = 5000;
        js_PublishAsyncComplete(c->js, &po);
        js_DeleteStream(c->js, c->stream, NULL, NULL);   /* leave no data behind */
    }
    natsSubscription_Destroy(c->sub);
    jsCtx_Destroy(c->js);
    natsConnection_Destroy(c->pub_nc);
    natsConnection_Destroy(c->sub_nc);
    free(c);
}
