/* Key-level retry (retry.scope = key): per lane, the aggregates waiting for a
 * retry, each with its items in arrival order (the one that asked for the
 * retry first, then the later ones of its key that were set aside). Slots
 * for the items are one growable array per lane, linked by index, so setting
 * an item aside allocates nothing once the lane has seen as many at once.
 * Thread: the lane's executor only. */
#ifndef KB_CORE_PARKED_H
#define KB_CORE_PARKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kb_lane;

/* One aggregate waiting for its retry. */
struct kb_waiting {
    struct kb_lane *lane;
    const void *key;                   /* the head item's key (every item's bytes) */
    size_t key_len;
    uint32_t hash;                     /* kb_fnv1a32 of the key: a cheap first compare */
    uint32_t attempt;                  /* the head item's next attempt */
    uint32_t head, tail;               /* the items, as slot indices */
    struct kb_waiting *next;           /* the lane's list, or its free list */
};

struct kb_parked {
    struct kb_waiting *waiting;        /* the lane's waiting aggregates */
    struct kb_waiting *spare;          /* recycled ones */
    void **item;                       /* slots: an item each ... */
    uint32_t *next;                    /* ... and the next slot of its aggregate */
    size_t cap;                        /* slots allocated */
    uint32_t max_slots;                /* never more: the lane's capacity and look-ahead */
    uint32_t free_slot;                /* first free slot (KB_SLOT_NONE: none yet) */
};

/* A lane's store, empty; NULL on out of memory. */
struct kb_parked *kb__parked_new(uint32_t max_slots);

/* The waiting aggregate with exactly these key bytes, or NULL. */
struct kb_waiting *kb__parked_find(const struct kb_parked *pk, const void *key, size_t key_len,
                                   uint32_t hash);

/* Start a waiting aggregate whose first item is `item` (key as given, valid
 * while the item waits). NULL when no slot or no memory: nothing changed. */
struct kb_waiting *kb__parked_open(struct kb_parked *pk, struct kb_lane *lane, void *item,
                                   const void *key, size_t key_len, uint32_t hash);

/* Append `item` behind w's items. false when the store is full (max_slots)
 * or out of memory: nothing changed. */
bool kb__parked_append(struct kb_parked *pk, struct kb_waiting *w, void *item);

/* w's first item. */
static inline void *kb__parked_head(const struct kb_parked *pk, const struct kb_waiting *w)
{
    return pk->item[w->head];
}

/* Drop w's first item (the caller finished it). false when w has no item
 * left: it is unlinked and recycled. Otherwise the caller points w->key at
 * the new head item's key (the finished one's bytes may be gone). */
bool kb__parked_pop(struct kb_parked *pk, struct kb_waiting *w);

/* Hand every item still held to `release` (w's head item first, with
 * `first` true), then free the store. */
void kb__parked_free(struct kb_parked *pk, void (*release)(void *item, bool first,
                                                             uint32_t attempt, void *arg),
                     void *arg);

#endif /* KB_CORE_PARKED_H */
