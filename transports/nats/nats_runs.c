/* Handler runs on the server: KV bucket <nats.lease_bucket>_runs, one key
 * per redelivered or retried message, <stream>.<group>.<stream seq>, whose
 * value lists its events' runs begun so far, a line "<delivery ID> <runs>"
 * each (a frame's events run one by one). Written before a run only for an
 * event the server delivered before (a crash, a hand-over) or that is being
 * retried, and by the crash-journal adoption at open; read by the feeder (the
 * attempt is runs + 1). A key is deleted when its message is acked; one
 * whose delete was lost, or of a message this process never acked, expires
 * with the bucket's MaxAge, a week (a stream sequence is never handed out
 * twice). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_names.h"
#include "nats_runs.h"

#define RUNS_MAX_AGE_NS (7LL * 24 * 3600 * 1000000000LL)
/* every event of the largest frame: a line "<seq>.<i> <runs>" is at most 37 bytes */
#define RUNS_VALUE_MAX (KB_NATS_BATCH_MAX * 40)
#define RUNS_TRIES 5          /* compare-and-set rounds against a concurrent writer */

/* The feeder's last read: the events of one frame arrive one after another
 * (a later delivery of the message reads again). */
struct kb_nats_runs_cache {
    const kb_nats_topic *tp;
    uint64_t sseq;
    uint32_t delivered;
    char value[RUNS_VALUE_MAX];
};

static void runs_key(const kb_transport *t, const char *stream, const char *id, char *out,
                     size_t len)
{
    snprintf(out, len, "%s.%s.%.*s", stream, t->group, (int)strcspn(id, "."), id);
}

/* Runs of `id` in a value, 0 when it has no line. */
static uint32_t runs_in(const char *value, const char *id)
{
    size_t n = strlen(id);
    for (const char *l = value; *l != '\0'; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : "") {
        if (strncmp(l, id, n) == 0 && l[n] == ' ') {
            unsigned long long v = strtoull(l + n + 1, NULL, 10);
            return v < UINT32_MAX ? (uint32_t)v : UINT32_MAX - 1;   /* saturate, never wrap */
        }
    }
    return 0;
}

const char *kb__nats_runs_check(const char *value, uint64_t sseq)
{
    char own[24];
    size_t n = (size_t)snprintf(own, sizeof own, "%llu", (unsigned long long)sseq);
    for (const char *l = value; *l != '\0';) {
        const char *end = strchr(l, '\n');
        if (end == NULL)
            return "a line without its newline";
        if (strncmp(l, own, n) != 0)
            return "a line of another message";
        const char *p = l + n;
        if (*p == '.') {   /* the event's index in its frame: 1..KB_NATS_BATCH_MAX */
            unsigned long i = 0;
            size_t d = 0;
            for (p++; *p >= '0' && *p <= '9' && d < 5; p++, d++)
                i = i * 10 + (unsigned long)(*p - '0');
            if (d == 0 || i == 0 || i > KB_NATS_BATCH_MAX)
                return "an event index out of range";
        }
        size_t d = 0;
        if (*p++ != ' ')
            return "malformed";
        for (; *p >= '0' && *p <= '9' && d < 8; p++, d++)
            ;
        if (d == 0 || p != end)
            return "a count of runs out of form (1 to 8 digits)";
        l = end + 1;
    }
    return NULL;
}

/* `value` with `id`'s line set to `runs`; false when it would not fit. */
static bool runs_set(const char *value, const char *id, uint32_t runs, char *out, size_t len)
{
    size_t n = strlen(id), used = 0;
    for (const char *l = value; *l != '\0';) {
        const char *end = strchr(l, '\n');
        size_t ll = end ? (size_t)(end - l) + 1 : strlen(l);
        if (!(strncmp(l, id, n) == 0 && l[n] == ' ')) {
            if (used + ll >= len)
                return false;
            memcpy(out + used, l, ll);
            used += ll;
        }
        l += ll;
    }
    int w = snprintf(out + used, len - used, "%s %u\n", id, runs);
    return w > 0 && (size_t)w < len - used;
}

