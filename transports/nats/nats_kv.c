/* The lease bucket: created or bound once per bus, and read and written by
 * the lease thread in pipelined batches. Only stream-leader requests (puts,
 * message gets, stream info): no call here creates a consumer, which the
 * server may place on a node that is gone and answer only after nats.c's
 * timeout (the member listing through a KV watcher waited 5 s per round
 * while a node was down). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_kv.h"
#include "nats_late.h"
#include "nats_lease.h"
#include "nats_msg.h"
#include "nats_names.h"

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

/* A sixth of the TTL, at most nats.c's own 5 s. An unanswered round is
 * retried soon after, so several tries fit in a lease's life, and one node's
 * loss (its KV leader's election) does not let the leases run out locally
 * while the thread waits. */
int kb__nats_round_wait_ms(const kb_transport *t)
{
    int64_t ms = t->lease_ttl_ms / 6;
    return ms > 5000 ? 5000 : (int)ms;
}

kb_nats_kv_op *kb__nats_kv_add(kb_nats_kv_ops *ops, const char *key, kb_nats_part *p,
                               uint64_t expect, bool get)
{
    void *v = ops->v;
    if (kb_vec_reserve(&v, &ops->cap, ops->n + 1, sizeof *ops->v) != KB_OK)
        return NULL;
    ops->v = v;
    kb_nats_kv_op *k = &ops->v[ops->n++];
    snprintf(k->key, sizeof k->key, "%s", key);
    k->p = p;
    k->expect = expect;
    k->get = get;
    k->s = NATS_TIMEOUT;
    k->rev = 0;
    k->ours = false;
    k->this_bus = false;
    return k;
}

bool kb__nats_kv_answered(const kb_nats_kv_op *k)
{
    return k->s == NATS_OK || k->s == NATS_ERR;
}

/* A stored message's headers, decoded into buf (empty when none). */
static void stored_headers(const char *d, char *buf, size_t cap)
{
    size_t n = 0;
    const char *h = kb__nats_json_str(d, "hdrs", &n);
    long got = h != NULL ? kb__nats_b64_decode(h, n, buf, cap - 1) : -1;
    buf[got > 0 ? got : 0] = '\0';
}

/* Which bus put a lease: its Kb-Bus header. A put whose answer was lost and
 * that the server stored anyway is this bus's own, and only this bus's: not
 * another bus of the same consumer name (another bus of the process, or a
 * process restarted beside a hung one), whose leases must stay theirs. */
#define KB_BUS_HDR "Kb-Bus"

/* Does a header line of the block begin with `start`? Only whole lines: a
 * value or a longer name that holds the text is another header. */
static bool header_line(const char *hdrs, const char *start)
{
    char want[64];
    snprintf(want, sizeof want, "\r\n%s", start);   /* the status line comes first */
    return strstr(hdrs, want) != NULL;
}

static bool put_by(const kb_transport *t, const char *hdrs)
{
    char want[48];
    snprintf(want, sizeof want, KB_BUS_HDR ": %s\r\n", t->bus_id);
    return header_line(hdrs, want);
}

/* Is the stored value this process's name? */
static bool names_us(const kb_transport *t, const char *d)
{
    size_t n = 0;
    const char *v = kb__nats_json_str(d, "data", &n);
    char buf[sizeof t->id];
    long got = v != NULL ? kb__nats_b64_decode(v, n, buf, sizeof buf) : -1;
    return got >= 0 && (size_t)got == strlen(t->id) && memcmp(buf, t->id, (size_t)got) == 0;
}

/* One reply: a publish ack ({"stream":..,"seq":N}) or a refusal (a wrong
 * revision); for a read, the stored message ({"message":{..,"seq":N,..}}),
 * "no message found" (10037: expired or never written), or a delete marker.
 * A status without a body (no responders: a bucket without a leader) is
 * unanswered. */
void kb__nats_kv_reply(const kb_transport *t, kb_nats_kv_op *k, natsMsg *m)
{
    const char *d = natsMsg_GetData(m), *seq = d ? strstr(d, "\"seq\":") : NULL;
    if (natsMsg_GetDataLength(m) == 0) {
        k->s = NATS_NO_RESPONDERS;
        return;
    }
    if (strstr(d, "\"error\"") != NULL || seq == NULL) {
        k->s = !k->get ? NATS_ERR : strstr(d, "10037") != NULL ? NATS_NOT_FOUND : NATS_ERR;
        return;
    }
    k->rev = strtoull(seq + 6, NULL, 10);
    char hdrs[1024] = "";
    if (k->get)
        stored_headers(d, hdrs, sizeof hdrs);
    k->s = k->get && header_line(hdrs, "KV-Operation:") ? NATS_NOT_FOUND : NATS_OK;
    k->ours = k->get && k->s == NATS_OK && names_us(t, d);
    k->this_bus = k->ours && put_by(t, hdrs);
}

