/* What the bus gives the floor above it (core/serve/: kb_open, kb_close and
 * what they start): opening and closing in steps, the gate of public calls,
 * the topics and their figures read inside it, and the configuration
 * serving needs, resolved once. The serve floor includes this header alone
 * from the core and sees no bus or topic layout. */
#ifndef KB_CORE_BUS_CALLS_H
#define KB_CORE_BUS_CALLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

struct kb_topic;
struct kb_serve;   /* the serve floor's own state of a bus */

/* ---- opening and closing, in the steps kb_open and kb_close take ---- */

/* Take the conf, resolve it and start the executors: a bus not connected to
 * its transport yet. NULL with errstr and the last error code set; the conf
 * is then the caller's again. Thread: kb_open's. */
kb_bus *kb__bus_new(kb_conf *c, char *errstr, size_t errlen);
/* Open the transport: the bus is ready for calls. */
int kb__bus_connect(kb_bus *b, char *errstr, size_t errlen);
/* Undo kb__bus_new after a later step failed with `rc`: free the bus, set
 * the last error code; the conf is the caller's again. */
void kb__bus_discard(kb_bus *b, int rc);
/* kb_close's first step: no call enters from now on. KB_EINVAL from a
 * handler or a callback, KB_ECLOSED when another kb_close came first (the
 * error text set); KB_OK: go on with kb__bus_close_end. */
int kb__bus_close_begin(kb_bus *b);
/* The rest of kb_close: wait out the calls inside, handle what is queued up
 * to the deadline, close the transport, free the bus. */
int kb__bus_close_end(kb_bus *b, int64_t deadline_ns);

/* The serve floor's state, kept with the bus and never looked into. */
void kb__bus_set_serve(kb_bus *b, struct kb_serve *s);
struct kb_serve *kb__bus_serve(const kb_bus *b);

/* The configuration serving needs, as kb_open resolved it. Strings live as
 * long as the bus. */
typedef struct kb_serve_conf {
    const char *scheme;              /* the transport's */
    const char *consumer;
    const char *metrics_listen;      /* "": no endpoint */
    int64_t metrics_max_connections, metrics_max_per_client, metrics_min_interval_ms;
    int64_t stats_interval_ms;       /* 0: no feed */
    kb_stats_fn stats_fn;            /* NULL: no feed */
    void *stats_opaque;
} kb_serve_conf;
void kb__bus_serve_conf(const kb_bus *b, kb_serve_conf *out);

/* ---- the gate, and what may be read inside it ---- */

/* Enter and leave the gate of public calls: false once kb_close has begun. */
bool kb__bus_enter(kb_bus *b, const char *who);
void kb__bus_leave(kb_bus *b);

/* Every topic the bus knows, malloc'ed (free it); each lives until
 * kb_close, which waits for the caller to leave the gate. KB_ENOMEM. */
int kb__bus_topics(kb_bus *b, struct kb_topic ***out, size_t *n);

/* Upper bounds of the histogram buckets, 1 µs to 10 s in a 1-2.5-5 series;
 * a last bucket (+Inf) takes the rest. */
#define KB_HIST_BOUNDS 22
extern const int64_t kb__hist_bound_ns[KB_HIST_BOUNDS + 2];   /* then INT64_MAX twice */
extern const char *const kb__hist_bound_text[KB_HIST_BOUNDS];   /* in seconds */

typedef struct kb_hist_snap {
    uint64_t bucket[KB_HIST_BOUNDS + 1];   /* not cumulative */
    uint64_t count, sum_ns;
} kb_hist_snap;

/* A topic as metrics read it. */
typedef struct kb_topic_view {
    const char *name;                /* valid while the caller is inside the gate */
    kb_pool *pool;                   /* NULL: nobody subscribed here */
    bool hist;                       /* latency and duration are recorded */
    kb_hist_snap latency, duration;  /* summed over the executors */
} kb_topic_view;
void kb__topic_view(const struct kb_topic *t, kb_topic_view *out);

/* kb_stats and kb_partition_stats_get of a topic, for a caller inside the
 * gate; KB_ECLOSED once kb_close has begun. */
int kb__topic_stats(kb_bus *b, struct kb_topic *t, kb_topic_stats *out);
int kb__topic_partition_stats(kb_bus *b, struct kb_topic *t, uint32_t partition,
                              kb_partition_stats *out);

#endif /* KB_CORE_BUS_CALLS_H */
