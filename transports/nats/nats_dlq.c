/* Dead letters live on kb.<topic>.dlq in the topic's own stream (one stream
 * may not overlap another's subjects), with headers naming where they came
 * from. Their ID is their stream sequence; listing uses direct gets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nats_claim.h"
#include "nats_dlq.h"
#include "nats_hdr.h"
#include "nats_msg.h"
#include "nats_names.h"
#include "nats_publish.h"
#include "nats_topic.h"

int kb__nats_dlq_publish(kb_transport *t, kb_nats_topic *tp, const kb_nats_dead *d)
{
    natsMsg *m = NULL;
    char num[32], id[2 * KB_NATS_NAME], why[257];
    snprintf(why, sizeof why, "%s", d->reason);   /* within KB_NATS_DLQ_ROOM */
    /* Another client's message close to max_payload cannot carry our headers
     * too: store the dead letter without its body (the original stays in the
     * stream at its sequence) rather than have it refused and redelivered for
     * ever, holding up its partition. */
    bool omit = (d->payload == NULL && d->payload_len > 0) ||
                d->payload_len + KB_NATS_HDR_BASE + KB_NATS_DLQ_ROOM +
                    (d->key_len ? kb__nats_key_hdr_len(d->key, d->key_len) : 0) +
                    kb__nats_hdr_len(d->headers, d->n_headers) >
                atomic_load(&t->max_payload);
    natsStatus s = natsMsg_Create(&m, tp->dlq_subject, NULL,
                                  d->payload_len && !omit ? d->payload : NULL,
                                  omit ? 0 : (int)d->payload_len);
    snprintf(num, sizeof num, "%zu", d->payload_len);
    if (s == NATS_OK && omit)
        s = natsMsgHeader_Set(m, KB_NATS_OMITTED_HDR, num);
    if (s == NATS_OK && d->key_len > 0 && kb__nats_set_key(m, d->key, d->key_len) != KB_OK)
        s = NATS_NO_MEMORY;
    if (s == NATS_OK && kb__nats_hdr_set(m, d->headers, d->n_headers) != KB_OK)
        s = NATS_NO_MEMORY;
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Kb-Orig-Subject", d->orig_subject);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Kb-Orig-Id", d->orig_id);
    snprintf(num, sizeof num, "%u", d->partition);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Kb-Partition", num);
    snprintf(num, sizeof num, "%u", d->attempts);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Kb-Attempts", num);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Kb-Reason", why);
    /* A redelivered event dead-lettered again is stored once. */
    snprintf(id, sizeof id, "dlq-%s-%s", tp->stream, d->orig_id);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Nats-Msg-Id", id);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = t->publish_timeout_ms;
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    if (s == NATS_OK)
        s = js_PublishMsg(&pa, t->js, m, &po, &jerr);
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
    if (s == NATS_OK)
        return KB_OK;
    int rc = kb__nats_errf(tp->dlq_subject, s, jerr);
    /* No answer may be followed by one; a refusal (header over 64 KiB, a
     * JetStream error) is final. Not sent while reconnecting (nats.c keeps
     * no reconnect buffer): tried again too. */
    bool unanswered = jerr == 0 && (s == NATS_TIMEOUT || s == NATS_CONNECTION_CLOSED ||
                                    s == NATS_CONNECTION_DISCONNECTED || s == NATS_NO_RESPONDERS ||
                                    s == NATS_INSUFFICIENT_BUFFER);
    return unanswered ? KB_ETIMEDOUT : rc == KB_ETIMEDOUT ? KB_ETRANSPORT : rc;
}

void kb__nats_dlq_settle(kb_transport *t, kb_nats_entry *e, int rc)
{
    kb_nats_claim *c = e->claim;
    if (rc == KB_ETIMEDOUT)   /* it ran up to retry.max_attempts: no final record */
        atomic_store(&c->released_ran, true);
    kb__nats_settle(e, rc != KB_ETIMEDOUT);   /* `e` may be reused from here on */
    if (rc == KB_ETIMEDOUT)
        kb__nats_claim_reset(t, c);
}

int kb__nats_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason)
{
    kb_nats_entry *e = d->cookie;
    kb_nats_topic *tp = d->tt;
    if (e == NULL || tp == NULL) {
        kb_errf(NULL, 0, "nats: dead letter of %s without its message", d->topic);
        return KB_EINVAL;
    }
    kb_nats_dead dead = {
        .orig_subject = natsMsg_GetSubject(e->msg), .orig_id = d->id,
        .key = d->key, .key_len = d->key_len, .payload = d->payload,
        .payload_len = d->payload_len, .headers = d->headers, .n_headers = d->n_headers,
        .partition = d->partition, .attempts = d->attempt, .reason = reason,
    };
    int rc = kb__nats_dlq_publish(t, tp, &dead);
    kb__nats_dlq_settle(t, e, rc);
    return rc;   /* an error: the bus counts the dead letter as lost */
}

