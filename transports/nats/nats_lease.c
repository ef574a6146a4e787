/* Partition ownership among processes: members heartbeat a key per topic in
 * a JetStream KV bucket whose TTL is the lease TTL; each partition goes to the
 * member that ranks first by rendezvous hashing. A lease is a KV key created
 * and renewed by puts on its last revision, so a process that lost it learns
 * so on its next renewal (fencing). Every
 * acquisition gets its own consumer, started at the previous consumer's ack
 * floor: redelivered events come first, in stream order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"
#include "nats_lease.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_probe.h"
#include "nats_progress.h"

/* The bucket's TTL is what ends a lease: nats.lease_ttl_ms is applied to an
 * existing bucket (the MaxAge of its stream KV_<bucket>, with a duplicate
 * window no longer than that, as the server requires). */
static int apply_ttl(kb_transport *t, int64_t had_ms)
{
    char stream[96];
    snprintf(stream, sizeof stream, "KV_%s", t->bucket);
    jsStreamInfo *si = NULL, *upd = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, t->js, stream, NULL, &jerr);
    if (s == NATS_OK) {
        jsStreamConfig cfg = *si->Config;
        cfg.MaxAge = t->lease_ttl_ms * 1000000;   /* nanoseconds */
        if (cfg.Duplicates > cfg.MaxAge)
            cfg.Duplicates = cfg.MaxAge;
        s = js_UpdateStream(&upd, t->js, &cfg, NULL, &jerr);
    }
    jsStreamInfo_Destroy(upd);
    jsStreamInfo_Destroy(si);
    if (s != NATS_OK) {
        kb_errf(NULL, 0, "nats %s: lease bucket %s has a TTL of %lld ms, nats.lease_ttl_ms is "
                 "%lld ms, and the server refused to change it: %s (jetstream error %d)",
                 t->url_safe, t->bucket, (long long)had_ms, (long long)t->lease_ttl_ms,
                 kb__nats_reason(s), (int)jerr);
        return s == NATS_NO_MEMORY ? KB_ENOMEM : KB_ETRANSPORT;
    }
    kb_log(t->bus, KB_LOG_NOTICE, "nats %s: lease bucket %s: TTL %lld ms -> %lld ms "
           "(nats.lease_ttl_ms)", t->url_safe, t->bucket, (long long)had_ms,
           (long long)t->lease_ttl_ms);
    return KB_OK;
}

int kb__nats_lease_bucket(kb_transport *t, bool leases, kvStore **out)
{
    pthread_mutex_lock(&t->kv_lock);
    int rc = KB_OK;
    natsStatus s = NATS_OK;
    if (t->kv == NULL && leases) {
        kvConfig kc;
        kvConfig_Init(&kc);
        kc.Bucket = t->bucket;
        kc.History = 1;
        kc.TTL = t->lease_ttl_ms * 1000000;   /* nanoseconds */
        kc.Replicas = t->replicas;
        kc.StorageType = js_FileStorage;   /* leases survive a server restart */
        if (js_CreateKeyValue(&t->kv, t->js, &kc) != NATS_OK)
            s = js_KeyValue(&t->kv, t->js, t->bucket);   /* it exists, maybe with another TTL */
    } else if (t->kv == NULL) {
        s = js_KeyValue(&t->kv, t->js, t->bucket);
    }
    if (s != NATS_OK) {
        kb_errf(NULL, 0, "nats %s: lease bucket %s: %s", t->url_safe, t->bucket,
                 kb__nats_reason(s));
        rc = s == NATS_NOT_FOUND ? KB_ENOTFOUND : s == NATS_NO_MEMORY ? KB_ENOMEM : KB_ETRANSPORT;
    }
    kvStatus *st = NULL;
    if (rc == KB_OK && leases && !t->kv_ttl_set) {
        s = kvStore_Status(&st, t->kv);
        if (s != NATS_OK) {
            rc = kb__nats_errf("lease bucket status", s, 0);
            rc = rc == KB_ENOMEM ? rc : KB_ETRANSPORT;
        } else if (kvStatus_Replicas(st) != t->replicas) {
            kb_errf(NULL, 0, "nats %s: lease bucket %s has replicas=%lld but this process is "
                     "configured with nats.replicas=%d; the bucket is not changed",
                     t->url_safe, t->bucket, (long long)kvStatus_Replicas(st), t->replicas);
            rc = KB_EINVAL;
        } else if (kvStatus_TTL(st) != t->lease_ttl_ms * 1000000) {
            rc = apply_ttl(t, kvStatus_TTL(st) / 1000000);
        }
        kvStatus_Destroy(st);
        t->kv_ttl_set = rc == KB_OK;
    }
    if (out != NULL)
        *out = rc == KB_OK ? t->kv : NULL;
    pthread_mutex_unlock(&t->kv_lock);
    return rc;
}

void kb__nats_lease_kick(kb_transport *t)
{
    atomic_store(&t->lease_kick, 1);
    kb_signal_notify(t->lease_wake);
}

static void member_prefix(kb_transport *t, kb_nats_topic *tp, char *buf, size_t len)
{
    snprintf(buf, len, "m.%s.%s.", tp->stream, t->group);
}

/* KV keys allow [-/_=.a-zA-Z0-9]: anything else in the consumer name becomes '_'. */
static void member_key(kb_transport *t, kb_nats_topic *tp, char *buf, size_t len)
{
    member_prefix(t, tp, buf, len);
    size_t o = strlen(buf);
    for (const char *p = t->id; *p && o + 1 < len; p++) {
        char ch = *p;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '-' || ch == '_' || ch == '=';
        buf[o++] = ok ? ch : '_';
    }
    buf[o] = '\0';
}

