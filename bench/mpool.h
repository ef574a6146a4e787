/* A naive keyed pool, the yardstick beside kb_pool: `threads` workers, each a
 * bounded queue behind one mutex and two condition variables; key hash ->
 * lane (hash % 1024) -> worker (lane % threads). Same ordering guarantee as
 * kb_pool, none of its lock-free machinery. */
#ifndef KB_BENCH_MPOOL_H
#define KB_BENCH_MPOOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kb_mpool kb_mpool;
typedef void (*kb_mpool_fn)(void *item, void *opaque);

/* NULL on failure. capacity: items per worker queue. */
kb_mpool *kb_mpool_new(uint32_t threads, uint32_t capacity, kb_mpool_fn fn, void *opaque);
/* Blocks while the worker's queue is full. Thread: any. */
void kb_mpool_submit(kb_mpool *p, uint32_t hash, void *item);
/* Wait until every item submitted so far is handled. */
void kb_mpool_flush(kb_mpool *p);
/* Flush, stop the workers, free. */
void kb_mpool_destroy(kb_mpool *p);

#ifdef __cplusplus
}
#endif

#endif
