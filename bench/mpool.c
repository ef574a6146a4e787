/* kb_mpool: see mpool.h. */
#include <pthread.h>
#include <stdlib.h>

#include "mpool.h"

#define MPOOL_LANES 1024

struct worker {
    pthread_mutex_t lock;
    pthread_cond_t nonempty, nonfull, idle;
    void **q;
    uint64_t head, tail;    /* free-running: tail - head items queued */
    int busy, stop;
    pthread_t thread;
    kb_mpool *pool;
};

struct kb_mpool {
    uint32_t threads, capacity;
    kb_mpool_fn fn;
    void *opaque;
    struct worker *w;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    kb_mpool *p = w->pool;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (w->head == w->tail && !w->stop)
            pthread_cond_wait(&w->nonempty, &w->lock);
        if (w->head == w->tail)
            break;
        void *item = w->q[w->head++ % p->capacity];
        pthread_cond_signal(&w->nonfull);
        w->busy = 1;
        pthread_mutex_unlock(&w->lock);
        p->fn(item, p->opaque);
        pthread_mutex_lock(&w->lock);
        w->busy = 0;
        if (w->head == w->tail)
            pthread_cond_broadcast(&w->idle);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

kb_mpool *kb_mpool_new(uint32_t threads, uint32_t capacity, kb_mpool_fn fn, void *opaque)
{
    kb_mpool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    *p = (kb_mpool){.threads = threads ? threads : 1, .capacity = capacity ? capacity : 1,
                    .fn = fn, .opaque = opaque};
    p->w = calloc(p->threads, sizeof *p->w);
    if (p->w == NULL) {
        free(p);
        return NULL;
    }
    for (uint32_t i = 0; i < p->threads; i++) {
        struct worker *w = &p->w[i];
        w->pool = p;
        pthread_mutex_init(&w->lock, NULL);
        pthread_cond_init(&w->nonempty, NULL);
        pthread_cond_init(&w->nonfull, NULL);
        pthread_cond_init(&w->idle, NULL);
        w->q = malloc(sizeof *w->q * p->capacity);
        if (w->q == NULL || pthread_create(&w->thread, NULL, work, w) != 0) {
            p->threads = i;   /* destroy stops the ones that started */
            free(w->q);
            kb_mpool_destroy(p);
            return NULL;
        }
    }
    return p;
}

void kb_mpool_submit(kb_mpool *p, uint32_t hash, void *item)
{
    struct worker *w = &p->w[(hash % MPOOL_LANES) % p->threads];
    pthread_mutex_lock(&w->lock);
    while (w->tail - w->head == p->capacity)
        pthread_cond_wait(&w->nonfull, &w->lock);
    w->q[w->tail++ % p->capacity] = item;
    pthread_cond_signal(&w->nonempty);
    pthread_mutex_unlock(&w->lock);
}

void kb_mpool_flush(kb_mpool *p)
{
    for (uint32_t i = 0; i < p->threads; i++) {
        struct worker *w = &p->w[i];
        pthread_mutex_lock(&w->lock);
        while (w->head != w->tail || w->busy)
            pthread_cond_wait(&w->idle, &w->lock);
        pthread_mutex_unlock(&w->lock);
    }
}

void kb_mpool_destroy(kb_mpool *p)
{
    for (uint32_t i = 0; i < p->threads; i++) {
        struct worker *w = &p->w[i];
        pthread_mutex_lock(&w->lock);
        w->stop = 1;   /* the worker drains its queue first */
        pthread_cond_signal(&w->nonempty);
        pthread_mutex_unlock(&w->lock);
        pthread_join(w->thread, NULL);
        free(w->q);
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->nonempty);
        pthread_cond_destroy(&w->nonfull);
        pthread_cond_destroy(&w->idle);
    }
    free(p->w);
    free(p);
}