/* "At least `runs` runs of event `id`", raising the count only: a late
 * adoption must not lower a newer one. */
static int record(kb_transport *t, const char *stream, const char *id, uint32_t runs)
{
    char key[2 * KB_NATS_NAME + 64];
    runs_key(t, stream, id, key, sizeof key);
    natsStatus s = NATS_OK;
    if (!strchr(id, '.')) {   /* a plain message: one event, usually no record yet */
        char value[64];
        uint64_t done = 0;
        snprintf(value, sizeof value, "%s %u\n", id, runs);
        if (kvStore_CreateString(&done, t->runs_kv, key, value) == NATS_OK)
            return KB_OK;
    }
    for (int i = 0; i < RUNS_TRIES; i++) {
        kvEntry *e = NULL;
        s = kvStore_Get(&e, t->runs_kv, key);
        if (s != NATS_OK && s != NATS_NOT_FOUND)
            break;
        const char *old = e != NULL ? kvEntry_ValueString(e) : "";
        uint64_t rev = e != NULL ? kvEntry_Revision(e) : 0, done = 0;
        if (runs_in(old, id) >= runs) {
            kvEntry_Destroy(e);
            return KB_OK;
        }
        char *value = malloc(RUNS_VALUE_MAX);
        if (value == NULL || !runs_set(old, id, runs, value, RUNS_VALUE_MAX)) {
            kvEntry_Destroy(e);
            free(value);
            kb_errf(NULL, 0, "nats %s: runs of %s: more than %d bytes of records", t->url_safe, key,
                    RUNS_VALUE_MAX);
            return KB_ETRANSPORT;
        }
        kvEntry_Destroy(e);
        s = rev != 0 ? kvStore_UpdateString(&done, t->runs_kv, key, value, rev)
                     : kvStore_CreateString(&done, t->runs_kv, key, value);
        free(value);
        if (s == NATS_OK)
            return KB_OK;
    }
    kb_errf(NULL, 0, "nats %s: run %u of %s (%s) not recorded: %s", t->url_safe, runs, id, key,
            kb__nats_reason(s));
    return KB_ETRANSPORT;
}

void kb__nats_run_begins(kb_transport *t, const kb_delivery *d)
{
    if (record(t, d->tt->stream, d->id, d->attempt) != KB_OK)
        kb_log(t->bus, KB_LOG_WARNING, "%s (the crash journal still holds it)", kb_last_error());
    else if (d->cookie != NULL)
        atomic_store_explicit(&((kb_nats_entry *)d->cookie)->runs, true, memory_order_relaxed);
}

void kb__nats_runs_forget(kb_transport *t, const kb_nats_entry *e)
{
    char id[24], key[2 * KB_NATS_NAME + 64], subj[sizeof key + sizeof t->bucket + 16];
    snprintf(id, sizeof id, "%llu", (unsigned long long)e->sseq);
    runs_key(t, e->claim->part->topic->stream, id, key, sizeof key);
    snprintf(subj, sizeof subj, "$KV.%s_runs.%s", t->bucket, key);
    natsMsg *m = NULL;
    if (natsMsg_Create(&m, subj, NULL, NULL, 0) == NATS_OK &&
        natsMsgHeader_Set(m, "KV-Operation", "DEL") == NATS_OK)
        /* behind the entry's ack on the same socket: a delete that overtook
         * it would let a redelivery after a lost ack start from run 1.
         * Lost: it expires with the bucket. */
        natsConnection_PublishMsg(kb__nats_feed_conn(t), m);
    natsMsg_Destroy(m);
}