/* How long the lease thread waits for one answer of the server (a round's
 * KV puts, a lookup, a consumer's info): a sixth of the TTL, at most nats.c's
 * own 5 s. An unanswered round is retried soon after (ROUND_RETRY), so
 * several tries fit in a lease's life, and one node's loss (its KV or
 * consumer leaders' elections) does not let the leases run out locally
 * while the thread waits. */
static int round_wait_ms(const kb_transport *t)
{
    int64_t ms = t->lease_ttl_ms / 6;
    return ms > 5000 ? 5000 : (int)ms;
}

/* The same for a consumer's creation, listing or deletion, which need the
 * meta leader: a third of the TTL, at least 2 s (a consumer is created in
 * well under a second, even under ThreadSanitizer), at most 5 s. A node's
 * loss leaves the meta group or a consumer without a leader for seconds;
 * waiting 5 s per partition kept a round from renewing its leases. */
static void call_opts(const kb_transport *t, jsOptions *o)
{
    int64_t ms = t->lease_ttl_ms / 3;
    jsOptions_Init(o);
    o->Wait = ms < 2000 ? 2000 : ms > 5000 ? 5000 : ms;
}

/* Every member key of the bucket ("m.>"), listed once per lease round for
 * all topics: a listing per topic cost rounds of seconds with hundreds of
 * topics and let leases run out. */
typedef struct roster {
    char **keys;
    int n;
    bool ok;
} roster;

static void roster_load(kb_transport *t, roster *r)
{
    memset(r, 0, sizeof *r);
    kvWatchOptions o;
    kvWatchOptions_Init(&o);
    o.IgnoreDeletes = true;
    o.MetaOnly = true;
    kvWatcher *w = NULL;
    if (kvStore_Watch(&w, t->kv, "m.>", &o) != NATS_OK)
        return;
    size_t cap = 0;
    for (;;) {
        kvEntry *e = NULL;
        if (kvWatcher_Next(&e, w, round_wait_ms(t)) != NATS_OK)
            break;
        if (e == NULL) {   /* every current key seen */
            r->ok = true;
            break;
        }
        void *keys = r->keys;
        if (kb_vec_reserve(&keys, &cap, (size_t)r->n + 1, sizeof *r->keys) != KB_OK) {
            kvEntry_Destroy(e);
            break;
        }
        r->keys = keys;
        if ((r->keys[r->n] = strdup(kvEntry_Key(e))) != NULL)
            r->n++;
        kvEntry_Destroy(e);
    }
    kvWatcher_Destroy(w);
}

static void roster_free(roster *r)
{
    for (int i = 0; i < r->n; i++)
        free(r->keys[i]);
    free(r->keys);
}

typedef struct members {
    const char **ids;   /* into the roster */
    int n;
    char mine[KB_NATS_NAME];
    char key[2 * KB_NATS_NAME];   /* this process's member key */
} members;

/* The topic's members: the roster's keys under its prefix, this process
 * always among them. */
static void members_load(kb_transport *t, kb_nats_topic *tp, const roster *r, members *ms)
{
    char pre[2 * KB_NATS_NAME];
    member_prefix(t, tp, pre, sizeof pre);
    member_key(t, tp, ms->key, sizeof ms->key);
    size_t pl = strlen(pre);
    snprintf(ms->mine, sizeof ms->mine, "%s", ms->key + pl);
    ms->n = 0;
    ms->ids = r->ok ? calloc((size_t)r->n + 1, sizeof *ms->ids) : NULL;
    if (ms->ids == NULL)
        return;   /* unknown: keep what we have */
    bool me = false;
    for (int i = 0; i < r->n; i++)
        if (strncmp(r->keys[i], pre, pl) == 0) {
            ms->ids[ms->n++] = r->keys[i] + pl;
            me = me || strcmp(r->keys[i] + pl, ms->mine) == 0;
        }
    if (!me)
        ms->ids[ms->n++] = ms->mine;
}

static void members_free(members *ms)
{
    free(ms->ids);
}

/* Rendezvous ranking (the SDK's, shared with redis://): the live member
 * ranked first takes the partition. The topic's hash is mixed into the
 * partition number so that topics do not all go to the same member. When the
 * member list is unknown (KV trouble), keep what we have. */
static bool wanted(const members *ms, const kb_nats_part *p, bool have)
{
    if (ms->n == 0)
        return have;
    uint32_t spread = (uint32_t)kb_mix64((uint64_t)p->topic->hash << 32 | p->n);
    long best = kb_rendezvous_owner(ms->ids, (size_t)ms->n, spread);
    return best >= 0 && strcmp(ms->ids[best], ms->mine) == 0;
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

static void marks_inherit(kb_nats_claim *c, const jsConsumerInfo *ci, uint64_t floor)
{
    const char *d = ci->Config != NULL ? ci->Config->Description : NULL;
    if (d != NULL && strncmp(d, "kb-seen", 7) == 0)
        for (char *p = (char *)d + 7, *end; *p; p = end) {
            uint64_t m = strtoull(p, &end, 10);
            if (end == p)
                break;
            marks_add(c, m, floor);
        }
    marks_add(c, ci->Delivered.Stream, floor);
}

static void marks_describe(const kb_nats_claim *c, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "kb-seen");
    for (uint32_t i = 0; i < c->nmarks && o + 22 < len; i++) {
        buf[o++] = ' ';
        o += kb__nats_put_u64(buf + o, c->marks[i]);
    }
}

/* One lease round's acquisitions: they stop at `until`, or once the server
 * left a request unanswered (stalled: the next round comes soon). */
