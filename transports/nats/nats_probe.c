/* A consumer's pending set, learned from the server: nats-server 2.9 gives
 * only the ack floor and counts (NumAckPending), not which messages above
 * the floor an AckExplicit consumer acked. A NAK puts a pending message on
 * the consumer's redelivery queue at once (one for a sequence it does not
 * hold is ignored), and a pull then gets exactly those, in stream order.
 * The server's last delivery (Delivered.Stream) can lag the messages it
 * holds: nats-server 2.9 steps it back one each time a redelivery finds no
 * live pull (the killed consumer's requests), so the one delivered last is
 * pending above it and comes to the pull as if new. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_probe.h"

#define KB_NATS_PROBE_WAIT_MS 1000   /* at most; a sixth of the lease TTL when shorter */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Messages answering the pull whose status would come on reply_to, up to
 * `want` of them (the request asks for exactly `want`: it ends with the last
 * of them or with its status), their distinct stream sequences above floor
 * sorted into got; the count. */
static uint32_t collect(kb_transport *t, const char *reply_to, uint64_t floor, uint64_t *got,
                        uint32_t want, int wait_ms)
{
    uint32_t n = 0, seen = 0;
    int64_t deadline = kb_deadline_ns(wait_ms + 100);
    while (seen < want) {
        natsMsg *m = NULL;
        int left = kb_deadline_left_ms(deadline);
        if (left <= 0 || natsSubscription_NextMsg(&m, t->probe_sub, left) != NATS_OK)
            break;
        kb_nats_meta meta;
        const char *reply = natsMsg_GetReply(m);
        bool data = reply != NULL && kb__nats_parse_ack(reply, &meta) == 0;
        bool mine = !data && strcmp(natsMsg_GetSubject(m), reply_to) == 0;
        natsMsg_Destroy(m);
        if (mine) {
            t->probe_open = false;   /* its status: the request ended */
            break;
        }
        if (!data)
            continue;
        seen++;
        if (meta.sseq > floor)
            got[n++] = meta.sseq;
    }
    if (seen == want)
        t->probe_open = false;
    qsort(got, n, sizeof *got, cmp_u64);
    uint32_t u = 0;
    for (uint32_t i = 0; i < n; i++)
        if (u == 0 || got[u - 1] != got[i])
            got[u++] = got[i];
    return u;
}

/* Whether `above` messages newer than `to` that came to the probe make up
 * what `in_range` redeliveries lack of the `want` pending: those newer ones
 * that were never delivered before are pending now besides the `want`. */
static bool complete_above(kb_transport *t, const char *stream, const char *consumer,
                           uint64_t want, uint32_t in_range, uint32_t above)
{
    jsConsumerInfo *now = NULL;
    if (above == 0 || js_GetConsumerInfo(&now, t->js, stream, consumer, NULL, NULL) != NATS_OK)
        return false;
    int64_t new_ones = (int64_t)now->NumAckPending - (int64_t)want;
    jsConsumerInfo_Destroy(now);
    return new_ones >= 0 && new_ones <= (int64_t)above &&
           (uint64_t)in_range + above - (uint64_t)new_ones == want;
}

/* Nothing left of an earlier probe on the subscription: its request ended
 * (its status came) and what it delivered is read. False when it has not. */
static bool probe_idle(kb_transport *t, int wait_ms)
{
    int64_t deadline = kb_deadline_ns(t->probe_open ? wait_ms : 0);
    for (;;) {
        natsMsg *m = NULL;
        int left = kb_deadline_left_ms(deadline);
        if (natsSubscription_NextMsg(&m, t->probe_sub, left > 0 ? left : 1) != NATS_OK)
            return !t->probe_open;
        if (natsMsg_GetReply(m) == NULL || strncmp(natsMsg_GetReply(m), "$JS.ACK.", 8) != 0)
            t->probe_open = false;   /* a status of the open request */
        natsMsg_Destroy(m);
    }
}

/* The probe subscription, made at the first probe: <inbox>.* */
static bool probe_sub(kb_transport *t)
{
    if (t->probe_sub != NULL)
        return true;
    natsInbox *inbox = NULL;
    if (natsInbox_Create(&inbox) != NATS_OK)
        return false;
    snprintf(t->probe_inbox, sizeof t->probe_inbox, "%s", inbox);
    natsInbox_Destroy(inbox);
    char all[160];
    snprintf(all, sizeof all, "%s.*", t->probe_inbox);
    if (natsConnection_SubscribeSync(&t->probe_sub, t->nc, all) != NATS_OK)
        return false;
    return natsSubscription_SetPendingLimits(t->probe_sub, -1, -1) == NATS_OK;
}

bool kb__nats_probe_pending(kb_transport *t, const char *stream, const jsConsumerInfo *ci,
                            uint64_t **pending, uint32_t *n)
{
    uint64_t floor = kb__nats_floor_of(ci), to = ci->Delivered.Stream;
    *pending = NULL;
    *n = 0;
    if (ci->NumAckPending <= 0)
        return true;
    uint64_t want = (uint64_t)ci->NumAckPending;
    /* the lease thread renews leases between its takeovers: never past one */
    int wait_ms = t->lease_ttl_ms / 6 < KB_NATS_PROBE_WAIT_MS ? (int)(t->lease_ttl_ms / 6)
                                                              : KB_NATS_PROBE_WAIT_MS;
    if (to <= floor || want > to - floor || to - floor >= KB_NATS_NAK_MAX)
        return false;
    uint64_t *got = malloc((size_t)want * sizeof *got);
    char reply_to[160];
    bool ok = got != NULL && probe_sub(t) && probe_idle(t, wait_ms);
    if (ok) {
        snprintf(reply_to, sizeof reply_to, "%s.%u", t->probe_inbox, ++t->probe_serial);
        char subj[2 * KB_NATS_NAME], body[96];
        snprintf(subj, sizeof subj, "$JS.API.CONSUMER.MSG.NEXT.%s.%s", stream, ci->Name);
        snprintf(body, sizeof body, "{\"batch\":%llu,\"expires\":%lld}",
                 (unsigned long long)want, (long long)wait_ms * 1000000);
        /* The NAKs go on the consumer's connection, the pull on nc (where
         * the probe inbox is subscribed): the server has read the NAKs once
         * it answers the PING behind them, and only then may the pull go. */
        ok = kb__nats_nak_range(t, stream, ci->Name, floor + 1, to, ci->Delivered.Consumer) &&
             natsConnection_FlushTimeout(kb__nats_feed_conn(t), wait_ms) == NATS_OK &&
             natsConnection_FlushTimeout(t->nc, wait_ms) == NATS_OK &&
             natsConnection_PublishRequestString(t->nc, subj, reply_to, body) == NATS_OK;
        t->probe_open = ok;
    }
    uint32_t distinct = ok ? collect(t, reply_to, floor, got, (uint32_t)want, wait_ms) : 0;
    uint32_t in_range = 0;
    while (in_range < distinct && got[in_range] <= to)
        in_range++;
    /* the pending ones above `to` are not skipped: handled again */
    ok = ok && (in_range == want ||
                complete_above(t, stream, ci->Name, want, in_range, distinct - in_range));
    if (!ok || in_range == 0) {
        free(got);
        got = NULL;
    }
    *pending = got;
    *n = ok ? in_range : 0;
    return ok;
}
