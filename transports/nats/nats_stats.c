/* Broker figures: per-subject counts from the stream, pending and lag from
 * the partitions' consumers, the owner from the lease bucket. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_lease.h"
#include "nats_names.h"
#include "nats_stats.h"
#include "nats_tally.h"
#include "nats_topic.h"

/* Messages per subject of the topic's stream; dlq into *dlq, partition `only`
 * (or all partitions when only < 0) into *msgs, and their events into
 * *events. KB_ENOTFOUND without a stream. */
static int subject_counts(kb_transport *t, kb_nats_topic *tp, long only, uint64_t *msgs,
                          uint64_t *events, uint64_t *dlq)
{
    char filter[KB_NATS_NAME];
    snprintf(filter, sizeof filter, "kb.%s.*", tp->name);
    jsOptions o;
    jsOptions_Init(&o);
    o.Stream.Info.SubjectsFilter = filter;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, t->js, tp->stream, &o, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
        kb_errf(NULL, 0, "nats: topic %s has no stream (%s)", tp->name, tp->stream);
        return KB_ENOTFOUND;
    }
    if (s != NATS_OK)
        return kb__nats_errf(tp->stream, s, jerr);
    uint32_t stated = kb__nats_stated_partitions(si->Config->Description);
    if (stated != 0 && stated != t->partitions) {
        /* figures by this process's count would be wrong without a word */
        jsStreamInfo_Destroy(si);
        return kb__nats_parts_mismatch(t, tp, stated);
    }
    *msgs = *dlq = 0;
    for (int i = 0; si->State.Subjects != NULL && i < si->State.Subjects->Count; i++) {
        const jsStreamStateSubject *ss = &si->State.Subjects->List[i];
        if (strcmp(ss->Subject, tp->dlq_subject) == 0) {
            *dlq = ss->Msgs;
            continue;
        }
        long n = kb__nats_subject_part(t, tp->name, ss->Subject);
        if (n >= 0 && (only < 0 || n == only))
            *msgs += ss->Msgs;
    }
    uint64_t first = si->State.FirstSeq, last = si->State.LastSeq, extra = 0;
    jsStreamInfo_Destroy(si);
    int rc = kb__nats_tally(t, tp, first, last, only, &extra);
    *events = *msgs + extra;
    return rc;
}

/* Every consumer of the topic's stream (NULL list when there is none). */
static int list_consumers(kb_transport *t, kb_nats_topic *tp, jsConsumerInfoList **list)
{
    jsErrCode jerr = 0;
    natsStatus s = js_Consumers(list, t->js, tp->stream, NULL, &jerr);
    if (s != NATS_OK && s != NATS_NOT_FOUND)
        return kb__nats_errf("consumers", s, jerr);
    return KB_OK;
}

int kb__nats_stats(kb_transport *t, kb_nats_topic *tp, kb_topic_stats *out)
{
    out->partitions = t->partitions;
    out->published = atomic_load(&tp->published);
    out->broker_trimmed = atomic_load(&tp->trimmed);
    if (atomic_load(&tp->subscribed))
        for (uint32_t i = 0; i < t->partitions; i++) {
            kb_nats_claim *c = atomic_load(&tp->parts[i].claim);
            out->partitions_owned += c != NULL && !atomic_load(&c->fenced);
        }
    int rc = subject_counts(t, tp, -1, &out->broker_frames, &out->broker_length,
                            &out->dlq_length);
    if (rc != KB_OK)
        return rc;
    jsConsumerInfoList *list = NULL;
    rc = list_consumers(t, tp, &list);
    if (rc != KB_OK)
        return rc;
    bool consumed = false;
    for (int i = 0; list != NULL && i < list->Count; i++)
        if (kb__nats_consumer_part(t, list->List[i]->Name) >= 0 ||
            kb__nats_consumer_wide(t, list->List[i]->Name)) {
            consumed = true;
            out->broker_pending += (uint64_t)list->List[i]->NumAckPending;
            out->broker_lag += list->List[i]->NumPending;
        }
    jsConsumerInfoList_Destroy(list);
    if (!consumed)   /* the group has no consumer yet: nothing was delivered to it */
        out->broker_lag = out->broker_frames;
    return KB_OK;
}

int kb__nats_partition_stats(kb_transport *t, kb_nats_topic *tp, uint32_t partition,
                             kb_partition_stats *out)
{
    if (partition >= t->partitions) {
        kb_errf(NULL, 0, "nats: %s has partitions 0..%u, not %u", tp->name, t->partitions - 1,
                 partition);
        return KB_ENOTFOUND;
    }
    out->partition = partition;
    uint64_t dlq = 0, msgs = 0;
    int rc = subject_counts(t, tp, (long)partition, &msgs, &out->length, &dlq);
    if (rc != KB_OK)
        return rc;
    jsConsumerInfoList *list = NULL;
    rc = list_consumers(t, tp, &list);
    if (rc != KB_OK)
        return rc;
    for (int i = 0; list != NULL && i < list->Count; i++) {
        const jsConsumerInfo *ci = list->List[i];
        if (kb__nats_consumer_wide(t, ci->Name)) {
            out->consumers++;   /* its figures are the topic's: kb_stats has them */
            continue;
        }
        if (kb__nats_consumer_part(t, ci->Name) != (long)partition)
            continue;
        out->consumers++;
        out->pending += (uint64_t)ci->NumAckPending;
        out->lag += ci->NumPending;
        out->redelivered += (uint64_t)ci->NumRedelivered;
    }
    jsConsumerInfoList_Destroy(list);
    if (out->consumers == 0)   /* nothing of the partition was delivered to the group */
        out->lag = msgs;
    char key[2 * KB_NATS_NAME];
    snprintf(key, sizeof key, "l.%s.%s.%u", tp->stream, t->group, partition);
    kvEntry *e = NULL;
    kvStore *kv = NULL;   /* no bucket: no owner (a read creates none) */
    if (kb__nats_lease_bucket(t, false, &kv) == KB_OK && kvStore_Get(&e, kv, key) == NATS_OK) {
        snprintf(out->owner, sizeof out->owner, "%s", kvEntry_ValueString(e));
        kvEntry_Destroy(e);
    }
    return KB_OK;
}
