/* Checks what handlers see: per-key order, loss, duplicates, and whether two
 * handlers of one key ever overlapped. Events carry (key index, sequence). */
#ifndef KB_TEST_TRACKER_H
#define KB_TEST_TRACKER_H

#include <stdatomic.h>
#include <stdint.h>

#include <keybus/keybus.h>

typedef struct kb_tracker {
    uint32_t keys;
    uint32_t *last;                   /* last in-order sequence per key (1-based) */
    _Atomic uint32_t *busy;           /* handlers of the key running now */
    _Atomic uint64_t handled;         /* handler calls that returned KB_HANDLED */
    _Atomic uint64_t order_violations;/* a sequence arrived before its predecessor */
    _Atomic uint64_t duplicates;      /* a sequence seen again (redelivery) */
    _Atomic uint64_t concurrent;      /* two handlers of one key at once */
} kb_tracker;

void kb_tracker_init(kb_tracker *t, uint32_t keys);
void kb_tracker_destroy(kb_tracker *t);

/* Publish event `seq` (1, 2, ...) of key index `key` with a payload of
 * `payload_bytes` (at least 8). */
int kb_tracker_publish(kb_bus *b, const char *topic, uint32_t key, uint32_t seq,
                       size_t payload_bytes);

/* Key index and sequence of an event published by kb_tracker_publish. */
void kb_tracker_decode(const kb_event *ev, uint32_t *key, uint32_t *seq);

/* Record one event; pass as the kb_handler_fn with the tracker as opaque. */
int kb_tracker_handler(const kb_event *ev, void *opaque);

/* Events seen in order without a gap: equals the number published when
 * nothing was lost. */
uint64_t kb_tracker_distinct(const kb_tracker *t);

#endif /* KB_TEST_TRACKER_H */