typedef struct lease_round {
    int64_t until;
    bool stalled;
} lease_round;

/* A topic's consumers as one round lists them, and what the round learned
 * from probing one of them: a probe takes what it pulls, so the same
 * consumer probed again for the next partition would answer short (its
 * listed counts are stale), and skip nothing. */
typedef struct listing {
    lease_round *rd;               /* the round it is part of */
    jsConsumerInfoList *list;
    bool listed;
    const jsConsumerInfo *probed;  /* NULL: none yet */
    bool probe_ok;
    uint64_t *pending;             /* its pending set (kb__nats_probe_pending) */
    uint32_t npending;
} listing;

static void listing_free(listing *l)
{
    free(l->pending);
    jsConsumerInfoList_Destroy(l->list);
}

/* The consumers of the topic's stream, listed once per round for all its
 * partitions; false when the listing failed. */
static bool consumers_list(kb_transport *t, kb_nats_topic *tp, listing *l)
{
    if (l->listed)
        return true;
    jsErrCode jerr = 0;
    jsOptions o;
    call_opts(t, &o);
    natsStatus s = js_Consumers(&l->list, t->js, tp->stream, &o, &jerr);
    if (s != NATS_OK && s != NATS_NOT_FOUND) {
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: listing consumers of %s: %s", t->url_safe, tp->stream,
               natsStatus_GetText(s));
        l->rd->stalled = true;
        return false;
    }
    l->listed = true;
    return true;
}

/* Does the consumer's ack floor and delivery history carry over to a claim
 * of partition n (n < 0: a wide claim, every partition)? */
static bool covers(kb_transport *t, const char *consumer, long n)
{
    return kb__nats_consumer_wide(t, consumer) ||
           (n >= 0 && kb__nats_consumer_part(t, consumer) == n);
}

/* A claim starts at the highest floor of the earlier consumers, but an
 * AckExplicit one (a wide consumer made by keybus before its wide consumers
 * were AckAll) may have acked much above its floor: a held event of one
 * partition keeps the topic's floor while the others go on. Its pending set, learned from the server, tells the new claim which
 * messages above the floor were handled there: they are acked without a
 * handler. The earlier consumer with the most delivered is asked; when it
 * cannot tell, everything above the floor comes again (duplicates, never
 * gaps). */