static const char *hdr(natsMsg *m, const char *name)
{
    const char *v = NULL;
    return natsMsgHeader_Get(m, name, &v) == NATS_OK && v ? v : "";
}

/* Nats-Time-Stamp of a direct get (RFC 3339, UTC, up to nanoseconds) as Unix
 * ms; 0 when absent or unreadable. */
static int64_t stamp_ms(natsMsg *m)
{
    struct tm tm = {0};
    const char *v = hdr(m, "Nats-Time-Stamp");
    char *rest = strptime(v, "%Y-%m-%dT%H:%M:%S", &tm);
    if (rest == NULL)
        return 0;
    int64_t ms = (int64_t)timegm(&tm) * 1000;
    if (*rest == '.') {
        int64_t scale = 100;
        for (rest++; *rest >= '0' && *rest <= '9'; rest++, scale /= 10)
            ms += scale > 0 ? (*rest - '0') * scale : 0;
    }
    return ms;
}

kb_dead_letter kb__nats_dead_letter_of(const kb_transport *t, natsMsg *m, const char *id,
                                      char *key, kb_nats_hdrs *h)
{
    const char *why = NULL;
    int klen = kb__nats_get_key(m, key, KB_NATS_DLQ_KEY_CAP, &why);
    if (kb__nats_hdr_get(t, m, h, &why) != 0)
        h->n = 0;   /* listed without them; a replay says why */
    /* anyone may publish on the dead-letter subject: a partition out of
     * range reads as the key's (where a replay sends it), else 0; counts
     * decimal or 0 */
    uint64_t part = 0, attempts = 0;
    const char *p = hdr(m, "Kb-Partition");
    if (strcmp(p, "0") != 0 && (!kb__nats_seq_parse(p, &part) || part >= t->partitions))
        part = klen > 0 ? kb_partition_of(key, (size_t)klen, t->partitions) : 0;
    if (!kb__nats_seq_parse(hdr(m, "Kb-Attempts"), &attempts) || attempts > UINT32_MAX)
        attempts = 0;
    return (kb_dead_letter){
        .id = id,
        .key = key, .key_len = klen > 0 ? (size_t)klen : 0,
        .payload = natsMsg_GetData(m) ? natsMsg_GetData(m) : "",
        .payload_len = (size_t)natsMsg_GetDataLength(m),
        .partition = (uint32_t)part,
        .original_id = hdr(m, "Kb-Orig-Id"),
        .attempts = (uint32_t)attempts,
        .reason = hdr(m, "Kb-Reason"),
        .time_ms = stamp_ms(m),
        .headers = h->n ? h->h : NULL, .n_headers = h->n,
    };
}

int kb__nats_dead_letters(kb_transport *t, kb_nats_topic *tp, const char *after_id, size_t max,
                          kb_dead_letter_fn fn, void *opaque)
{
    uint64_t after = 0;
    if (after_id != NULL && after_id[0] != '\0' && strcmp(after_id, "0") != 0 &&
        !kb__nats_seq_parse(after_id, &after)) {
        kb_errf(NULL, 0, "kb_dead_letters %s: \"%.32s\" is not a stream sequence (decimal)",
                tp->name, after_id);
        return KB_EINVAL;
    }
    int exists = kb__nats_topic_exists(t, tp);   /* a listing creates nothing */
    if (exists != KB_OK)
        return exists;
    if (after == UINT64_MAX)
        return KB_OK;   /* nothing comes after the last sequence */
    uint64_t seq = after + 1;
    char *key = malloc(KB_NATS_DLQ_KEY_CAP);
    kb_nats_hdrs *h = calloc(1, sizeof *h);
    if (key == NULL || h == NULL) {
        free(key);
        free(h);
        return KB_ENOMEM;
    }
    int rc = KB_OK;
    for (size_t n = 0; n < max; n++) {
        jsDirectGetMsgOptions o;
        jsDirectGetMsgOptions_Init(&o);
        o.Sequence = seq;
        o.NextBySubject = tp->dlq_subject;
        natsMsg *m = NULL;
        natsStatus s = js_DirectGetMsg(&m, t->js, tp->stream, NULL, &o);
        if (s == NATS_NOT_FOUND)
            break;
        if (s != NATS_OK) {
            rc = kb__nats_errf("listing dead letters", s, 0);
            break;
        }
        uint64_t at = strtoull(hdr(m, "Nats-Sequence"), NULL, 10);
        char id[24];
        snprintf(id, sizeof id, "%llu", (unsigned long long)at);
        kb_dead_letter dl = kb__nats_dead_letter_of(t, m, id, key, h);
        int stop = fn(&dl, opaque);
        natsMsg_Destroy(m);
        if (stop || at == 0)
            break;
        seq = at + 1;
    }
    kb__nats_hdrs_free(h);
    free(h);
    free(key);
    return rc;
}

