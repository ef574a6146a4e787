/* The operator's reads and the one removal (keybus.h, "Administration"): a
 * group is the set of durable consumers named <group>_<n>_<rev> (partition
 * n) and <group>_w_<rev> (every partition) on the topic's stream, its
 * leases the keys l.<stream>.<group>.<n> of the lease bucket. Listings are
 * the stream and consumer lists; a peek reads messages with direct gets by
 * subject from the group's ack floor (no consumer is made, nothing acked),
 * leaving out what its consumers' progress records say was handled above
 * the floor (the next owner settles those without a handler);
 * a group is removed by deleting its consumers, refused while a lease key
 * of the group lives. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_admin.h"
#include "nats_frame.h"
#include "nats_hdr.h"
#include "nats_lease.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_progress.h"
#include "nats_topic.h"

#define KEY_CAP 65536   /* a key read off a message: the largest limits.max_key_bytes */

static bool digits(const char *s)
{
    return *s != '\0' && s[strspn(s, "0123456789")] == '\0';
}

/* The group of a consumer name <group>_<n>_<rev> or <group>_w_<rev>: its
 * length, and *part (n, or -1 for a wide one); 0 for another name. */
static size_t group_of_consumer(const char *name, long *part)
{
    const char *rev = strrchr(name, '_');
    if (rev == NULL || rev == name || !digits(rev + 1))
        return 0;
    const char *p = rev - 1;
    while (p > name && *p != '_')
        p--;
    if (p == name || *p != '_')
        return 0;
    size_t len = (size_t)(rev - p - 1);
    if (len == 1 && p[1] == 'w')
        *part = -1;
    else if (len > 0 && len < 10 && strspn(p + 1, "0123456789") == len)
        *part = strtol(p + 1, NULL, 10);
    else
        return 0;
    return (size_t)(p - name);
}

static int consumers_of(kb_transport *t, kb_nats_topic *tp, jsConsumerInfoList **list)
{
    *list = NULL;
    int rc = kb__nats_topic_exists(t, tp);
    if (rc != KB_OK)
        return rc;
    jsErrCode jerr = 0;
    natsStatus s = js_Consumers(list, t->js, tp->stream, NULL, &jerr);
    if (s != NATS_OK && s != NATS_NOT_FOUND)
        return kb__nats_errf("consumers", s, jerr);
    return KB_OK;
}

/* Is consumer `ci` one of `group`'s? *part: its partition, -1 when wide. */
static bool of_group(const jsConsumerInfo *ci, const char *group, long *part)
{
    size_t len = group_of_consumer(ci->Name, part);
    return len > 0 && len == strlen(group) && strncmp(ci->Name, group, len) == 0;
}

/* The holder of the group's lease on partition n into buf ("" when none);
 * kv NULL: no bucket, no leases. */
static void lease_holder(kvStore *kv, kb_nats_topic *tp, const char *group, uint32_t n,
                         char *buf, size_t len)
{
    char key[3 * KB_NATS_NAME];
    snprintf(key, sizeof key, "l.%s.%s.%u", tp->stream, group, n);
    kvEntry *e = NULL;
    buf[0] = '\0';
    if (kv != NULL && kvStore_Get(&e, kv, key) == NATS_OK) {
        snprintf(buf, len, "%s", kvEntry_ValueString(e));
        kvEntry_Destroy(e);
    }
}

static kvStore *lease_bucket(kb_transport *t)
{
    kvStore *kv = NULL;   /* no bucket: no leases (a read creates none) */
    return kb__nats_lease_bucket(t, false, &kv) == KB_OK ? kv : NULL;
}

/* ---- groups ---- */

static int group_info(kb_transport *t, kb_nats_topic *tp, const jsConsumerInfoList *list,
                      kvStore *kv, const char *name, kb_group_info *out)
{
    if ((out->name = strdup(name)) == NULL)
        return KB_ENOMEM;
    bool *covered = calloc(t->partitions, sizeof *covered);
    if (covered == NULL)
        return KB_ENOMEM;
    for (int i = 0; i < list->Count; i++) {
        const jsConsumerInfo *ci = list->List[i];
        long part;
        if (!of_group(ci, name, &part))
            continue;
        out->pending += (uint64_t)ci->NumAckPending;
        out->lag += ci->NumPending;
        for (uint32_t n = 0; n < t->partitions; n++)
            covered[n] |= part < 0 || part == (long)n;
    }
    kb_names holders = {0};
    int rc = KB_OK;
    for (uint32_t n = 0; rc == KB_OK && n < t->partitions; n++) {
        out->partitions += covered[n];
        char holder[256];
        lease_holder(kv, tp, name, n, holder, sizeof holder);
        if (holder[0] != '\0') {
            out->leases++;
            rc = kb_names_add(&holders, holder, strlen(holder));
        }
    }
    free(covered);
    out->consumers = holders.v;
    out->n_consumers = holders.n;
    return rc;
}

