/* Metrics recording (docs/metrics.md): per-topic histograms of
 * publish-to-handle latency and handler duration, kept per executor so that
 * recording is a plain store by the one thread that owns the slot, and
 * merged on read (kb__topic_view). Collecting and exposing them is the serve
 * floor's (core/serve/). */
#ifndef KB_CORE_METRICS_H
#define KB_CORE_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "bus_int.h"

/* The buckets are bus_calls.h's. The first bucket whose bound reaches 2^i ns, for i < 35 (2^34 ns > 10 s):
 * a value's bucket is then at most two steps on, since neighbouring bounds
 * are at least 2x apart. */
extern const uint8_t kb__hist_from_log2[35];

struct kb_hist {
    _Atomic uint64_t bucket[KB_HIST_BOUNDS + 1];   /* not cumulative */
    _Atomic uint64_t sum_ns;
};

/* One executor's slot of a topic: written by that executor only. */
struct kb_exec_metrics {
    _Alignas(KB_CACHELINE) struct kb_hist latency;   /* publish (or receipt) to handler start */
    struct kb_hist duration;                         /* handler run */
};

struct kb_topic_metrics {
    uint32_t n;                        /* executors of the bus */
    struct kb_exec_metrics *ex;
};

/* A topic's histograms, when metrics.enabled; NULL otherwise (or out of
 * memory: the topic then goes without). Freed with kb__topic_metrics_free. */
struct kb_topic_metrics *kb__topic_metrics_new(const kb_bus *b);
void kb__topic_metrics_free(struct kb_topic_metrics *m);

/* ns per TSC tick << 32 when the TSC is invariant (x86-64: constant_tsc and
 * nonstop_tsc), else 0; set once by the first kb__topic_metrics_new. */
extern uint64_t kb__tsc_mult;

/* The metrics clock in ns, its origin arbitrary: the TSC scaled where it is
 * invariant (reading kvm-clock through the vDSO costs two to three times as
 * much, and histograms read it three times per event), else the monotonic
 * clock. */
static inline int64_t kb__metrics_clock(void)
{
#if defined(__x86_64__)
    if (kb__tsc_mult != 0)
        return (int64_t)(((unsigned __int128)__rdtsc() * kb__tsc_mult) >> 32);
#endif
    return kb__now_ns();
}

/* The clock when the topic records histograms, else 0 (no clock read). */
static inline int64_t kb__metrics_stamp(const struct kb_topic *t)
{
    return t->metrics != NULL ? kb__metrics_clock() : 0;
}

static inline void kb__hist_add(struct kb_hist *h, int64_t ns)
{
    unsigned log2 = ns > 0 ? 63u - (unsigned)__builtin_clzll((uint64_t)ns) : 0;
    unsigned i = log2 < 35 ? kb__hist_from_log2[log2] : KB_HIST_BOUNDS;
    /* two steps at most, without branches (the bounds end with INT64_MAX) */
    i += ns > kb__hist_bound_ns[i];
    i += ns > kb__hist_bound_ns[i];
    /* single writer: plain loads and stores, no locked instruction */
    atomic_store_explicit(&h->bucket[i],
                          atomic_load_explicit(&h->bucket[i], memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&h->sum_ns,
                          atomic_load_explicit(&h->sum_ns, memory_order_relaxed) + (uint64_t)ns,
                          memory_order_relaxed);
}

/* A handler run on executor `ex` began at `start` (kb__metrics_stamp) and
 * has just returned; `born` is the record's stamp. The latency counts first
 * runs only: a retry's wait is the backoff, not the bus. */
static inline void kb__metrics_ran(const struct kb_topic *t, uint32_t ex, int64_t born,
                                   int64_t start, uint32_t attempt)
{
    if (t->metrics == NULL || start == 0)
        return;
    struct kb_exec_metrics *m = &t->metrics->ex[ex];
    if (attempt == 1 && born != 0)
        kb__hist_add(&m->latency, start > born ? start - born : 0);
    int64_t end = kb__metrics_clock();
    kb__hist_add(&m->duration, end > start ? end - start : 0);
}

#endif /* KB_CORE_METRICS_H */