static void skip_acked(kb_transport *t, kb_nats_claim *c, listing *l, long n, uint64_t floor)
{
    const jsConsumerInfoList *list = l->list;
    const jsConsumerInfo *best = NULL;
    for (int i = 0; list != NULL && i < list->Count; i++) {
        const jsConsumerInfo *ci = list->List[i];
        if (!covers(t, ci->Name, n) || ci->Config == NULL ||
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
    if (l->probed != best) {   /* once per listing: see `listing` */
        free(l->pending);
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

/* A fresh consumer for claim c, starting after the highest floor of the
 * earlier consumers in `list` that cover its partitions; false (c fenced)
 * when the server refused it. */
static bool open_consumer(kb_transport *t, kb_nats_claim *c, listing *l)
{
    const jsConsumerInfoList *list = l->list;
    kb_nats_topic *tp = c->part->topic;
    long n = c->wide ? -1 : (long)c->part->n;
    uint64_t floor = 0;
    bool new_group = true;   /* no earlier consumer of the group covers the partition */
    for (int i = 0; list != NULL && i < list->Count; i++) {
        if (!covers(t, list->List[i]->Name, n))
            continue;
        new_group = false;
        if (kb__nats_floor_of(list->List[i]) > floor)
            floor = kb__nats_floor_of(list->List[i]);
    }
    for (int i = 0; list != NULL && i < list->Count; i++)
        if (covers(t, list->List[i]->Name, n)) {
            marks_inherit(c, list->List[i], floor);
            kb__nats_progress_inherit(t, c, list->List[i]->Name);
        }
    skip_acked(t, c, l, n, floor);
    char desc[32 + 22 * KB_NATS_MARKS], filter[KB_NATS_NAME];
    marks_describe(c, desc, sizeof desc);
    snprintf(filter, sizeof filter, "kb.%s.*", tp->name);   /* the stream's, dead letters too */
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = c->consumer;
    cc.Description = desc;
    /* one ack covers the finished prefix (AckExplicit wide consumers of
     * earlier versions are still read by skip_acked) */
    cc.AckPolicy = js_AckAll;
    cc.AckWait = t->ack_wait_ms * 1000000;
    cc.MaxAckPending = t->max_ack_pending * (c->wide ? t->partitions : 1);
    cc.MaxDeliver = -1;         /* retries are the bus's; the server never gives up */
    cc.FilterSubject = c->wide ? filter : c->part->subject;
    cc.DeliverPolicy = floor > 0                        ? js_DeliverByStartSequence
                       : new_group && t->start_latest ? js_DeliverNew
                                                      : js_DeliverAll;
    cc.OptStartSeq = floor > 0 ? floor + 1 : 0;
    c->delivered_hi = floor;   /* a wide claim's first gap starts here (nats_consume.c) */
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    jsOptions o;
    call_opts(t, &o);
    natsStatus s = js_AddConsumer(&ci, t->js, tp->stream, &cc, &o, &jerr);
    jsConsumerInfo_Destroy(ci);
    if (s != NATS_OK) {
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: consumer %s: %s (error %d)", t->url_safe, c->consumer,
               natsStatus_GetText(s), (int)jerr);
        atomic_store(&c->fenced, 1);
        atomic_store(&c->feeder_left, 1);
        l->rd->stalled = l->rd->stalled || s == NATS_TIMEOUT;
        return false;
    }
    return true;
}

/* An earlier consumer whose floor and progress a newer one carries on. */
static void consumer_delete(kb_transport *t, const char *stream, const char *name)
{
    jsOptions o;
    call_opts(t, &o);
    js_DeleteConsumer(t->js, stream, name, &o, NULL);
    kb__nats_progress_forget(t, stream, name);
}

/* A claim of one partition; the partition's earlier consumers are deleted
 * (wide ones only once every partition has its own: wide_retire). */
static kb_nats_claim *open_claim(kb_transport *t, kb_nats_part *p, uint64_t rev,
                                 listing *l)
{
    const jsConsumerInfoList *list = l->list;
    kb_nats_claim *c = kb__nats_claim_new(t, p, rev, false);
    if (c == NULL || !open_consumer(t, c, l))
        return NULL;
    for (int i = 0; list != NULL && i < list->Count; i++)
        if (kb__nats_consumer_part(t, list->List[i]->Name) == (long)p->n &&
            strcmp(list->List[i]->Name, c->consumer) != 0)
            consumer_delete(t, p->topic->stream, list->List[i]->Name);
    return c;
}

/* KV puts of a lease round (member heartbeats, lease renewals on their
 * revision, lease creates on revision 0), pipelined: they all go out at once and their replies come back
 * on one inbox, so a round costs one wait instead of a round trip per topic
 * and partition (issue 19: 1,000 topics are 8,000 leases). */
typedef struct kv_put {
    char key[2 * KB_NATS_NAME];
    kb_nats_part *p;        /* a lease's put on revision `expect` (0: a create);
                               NULL: a member heartbeat */
    uint64_t expect;
    natsStatus s;           /* NATS_OK, NATS_ERR (refused: wrong revision), or unanswered */
    uint64_t rev;           /* the key's new revision */
} kv_put;

typedef struct kv_puts {
    kv_put *v;
    size_t n, cap;
} kv_puts;

static kv_put *kv_put_add(kv_puts *ps, const char *key, kb_nats_part *p, uint64_t expect)
{
    void *v = ps->v;
    if (kb_vec_reserve(&v, &ps->cap, ps->n + 1, sizeof *ps->v) != KB_OK)
        return NULL;
    ps->v = v;
    kv_put *k = &ps->v[ps->n++];
    snprintf(k->key, sizeof k->key, "%s", key);
    k->p = p;
    k->expect = expect;
    k->s = NATS_TIMEOUT;
    k->rev = 0;
    return k;
}

/* One reply: a JetStream publish ack ({"stream":..,"seq":N}), an error (a
 * wrong revision), or a status without a body (no responders: unanswered). */
static void kv_reply(kv_put *k, natsMsg *m)
{
    const char *d = natsMsg_GetData(m), *seq = d ? strstr(d, "\"seq\":") : NULL;
    if (natsMsg_GetDataLength(m) == 0) {
        k->s = NATS_NO_RESPONDERS;
        return;
    }
    if (strstr(d, "\"error\"") != NULL || seq == NULL) {
        k->s = NATS_ERR;
        return;
    }
    k->rev = strtoull(seq + 6, NULL, 10);
    k->s = NATS_OK;
}

/* The bus's subscription for KV put replies, made at its first round. */
static natsStatus kv_sub(kb_transport *t)
{
    if (t->kv_sub != NULL)
        return NATS_OK;
    natsInbox *inbox = NULL;
    natsStatus s = natsInbox_Create(&inbox);
    if (s != NATS_OK)
        return s;
    char all[160];
    snprintf(t->kv_inbox, sizeof t->kv_inbox, "%s", inbox);
    natsInbox_Destroy(inbox);
    snprintf(all, sizeof all, "%s.*.*", t->kv_inbox);
    s = natsConnection_SubscribeSync(&t->kv_sub, t->nc, all);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(t->kv_sub, -1, -1);
    return s;
}

static void kv_put_all(kb_transport *t, kv_puts *ps)
{
    char reply[192], subj[3 * KB_NATS_NAME], rev[24], prefix[160];
    natsStatus s = kv_sub(t);
    uint32_t round = ++t->kv_round;   /* replies of earlier rounds are dropped */
    size_t pl = (size_t)snprintf(prefix, sizeof prefix, "%s.%u.", t->kv_inbox, round);
    for (size_t i = 0; s == NATS_OK && i < ps->n; i++) {
        kv_put *k = &ps->v[i];
        natsMsg *m = NULL;
        snprintf(subj, sizeof subj, "$KV.%s.%s", t->bucket, k->key);
        snprintf(reply, sizeof reply, "%s%zu", prefix, i);
        kb__nats_put_u64(rev, k->expect);
        s = natsMsg_Create(&m, subj, reply, t->id, (int)strlen(t->id));
        if (s == NATS_OK && k->p != NULL)
            s = natsMsgHeader_Set(m, "Nats-Expected-Last-Subject-Sequence", rev);
        if (s == NATS_OK)
            s = natsConnection_PublishMsg(t->nc, m);
        natsMsg_Destroy(m);
    }
    int64_t deadline = kb_deadline_ns(round_wait_ms(t));
    for (size_t got = 0; s == NATS_OK && got < ps->n;) {
        natsMsg *m = NULL;
        int left = kb_deadline_left_ms(deadline);
        if (left <= 0 || natsSubscription_NextMsg(&m, t->kv_sub, left) != NATS_OK)
            break;
        const char *subject = natsMsg_GetSubject(m);
        char *end = NULL;
        unsigned long i = strncmp(subject, prefix, pl) == 0 ? strtoul(subject + pl, &end, 10) : 0;
        if (end != NULL && *end == '\0' && i < ps->n && ps->v[i].s == NATS_TIMEOUT) {
            kv_reply(&ps->v[i], m);
            got++;
        }
        natsMsg_Destroy(m);
    }
}

/* One put of the partition's lease key on revision `expect` (0: create),
 * bounded like a round's; the new revision in *rev. */
static natsStatus lease_put(kb_transport *t, kb_nats_part *p, uint64_t expect, uint64_t *rev)
{
    kv_puts one = {NULL, 0, 0};
    natsStatus s = NATS_NO_MEMORY;
    if (kv_put_add(&one, p->lease_key, p, expect) != NULL) {
        kv_put_all(t, &one);
        s = one.v[0].s;
        *rev = one.v[0].rev;
    }
    free(one.v);
    return s;
}

typedef enum { HOLDER_UNKNOWN, HOLDER_NONE, HOLDER_US, HOLDER_OTHER } holder;

/* Who holds the partition's lease key, and its last revision (a delete's
 * or an expiry's marker: none). This process is the only writer of its own
 * name, each put on the revision before: a key still naming it was never
 * another's since. HOLDER_UNKNOWN: no answer. */
static holder lease_holder(kb_transport *t, kb_nats_part *p, uint64_t *rev)
{
    char stream[96], subj[3 * KB_NATS_NAME];
    snprintf(stream, sizeof stream, "KV_%s", t->bucket);
    snprintf(subj, sizeof subj, "$KV.%s.%s", t->bucket, p->lease_key);
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = round_wait_ms(t);
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetLastMsg(&m, t->js, stream, subj, &o, &jerr);
    *rev = 0;
    if (s == NATS_NOT_FOUND)
        return HOLDER_NONE;
    if (s != NATS_OK)
        return HOLDER_UNKNOWN;
    *rev = natsMsg_GetSequence(m);
    const char *op = NULL;
    size_t len = strlen(t->id);
    holder h = natsMsgHeader_Get(m, "KV-Operation", &op) == NATS_OK ? HOLDER_NONE
               : (size_t)natsMsg_GetDataLength(m) == len &&
                       memcmp(natsMsg_GetData(m), t->id, len) == 0
                   ? HOLDER_US
                   : HOLDER_OTHER;
    natsMsg_Destroy(m);
    return h;
}

static void drop(kb_transport *t, kb_nats_part *p)
{
    kb_bus_lease_changed(t->bus, p->subject, p->n, 0);
    kb_nats_claim *c = atomic_load(&p->claim);
    if (c != NULL)
        atomic_store(&c->fenced, 1);
    atomic_store(&p->claim, NULL);
    kb_signal_notify(t->acked);   /* a feeder waiting for room in its ring */
}

/* Take the lease when it is free, or ours from before (a restart of this
 * consumer name, a renewal whose answer was lost), on its last revision. */
static bool acquire(kb_transport *t, kb_nats_part *p, lease_round *rd)
{
    uint64_t last = 0, rev = 0;
    holder h = lease_holder(t, p, &last);
    natsStatus s = h == HOLDER_NONE || h == HOLDER_US ? lease_put(t, p, last, &rev) : NATS_ERR;
    rd->stalled = rd->stalled || h == HOLDER_UNKNOWN || (s != NATS_OK && s != NATS_ERR);
    if (s != NATS_OK)
        return false;   /* taken, or gone meanwhile: next round */
    p->lease_rev = rev;
    p->lease_until_ns = kb_now_ns() + t->lease_ttl_ms * 1000000;
    kb_bus_lease_changed(t->bus, p->subject, p->n, 1);
    return true;
}

/* When the lease of p runs out locally: TTL - TTL/6 after its last take or
 * renewal (renewed() drops it then). */
static int64_t local_expiry(const kb_transport *t, const kb_nats_part *p)
{
    return p->lease_until_ns - t->lease_ttl_ms * 1000000 / 6;
}

/* Claim c stays valid while every lease it covers does: a lease round can
 * block past that, and the feeder and executors must stop on their own. */
static void claim_validity(const kb_transport *t, kb_nats_claim *c)
{
    int64_t until = local_expiry(t, c->part);
    kb_nats_part *parts = c->part->topic->parts;
    for (uint32_t i = 0; c->wide && i < t->partitions; i++) {
        int64_t e = parts[i].lease_rev != 0 ? local_expiry(t, &parts[i]) : 0;
        if (e < until)
            until = e;
    }
    atomic_store(&c->valid_until_ns, until);
}

/* After renewals: every current claim (a wide one once) takes its new
 * expiry. */
static void claims_validity(kb_transport *t)
{
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next)
        for (uint32_t i = 0; atomic_load(&tp->subscribed) && i < t->partitions; i++) {
            kb_nats_claim *c = atomic_load(&tp->parts[i].claim);
            if (c != NULL && c->part == &tp->parts[i])
                claim_validity(t, c);
        }
}

/* The outcome of a lease's renewal (kv_put_all); *unanswered set when the
 * server left it without an answer. A refused renewal is a lost lease, even
 * when the key names this consumer: the name is shared by every bus of the
 * process and by a restarted process beside a hung old one. */
static void renewed(kb_transport *t, kb_nats_part *p, natsStatus s, uint64_t rev, int64_t started,
                    bool *unanswered)
{
    if (s == NATS_OK) {
        p->lease_rev = rev;
        p->lease_until_ns = started + t->lease_ttl_ms * 1000000;
        return;
    }
    /* NATS_ERR: someone else holds it now. Otherwise the server is
     * unreachable and the lease runs out locally. */
    int64_t margin = t->lease_ttl_ms * 1000000 / 6;
    if (s == NATS_ERR || kb_now_ns() > p->lease_until_ns - margin) {
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: lease of %s lost (%s)", t->url_safe, p->subject,
               natsStatus_GetText(s));
        drop(t, p);
        p->lease_rev = 0;
        p->releasing = false;
    } else {
        *unanswered = true;
    }
}

/* Hand a partition over without duplicates: stop feeding, let the handlers
 * finish and the frontier be acked, then delete the lease. The acks wait in
 * the consumer's connection, the delete goes on nc: the PING answered on the
 * former says the server has the acks before the next owner can start. Not
 * answered: the lease stays until a later round, and the round waits on that
 * connection no more (*feed_down). */
static void release_step(kb_transport *t, kb_nats_part *p, bool *feed_down)
{
    if (!kb__nats_claims_done(p) || *feed_down)
        return;
    if (natsConnection_FlushTimeout(kb__nats_feed_conn(t), round_wait_ms(t)) != NATS_OK) {
        *feed_down = true;
        return;
    }
    kvStore_Delete(t->kv, p->lease_key);
    p->lease_rev = 0;
    p->releasing = false;
}

/* Hand over or drop what the partition holds (after its renewal). */
static void part_keep(kb_transport *t, kb_nats_part *p, bool *feed_down)
{
    bool have = p->lease_rev != 0;
    if (have && p->releasing)
        release_step(t, p, feed_down);
    else if (have && !p->wanted) {
        drop(t, p);
        p->releasing = true;
    }
}

/* A consumer is named after its lease revision. When a claim of that
 * revision existed already (one reset while the lease stayed), the lease is
 * renewed first for a new revision: a new consumer must never take over an
 * earlier one's name, and with it its delivery state. */
static bool fresh_revision(kb_transport *t, kb_nats_part *p, kb_nats_claim *earlier, lease_round *rd)
{
    bool used = false;
    for (kb_nats_claim *c = earlier; c != NULL && !used; c = c->next)
        used = c->rev == p->lease_rev;
    if (!used)
        return true;
    uint64_t rev = 0;
    natsStatus s = lease_put(t, p, p->lease_rev, &rev);
    if (s != NATS_OK) {   /* next round: a renewal will tell whether it is still ours */
        rd->stalled = rd->stalled || s != NATS_ERR;
        return false;
    }
    p->lease_rev = rev;
    p->lease_until_ns = kb_now_ns() + t->lease_ttl_ms * 1000000;
    return true;
}

/* Take the lease if wanted, and a claim when the lease has none. */
static void part_take(kb_transport *t, kb_nats_part *p, listing *l)
{
    if (p->releasing || atomic_load(&t->stopping))
        return;
    bool have = p->lease_rev != 0;
    if (!have && p->wanted)
        have = acquire(t, p, l->rd);
    kb_nats_claim *c = atomic_load(&p->claim);
    if (have && (c == NULL || atomic_load(&c->fenced)) &&
        fresh_revision(t, p, atomic_load(&p->claims), l->rd) &&
        consumers_list(t, p->topic, l)) {
        kb_nats_claim *nc = open_claim(t, p, p->lease_rev, l);
        drop(t, p);
        if (nc != NULL) {
            claim_validity(t, nc);
            atomic_store(&p->claim, nc);
        }
    }
}

/* Take the topic's wanted, free leases with one pipelined create each; those
 * refused (taken, deleted before, ours from an earlier run) go the slow way
 * in part_take. */
static void acquire_all(kb_transport *t, kb_nats_topic *tp)
{
    kv_puts puts = {NULL, 0, 0};
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *p = &tp->parts[i];
        if (p->wanted && p->lease_rev == 0 && !p->releasing)
            kv_put_add(&puts, p->lease_key, p, 0);
    }
    if (puts.n > 0)
        kv_put_all(t, &puts);
    int64_t now = kb_now_ns();
    for (size_t i = 0; i < puts.n; i++)
        if (puts.v[i].s == NATS_OK) {
            puts.v[i].p->lease_rev = puts.v[i].rev;
            puts.v[i].p->lease_until_ns = now + t->lease_ttl_ms * 1000000;
        }
    free(puts.v);
}