uint32_t kb__nats_runs_attempt(kb_transport *t, const kb_nats_topic *tp, uint64_t sseq,
                               const char *id, uint32_t delivered)
{
    struct kb_nats_runs_cache *c = t->runs_cache;
    if (c->tp != tp || c->sseq != sseq || c->delivered != delivered) {
        char key[2 * KB_NATS_NAME + 64];
        runs_key(t, tp->stream, id, key, sizeof key);
        kvEntry *e = NULL;
        natsStatus s = kvStore_Get(&e, t->runs_kv, key);
        const char *why = s != NATS_OK && s != NATS_NOT_FOUND ? kb__nats_reason(s) : NULL;
        if (s == NATS_OK && strlen(kvEntry_ValueString(e)) >= sizeof c->value)
            why = "longer than this process reads";   /* never cut: lines would be lost */
        else if (s == NATS_OK)
            why = kb__nats_runs_check(kvEntry_ValueString(e), sseq);   /* anyone may write it */
        if (why != NULL && s == NATS_OK)
            kvEntry_Destroy(e);
        if (why != NULL) {
            /* deliveries are not runs (NAKs of probes and reconnects add to
             * them): never enough to dead-letter an event no handler ran */
            uint32_t attempt = delivered < t->max_attempts ? delivered : t->max_attempts;
            kb_log(t->bus, KB_LOG_WARNING, "nats %s: runs of %s unread (%s): attempt %u taken "
                   "from its delivery count, at most retry.max_attempts", t->url_safe, id, why,
                   attempt);
            c->tp = NULL;
            return attempt;
        }
        snprintf(c->value, sizeof c->value, "%s", e != NULL ? kvEntry_ValueString(e) : "");
        kvEntry_Destroy(e);
        c->tp = tp;
        c->sseq = sseq;
        c->delivered = delivered;
    }
    uint32_t runs = runs_in(c->value, id);
    return runs < UINT32_MAX ? runs + 1 : runs;
}

static int adopt(void *opaque, const kb_run *run)
{
    char stream[KB_NATS_NAME];
    kb__nats_stream_name(stream, sizeof stream, run->topic);
    return record(opaque, stream, run->id, run->attempt);
}

int kb__nats_runs_open(kb_transport *t, char *errstr, size_t errlen)
{
    if (t->runs_kv != NULL)
        return KB_OK;
    if (t->runs_cache == NULL)
        t->runs_cache = calloc(1, sizeof *t->runs_cache);
    if (t->runs_cache == NULL) {
        kb_errf(errstr, errlen, "nats: out of memory");
        return KB_ENOMEM;
    }
    char bucket[sizeof t->bucket + 8];
    snprintf(bucket, sizeof bucket, "%s_runs", t->bucket);
    kvConfig kc;
    kvConfig_Init(&kc);
    kc.Bucket = bucket;
    kc.History = 1;
    kc.TTL = RUNS_MAX_AGE_NS;
    kc.StorageType = js_FileStorage;   /* runs survive a server restart */
    kc.Replicas = t->replicas;         /* as the streams and the lease bucket */
    natsStatus s = js_CreateKeyValue(&t->runs_kv, t->js, &kc);
    if (s != NATS_OK)   /* it exists: use it */
        s = js_KeyValue(&t->runs_kv, t->js, bucket);
    /* the lease thread's handle: its lookup waits a round only, and when it
     * fails the lease thread uses runs_kv (nats_progress.c) */
    if (s == NATS_OK && js_KeyValue(&t->runs_kv_round, t->js_round, bucket) != NATS_OK)
        t->runs_kv_round = NULL;
    if (s != NATS_OK) {
        kb_errf(errstr, errlen, "nats %s: runs bucket %s: %s", t->url_safe, bucket,
                kb__nats_reason(s));
        return KB_ETRANSPORT;
    }
    int rc = kb_bus_runs_journal(t->bus, t->url_safe, adopt, t, errstr, errlen);
    if (rc != KB_OK) {   /* unbound again: the next subscribe tries the journal too */
        kvStore_Destroy(t->runs_kv);
        kvStore_Destroy(t->runs_kv_round);
        t->runs_kv = t->runs_kv_round = NULL;
    }
    return rc;
}

void kb__nats_runs_close(kb_transport *t)
{
    kvStore_Destroy(t->runs_kv);
    kvStore_Destroy(t->runs_kv_round);
    free(t->runs_cache);
}
