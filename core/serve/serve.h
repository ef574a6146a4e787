/* The serve floor: kb_open and kb_close, and what they start over an open
 * bus: the snapshot of every figure (collect.c), its Prometheus text
 * (metrics_prom.c) and JSON (metrics_json.c), the metrics.listen endpoint
 * (metrics_http.c) and the stats feed (stats_feed.c). It sees the bus
 * through bus_calls.h alone. */
#ifndef KB_CORE_SERVE_H
#define KB_CORE_SERVE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <keybus/transport.h>

#include "../bus_calls.h"

/* ---- the snapshot every exposition is built from ---- */

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
char *kb__metrics_json(const kb_serve_conf *c, const kb_metrics_snap *s);
char *kb__metrics_partitions_json(const kb_metrics_snap *s);

/* ---- what kb_open starts ---- */

/* A condition variable whose timed waits take CLOCK_MONOTONIC deadlines
 * (kb_now_ns), for the threads below (cond.c). */
void kb__serve_cond_init(pthread_cond_t *c);

/* The endpoint's answers (scrape_cache.c): a collector thread and the last
 * snapshot's texts. _get returns a malloc'ed copy of the Prometheus text or,
 * with `partitions`, the /partitions JSON, fresh within min_interval_ms when
 * the collector manages it within a few seconds; NULL with *rc KB_ECLOSED
 * (halted), KB_ENOMEM, KB_ETIMEDOUT (no snapshot yet) or the collection's
 * error. Thread: any. _halt wakes every waiter and joins the collector;
 * _free halts and frees, after the last _get has returned. */
struct kb_scrape_cache;
int kb__scrape_cache_start(kb_bus *b, int64_t min_interval_ms, struct kb_scrape_cache **out,
                           char *errstr, size_t errlen);
char *kb__scrape_cache_get(struct kb_scrape_cache *c, bool partitions, size_t *len, int *rc);
void kb__scrape_cache_halt(struct kb_scrape_cache *c);
void kb__scrape_cache_free(struct kb_scrape_cache *c);

/* The HTTP endpoint (metrics_http.c) and the feed thread (stats_feed.c). */
struct kb_metrics_http;
int kb__metrics_http_start(kb_bus *b, const kb_serve_conf *c, struct kb_metrics_http **out,
                           char *errstr, size_t errlen);
void kb__metrics_http_stop(struct kb_metrics_http *h);
struct kb_stats_feed;
int kb__stats_feed_start(kb_bus *b, const kb_serve_conf *c, struct kb_stats_feed **out,
                         char *errstr, size_t errlen);
void kb__stats_feed_stop(struct kb_stats_feed *f);

#endif /* KB_CORE_SERVE_H */