/* One consumer for the whole topic when this process takes every partition
 * at once and the group has no partition consumers on it (a topic seen first,
 * or a lone member's restart): a consumer costs the server about a
 * millisecond to create, and 1,000 topics of 8 partitions took 8,000 of them
 * (issue 19). When another member comes, the wide claim is dropped like any
 * other and each partition gets its own consumer from its floor. True when
 * the topic's claims are settled for this round. */
static bool wide_take(kb_transport *t, kb_nats_topic *tp, listing *l)
{
    if (!t->topic_consumer || t->partitions < 2 || atomic_load(&t->stopping))
        return false;
    for (uint32_t i = 0; i < t->partitions; i++) {
        kb_nats_part *p = &tp->parts[i];
        kb_nats_claim *c = atomic_load(&p->claim);
        if (p->releasing || !p->wanted || (c != NULL && !atomic_load(&c->fenced)))
            return false;
    }
    for (uint32_t i = 0; i < t->partitions; i++)
        if (tp->parts[i].lease_rev == 0 && !acquire(t, &tp->parts[i], l->rd))
            return false;
    if (!fresh_revision(t, &tp->parts[0], atomic_load(&tp->wide_claims), l->rd) ||
        !consumers_list(t, tp, l))
        return true;   /* next round */
    const jsConsumerInfoList *list = l->list;
    for (int i = 0; list != NULL && i < list->Count; i++)
        if (kb__nats_consumer_part(t, list->List[i]->Name) >= 0)
            return false;
    kb_nats_claim *w = kb__nats_claim_new(t, &tp->parts[0], tp->parts[0].lease_rev, true);
    if (w == NULL || !open_consumer(t, w, l))
        return false;   /* one partition at a time, then */
    for (int i = 0; list != NULL && i < list->Count; i++) {
        const char *name = list->List[i]->Name;
        if (kb__nats_consumer_wide(t, name) && strcmp(name, w->consumer) != 0)
            consumer_delete(t, tp->stream, name);
    }
    claim_validity(t, w);
    /* partition 0 pulls for all: it learns of the claim last, so every
     * partition knows it before its first message can come */
    for (uint32_t i = t->partitions; i-- > 0;) {
        drop(t, &tp->parts[i]);
        atomic_store(&tp->parts[i].claim, w);
    }
    return true;
}

