/* Topics: state per topic (topic_open), the index table and the stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"
#include "nats_names.h"
#include "nats_topic.h"

int kb__nats_topic_new(kb_transport *t, const char *name, kb_kit_backlog *backlog,
                       kb_nats_topic **out, char *errstr, size_t errlen)
{
    kb_nats_topic *tp = calloc(1, sizeof *tp);
    bool mem = tp == NULL || (tp->name = strdup(name)) == NULL ||
               (tp->subjects = calloc(t->partitions, sizeof *tp->subjects)) == NULL ||
               (tp->batches = calloc(t->partitions, sizeof *tp->batches)) == NULL ||
               (tp->tally.extra = calloc(t->partitions, sizeof *tp->tally.extra)) == NULL ||
               natsStatistics_Create(&tp->conn_stats) != NATS_OK;
    pthread_mutex_lock(&t->topics_lock);
    uint32_t idx = t->ntopics, chunk = idx / KB_NATS_TOPIC_CHUNK;
    kb_nats_topic **slots = chunk < KB_NATS_TOPIC_CHUNKS ? atomic_load(&t->topic_chunks[chunk]) : NULL;
    if (!mem && chunk < KB_NATS_TOPIC_CHUNKS && slots == NULL) {
        slots = calloc(KB_NATS_TOPIC_CHUNK, sizeof *slots);
        atomic_store_explicit(&t->topic_chunks[chunk], slots, memory_order_release);
    }
    if (mem || slots == NULL) {
        pthread_mutex_unlock(&t->topics_lock);
        if (tp != NULL) {
            natsStatistics_Destroy(tp->conn_stats);
            free(tp->tally.extra);
            free(tp->batches);
            free(tp->subjects);
            free(tp->name);
            free(tp);
        }
        kb_kit_backlog_free(backlog);
        kb_errf(errstr, errlen, chunk < KB_NATS_TOPIC_CHUNKS ? "nats: out of memory for topic %s"
                                                             : "nats: too many topics for %s",
                name);
        return chunk < KB_NATS_TOPIC_CHUNKS ? KB_ENOMEM : KB_EINVAL;
    }
    tp->index = idx;
    tp->backlog = backlog;
    pthread_mutex_init(&tp->send_mu, NULL);
    tp->hash = kb_fnv1a32(name, strlen(name));
    kb__nats_stream_name(tp->stream, sizeof tp->stream, name);
    snprintf(tp->dlq_subject, sizeof tp->dlq_subject, "kb.%s.dlq", name);
    for (uint32_t i = 0; i < t->partitions; i++) {
        snprintf(tp->subjects[i], sizeof tp->subjects[i], "kb.%s.%u", name, i);
        pthread_mutex_init(&tp->batches[i].mu, NULL);
    }
    slots[idx % KB_NATS_TOPIC_CHUNK] = tp;
    t->ntopics = idx + 1;
    tp->next = atomic_load_explicit(&t->topics, memory_order_relaxed);
    atomic_store_explicit(&t->topics, tp, memory_order_release);
    pthread_mutex_unlock(&t->topics_lock);
    *out = tp;
    return KB_OK;
}

uint32_t kb__nats_stated_partitions(const char *desc)
{
    const char *at = desc != NULL ? strstr(desc, KB_NATS_PARTS_DESC) : NULL;
    if (at == NULL)
        return 0;
    at += strlen(KB_NATS_PARTS_DESC);
    size_t n = strspn(at, "0123456789");
    if (n == 0 || n > 9)
        return 0;
    return (uint32_t)strtoul(at, NULL, 10);
}

int kb__nats_parts_mismatch(kb_transport *t, kb_nats_topic *tp, uint32_t stated)
{
    kb_errf(NULL, 0, "nats: topic %s has partitions=%u in stream %s on %s but this process "
            "is configured with partitions=%u; use the stored count", tp->name, stated,
            tp->stream, t->url_safe, t->partitions);
    return KB_EINVAL;
}

static int mismatch(kb_transport *t, kb_nats_topic *tp)
{
    uint32_t stated = atomic_load(&tp->stored_parts);
    if (stated != t->partitions)
        return kb__nats_parts_mismatch(t, tp, stated);
    kb_errf(NULL, 0, "nats: topic %s has replicas=%d in stream %s on %s but this process is "
            "configured with nats.replicas=%d; the stream is not changed (set the same "
            "count, or change the stream's replicas with the nats CLI)", tp->name,
            atomic_load(&tp->stored_replicas), tp->stream, t->url_safe, t->replicas);
    return KB_EINVAL;
}

/* A stream an older keybus made states no count: it takes this process's
 * (its other settings kept; an operator's description follows ours). */
static natsStatus adopt(kb_transport *t, kb_nats_topic *tp, const jsStreamInfo *si,
                        jsErrCode *jerr)
{
    const char *old = si->Config->Description;
    size_t len = strlen(KB_NATS_PARTS_DESC) + 12 + (old != NULL ? strlen(old) + 1 : 0);
    char *desc = malloc(len);
    if (desc == NULL)
        return NATS_NO_MEMORY;
    snprintf(desc, len, "%s%u%s%s", KB_NATS_PARTS_DESC, t->partitions,
             old != NULL && old[0] ? " " : "", old != NULL ? old : "");
    jsStreamConfig cfg = *si->Config;
    cfg.Description = desc;
    jsStreamInfo *upd = NULL;
    natsStatus s = js_UpdateStream(&upd, t->js, &cfg, NULL, jerr);
    jsStreamInfo_Destroy(upd);
    free(desc);
    if (s == NATS_OK)
        kb_log(t->bus, KB_LOG_NOTICE,
               "nats %s: stream %s stated no partition count: it is partitions=%u from now on",
               t->url_safe, tp->stream, t->partitions);
    return s;
}

