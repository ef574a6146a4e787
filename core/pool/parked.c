#include "parked.h"

#include <stdlib.h>
#include <string.h>

#define KB_SLOT_NONE UINT32_MAX
/* Slots a lane's store starts with; it doubles up to max_slots. */
#define FIRST_SLOTS 16

struct kb_parked *kb__parked_new(uint32_t max_slots)
{
    struct kb_parked *pk = calloc(1, sizeof *pk);
    if (pk != NULL) {
        pk->max_slots = max_slots;
        pk->free_slot = KB_SLOT_NONE;
    }
    return pk;
}

struct kb_waiting *kb__parked_find(const struct kb_parked *pk, const void *key, size_t key_len,
                                   uint32_t hash)
{
    for (struct kb_waiting *w = pk->waiting; w != NULL; w = w->next)
        if (w->hash == hash && w->key_len == key_len && memcmp(w->key, key, key_len) == 0)
            return w;
    return NULL;
}

/* A free slot holding `item`, or KB_SLOT_NONE. Slots are linked by index,
 * so growing the arrays moves nothing that refers to them. */
static uint32_t slot_take(struct kb_parked *pk, void *item)
{
    uint32_t s = pk->free_slot;
    if (s != KB_SLOT_NONE) {
        pk->free_slot = pk->next[s];
    } else {
        /* every slot is taken: double the arrays, up to max_slots */
        if (pk->cap >= pk->max_slots)
            return KB_SLOT_NONE;
        size_t grow = pk->cap ? pk->cap * 2 : FIRST_SLOTS;
        if (grow > pk->max_slots)
            grow = pk->max_slots;
        void **items = realloc(pk->item, grow * sizeof *items);
        if (items == NULL)
            return KB_SLOT_NONE;
        pk->item = items;
        uint32_t *next = realloc(pk->next, grow * sizeof *next);
        if (next == NULL)
            return KB_SLOT_NONE;
        pk->next = next;
        for (size_t i = grow - 1; i > pk->cap; i--) {
            pk->next[i] = pk->free_slot;
            pk->free_slot = (uint32_t)i;
        }
        s = (uint32_t)pk->cap;
        pk->cap = grow;
    }
    pk->item[s] = item;
    pk->next[s] = KB_SLOT_NONE;
    return s;
}

struct kb_waiting *kb__parked_open(struct kb_parked *pk, struct kb_lane *lane, void *item,
                                   const void *key, size_t key_len, uint32_t hash)
{
    struct kb_waiting *w = pk->spare;
    if (w != NULL)
        pk->spare = w->next;
    else if ((w = malloc(sizeof *w)) == NULL)
        return NULL;
    uint32_t s = slot_take(pk, item);
    if (s == KB_SLOT_NONE) {
        w->next = pk->spare;
        pk->spare = w;
        return NULL;
    }
    *w = (struct kb_waiting){.lane = lane, .key = key, .key_len = key_len, .hash = hash,
                             .attempt = 1, .head = s, .tail = s, .next = pk->waiting};
    pk->waiting = w;
    return w;
}

bool kb__parked_append(struct kb_parked *pk, struct kb_waiting *w, void *item)
{
    uint32_t s = slot_take(pk, item);
    if (s == KB_SLOT_NONE)
        return false;
    pk->next[w->tail] = s;
    w->tail = s;
    return true;
}

bool kb__parked_pop(struct kb_parked *pk, struct kb_waiting *w)
{
    uint32_t s = w->head;
    w->head = pk->next[s];
    pk->next[s] = pk->free_slot;
    pk->free_slot = s;
    if (w->head != KB_SLOT_NONE)
        return true;
    struct kb_waiting **pp = &pk->waiting;
    while (*pp != w)
        pp = &(*pp)->next;
    *pp = w->next;
    w->next = pk->spare;
    pk->spare = w;
    return false;
}

static void free_list(struct kb_waiting *w)
{
    for (struct kb_waiting *next; w != NULL; w = next) {
        next = w->next;
        free(w);
    }
}

void kb__parked_free(struct kb_parked *pk, void (*release)(void *item, bool first,
                                                             uint32_t attempt, void *arg),
                     void *arg)
{
    if (pk == NULL)
        return;
    for (struct kb_waiting *w = pk->waiting; w != NULL; w = w->next)
        for (uint32_t s = w->head; s != KB_SLOT_NONE; s = pk->next[s])
            release(pk->item[s], s == w->head, w->attempt, arg);
    free_list(pk->waiting);
    free_list(pk->spare);
    free(pk->item);
    free(pk->next);
    free(pk);
}