/* Once every partition has its own consumer, the wide ones (whose floors
 * they all carry) are deleted: they would count twice in the stats. */
static void wide_retire(kb_transport *t, kb_nats_topic *tp)
{
    jsConsumerInfoList *list = NULL;
    jsOptions o;
    call_opts(t, &o);
    if (js_Consumers(&list, t->js, tp->stream, &o, NULL) != NATS_OK)
        return;
    uint32_t owned = 0;
    bool *has = calloc(t->partitions, sizeof *has);
    for (int i = 0; has != NULL && i < list->Count; i++) {
        long n = kb__nats_consumer_part(t, list->List[i]->Name);
        if (n >= 0 && !has[n]) {
            has[n] = true;
            owned++;
        }
    }
    for (int i = 0; owned == t->partitions && i < list->Count; i++)
        if (kb__nats_consumer_wide(t, list->List[i]->Name))
            consumer_delete(t, tp->stream, list->List[i]->Name);
    free(has);
    jsConsumerInfoList_Destroy(list);
}

/* The topic's claims for this round: one wide claim, or one per partition
 * (while the round has time and the server answers). */
static void topic_take(kb_transport *t, kb_nats_topic *tp, lease_round *rd)
{
    listing l = {.rd = rd};
    if (!atomic_load(&t->stopping))
        acquire_all(t, tp);
    if (!wide_take(t, tp, &l)) {
        for (uint32_t i = 0; i < t->partitions && !rd->stalled && kb_now_ns() <= rd->until; i++)
            part_take(t, &tp->parts[i], &l);
        bool had_wide = false;   /* listed only when claims were taken */
        for (int i = 0; l.list != NULL && i < l.list->Count; i++)
            had_wide = had_wide || kb__nats_consumer_wide(t, l.list->List[i]->Name);
        if (had_wide && !rd->stalled)
            wide_retire(t, tp);
    }
    listing_free(&l);
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
static bool renudge_claim(kb_transport *t, kb_nats_claim *c)
{
    jsConsumerInfo *ci = NULL;
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = round_wait_ms(t);   /* a consumer whose leader is being elected: next round */
    if (js_GetConsumerInfo(&ci, t->js, c->part->topic->stream, c->consumer, &o, NULL) !=
        NATS_OK)
        return false;
    uint64_t below = kb__nats_pending_below_floor(ci);
    uint64_t acked = atomic_load(&c->acked_to), had = atomic_load(&c->delivered_hi);
    bool ok = true;
    if (below > 0) {
        kb_log(t->bus, KB_LOG_WARNING,
               "nats %s: consumer %s came back from the server's restart with %llu messages "
               "pending below its ack floor %llu; starting again from there with a new consumer",
               t->url_safe, c->consumer, (unsigned long long)below,
               (unsigned long long)ci->AckFloor.Stream);
        kb__nats_claim_reset(t, c);
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

/* Every claim asked once per reconnect; the first unanswered one ends the
 * round's asking (the rest are asked again next round). */
static void renudge_all(kb_transport *t, lease_round *rd)
{
    uint32_t rc = atomic_load(&t->reconnects);
    if (rc == t->reconnects_renudged && !atomic_exchange(&t->renudge_wanted, 0))
        return;
    bool ok = true;
    for (kb_nats_topic *tp = atomic_load(&t->topics); ok && tp && !atomic_load(&t->closing);
         tp = tp->next)
        for (uint32_t i = 0; ok && atomic_load(&tp->subscribed) && i < t->partitions; i++) {
            kb_nats_claim *c = atomic_load(&tp->parts[i].claim);
            if (c != NULL && c->part == &tp->parts[i] && !atomic_load(&c->fenced))
                ok = renudge_claim(t, c);   /* a wide claim once, on partition 0 */
        }
    if (ok)
        t->reconnects_renudged = rc;
    rd->stalled = rd->stalled || !ok;
}

/* One lease round: heartbeats and renewals first, for every topic, then the
 * member listing, then acquisitions for at most a third of the TTL. Taking a
 * partition costs a KV create and a new consumer (about a millisecond of
 * server time each), so hundreds of new topics take several rounds; renewing
 * first keeps that from letting held leases run out (issue 19: 4,352 "lease
 * lost" with 500 topics), and so does a listing that waits for a bucket
 * without a leader. The wait before the next round: 0 when acquisitions are
 * left, ROUND_RETRY when the server left something unanswered. */
#define ROUND_RETRY(t) ((t)->lease_ttl_ms * 1000000 / 12)
static int64_t pass(kb_transport *t, bool *heartbeat_failing)
{
    kv_puts puts = {NULL, 0, 0};
    int64_t started = kb_now_ns();
    /* back-to-back rounds (acquisitions left over) renew only when due */
    int64_t renew_ns = t->lease_ttl_ms * 1000000 * 2 / 3;
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp && !atomic_load(&t->closing);
         tp = tp->next) {
        if (!atomic_load(&tp->subscribed))
            continue;
        char mine[2 * KB_NATS_NAME];
        member_key(t, tp, mine, sizeof mine);
        kv_put_add(&puts, mine, NULL, 0);
        for (uint32_t i = 0; i < t->partitions; i++) {
            kb_nats_part *p = &tp->parts[i];
            if (p->lease_rev != 0 && started >= p->lease_until_ns - renew_ns)
                kv_put_add(&puts, p->lease_key, p, p->lease_rev);
        }
    }
    kv_put_all(t, &puts);
    bool retry = false, heartbeat_failed = false;
    size_t answered = 0;
    for (size_t i = 0; i < puts.n; i++) {
        answered += puts.v[i].s == NATS_OK || puts.v[i].s == NATS_ERR;
        if (puts.v[i].p != NULL)
            renewed(t, puts.v[i].p, puts.v[i].s, puts.v[i].rev, started, &retry);
        else
            heartbeat_failed = heartbeat_failed || puts.v[i].s != NATS_OK;
    }
    if (heartbeat_failed && !*heartbeat_failing)   /* once, not every retry */
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: membership heartbeat failed", t->url_safe);
    *heartbeat_failing = heartbeat_failed;
    claims_validity(t);
    /* a bucket that answered nothing (no leader): no listing, no takes */
    lease_round rd = {0, puts.n > 0 && answered == 0};
    free(puts.v);
    roster r = {NULL, 0, false};
    bool listed = rd.stalled;
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp && !atomic_load(&t->closing);
         tp = tp->next) {
        if (!atomic_load(&tp->subscribed))
            continue;
        if (!listed) {
            roster_load(t, &r);
            listed = true;
        }
        members ms;
        members_load(t, tp, &r, &ms);
        for (uint32_t i = 0; i < t->partitions; i++)
            tp->parts[i].wanted = wanted(&ms, &tp->parts[i], tp->parts[i].lease_rev != 0);
        members_free(&ms);
    }
    roster_free(&r);
    renudge_all(t, &rd);
    /* acquisitions stop when a held lease falls due: a take's slowest
     * call (TTL/3) then still ends before the lease runs out locally */
    rd.until = kb_now_ns() + t->lease_ttl_ms * 1000000 / 3;
    bool feed_down = false;
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp && !atomic_load(&t->closing);
         tp = tp->next)
        for (uint32_t i = 0; atomic_load(&tp->subscribed) && i < t->partitions; i++) {
            kb_nats_part *p = &tp->parts[i];
            part_keep(t, p, &feed_down);
            if (p->lease_rev != 0 && p->lease_until_ns - renew_ns < rd.until)
                rd.until = p->lease_until_ns - renew_ns;
        }
    for (kb_nats_topic *tp = atomic_load(&t->topics);
         tp && !atomic_load(&t->closing) && !rd.stalled && kb_now_ns() <= rd.until;
         tp = tp->next)
        if (atomic_load(&tp->subscribed))
            topic_take(t, tp, &rd);
    if (rd.stalled || retry || heartbeat_failed)
        return ROUND_RETRY(t);
    return kb_now_ns() > rd.until ? 0 : t->lease_ttl_ms * 1000000 / 3;
}