/* The count the topic's existing stream states (adopting ours when it states
 * none) into tp->stored_parts, its replicas into tp->stored_replicas. */
static natsStatus read_count(kb_transport *t, kb_nats_topic *tp, jsErrCode *jerr)
{
    jsStreamInfo *si = NULL;
    natsStatus s = js_GetStreamInfo(&si, t->js, tp->stream, NULL, jerr);
    if (s != NATS_OK)
        return s;
    uint32_t n = kb__nats_stated_partitions(si->Config->Description);
    atomic_store(&tp->stored_replicas, (int)si->Config->Replicas);
    if (n == 0 && (s = adopt(t, tp, si, jerr)) == NATS_OK)
        n = t->partitions;
    jsStreamInfo_Destroy(si);
    atomic_store(&tp->stored_parts, n);
    return s;
}

int kb__nats_topic_ready(kb_transport *t, kb_nats_topic *tp)
{
    int state = atomic_load_explicit(&tp->stream_ready, memory_order_acquire);
    if (state != 0)
        return state > 0 ? KB_OK : mismatch(t, tp);
    pthread_mutex_lock(&t->topics_lock);
    natsStatus s = NATS_OK;
    jsErrCode jerr = 0;
    /* One round trip when the stream is new or as we make it: create it with
     * the partition count in its Description. Another configuration (limits
     * an operator set, an older keybus's stream, other replicas) costs a look
     * at its count and replicas. */
    if (atomic_load(&tp->stream_ready) == 0) {
        char subj[KB_NATS_NAME], desc[64];
        snprintf(subj, sizeof subj, "kb.%s.*", tp->name);
        snprintf(desc, sizeof desc, "%s%u", KB_NATS_PARTS_DESC, t->partitions);
        const char *subjects[] = {subj};
        jsStreamConfig cfg;
        jsStreamConfig_Init(&cfg);
        cfg.Name = tp->stream;
        cfg.Description = desc;
        cfg.Subjects = subjects;
        cfg.SubjectsLen = 1;
        cfg.Storage = t->storage;
        cfg.Replicas = t->replicas;
        cfg.Duplicates = t->dup_window_ms * 1000000;
        cfg.AllowDirect = true;   /* dead letters are listed with direct gets */
        jsStreamInfo *si = NULL;
        s = js_AddStream(&si, t->js, &cfg, NULL, &jerr);
        if (s == NATS_OK) {
            atomic_store(&tp->stored_parts, kb__nats_stated_partitions(si->Config->Description));
            atomic_store(&tp->stored_replicas, (int)si->Config->Replicas);
        }
        jsStreamInfo_Destroy(si);
        if (jerr == JSStreamNameExistErr) {
            jerr = 0;
            s = read_count(t, tp, &jerr);
        }
        if (s == NATS_OK) {
            bool same = atomic_load(&tp->stored_parts) == t->partitions &&
                        atomic_load(&tp->stored_replicas) == t->replicas;
            if (!same) {
                mismatch(t, tp);
                kb_log(t->bus, KB_LOG_ERROR, "%s", kb_last_error());
            }
            atomic_store_explicit(&tp->stream_ready, same ? 1 : -1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&t->topics_lock);
    if (s != NATS_OK) {
        int rc = kb__nats_errf(tp->stream, s, jerr);
        return rc == KB_ENOMEM ? rc : KB_ETRANSPORT;
    }
    return atomic_load(&tp->stream_ready) > 0 ? KB_OK : mismatch(t, tp);
}

int kb__nats_topic_exists(kb_transport *t, kb_nats_topic *tp)
{
    if (atomic_load_explicit(&tp->stream_ready, memory_order_acquire) != 0)
        return KB_OK;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, t->js, tp->stream, NULL, &jerr);
    jsStreamInfo_Destroy(si);
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
        kb_errf(NULL, 0, "nats: topic %s has no stream (%s): never published or subscribed",
                 tp->name, tp->stream);
        return KB_ENOTFOUND;
    }
    if (s != NATS_OK) {
        int rc = kb__nats_errf(tp->stream, s, jerr);
        return rc == KB_ENOMEM ? rc : KB_ETRANSPORT;
    }
    return KB_OK;
}

uint64_t kb__nats_topic_free(kb_transport *t, kb_nats_topic *tp)
{
    uint64_t unsent = 0;
    if (tp->parts != NULL)
        kb__nats_claims_free(tp, t->partitions);
    for (uint32_t i = 0; i < t->partitions; i++) {
        unsent += tp->batches[i].count;
        free(tp->batches[i].buf);
        free(tp->batches[i].keys);
        pthread_mutex_destroy(&tp->batches[i].mu);
    }
    kb_kit_backlog_free(tp->backlog);
    pthread_mutex_destroy(&tp->send_mu);
    natsStatistics_Destroy(tp->conn_stats);
    free(tp->parts);
    free(tp->batches);
    free(tp->tally.extra);
    free(tp->subjects);
    free(tp->name);
    free(tp);
    return unsent;
}
