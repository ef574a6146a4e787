/* Internal structures of the bus: the topic registry and what a topic holds. */
#ifndef KB_CORE_BUS_INT_H
#define KB_CORE_BUS_INT_H

/* liburcu-bp's read lock is called out of line except where a file asks
 * for the inline version first (bus.c's publish path): UBSan reports the
 * inline version's access to liburcu's under-aligned reader record. */
#include <pthread.h>
#include <urcu-bp.h>
#include <urcu/rculfhash.h>

#include <keybus/pool.h>
#include <keybus/transport.h>

#include "base/err.h"
#include "bus_calls.h"
#include "conf_int.h"
#include "pool/pool_calls.h"

/* A topic of this bus (the public kb_topic handle); once subscribed,
 * transports see it as a kb_sink. Lives until kb_close. */
struct kb_topic {
    struct cds_lfht_node node;
    char *name;
    kb_bus *bus;
    kb_transport_topic *tt;            /* the transport's state (topic_open) */
    _Atomic(kb_pool *) pool;           /* set by kb_subscribe; NULL: no handler here */
    kb_pool **retired;                 /* pools of failed subscribes, freed at kb_close */
    size_t n_retired, retired_cap;
    kb_handler_fn fn;                  /* written before pool is published */
    void *opaque;
    /* Handler runs need no more than the handler call: no ownership check or
     * run record by the transport, no histograms (kb__topic_handle). Written
     * before pool is published. */
    bool plain;
    _Atomic uint64_t dead_letter_failures;   /* dead letters nobody stored */
    _Atomic uint32_t feeding;          /* debug builds: a feeder is in kb_sink_deliver */
    struct kb_topic_metrics *metrics;  /* histograms per executor (metrics.h); NULL: off */
};

struct kb_bus {
    uint64_t serial;                   /* unique per kb_open in this process */
    kb_conf *conf;
    const kb_transport_ops *ops;
    kb_transport *t;
    kb_sched *sched;
    struct kb_runs *runs;              /* the crash journal, when the transport keeps one */
    struct cds_lfht *topics;
    pthread_mutex_t subscribe_lock;    /* topic creation is rare: serialise it */
    _Atomic uint32_t closing;
    /* The gate of every public call but publishing (which RCU covers): calls
     * in progress, which kb_close waits out before it frees anything. */
    pthread_mutex_t gate_lock;
    pthread_cond_t gate_left;          /* the last call left a closing bus */
    uint32_t calls;
    kb_log_fn log;
    void *log_opaque;
    _Atomic uint64_t rng;              /* kb_bus_random's state */
    kb_core_conf core;                 /* the core's keys, resolved at kb_open */
    /* hot-path copies of configuration */
    uint32_t max_key, max_payload, max_attempts, max_headers, max_header_bytes;
    int enqueue_timeout_ms;
    kb_idle idle;
    struct kb_serve *serve;            /* the serve floor's: endpoint, stats feed */
    /* Accepted publishes the transport said failed (kb_bus_publish_failed)
     * since the last kb_flush: the latest one's code and text. */
    pthread_mutex_t pub_fail_lock;
    uint64_t pub_failed;
    int pub_fail_rc;
    char pub_fail_error[256];
};

static inline kb_pool *kb__topic_pool(struct kb_topic *t)
{
    return atomic_load_explicit(&t->pool, memory_order_acquire);
}

/* kb_errf for a submit of `who` ("kb_publish", "topic") that failed with
 * `rc` on the lane of `hash`, waiting up to timeout_ms for room. */
void kb__submit_failed(const struct kb_topic *t, const char *who, kb_pool *pool, int rc,
                       uint32_t hash, int timeout_ms);

/* KB_OK when no accepted publish failed since the last call; else the
 * latest failure's code, with a text for `who` (kb_flush, kb_close) counting
 * them, and the count starts again. Thread: any. */
int kb__publish_failures_take(kb_bus *b, const char *who);

/* Copy a delivery into a record and enqueue it on the topic's lane. */
int kb__sink_put(struct kb_topic *topic, const kb_delivery *d, uint32_t hash, int timeout_ms);

/* Pool callbacks that run the application's handler and settle with the transport. */
int kb__topic_handle(void *item, uint32_t attempt, void *opaque);
void kb__topic_finish(void *item, int outcome, uint32_t attempts, void *opaque);
const void *kb__topic_key(const void *item, size_t *key_len, void *opaque);

#endif /* KB_CORE_BUS_INT_H */