static int kicked(void *arg)
{
    kb_transport *t = arg;
    return atomic_load(&t->lease_kick) || atomic_load(&t->closing);
}

/* The lease thread, kb-nats-lease: a round every third of the lease TTL (a
 * twelfth after one the server left unanswered), or at once when kicked (a
 * topic subscribed, a claim reset) or closing. */
static void *leaser(void *arg)
{
    kb_transport *t = arg;
    bool heartbeat_failing = false;
    while (!atomic_load(&t->closing)) {
        int64_t wait_ns = pass(t, &heartbeat_failing);
        if (wait_ns > 0)
            kb_signal_wait(t->lease_wake, kicked, t, kb_now_ns() + wait_ns);
        atomic_store(&t->lease_kick, 0);
    }
    nats_ReleaseThreadMemory();
    atomic_store(&t->leaser_done, 1);
    kb_signal_notify(t->lease_wake);
    return NULL;
}

int kb__nats_leaser_start(kb_transport *t, char *errstr, size_t errlen)
{
    return kb__nats_thread_start(&t->leaser, "kb-nats-lease", leaser, t, errstr, errlen);
}

/* A KV delete as a plain publish to the bucket's subject: no round trip per
 * key, so close releases every lease within its deadline. */
static void kv_delete(kb_transport *t, const char *key)
{
    char subj[3 * KB_NATS_NAME];
    snprintf(subj, sizeof subj, "$KV.%s.%s", t->bucket, key);
    natsMsg *m = NULL;
    if (natsMsg_Create(&m, subj, NULL, NULL, 0) == NATS_OK &&
        natsMsgHeader_Set(m, "KV-Operation", "DEL") == NATS_OK)
        natsConnection_PublishMsg(t->nc, m);
    natsMsg_Destroy(m);
}

void kb__nats_lease_release_all(kb_transport *t, int64_t deadline)
{
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next) {
        if (!atomic_load(&tp->subscribed))
            continue;
        char mine[2 * KB_NATS_NAME];
        member_key(t, tp, mine, sizeof mine);
        kv_delete(t, mine);
        for (uint32_t i = 0; i < t->partitions; i++)
            if (tp->parts[i].lease_rev != 0) {
                kv_delete(t, tp->parts[i].lease_key);
                tp->parts[i].lease_rev = 0;
            }
    }
    int left = kb_deadline_left_ms(deadline);
    natsConnection_FlushTimeout(t->nc, left < 0 ? 5000 : left > 0 ? left : 1);
}