int kb__nats_groups(kb_transport *t, kb_nats_topic *tp, kb_group_info **out, size_t *n)
{
    jsConsumerInfoList *list;
    int rc = consumers_of(t, tp, &list);
    kb_names groups = {0};
    for (int i = 0; rc == KB_OK && list != NULL && i < list->Count; i++) {
        long part;
        size_t len = group_of_consumer(list->List[i]->Name, &part);
        if (len > 0)
            rc = kb_names_add(&groups, list->List[i]->Name, len);
    }
    if (rc == KB_OK && groups.n > 0 && (*out = calloc(groups.n, sizeof **out)) == NULL)
        rc = KB_ENOMEM;
    kvStore *kv = rc == KB_OK && groups.n > 0 ? lease_bucket(t) : NULL;
    for (size_t g = 0; rc == KB_OK && g < groups.n; g++) {
        (*n)++;
        rc = group_info(t, tp, list, kv, groups.v[g], &(*out)[g]);
    }
    if (rc == KB_ENOMEM)
        kb_errf(NULL, 0, "nats: out of memory for the groups of %s", tp->name);
    kb_names_free(&groups);
    jsConsumerInfoList_Destroy(list);
    return rc;
}

/* ---- group-delete ---- */

int kb__nats_group_delete(kb_transport *t, kb_nats_topic *tp, const char *group, unsigned flags)
{
    jsConsumerInfoList *list;
    int rc = consumers_of(t, tp, &list);
    if (rc != KB_OK)
        return rc;
    uint32_t found = 0;
    for (int i = 0; list != NULL && i < list->Count; i++) {
        long part;
        found += of_group(list->List[i], group, &part);
    }
    if (found == 0) {
        jsConsumerInfoList_Destroy(list);
        kb_errf(NULL, 0, "group %s does not exist on topic %s", group, tp->name);
        return KB_ENOTFOUND;
    }
    kvStore *kv = !(flags & KB_GROUP_DELETE_F_FORCE) ? lease_bucket(t) : NULL;
    for (uint32_t n = 0; kv != NULL && n < t->partitions; n++) {
        char holder[256];
        lease_holder(kv, tp, group, n, holder, sizeof holder);
        if (holder[0] != '\0') {
            kb_errf(NULL, 0, "group %s of topic %s: partition %u is leased by its consumer "
                             "%s, a live member; stop it first (or force)",
                    group, tp->name, n, holder);
            jsConsumerInfoList_Destroy(list);
            return KB_EINVAL;
        }
    }
    for (int i = 0; rc == KB_OK && i < list->Count; i++) {
        long part;
        if (!of_group(list->List[i], group, &part))
            continue;
        jsErrCode jerr = 0;
        natsStatus s = js_DeleteConsumer(t->js, tp->stream, list->List[i]->Name, NULL, &jerr);
        if (s != NATS_OK && s != NATS_NOT_FOUND)
            rc = kb__nats_errf(list->List[i]->Name, s, jerr);
    }
    if (rc == KB_OK)
        kb_log(t->bus, KB_LOG_NOTICE, "nats: group %s of topic %s deleted (%u consumers)", group,
               tp->name, found);
    jsConsumerInfoList_Destroy(list);
    return rc;
}

/* ---- topics ---- */

/* The topic a keybus stream carries (its subjects kb.<topic>.*), or NULL. */
static const char *topic_of_stream(const jsStreamInfo *si, size_t *len)
{
    const jsStreamConfig *c = si->Config;
    for (int i = 0; c != NULL && i < c->SubjectsLen; i++) {
        const char *s = c->Subjects[i];
        size_t l = strlen(s);
        if (strncmp(s, "kb.", 3) == 0 && l > 5 && strcmp(s + l - 2, ".*") == 0) {
            *len = l - 5;
            return s + 3;
        }
    }
    return NULL;
}

