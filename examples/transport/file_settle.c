/* Settling: executors ack or dead-letter deliveries in any order across keys,
 * but a partition's committed offset may only pass events that are all
 * settled (at-least-once: a restart resumes there). Each partition keeps its
 * deliveries in log order; the committed offset follows the settled prefix. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_int.h"

int kb__file_pending_push(struct kb__file_part *p, uint64_t end, struct kb__file_pending **out)
{
    struct kb__file_pending *pe = calloc(1, sizeof *pe);
    if (pe == NULL) {
        kb_errf(NULL, 0, "file: out of memory for a delivery");
        return KB_ENOMEM;
    }
    pe->part = p;
    pe->end = end;
    pthread_mutex_lock(&p->lock);
    if (p->tail != NULL)
        p->tail->next = pe;
    else
        p->head = pe;
    p->tail = pe;
    p->in_flight++;
    pthread_mutex_unlock(&p->lock);
    *out = pe;
    return KB_OK;
}

/* Take back the delivery pushed last, which the sink refused: it is read
 * again later. Reader thread (the only one that pushes). */
void kb__file_pending_cancel(struct kb__file_part *p, struct kb__file_pending *pe)
{
    pthread_mutex_lock(&p->lock);
    struct kb__file_pending **link = &p->head, *prev = NULL;
    while (*link != pe) {
        prev = *link;
        link = &(*link)->next;
    }
    *link = NULL;   /* pe is the tail */
    p->tail = prev;
    p->in_flight--;
    pthread_mutex_unlock(&p->lock);
    free(pe);
}

/* Executor threads. The file is written later by the reader thread (one
 * pwrite per tick, not one per ack); kb_drain reads the value in memory. */
void kb__file_settle(kb_transport *t, struct kb__file_pending *pe)
{
    struct kb__file_part *p = pe->part;
    int moved = 0;
    pthread_mutex_lock(&p->lock);
    pe->done = 1;
    while (p->head != NULL && p->head->done) {
        struct kb__file_pending *first = p->head;
        atomic_store_explicit(&p->committed, first->end, memory_order_release);
        p->head = first->next;
        if (p->head == NULL)
            p->tail = NULL;
        p->in_flight--;
        free(first);
        moved = 1;
    }
    pthread_mutex_unlock(&p->lock);
    if (moved)
        kb_signal_notify(t->settled);
}

/* Close: deliveries released unhandled stay in the queue (not settled, so
 * the next owner delivers them again); free them with the partition. */
void kb__file_pending_free_all(struct kb__file_part *p)
{
    for (struct kb__file_pending *pe = p->head, *next; pe != NULL; pe = next) {
        next = pe->next;
        free(pe);
    }
    p->head = p->tail = NULL;
    p->in_flight = 0;
}

/* Store the committed offset if it moved. Reader thread, or close. */
int kb__file_commit_write(struct kb__file_part *p)
{
    uint64_t c = atomic_load_explicit(&p->committed, memory_order_acquire);
    if (c == p->committed_written)
        return KB_OK;
    if (pwrite(p->offset_fd, &c, sizeof c, 0) != (ssize_t)sizeof c) {
        kb_errf(NULL, 0, "file: partition %u: storing the committed offset: %s", p->index,
                strerror(errno));
        return KB_ETRANSPORT;
    }
    p->committed_written = c;
    return KB_OK;
}

/* The group's committed offset: ours while we own the partition (the file
 * lags it by a tick), else what the owner last stored. Thread: any. */
uint64_t kb__file_committed(struct kb__file_part *p)
{
    if (atomic_load_explicit(&p->owned, memory_order_acquire))
        return atomic_load_explicit(&p->committed, memory_order_acquire);
    uint64_t c = 0;
    if (pread(p->offset_fd, &c, sizeof c, 0) != (ssize_t)sizeof c)
        c = 0;   /* no consumer has committed anything yet */
    return c;
}