/* The bus's subscription for replies, made at its first batch. */
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

static natsStatus kv_send(kb_transport *t, const kb_nats_kv_op *k, const char *reply)
{
    char subj[3 * KB_NATS_NAME], body[3 * KB_NATS_NAME + 32], rev[24];
    natsMsg *m = NULL;
    natsStatus s;
    if (k->get) {
        snprintf(subj, sizeof subj, "$JS.API.STREAM.MSG.GET.KV_%s", t->bucket);
        int n = snprintf(body, sizeof body, "{\"last_by_subj\":\"$KV.%s.%s\"}", t->bucket, k->key);
        s = natsMsg_Create(&m, subj, reply, body, n);
    } else {
        snprintf(subj, sizeof subj, "$KV.%s.%s", t->bucket, k->key);
        s = natsMsg_Create(&m, subj, reply, t->id, (int)strlen(t->id));
        kb__nats_put_u64(rev, k->expect);
        if (s == NATS_OK && k->p != NULL)
            s = natsMsgHeader_Set(m, "Nats-Expected-Last-Subject-Sequence", rev);
        if (s == NATS_OK && k->p != NULL)
            s = natsMsgHeader_Set(m, KB_BUS_HDR, t->bus_id);
    }
    if (s == NATS_OK)
        s = natsConnection_PublishMsg(t->nc, m);
    natsMsg_Destroy(m);
    return s;
}

/* The reply's round and index, from <kv_inbox>.<round>.<index>. */
static bool reply_of(const kb_transport *t, const char *subject, uint32_t *round, uint32_t *index)
{
    size_t il = strlen(t->kv_inbox);
    if (strncmp(subject, t->kv_inbox, il) != 0 || subject[il] != '.')
        return false;
    char *end = NULL;
    unsigned long r = strtoul(subject + il + 1, &end, 10);
    if (end == subject + il + 1 || *end != '.')
        return false;
    const char *is = end + 1;
    unsigned long i = strtoul(is, &end, 10);
    if (end == is || *end != '\0' || r > UINT32_MAX || i > UINT32_MAX)
        return false;
    *round = (uint32_t)r;
    *index = (uint32_t)i;
    return true;
}

/* A reply to an earlier round: only a renewal's counts (nats_late.c). */
static void late_reply(kb_transport *t, uint32_t round, uint32_t index, natsMsg *m)
{
    kb_nats_kv_op k = {.s = NATS_TIMEOUT};
    kb__nats_kv_reply(t, &k, m);
    kb__nats_late_answered(t, round, index, &k);
}

void kb__nats_kv_late_answers(kb_transport *t)
{
    int msgs = 0;
    if (t->kv_sub == NULL || t->kv_late_n == 0 ||
        natsSubscription_GetPending(t->kv_sub, &msgs, NULL) != NATS_OK)
        return;
    for (; msgs > 0; msgs--) {
        natsMsg *m = NULL;
        uint32_t round = 0, index = 0;
        if (natsSubscription_NextMsg(&m, t->kv_sub, 1) != NATS_OK)
            return;
        if (reply_of(t, natsMsg_GetSubject(m), &round, &index))
            late_reply(t, round, index, m);
        natsMsg_Destroy(m);
    }
}