/* Messages of the partitions of one topic's stream, its groups. */
static int topic_info(kb_transport *t, const jsStreamInfo *si, kb_topic_info *out)
{
    out->partitions = kb__nats_stated_partitions(si->Config->Description);
    char filter[KB_NATS_NAME], dlq[KB_NATS_NAME];
    snprintf(filter, sizeof filter, "kb.%s.*", out->name);
    snprintf(dlq, sizeof dlq, "kb.%s.dlq", out->name);
    jsOptions o;
    jsOptions_Init(&o);
    o.Stream.Info.SubjectsFilter = filter;
    jsStreamInfo *full = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&full, t->js, si->Config->Name, &o, &jerr);
    if (s != NATS_OK)
        return kb__nats_errf(si->Config->Name, s, jerr);
    for (int i = 0; full->State.Subjects != NULL && i < full->State.Subjects->Count; i++)
        if (strcmp(full->State.Subjects->List[i].Subject, dlq) != 0)
            out->length += full->State.Subjects->List[i].Msgs;
    jsStreamInfo_Destroy(full);
    jsConsumerNamesList *cn = NULL;
    s = js_ConsumerNames(&cn, t->js, si->Config->Name, NULL, &jerr);
    if (s != NATS_OK && s != NATS_NOT_FOUND)
        return kb__nats_errf("consumer names", s, jerr);
    kb_names groups = {0};
    int rc = KB_OK;
    for (int i = 0; rc == KB_OK && cn != NULL && i < cn->Count; i++) {
        long part;
        size_t len = group_of_consumer(cn->List[i], &part);
        if (len > 0)
            rc = kb_names_add(&groups, cn->List[i], len);
    }
    jsConsumerNamesList_Destroy(cn);
    out->groups = groups.v;
    out->n_groups = groups.n;
    return rc;
}

int kb__nats_topics(kb_transport *t, kb_topic_info **out, size_t *n)
{
    jsStreamInfoList *list = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Streams(&list, t->js, NULL, &jerr);
    if (s == NATS_NOT_FOUND)
        return KB_OK;
    if (s != NATS_OK)
        return kb__nats_errf("streams", s, jerr);
    int rc = list->Count > 0 && (*out = calloc((size_t)list->Count, sizeof **out)) == NULL
                 ? KB_ENOMEM : KB_OK;
    for (int i = 0; rc == KB_OK && i < list->Count; i++) {
        size_t len;
        const char *topic = topic_of_stream(list->List[i], &len);
        char name[KB_NATS_NAME], stream[KB_NATS_NAME];
        if (topic == NULL || len >= sizeof name)
            continue;
        memcpy(name, topic, len);
        name[len] = '\0';
        kb__nats_stream_name(stream, sizeof stream, name);
        if (kb_topic_name_check(name, NULL, 0) != KB_OK ||
            strcmp(stream, list->List[i]->Config->Name) != 0)
            continue;   /* not a stream keybus made */
        if (((*out)[*n].name = strdup(name)) == NULL) {
            rc = KB_ENOMEM;
            break;
        }
        rc = topic_info(t, list->List[i], &(*out)[(*n)++]);
    }
    if (rc == KB_ENOMEM)
        kb_errf(NULL, 0, "nats: out of memory for the topics");
    jsStreamInfoList_Destroy(list);
    return rc;
}

/* ---- peek ---- */

/* A message the group would be handed, and whether it holds it pending. */
typedef struct peeked {
    natsMsg *m;
    uint64_t seq;
    uint32_t part;
    bool pending;
} peeked;