/* Dead letter `id` of the topic's stream, checked to be one (the stream also
 * holds the events): KB_OK with *m the caller's to destroy. */
static int get_dead_letter(kb_transport *t, kb_nats_topic *tp, const char *id, uint64_t *seq,
                           natsMsg **m)
{
    if (!kb__nats_seq_parse(id, seq)) {
        kb_errf(NULL, 0, "nats: dead letter ID \"%.60s\" is not a stream sequence", id);
        return KB_EINVAL;
    }
    int exists = kb__nats_topic_exists(t, tp);   /* no stream made for a missing ID */
    if (exists != KB_OK)
        return exists;
    jsErrCode jerr = 0;
    natsStatus s = js_GetMsg(m, t->js, tp->stream, *seq, NULL, &jerr);
    if (s != NATS_OK || strcmp(natsMsg_GetSubject(*m), tp->dlq_subject) != 0) {
        natsMsg_Destroy(*m);
        *m = NULL;
        kb_errf(NULL, 0, "nats: no dead letter %s in %s", id, tp->stream);
        return KB_ENOTFOUND;
    }
    return KB_OK;
}

int kb__nats_dead_letter_delete(kb_transport *t, kb_nats_topic *tp, const char *id)
{
    uint64_t seq;
    natsMsg *m = NULL;
    int rc = get_dead_letter(t, tp, id, &seq, &m);
    natsMsg_Destroy(m);
    if (rc != KB_OK)
        return rc;
    jsErrCode jerr = 0;
    natsStatus s = js_DeleteMsg(t->js, tp->stream, seq, NULL, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSSequenceNotFoundErr) {
        kb_errf(NULL, 0, "nats: no dead letter %s in %s (removed meanwhile)", id, tp->stream);
        return KB_ENOTFOUND;
    }
    return s == NATS_OK ? KB_OK : kb__nats_errf("removing the dead letter", s, jerr);
}

int kb__nats_dead_letter_replay(kb_transport *t, kb_nats_topic *tp, const char *id)
{
    uint64_t seq;
    natsMsg *m = NULL;
    int rc = get_dead_letter(t, tp, id, &seq, &m);
    if (rc != KB_OK)
        return rc;
    jsErrCode jerr = 0;
    natsStatus s;
    char *key = malloc(KB_NATS_DLQ_KEY_CAP);
    kb_nats_hdrs *h = calloc(1, sizeof *h);
    const char *why = "out of memory";
    int klen = key && h ? kb__nats_get_key(m, key, KB_NATS_DLQ_KEY_CAP, &why) : -1;
    if (klen > 0 && kb__nats_hdr_get(t, m, h, &why) != 0)
        klen = -1;
    const char *omitted = NULL;
    if (key && h && natsMsgHeader_Get(m, KB_NATS_OMITTED_HDR, &omitted) == NATS_OK) {
        klen = -1;
        why = "it is a reference: its body was not kept with it (over a limit, or too large "
              "for the server); the original is at Kb-Orig-Id";
    }
    if (klen <= 0) {
        natsMsg_Destroy(m);
        if (h != NULL)
            kb__nats_hdrs_free(h);
        free(h);
        free(key);
        kb_errf(NULL, 0, "nats: dead letter %s cannot be replayed: %s", id, why);
        return KB_EINVAL;
    }
    kb_msg msg = {key, (size_t)klen, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m),
                  kb_fnv1a32(key, (size_t)klen), h->n ? h->h : NULL, h->n};
    /* A refused republish is only counted (its report says so): the dead
     * letter stays then. Another publish refused meanwhile keeps it too. */
    uint64_t refused = atomic_load(&t->pub_refused);
    rc = kb__nats_publish(t, tp, &msg);
    if (rc == KB_OK)
        rc = kb__nats_flush_until(t, kb_deadline_ns((int)t->publish_timeout_ms));
    if (rc == KB_OK && atomic_load(&t->pub_refused) != refused) {
        kb_errf(NULL, 0, "nats: dead letter %s kept: the server refused its republish (or "
                "another publish of this bus meanwhile)", id);
        rc = KB_ETRANSPORT;
    }
    if (rc == KB_OK)
        kb_log(t->bus, KB_LOG_INFO, "nats %s: dead letter %s of %s replayed to partition %u "
               "(its key's)", t->url_safe, id, tp->name, kb_partition_of(key, (size_t)klen,
                                                                          t->partitions));
    if (rc == KB_OK && (s = js_DeleteMsg(t->js, tp->stream, seq, NULL, &jerr)) != NATS_OK)
        rc = kb__nats_errf("removing the replayed dead letter", s, jerr);
    natsMsg_Destroy(m);
    kb__nats_hdrs_free(h);
    free(h);
    free(key);
    return rc;
}
