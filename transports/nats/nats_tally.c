/* Events stored per partition, for broker_length: the server counts messages,
 * and a frame is one message holding several events (Kb-Batch). So the
 * frames' extra events are counted by reading the headers of the messages
 * stored since the last look (an ephemeral headers-only pull consumer, no
 * acks, no_wait requests), and kept per topic for the next look. Keybus never
 * deletes partition messages; should the stream lose some at its start (a
 * purge, limits set by hand), the count starts again from its first message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_frame.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_tally.h"

#define KB_NATS_TALLY_BATCH 1024
#define KB_NATS_TALLY_WAIT_MS 5000   /* per reply: a lost one fails the stats call */

/* Count one message of the scan. */
static void count(kb_transport *t, kb_nats_tally *y, const char *topic, natsMsg *m,
                  uint64_t sseq)
{
    long n = kb__nats_subject_part(t, topic, natsMsg_GetSubject(m));
    if (sseq > y->to)
        y->to = sseq;
    if (n >= 0)   /* not a dead letter */
        y->extra[n] += kb__nats_events_in(m) - 1;
}

/* Read `expect` messages of consumer `name` (fewer when some were deleted
 * meanwhile: a no_wait request then ends with a status). */
static int scan(kb_transport *t, kb_nats_tally *y, const char *topic, const char *stream,
                const char *name, uint64_t expect)
{
    natsInbox *inbox = NULL;
    natsSubscription *sub = NULL;
    char next[2 * KB_NATS_NAME], body[64];
    snprintf(next, sizeof next, "$JS.API.CONSUMER.MSG.NEXT.%s.%s", stream, name);
    natsStatus s = natsInbox_Create(&inbox);
    if (s == NATS_OK)
        s = natsConnection_SubscribeSync(&sub, t->nc, inbox);
    while (s == NATS_OK && expect > 0) {
        uint64_t batch = expect < KB_NATS_TALLY_BATCH ? expect : KB_NATS_TALLY_BATCH, got = 0;
        snprintf(body, sizeof body, "{\"batch\":%llu,\"no_wait\":true}", (unsigned long long)batch);
        s = natsConnection_PublishRequestString(t->nc, next, inbox, body);
        bool ended = false;
        while (s == NATS_OK && got < batch && !ended) {
            natsMsg *m = NULL;
            s = natsSubscription_NextMsg(&m, sub, KB_NATS_TALLY_WAIT_MS);
            kb_nats_meta meta;
            if (s != NATS_OK)
                break;
            if (kb__nats_parse_ack(natsMsg_GetReply(m), &meta) == 0) {
                count(t, y, topic, m, meta.sseq);
                got++;
            } else {
                ended = true;   /* 404/408: nothing more */
            }
            natsMsg_Destroy(m);
        }
        expect -= got;
        if (ended && got == 0)
            break;
    }
    natsSubscription_Destroy(sub);
    natsInbox_Destroy(inbox);
    return s == NATS_OK ? KB_OK : kb__nats_errf("counting events in frames", s, 0);
}

/* Bring the tally up to the stream's last sequence. Caller holds tally_mu. */
static int update(kb_transport *t, kb_nats_tally *y, const char *topic, const char *stream,
                  uint64_t first, uint64_t last)
{
    if (first > y->from) {   /* messages gone from the start: count again */
        memset(y->extra, 0, t->partitions * sizeof *y->extra);
        y->from = first;
        y->to = first - 1;
    }
    if (last <= y->to)
        return KB_OK;
    char filter[KB_NATS_NAME];
    snprintf(filter, sizeof filter, "kb.%s.*", topic);
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.AckPolicy = js_AckNone;
    cc.HeadersOnly = true;
    cc.FilterSubject = filter;
    cc.DeliverPolicy = js_DeliverByStartSequence;
    cc.OptStartSeq = y->to + 1;
    cc.InactiveThreshold = 30LL * 1000000000;   /* removed by the server should we not */
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_AddConsumer(&ci, t->js, stream, &cc, NULL, &jerr);
    if (s != NATS_OK)
        return kb__nats_errf("a consumer for counting events", s, jerr);
    int rc = scan(t, y, topic, stream, ci->Name, ci->NumPending);
    if (rc == KB_OK && y->to < last)
        y->to = last;   /* the rest was deleted meanwhile */
    js_DeleteConsumer(t->js, stream, ci->Name, NULL, NULL);
    jsConsumerInfo_Destroy(ci);
    return rc;
}

int kb__nats_tally(kb_transport *t, kb_nats_topic *tp, uint64_t first, uint64_t last, long only,
                   uint64_t *extra)
{
    pthread_mutex_lock(&t->tally_mu);
    kb_nats_tally *y = &tp->tally;
    int rc = update(t, y, tp->name, tp->stream, first, last);
    *extra = 0;
    for (uint32_t i = 0; rc == KB_OK && i < t->partitions; i++)
        if (only < 0 || (long)i == only)
            *extra += y->extra[i];
    pthread_mutex_unlock(&t->tally_mu);
    return rc;
}
