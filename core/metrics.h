/* Metrics (docs/metrics.md): per-topic histograms of publish-to-handle
 * latency and handler duration, kept per executor so that recording is a
 * plain store by the one thread that owns the slot, and merged on read; the
 * snapshot of every figure that the Prometheus text (metrics_prom.c), the
 * HTTP endpoint (metrics_http.c) and the stats feed (stats_feed.c) share. */
#ifndef KB_CORE_METRICS_H
#define KB_CORE_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "bus_int.h"

/* Upper bounds of the histogram buckets, 1 µs to 10 s in a 1-2.5-5 series;
 * a last bucket (+Inf) takes the rest. */
#define KB_HIST_BOUNDS 22
extern const int64_t kb__hist_bound_ns[KB_HIST_BOUNDS + 2];   /* then INT64_MAX twice */
extern const char *const kb__hist_bound_text[KB_HIST_BOUNDS];   /* in seconds */
/* The first bucket whose bound reaches 2^i ns, for i < 35 (2^34 ns > 10 s):
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

/* ---- the snapshot every exposition is built from ---- */

typedef struct kb_hist_snap {
    uint64_t bucket[KB_HIST_BOUNDS + 1];   /* not cumulative */
    uint64_t count, sum_ns;
} kb_hist_snap;

typedef struct kb_metrics_part {
    kb_partition_stats ps;
    int rc;                            /* kb_partition_stats_get's result */
    bool lanes;                        /* the lane counters below are known */
    uint64_t received, handled, retried, dead_lettered;
} kb_metrics_part;

typedef struct kb_metrics_topic {
    char *name;
    kb_topic_stats s;
    int rc;                            /* kb_stats's result */
    bool pool;                         /* subscribed here */
    bool hist;                         /* latency and duration are recorded */
    kb_hist_snap latency, duration;
    uint32_t n_parts;
    kb_metrics_part *parts;            /* n_parts when `partitions` was asked */
} kb_metrics_topic;

typedef struct kb_metrics_snap {
    size_t n;
    kb_metrics_topic *t;               /* sorted by name */
} kb_metrics_snap;

/* Every topic the bus knows, with kb_stats figures, histograms and, when
 * `partitions`, the broker's view of each partition. KB_ECLOSED once kb_close
 * has begun, KB_ENOMEM; free with kb__metrics_snap_free either way. */
int kb__metrics_collect(kb_bus *b, bool partitions, kb_metrics_snap *out);
void kb__metrics_snap_free(kb_metrics_snap *s);

/* The Prometheus text of a snapshot, malloc'ed, NUL-terminated; NULL on out
 * of memory. */
char *kb__metrics_prom(const kb_metrics_snap *s, size_t *len);

/* The stats feed document and the /partitions document (cJSON, malloc'ed,
 * NUL-terminated); NULL on out of memory. */
char *kb__metrics_json(const kb_bus *b, const kb_metrics_snap *s, int64_t interval_ms);
char *kb__metrics_partitions_json(const kb_metrics_snap *s);

/* ---- the bus's metrics machinery: endpoint and stats feed ---- */

/* Start what the configuration asks for (metrics.listen, stats.interval_ms
 * with a callback). KB_EINVAL for a bad address, KB_ETRANSPORT when it cannot
 * listen (errstr names the address), KB_ENOMEM. */
int kb__metrics_open(kb_bus *b, char *errstr, size_t errlen);
/* Stop the endpoint and the feed (waiting for a request or callback in
 * progress). Idempotent. */
void kb__metrics_close(kb_bus *b);

/* The HTTP endpoint (metrics_http.c) and the feed thread (stats_feed.c). */
struct kb_metrics_http;
int kb__metrics_http_start(kb_bus *b, const char *listen, struct kb_metrics_http **out,
                           char *errstr, size_t errlen);
void kb__metrics_http_stop(struct kb_metrics_http *h);
struct kb_stats_feed;
int kb__stats_feed_start(kb_bus *b, int64_t interval_ms, kb_stats_fn fn, void *opaque,
                         struct kb_stats_feed **out, char *errstr, size_t errlen);
void kb__stats_feed_stop(struct kb_stats_feed *f);

/* Enter and leave the gate of public calls (bus.c): false once kb_close has
 * begun. */
bool kb__bus_enter(kb_bus *b, const char *who);
void kb__bus_leave(kb_bus *b);

#endif /* KB_CORE_METRICS_H */