static int by_seq(const void *a, const void *b)
{
    const peeked *x = a, *y = b;
    if (x->pending != y->pending)
        return x->pending ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Where the group stands on partition n: everything up to *floor acked,
 * up to *delivered handed out (both 0 without a consumer there). */
static void standing(const jsConsumerInfoList *list, const char *group, uint32_t n,
                     uint64_t *floor, uint64_t *delivered)
{
    *floor = *delivered = 0;
    for (int i = 0; list != NULL && i < list->Count; i++) {
        const jsConsumerInfo *ci = list->List[i];
        long part;
        if (!of_group(ci, group, &part) || (part >= 0 && part != (long)n))
            continue;
        uint64_t f = kb__nats_floor_of(ci);
        if (f > *floor)
            *floor = f;
        if (ci->Delivered.Stream > *delivered)
            *delivered = ci->Delivered.Stream;
    }
}

/* Read partition n's messages after `from`, up to `max` events, into v. */
static int read_partition(kb_transport *t, kb_nats_topic *tp, uint32_t n, uint64_t from,
                          uint64_t delivered, size_t max, peeked **v, size_t *nv, size_t *cap)
{
    char subject[KB_NATS_NAME];
    snprintf(subject, sizeof subject, "kb.%s.%u", tp->name, n);
    for (size_t events = 0; events < max;) {
        jsDirectGetMsgOptions o;
        jsDirectGetMsgOptions_Init(&o);
        o.Sequence = from + 1;
        o.NextBySubject = subject;
        natsMsg *m = NULL;
        natsStatus s = js_DirectGetMsg(&m, t->js, tp->stream, NULL, &o);
        if (s == NATS_NOT_FOUND)
            return KB_OK;
        if (s != NATS_OK)
            return kb__nats_errf("peeking", s, 0);
        const char *seq = NULL;
        if (natsMsgHeader_Get(m, "Nats-Sequence", &seq) != NATS_OK || seq == NULL ||
            !kb__nats_seq_parse(seq, &from)) {
            natsMsg_Destroy(m);
            kb_errf(NULL, 0, "nats: a direct get of %s without its sequence", subject);
            return KB_ETRANSPORT;
        }
        if (kb_vec_reserve((void **)v, cap, *nv + 1, sizeof **v) != KB_OK) {
            natsMsg_Destroy(m);
            return KB_ENOMEM;
        }
        (*v)[(*nv)++] = (peeked){m, from, n, from <= delivered};
        events += kb__nats_events_in(m);
    }
    return KB_OK;
}

/* "Every event of the key hashed `hash` on partition `part` up to message
 * sseq, event idx, is handled": a line of a progress record. */
typedef struct done_marks {
    kb_nats_progress_line *v;
    size_t n, cap;
} done_marks;

/* The progress records of the group's consumers, each line held to what
 * the server delivered to its consumer (as the next owner takes them in). */
static int read_marks(kb_transport *t, kb_nats_topic *tp, const jsConsumerInfoList *list,
                      const char *group, done_marks *out)
{
    char bucket[sizeof t->bucket + 8];
    snprintf(bucket, sizeof bucket, "%s_runs", t->bucket);
    kvStore *kv = NULL;
    if (js_KeyValue(&kv, t->js, bucket) != NATS_OK)
        return KB_OK;   /* no bucket: no records (nothing is created) */
    int rc = KB_OK;
    for (int i = 0; rc == KB_OK && list != NULL && i < list->Count; i++) {
        const jsConsumerInfo *ci = list->List[i];
        long part;
        char key[3 * KB_NATS_NAME];
        kvEntry *e = NULL;
        if (!of_group(ci, group, &part))
            continue;
        kb__nats_progress_record_key(tp->stream, ci->Name, key, sizeof key);
        if (kvStore_Get(&e, kv, key) != NATS_OK)
            continue;
        const char *v = kvEntry_ValueString(e);
        for (const char *l = v != NULL ? v : ""; rc == KB_OK && *l != '\0';) {
            const char *nl = strchr(l, '\n');
            size_t len = nl != NULL ? (size_t)(nl - l) : strlen(l);
            kb_nats_progress_line pl;
            if (kb__nats_progress_parse(l, len, t->partitions, ci->Delivered.Stream, &pl) == NULL) {
                if (kb_vec_reserve((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) != KB_OK)
                    rc = KB_ENOMEM;
                else
                    out->v[out->n++] = pl;
            }
            l += len + (nl != NULL);
        }
        kvEntry_Destroy(e);
    }
    kvStore_Destroy(kv);
    return rc;
}

/* Did a record vouch for event idx (0: a plain message) of message sseq? */
static bool marked(const done_marks *d, uint32_t part, const void *key, size_t len, uint64_t sseq,
                   uint64_t idx)
{
    uint64_t h = d->n > 0 ? kb__nats_progress_key_hash(key, len) : 0;
    for (size_t i = 0; i < d->n; i++) {
        const kb_nats_progress_line *m = &d->v[i];
        if (m->hash == h && m->part == part &&
            (sseq < m->sseq || (sseq == m->sseq && idx <= m->idx)))
            return true;
    }
    return false;
}

/* Hand the events of message p to fn, up to *left; false when fn asked to
 * stop. An event keybus would dead-letter (malformed) is left out, and so
 * is one a progress record says was handled. */
static bool hand_out(kb_transport *t, kb_nats_topic *tp, const peeked *p, const done_marks *d,
                     char *key, kb_nats_hdrs *hdrs, size_t *left, kb_peek_fn fn, void *opaque)
{
    const char *count = NULL, *why = NULL;
    bool framed = natsMsgHeader_Get(p->m, KB_NATS_BATCH_HDR, &count) == NATS_OK && count != NULL;
    kb_nats_frame frame = {NULL, NULL, 1, 1};
    kb_frame_event one = {NULL, NULL, 0, 0, NULL, 0};
    if (framed) {
        if (kb__nats_frame_open(p->m, count, &frame, &why) != 0)
            return true;
    } else {
        int klen = kb__nats_get_key(p->m, key, KEY_CAP, &why);
        if (klen < 0 || kb__nats_hdr_get(t, p->m, hdrs, &why) != 0)
            return true;
        one = (kb_frame_event){key, natsMsg_GetData(p->m), (size_t)klen,
                               (size_t)natsMsg_GetDataLength(p->m), NULL, 0};
    }
    char id[48];
    size_t base = kb__nats_put_u64(id, p->seq);
    for (uint32_t i = 1, events = frame.left; i <= events && *left > 0; i++) {
        kb_frame_event ev = one;
        if (framed) {
            kb__nats_frame_next(&frame, &ev);
            id[base] = '.';
            kb__nats_put_u64(id + base + 1, i);
            if (kb__nats_hdr_frame(t, &ev, hdrs, &why) != 0)
                continue;
        }
        if (marked(d, p->part, ev.key, ev.key_len, p->seq, framed ? i : 0))
            continue;
        kb_event e = {.topic = tp->name, .key = ev.key, .key_len = ev.key_len,
                      .payload = ev.payload, .payload_len = ev.payload_len, .attempt = 1,
                      .id = id, .headers = hdrs->h, .n_headers = hdrs->n};
        (*left)--;
        if (fn(&e, opaque) != 0)
            return false;
    }
    return true;
}

int kb__nats_peek(kb_transport *t, kb_nats_topic *tp, const char *group, size_t max,
                  kb_peek_fn fn, void *opaque)
{
    jsConsumerInfoList *list;
    int rc = consumers_of(t, tp, &list);
    if (rc != KB_OK)
        return rc;
    bool exists = false;
    for (int i = 0; list != NULL && i < list->Count && !exists; i++) {
        long part;
        exists = of_group(list->List[i], group, &part);
    }
    peeked *v = NULL;
    size_t nv = 0, cap = 0;
    /* a new group starting at the latest has nothing yet */
    for (uint32_t n = 0; rc == KB_OK && n < t->partitions && (exists || !t->start_latest); n++) {
        uint64_t floor = 0, delivered = 0;
        standing(list, group, n, &floor, &delivered);
        rc = read_partition(t, tp, n, floor, delivered, max, &v, &nv, &cap);
    }
    done_marks d = {0};
    if (rc == KB_OK && exists)
        rc = read_marks(t, tp, list, group, &d);
    jsConsumerInfoList_Destroy(list);
    char *key = rc == KB_OK ? malloc(KEY_CAP) : NULL;
    kb_nats_hdrs hdrs;
    memset(&hdrs, 0, sizeof hdrs);
    if (rc == KB_OK && key == NULL)
        rc = KB_ENOMEM;
    if (rc == KB_OK && nv > 1)
        qsort(v, nv, sizeof *v, by_seq);
    size_t left = max;
    for (size_t i = 0; rc == KB_OK && i < nv && left > 0; i++)
        if (!hand_out(t, tp, &v[i], &d, key, &hdrs, &left, fn, opaque))
            break;
    if (rc == KB_ENOMEM)
        kb_errf(NULL, 0, "nats: out of memory for a peek");
    kb__nats_hdrs_free(&hdrs);
    free(d.v);
    free(key);
    for (size_t i = 0; i < nv; i++)
        natsMsg_Destroy(v[i].m);
    free(v);
    return rc;
}
