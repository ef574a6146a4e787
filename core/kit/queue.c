/* The settled-prefix pending queue: deliveries in log order, settled in any
 * order; the committed offset is the end of the settled prefix, so it never
 * passes an event that is not settled. One mutex per partition: a settle
 * touches only its own partition's queue. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kit_int.h"

enum { PENDING_OUT = 0, PENDING_SETTLED = 1, PENDING_RELEASED = 2 };

struct kb_kit_pending {
    kb_kit_pending *next;
    kb_kit_queue *q;
    uint64_t end;
    uint64_t generation;
    int state;                    /* under q->lock */
};

struct kb_kit_queue {
    pthread_mutex_t lock;
    kb_kit_pending *head, *tail;  /* log order */
    _Atomic size_t outstanding;   /* PENDING_OUT entries: changed under lock, read without */
    _Atomic uint64_t committed;
    uint32_t partition;
    kb_signal *moved;
};

kb_kit_queue *kb_kit_queue_new(uint32_t partition, uint64_t committed, kb_signal *moved)
{
    kb_kit_queue *q = calloc(1, sizeof *q);
    if (q == NULL) {
        kb_errf(NULL, 0, "kit: out of memory for the pending queue of partition %u", partition);
        return NULL;
    }
    pthread_mutex_init(&q->lock, NULL);
    atomic_init(&q->committed, committed);
    q->partition = partition;
    q->moved = moved;
    return q;
}

static void free_entries(kb_kit_queue *q)
{
    for (kb_kit_pending *pe = q->head, *next; pe != NULL; pe = next) {
        next = pe->next;
        free(pe);
    }
    q->head = q->tail = NULL;
}

void kb_kit_queue_free(kb_kit_queue *q)
{
    if (q == NULL)
        return;
    free_entries(q);
    pthread_mutex_destroy(&q->lock);
    free(q);
}

int kb_kit_queue_push(kb_kit_queue *q, uint64_t end, uint64_t generation, kb_kit_pending **out)
{
    kb_kit_pending *pe = calloc(1, sizeof *pe);
    if (pe == NULL) {
        kb_errf(NULL, 0, "kit: out of memory for a delivery of partition %u", q->partition);
        return KB_ENOMEM;
    }
    pe->q = q;
    pe->end = end;
    pe->generation = generation;
    pthread_mutex_lock(&q->lock);
    if (q->tail != NULL)
        q->tail->next = pe;
    else
        q->head = pe;
    q->tail = pe;
    atomic_fetch_add_explicit(&q->outstanding, 1, memory_order_relaxed);
    pthread_mutex_unlock(&q->lock);
    *out = pe;
    return KB_OK;
}

void kb_kit_queue_cancel(kb_kit_queue *q, kb_kit_pending *pe)
{
    pthread_mutex_lock(&q->lock);
    kb_kit_pending **link = &q->head, *prev = NULL;
    while (*link != pe) {
        prev = *link;
        link = &(*link)->next;
    }
    *link = NULL;   /* pe is the tail: the feeder pushed it last */
    q->tail = prev;
    atomic_fetch_sub_explicit(&q->outstanding, 1, memory_order_release);
    pthread_mutex_unlock(&q->lock);
    free(pe);
}

int kb_kit_settle(kb_kit_pending *pe)
{
    kb_kit_queue *q = pe->q;
    int moved = 0;
    pthread_mutex_lock(&q->lock);
    pe->state = PENDING_SETTLED;
    while (q->head != NULL && q->head->state == PENDING_SETTLED) {
        kb_kit_pending *first = q->head;
        /* release: a reader of the offset (drain, the offset's writer) sees
         * every effect of the handlers before it */
        atomic_store_explicit(&q->committed, first->end, memory_order_release);
        q->head = first->next;
        if (q->head == NULL)
            q->tail = NULL;
        free(first);
        moved = 1;
    }
    /* after the offset: whoever sees the queue idle reads the offset it left */
    atomic_fetch_sub_explicit(&q->outstanding, 1, memory_order_release);
    pthread_mutex_unlock(&q->lock);
    if (moved && q->moved != NULL)
        kb_signal_notify(q->moved);
    return moved;
}

void kb_kit_release(kb_kit_pending *pe)
{
    kb_kit_queue *q = pe->q;
    pthread_mutex_lock(&q->lock);
    pe->state = PENDING_RELEASED;
    atomic_fetch_sub_explicit(&q->outstanding, 1, memory_order_release);
    pthread_mutex_unlock(&q->lock);
}

uint32_t kb_kit_pending_partition(const kb_kit_pending *pe)
{
    return pe->q->partition;
}

uint64_t kb_kit_pending_end(const kb_kit_pending *pe)
{
    return pe->end;
}

uint64_t kb_kit_pending_generation(const kb_kit_pending *pe)
{
    return pe->generation;
}

uint64_t kb_kit_queue_committed(const kb_kit_queue *q)
{
    return atomic_load_explicit(&q->committed, memory_order_acquire);
}

size_t kb_kit_queue_outstanding(const kb_kit_queue *q)
{
    return atomic_load_explicit(&q->outstanding, memory_order_acquire);
}

int kb_kit_queue_restart(kb_kit_queue *q, uint64_t committed)
{
    pthread_mutex_lock(&q->lock);
    size_t out = atomic_load_explicit(&q->outstanding, memory_order_relaxed);
    if (out == 0) {
        free_entries(q);   /* released ones: the new read position covers them */
        atomic_store_explicit(&q->committed, committed, memory_order_release);
    }
    pthread_mutex_unlock(&q->lock);
    if (out != 0) {
        kb_errf(NULL, 0, "kit: partition %u: %zu deliveries still outstanding", q->partition, out);
        return KB_EINVAL;
    }
    return KB_OK;
}