void kb__nats_kv_run(kb_transport *t, kb_nats_kv_ops *ops)
{
    char reply[192];
    natsStatus s = kv_sub(t);
    uint32_t batch = ++t->kv_round;   /* earlier batches' replies: only late renewals count */
    ops->sent_ns = kb_now_ns();   /* a lease's server TTL starts after this */
    for (size_t i = 0; s == NATS_OK && i < ops->n; i++) {
        snprintf(reply, sizeof reply, "%s.%u.%zu", t->kv_inbox, batch, i);
        s = kv_send(t, &ops->v[i], reply);
    }
    int64_t deadline = kb_deadline_ns(kb__nats_round_wait_ms(t));
    for (size_t got = 0; s == NATS_OK && got < ops->n;) {
        natsMsg *m = NULL;
        int left = kb_deadline_left_ms(deadline);
        if (left <= 0 || natsSubscription_NextMsg(&m, t->kv_sub, left) != NATS_OK)
            break;
        uint32_t round = 0, i = 0;
        bool ours = reply_of(t, natsMsg_GetSubject(m), &round, &i);
        if (ours && round != batch) {
            late_reply(t, round, i, m);
        } else if (ours && i < ops->n && ops->v[i].s == NATS_TIMEOUT) {
            kb__nats_kv_reply(t, &ops->v[i], m);
            got++;
        }
        natsMsg_Destroy(m);
    }
    kb__nats_late_keep(t, ops, batch);
}

natsStatus kb__nats_lease_put(kb_transport *t, kb_nats_part *p, uint64_t expect, uint64_t *rev,
                              int64_t *sent_ns)
{
    kb_nats_kv_ops one = {NULL, 0, 0, 0};
    natsStatus s = NATS_NO_MEMORY;
    if (kb__nats_kv_add(&one, p->lease_key, p, expect, false) != NULL) {
        kb__nats_kv_run(t, &one);
        s = one.v[0].s;
        *rev = one.v[0].rev;
        *sent_ns = one.sent_ns;
    }
    free(one.v);
    return s;
}

/* The member subjects the bucket's stream holds, from its leader's stream
 * info: deleted and live alike (a delete is a message too). */
static bool member_subjects(kb_transport *t, kb_nats_kv_ops *ops)
{
    char stream[96], filter[160];
    snprintf(stream, sizeof stream, "KV_%s", t->bucket);
    snprintf(filter, sizeof filter, "$KV.%s.m.>", t->bucket);
    size_t pl = strlen(filter) - 3;   /* "$KV.<bucket>." */
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = kb__nats_round_wait_ms(t);
    o.Stream.Info.SubjectsFilter = filter;
    jsStreamInfo *si = NULL;
    if (js_GetStreamInfo(&si, t->js, stream, &o, NULL) != NATS_OK)
        return false;
    bool ok = true;
    const jsStreamStateSubjects *subs = si->State.Subjects;
    for (int i = 0; ok && subs != NULL && i < subs->Count; i++)
        if (strlen(subs->List[i].Subject) > pl)
            ok = kb__nats_kv_add(ops, subs->List[i].Subject + pl, NULL, 0, true) != NULL;
    jsStreamInfo_Destroy(si);
    return ok;
}

void kb__nats_roster_load(kb_transport *t, kb_nats_roster *r)
{
    memset(r, 0, sizeof *r);
    kb_nats_kv_ops ops = {NULL, 0, 0, 0};
    if (!member_subjects(t, &ops)) {
        free(ops.v);
        return;
    }
    kb__nats_kv_run(t, &ops);
    r->ok = true;
    r->keys = calloc(ops.n + 1, sizeof *r->keys);
    for (size_t i = 0; r->ok && i < ops.n; i++) {
        if (ops.v[i].s == NATS_NOT_FOUND)
            continue;   /* left or expired */
        if (ops.v[i].s != NATS_OK || r->keys == NULL ||
            (r->keys[r->n] = strdup(ops.v[i].key)) == NULL)
            r->ok = false;   /* unknown: the caller keeps what it has */
        else
            r->n++;
    }
    free(ops.v);
}

void kb__nats_roster_free(kb_nats_roster *r)
{
    for (int i = 0; i < r->n; i++)
        free(r->keys[i]);
    free(r->keys);
}

void kb__nats_kv_delete(kb_transport *t, const char *key, uint64_t expect)
{
    char subj[3 * KB_NATS_NAME], rev[24];
    snprintf(subj, sizeof subj, "$KV.%s.%s", t->bucket, key);
    kb__nats_put_u64(rev, expect);
    natsMsg *m = NULL;
    if (natsMsg_Create(&m, subj, NULL, NULL, 0) == NATS_OK &&
        natsMsgHeader_Set(m, "KV-Operation", "DEL") == NATS_OK &&
        (expect == 0 || natsMsgHeader_Set(m, "Nats-Expected-Last-Subject-Sequence", rev) == NATS_OK))
        natsConnection_PublishMsg(t->nc, m);
    natsMsg_Destroy(m);
}
