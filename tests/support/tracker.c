#include "tracker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kb_tracker_init(kb_tracker *t, uint32_t keys)
{
    memset(t, 0, sizeof *t);
    t->keys = keys;
    t->last = calloc(keys, sizeof *t->last);
    t->busy = calloc(keys, sizeof *t->busy);
}

void kb_tracker_destroy(kb_tracker *t)
{
    free(t->last);
    free((void *)t->busy);
}

int kb_tracker_publish(kb_bus *b, const char *topic, uint32_t key, uint32_t seq,
                       size_t payload_bytes)
{
    char k[32];
    int klen = snprintf(k, sizeof k, "agg-%u", key);
    unsigned char payload[4096] = {0};
    if (payload_bytes < 8)
        payload_bytes = 8;
    if (payload_bytes > sizeof payload)
        payload_bytes = sizeof payload;
    memcpy(payload, &key, 4);
    memcpy(payload + 4, &seq, 4);
    return kb_publish(b, topic, k, (size_t)klen, payload, payload_bytes);
}

void kb_tracker_decode(const kb_event *ev, uint32_t *key, uint32_t *seq)
{
    *key = UINT32_MAX;
    *seq = 0;
    if (ev->payload_len >= 8) {
        memcpy(key, ev->payload, 4);
        memcpy(seq, (const char *)ev->payload + 4, 4);
    }
}

int kb_tracker_handler(const kb_event *ev, void *opaque)
{
    kb_tracker *t = opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (key >= t->keys) {
        t->order_violations++;
        return KB_HANDLED;
    }
    if (atomic_fetch_add(&t->busy[key], 1) != 0)
        t->concurrent++;
    if (seq == t->last[key] + 1)
        __atomic_store_n(&t->last[key], seq, __ATOMIC_RELAXED);   /* read by kb_tracker_distinct */
    else if (seq <= t->last[key])
        t->duplicates++;
    else
        t->order_violations++;
    t->handled++;
    atomic_fetch_sub(&t->busy[key], 1);
    return KB_HANDLED;
}

uint64_t kb_tracker_distinct(const kb_tracker *t)
{
    uint64_t n = 0;
    for (uint32_t k = 0; k < t->keys; k++)
        n += __atomic_load_n(&t->last[k], __ATOMIC_RELAXED);
    return n;
}
