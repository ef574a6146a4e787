/* Topics: state per topic (topic_open), the index table and the stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_claim.h"
#include "nats_names.h"
#include "nats_topic.h"

int kb__nats_topic_new(kb_transport *t, const char *name, kb_nats_topic **out, char *errstr,
                       size_t errlen)
{
    kb_nats_topic *tp = calloc(1, sizeof *tp);
    bool mem = tp == NULL || (tp->name = strdup(name)) == NULL ||
               (tp->subjects = calloc(t->partitions, sizeof *tp->subjects)) == NULL ||
               (tp->batches = calloc(t->partitions, sizeof *tp->batches)) == NULL ||
               (tp->tally.extra = calloc(t->partitions, sizeof *tp->tally.extra)) == NULL;
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
            free(tp->tally.extra);
            free(tp->batches);
            free(tp->subjects);
            free(tp->name);
            free(tp);
        }
        kb_errf(errstr, errlen, chunk < KB_NATS_TOPIC_CHUNKS ? "nats: out of memory for topic %s"
                                                             : "nats: too many topics for %s",
                name);
        return chunk < KB_NATS_TOPIC_CHUNKS ? KB_ENOMEM : KB_EINVAL;
    }
    tp->index = idx;
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

kb_nats_topic *kb__nats_topic_at(kb_transport *t, uint32_t index)
{
    uint32_t chunk = index / KB_NATS_TOPIC_CHUNK;
    kb_nats_topic **slots = chunk < KB_NATS_TOPIC_CHUNKS
                                ? atomic_load_explicit(&t->topic_chunks[chunk], memory_order_acquire)
                                : NULL;
    return slots != NULL ? slots[index % KB_NATS_TOPIC_CHUNK] : NULL;
}

int kb__nats_topic_ready(kb_transport *t, kb_nats_topic *tp)
{
    if (atomic_load_explicit(&tp->stream_ready, memory_order_acquire))
        return KB_OK;
    pthread_mutex_lock(&t->topics_lock);
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = atomic_load(&tp->stream_ready) ? NATS_OK : NATS_NOT_FOUND;
    /* One round trip: create, and take "exists" (same or another
     * configuration, e.g. limits an operator set) as ready. */
    if (s != NATS_OK) {
        char subj[KB_NATS_NAME];
        snprintf(subj, sizeof subj, "kb.%s.*", tp->name);
        const char *subjects[] = {subj};
        jsStreamConfig cfg;
        jsStreamConfig_Init(&cfg);
        cfg.Name = tp->stream;
        cfg.Subjects = subjects;
        cfg.SubjectsLen = 1;
        cfg.Storage = t->storage;
        cfg.Duplicates = t->dup_window_ms * 1000000;
        cfg.AllowDirect = true;   /* dead letters are listed with direct gets */
        jerr = 0;
        s = js_AddStream(&si, t->js, &cfg, NULL, &jerr);
        jsStreamInfo_Destroy(si);
        if (jerr == JSStreamNameExistErr)
            s = NATS_OK;
    }
    if (s == NATS_OK)
        atomic_store_explicit(&tp->stream_ready, 1, memory_order_release);
    pthread_mutex_unlock(&t->topics_lock);
    return s == NATS_OK ? KB_OK : kb__nats_errf(tp->stream, s, jerr);
}

uint64_t kb__nats_topic_free(kb_transport *t, kb_nats_topic *tp)
{
    uint64_t unsent = 0;
    if (tp->parts != NULL)
        kb__nats_claims_free(tp, t->partitions);
    for (uint32_t i = 0; i < t->partitions; i++) {
        unsent += tp->batches[i].count;
        free(tp->batches[i].buf);
        pthread_mutex_destroy(&tp->batches[i].mu);
    }
    free(tp->parts);
    free(tp->batches);
    free(tp->tally.extra);
    free(tp->subjects);
    free(tp->name);
    free(tp);
    return unsent;
}
