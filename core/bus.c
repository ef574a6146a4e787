/* The bus: configuration to transport, topic registry (liburcu lock-free hash
 * table, read under RCU on the publish path), publish, flush, stats, and the
 * steps of opening and closing that kb_open and kb_close (core/serve/) take.
 *
 * kb_close may start while other threads are inside any call. Publishing runs
 * in an RCU read section, which kb_close waits out with synchronize_rcu; every
 * other call passes the gate below, which kb_close closes and then waits for
 * the calls inside to leave. Nothing is freed before both are empty. */
/* The publish path's read lock inlined from liburcu's LGPL headers (small
 * inline functions, which the LGPL allows): a call into liburcu-bp costs
 * ~40 instructions with its two TLS lookups, the inline version a few.
 * Out of line under ASan+UBSan: liburcu-bp's reader records are less
 * aligned than their type says, which UBSan would report in inlined code. */
#if defined(__SANITIZE_ADDRESS__)
#define KB_URCU_CALLED
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define KB_URCU_CALLED
#endif
#endif
#if !defined(KB_URCU_CALLED) && !defined(_LGPL_SOURCE)
#define _LGPL_SOURCE
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "bus_int.h"
#include "conf_int.h"
#include "metrics.h"
#include "registry.h"
#include "runs.h"

#define KB_MAX_TOPIC_BYTES 200

static inline int topic_char(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-' || ch == '.';
}

/* Topic names: 1..200 bytes of [A-Za-z0-9._-], not starting or ending with a
 * dot and without "..": valid as a Redis key part and as NATS subject tokens. */
static int check_topic_err(const char *topic, const char *what, char *errstr, size_t errlen)
{
    if (topic == NULL) {
        kb_errf(errstr, errlen, "%s: topic is NULL", what);
        return KB_EINVAL;
    }
    size_t len = strlen(topic);
    if (len == 0 || len > KB_MAX_TOPIC_BYTES) {
        kb_errf(errstr, errlen, "%s: topic length %zu not in 1..%d", what, len, KB_MAX_TOPIC_BYTES);
        return KB_EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)topic[i];
        if (!topic_char(ch)) {
            /* the name itself is not quoted: it may hold terminal escapes */
            kb_errf(errstr, errlen, "%s: topic has '%c' (0x%02x) at %zu; allowed: letters, "
                     "digits, '.', '_', '-'", what, ch >= 32 && ch < 127 ? ch : '?', ch, i);
            return KB_EINVAL;
        }
    }
    if (topic[0] == '.' || topic[len - 1] == '.' || strstr(topic, "..") != NULL) {
        kb_errf(errstr, errlen, "%s: topic \"%s\" has an empty dot-separated part", what, topic);
        return KB_EINVAL;
    }
    return KB_OK;
}

int kb_topic_name_check(const char *topic, char *errstr, size_t errlen)
{
    return check_topic_err(topic, "topic", errstr, errlen);
}

static int check_topic(const char *topic, const char *what)
{
    return check_topic_err(topic, what, NULL, 0);
}

static int match_topic(struct cds_lfht_node *node, const void *key)
{
    return strcmp(caa_container_of(node, struct kb_topic, node)->name, key) == 0;
}

/* Caller holds the RCU read lock. */
static struct kb_topic *lookup(kb_bus *b, const char *name)
{
    struct cds_lfht_iter it;
    cds_lfht_lookup(b->topics, kb_fnv1a32(name, strlen(name)), match_topic, name, &it);
    struct cds_lfht_node *node = cds_lfht_iter_get_node(&it);
    if (node == NULL)
        return NULL;
    struct kb_topic *topic = caa_container_of(node, struct kb_topic, node);
    KB_TSAN_ACQUIRE(topic);   /* published by cds_lfht_add_unique */
    return topic;
}

/* The topic this thread published to last: applications publish to a few
 * topics, usually through the same string, so a pointer compare and a strcmp
 * replace validation, hashing and the table lookup. Keyed by the bus's serial
 * number, not its address, so a closed bus is never mistaken for a new one. */
static _Thread_local struct {
    uint64_t bus_serial;
    const char *name;
    struct kb_topic *topic;
} last_topic;

static _Atomic uint64_t bus_serials;

static struct kb_topic *cached_topic(const kb_bus *b, const char *name)
{
    if (last_topic.bus_serial == b->serial && last_topic.name == name &&
        strcmp(last_topic.topic->name, name) == 0)
        return last_topic.topic;
    return NULL;
}

/* The topic named `name`, or NULL; topics live until kb_close. */
static struct kb_topic *find_topic(kb_bus *b, const char *name)
{
    struct kb_topic *t = cached_topic(b, name);
    if (t != NULL)
        return t;
    rcu_read_lock();
    t = lookup(b, name);
    rcu_read_unlock();
    if (t != NULL) {
        last_topic.bus_serial = b->serial;
        last_topic.name = name;
        last_topic.topic = t;
    }
    return t;
}

/* Gated calls this thread is inside (a dead-letter or log callback may call
 * keybus again): kb_close from there would wait for itself. */
static _Thread_local int gate_depth;

/* Enter a public call: false once kb_close has begun (the call then returns
 * KB_ECLOSED at once, the text saying so in errstr and kb_last_error). A
 * mutex, not atomics: kb_close may free the bus as soon as the last call has
 * left, so leaving must touch nothing after the wake-up that allows it. */
static bool gate_enter(kb_bus *b, const char *who, char *errstr, size_t errlen)
{
    pthread_mutex_lock(&b->gate_lock);
    bool open = !atomic_load_explicit(&b->closing, memory_order_relaxed);
    b->calls += open;
    pthread_mutex_unlock(&b->gate_lock);
    if (!open)
        kb_errf(errstr, errlen, "%s: bus is closing", who);
    gate_depth += open;
    return open;
}

static void gate_leave(kb_bus *b)
{
    gate_depth--;
    pthread_mutex_lock(&b->gate_lock);
    if (--b->calls == 0 && atomic_load_explicit(&b->closing, memory_order_relaxed))
        pthread_cond_broadcast(&b->gate_left);
    pthread_mutex_unlock(&b->gate_lock);
}

/* kb_close: no call enters from now on; the ones inside are waited for.
 * False when another kb_close got here first. */
static bool gate_close(kb_bus *b)
{
    pthread_mutex_lock(&b->gate_lock);
    bool first = !atomic_exchange_explicit(&b->closing, 1, memory_order_seq_cst);
    pthread_mutex_unlock(&b->gate_lock);
    return first;
}

static void gate_wait_empty(kb_bus *b)
{
    pthread_mutex_lock(&b->gate_lock);
    while (b->calls > 0)
        pthread_cond_wait(&b->gate_left, &b->gate_lock);
    pthread_mutex_unlock(&b->gate_lock);
}

kb_sink *kb_bus_sink(kb_bus *b, const char *topic)
{
    if (b == NULL || topic == NULL)
        return NULL;
    struct kb_topic *t = find_topic(b, topic);
    return t != NULL && kb__topic_pool(t) != NULL ? (kb_sink *)t : NULL;
}

/* The topic named `name`, created (and opened in the transport) when
 * missing. Caller holds subscribe_lock and checked the name. NULL with *rc
 * KB_ECLOSED, KB_ENOMEM or the transport's error, and errstr saying which. */
static struct kb_topic *topic_add(kb_bus *b, const char *name, int *rc, char *errstr,
                                  size_t errlen)
{
    rcu_read_lock();
    struct kb_topic *t = lookup(b, name);
    rcu_read_unlock();
    *rc = KB_OK;
    if (t != NULL)
        return t;
    if (atomic_load_explicit(&b->closing, memory_order_acquire)) {
        kb_errf(errstr, errlen, "topic %s: bus is closing", name);
        *rc = KB_ECLOSED;
        return NULL;
    }
    t = calloc(1, sizeof *t);
    if (t == NULL || (t->name = strdup(name)) == NULL) {
        free(t);
        kb_errf(errstr, errlen, "topic %s: out of memory", name);
        *rc = KB_ENOMEM;
        return NULL;
    }
    if ((*rc = b->ops->topic_open(b->t, name, &t->tt, errstr, errlen)) != KB_OK) {
        free(t->name);
        free(t);
        return NULL;
    }
    t->bus = b;
    t->metrics = kb__topic_metrics_new(b);
    cds_lfht_node_init(&t->node);
    KB_TSAN_RELEASE(t);
    rcu_read_lock();
    cds_lfht_add(b->topics, kb_fnv1a32(name, strlen(name)), &t->node);
    rcu_read_unlock();
    return t;
}

static kb_topic *topic_get(kb_bus *b, const char *topic, int *rc, char *errstr, size_t errlen)
{
    *rc = KB_EINVAL;
    if (b == NULL) {
        kb_errf(errstr, errlen, "kb_topic_get: bus is NULL");
        return NULL;
    }
    if (check_topic_err(topic, "kb_topic_get", errstr, errlen) != KB_OK)
        return NULL;
    *rc = KB_ECLOSED;
    if (!gate_enter(b, "kb_topic_get", errstr, errlen))
        return NULL;
    *rc = KB_OK;
    struct kb_topic *t = find_topic(b, topic);
    if (t == NULL) {
        pthread_mutex_lock(&b->subscribe_lock);
        t = topic_add(b, topic, rc, errstr, errlen);
        pthread_mutex_unlock(&b->subscribe_lock);
    }
    gate_leave(b);
    return t;
}

kb_topic *kb_topic_get(kb_bus *b, const char *topic, char *errstr, size_t errlen)
{
    int rc;
    kb_topic *t = topic_get(b, topic, &rc, errstr, errlen);
    if (t == NULL)
        kb__err_set_code(rc);
    return t;
}

/* The topic for a per-topic call (stats, dead letters), opened in the
 * transport when this process has not used it yet. Caller is in the gate. */
static struct kb_topic *topic_for_call(kb_bus *b, const char *topic, int *rc)
{
    struct kb_topic *t = find_topic(b, topic);
    if (t != NULL) {
        *rc = KB_OK;
        return t;
    }
    pthread_mutex_lock(&b->subscribe_lock);
    t = topic_add(b, topic, rc, NULL, 0);
    pthread_mutex_unlock(&b->subscribe_lock);
    return t;
}

static kb_bus *bus_open(kb_conf *c, int *rc, char *errstr, size_t errlen);
static void bus_free(kb_bus *b);

kb_bus *kb__bus_new(kb_conf *c, char *errstr, size_t errlen)
{
    if (c == NULL) {
        kb_errf(errstr, errlen, "kb_open: conf is NULL");
        kb__err_set_code(KB_EINVAL);
        return NULL;
    }
    /* Taken first, so a second kb_open of the same conf fails even while
     * this one is still connecting. */
    if (!kb__conf_take(c)) {
        kb_errf(errstr, errlen, "kb_open: this kb_conf already belongs to an open bus "
                 "(kb_conf_dup gives a copy for another one)");
        kb__err_set_code(KB_EINVAL);
        return NULL;
    }
    int rc;
    kb_bus *b = bus_open(c, &rc, errstr, errlen);
    if (b == NULL) {
        kb__err_set_code(rc);
        kb__conf_give_back(c);
    }
    return b;
}

static void report_unknown_env(const char *name, const char *nearest, void *arg)
{
    kb_log(arg, KB_LOG_WARNING, "environment %s names no configuration key (nearest: %s); ignored", name,
           nearest);
}

/* *rc: why it returned NULL. */
static kb_bus *bus_open(kb_conf *c, int *rc, char *errstr, size_t errlen)
{
    /* keys of transports registered after the conf was made */
    if ((*rc = kb__conf_sync(c, errstr, errlen)) != KB_OK)
        return NULL;
    if ((*rc = kb__conf_env_loads_no_code(errstr, errlen)) != KB_OK)
        return NULL;
    bool env = kb_conf_bool(c, "conf.env");
    if (env && (*rc = kb__conf_env(c, errstr, errlen)) != KB_OK)
        return NULL;
    if ((*rc = kb__conf_secret_files(c, errstr, errlen)) != KB_OK)
        return NULL;
    kb_core_conf core;
    kb__conf_core(c, &core);
    *rc = KB_EINVAL;
    if (core.retry_max_backoff_ms < core.retry_backoff_ms) {
        kb_errf(errstr, errlen, "retry.max_backoff_ms (%lld) is below retry.backoff_ms (%lld)",
                 (long long)core.retry_max_backoff_ms, (long long)core.retry_backoff_ms);
        return NULL;
    }
    /* The URL was checked when set; the transport's own rules run again here,
     * since a transport registered later may judge it. */
    char why[512];
    kb_url *u = kb_url_parse(core.transport, why, sizeof why);
    const kb_transport_ops *ops = u ? kb__transport_find(u->scheme, strlen(u->scheme)) : NULL;
    int url_rc = u == NULL || ops == NULL ? KB_EINVAL
                 : ops->check_url != NULL ? ops->check_url(u, why, sizeof why)
                                          : KB_OK;
    if (u != NULL && ops == NULL)
        snprintf(why, sizeof why, "unknown URL scheme \"%.31s\"", u->scheme);
    kb_url_free(u);
    if (url_rc != KB_OK) {
        kb_errf(errstr, errlen, "transport: %s", why);
        return NULL;
    }

    *rc = KB_ENOMEM;
    kb_bus *b = calloc(1, sizeof *b);
    if (b == NULL) {
        kb_errf(errstr, errlen, "kb_open: out of memory");
        return NULL;
    }
    b->conf = c;
    b->ops = ops;
    b->serial = atomic_fetch_add_explicit(&bus_serials, 1, memory_order_relaxed) + 1;
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
        seed = (uint64_t)kb__now_ns() ^ (uint64_t)(uintptr_t)b;
    atomic_init(&b->rng, seed);
    kb__conf_log(c, &b->log, &b->log_opaque);
    if (env)
        kb__conf_unknown_env(c, report_unknown_env, b);
    b->core = core;
    b->max_key = (uint32_t)core.max_key_bytes;
    b->max_payload = (uint32_t)core.max_payload_bytes;
    b->max_attempts = (uint32_t)core.retry_max_attempts;
    b->max_headers = (uint32_t)core.max_headers;
    b->max_header_bytes = (uint32_t)core.max_header_bytes;
    b->enqueue_timeout_ms = (int)core.pool_enqueue_timeout_ms;
    b->idle = (kb_idle)kb__idle_parse(core.pool_idle);
    pthread_mutex_init(&b->subscribe_lock, NULL);
    pthread_mutex_init(&b->gate_lock, NULL);
    pthread_mutex_init(&b->pub_fail_lock, NULL);
    pthread_cond_init(&b->gate_left, NULL);

    b->topics = cds_lfht_new(16, 16, 0, CDS_LFHT_AUTO_RESIZE | CDS_LFHT_ACCOUNTING, NULL);
    uint32_t threads = (uint32_t)core.pool_threads;
    if (b->topics != NULL)
        b->sched = kb__sched_new(threads ? threads : kb_pool_default_threads(b->idle), b->idle,
                                 errstr, errlen);
    if (b->topics == NULL || b->sched == NULL) {
        if (b->topics == NULL)
            kb_errf(errstr, errlen, "kb_open: out of memory for the topic table");
        goto fail;
    }
    if (ops->run_begins != NULL && (*rc = kb__runs_dir_check(core.runs_dir, errstr, errlen)) != KB_OK)
        goto fail;
    return b;

fail:
    bus_free(b);
    return NULL;   /* the caller keeps the conf */
}

int kb__bus_connect(kb_bus *b, char *errstr, size_t errlen)
{
    return b->ops->open(&b->t, b, b->conf, errstr, errlen);
}

void kb__bus_discard(kb_bus *b, int rc)
{
    kb_conf *c = b->conf;
    bus_free(b);
    kb__err_set_code(rc);
    kb__conf_give_back(c);
}

/* What kb__bus_new made, before the transport opened. */
static void bus_free(kb_bus *b)
{
    kb__sched_destroy(b->sched);
    kb__runs_close(b->runs);
    if (b->topics != NULL)
        cds_lfht_destroy(b->topics, NULL);
    pthread_mutex_destroy(&b->subscribe_lock);
    pthread_mutex_destroy(&b->gate_lock);
    pthread_mutex_destroy(&b->pub_fail_lock);
    pthread_cond_destroy(&b->gate_left);
    free(b);
}

/* kb_subscribe inside the gate. */
static int subscribe(kb_bus *b, const char *topic, kb_handler_fn fn, void *opaque)
{
    int rc;
    pthread_mutex_lock(&b->subscribe_lock);
    struct kb_topic *t = topic_add(b, topic, &rc, NULL, 0);
    if (t == NULL || kb__topic_pool(t) != NULL) {
        pthread_mutex_unlock(&b->subscribe_lock);
        if (t == NULL)
            return rc;
        kb_errf(NULL, 0, "kb_subscribe: topic \"%s\" already has a handler", topic);
        return KB_EINVAL;
    }

    kb_pool_options o;
    kb_pool_options_init(&o);
    o.lanes = (uint32_t)b->core.pool_workers;
    o.capacity = (uint32_t)b->core.pool_queue_capacity;
    o.max_attempts = 0;   /* kb__topic_handle decides: it adds the broker's count */
    o.backoff_ms = (uint32_t)b->core.retry_backoff_ms;
    o.max_backoff_ms = (uint32_t)b->core.retry_max_backoff_ms;
    o.single_producer = (b->ops->flags & KB_TRANSPORT_F_SINGLE_FEEDER) != 0;
    o.salt = kb_fnv1a32(topic, strlen(topic));
    o.idle = b->idle;
    o.handle = kb__topic_handle;
    o.finish = kb__topic_finish;
    o.key = kb__topic_key;
    o.retry_scope = strcmp(b->core.retry_scope, "lane") == 0
                        ? KB_RETRY_SCOPE_LANE
                        : KB_RETRY_SCOPE_KEY;
    o.opaque = t;
    char why[256];
    kb_pool *pool = kb__pool_new_on(b->sched, &o, why, sizeof why);
    if (pool == NULL) {
        pthread_mutex_unlock(&b->subscribe_lock);
        kb_errf(NULL, 0, "kb_subscribe %s: %s", topic, why);
        return KB_ENOMEM;
    }
    t->fn = fn;
    t->opaque = opaque;
    t->plain = b->ops->still_owned == NULL && b->ops->run_begins == NULL && t->metrics == NULL;
    /* Publishers that see the pool also see the handler. */
    atomic_store_explicit(&t->pool, pool, memory_order_release);

    rc = b->ops->subscribe(b->t, t->tt, (kb_sink *)t);
    if (rc != KB_OK) {
        atomic_store_explicit(&t->pool, NULL, memory_order_release);
        synchronize_rcu();   /* no publisher still holds the pool */
        kb_pool_shutdown(pool);
        kb__pool_drain(pool, INT64_MAX);
        /* The executors may still hold its lanes (lingering, awaiting a re-check): it is
         * freed at kb_close, after them. A later kb_subscribe makes a new one. */
        if (kb_vec_reserve((void **)&t->retired, &t->retired_cap, t->n_retired + 1,
                           sizeof *t->retired) == KB_OK)
            t->retired[t->n_retired++] = pool;   /* out of memory: leaked, not freed early */
    }
    pthread_mutex_unlock(&b->subscribe_lock);
    return rc;
}

int kb_subscribe(kb_bus *b, const char *topic, kb_handler_fn fn, void *opaque)
{
    if (b == NULL || fn == NULL) {
        kb_errf(NULL, 0, "kb_subscribe: %s is NULL", b == NULL ? "bus" : "handler");
        return KB_EINVAL;
    }
    int rc = check_topic(topic, "kb_subscribe");
    if (rc != KB_OK)
        return rc;
    if (!gate_enter(b, "kb_subscribe", NULL, 0))
        return KB_ECLOSED;
    rc = subscribe(b, topic, fn, opaque);
    gate_leave(b);
    return rc;
}

/* Key and payload against the bus's limits; the error names `topic`. */
static __attribute__((noinline)) int check_msg(const kb_bus *b, const char *topic,
                                               const kb_msg *m)
{
    if (m->key == NULL || m->key_len == 0) {
        kb_errf(NULL, 0, "kb_publish %s: key is %s", topic, m->key == NULL ? "NULL" : "empty");
        return KB_EINVAL;
    }
    if (m->key_len > b->max_key) {
        kb_errf(NULL, 0, "kb_publish %s: key of %zu bytes exceeds limits.max_key_bytes (%u)",
                 topic, m->key_len, b->max_key);
        return KB_ETOOBIG;
    }
    if (m->payload == NULL && m->payload_len > 0) {
        kb_errf(NULL, 0, "kb_publish %s: payload is NULL but payload_len is %zu", topic,
                 m->payload_len);
        return KB_EINVAL;
    }
    if (m->payload_len > b->max_payload) {
        kb_errf(NULL, 0,
                 "kb_publish %s: payload of %zu bytes exceeds limits.max_payload_bytes (%u)",
                 topic, m->payload_len, b->max_payload);
        return KB_ETOOBIG;
    }
    if (m->n_headers == 0)
        return KB_OK;
    if (!(b->ops->flags & (KB_TRANSPORT_F_LOCAL | KB_TRANSPORT_F_HEADERS))) {
        kb_errf(NULL, 0, "kb_publish %s: %s:// does not carry headers", topic, b->ops->scheme);
        return KB_EINVAL;
    }
    char what[240];
    snprintf(what, sizeof what, "kb_publish %s", topic);
    return kb_headers_check(m->headers, m->n_headers, b->max_headers, b->max_header_bytes, what);
}

/* check_msg, inline where the event is plain (a key and a payload within the
 * limits, no headers): the full check, and its texts, only for the others. */
static inline int msg_ok(const kb_bus *b, const char *topic, const kb_msg *m)
{
    /* key_len - 1 < max_key: 1..max_key bytes */
    if (m->key != NULL && m->key_len - 1 < b->max_key && m->payload_len <= b->max_payload &&
        (m->payload != NULL || m->payload_len == 0) && m->n_headers == 0)
        return KB_OK;
    return check_msg(b, topic, m);
}

/* Events a local publish copies and enqueues at once. */
#define LOCAL_CHUNK 64

static __attribute__((cold)) int no_subscriber(const struct kb_topic *t)
{
    kb_errf(NULL, 0, "kb_publish: no subscriber for topic \"%s\" on %s://", t->name,
             t->bus->ops->scheme);
    return KB_ENOTFOUND;
}

static __attribute__((cold)) int bus_closing(const struct kb_topic *t)
{
    kb_errf(NULL, 0, "kb_publish %s: bus is closing", t->name);
    return KB_ECLOSED;
}

static __attribute__((cold)) void rec_out_of_memory(const struct kb_topic *t, const kb_msg *m)
{
    kb_errf(NULL, 0, "kb_publish %s: out of memory for an event of %zu bytes", t->name,
             m->key_len + m->payload_len);
}

/* The record of a local publish (checked), inline: a call per event cost more
 * than filling it. NULL, with the error set, on out of memory. */
static inline __attribute__((always_inline)) kb_rec *local_rec(struct kb_topic *t,
                                                                const kb_msg *m)
{
    kb_rec *r = kb__rec_new(t, kb__metrics_stamp(t), m->key, m->key_len, m->payload,
                            m->payload_len, "", 0, m->headers, m->n_headers);
    if (r == NULL)
        rec_out_of_memory(t, m);
    else
        KB_PROBE4(publish, t->name, m->key, m->key_len, r);
    return r;
}

/* mem://: records straight into the topic's pool, no transport call. */
static int publish_local(struct kb_topic *t, const kb_msg *msgs, size_t n, size_t *done)
{
    kb_bus *b = t->bus;
    kb_pool *pool = kb__topic_pool(t);
    if (pool == NULL)
        return no_subscriber(t);
    void *recs[LOCAL_CHUNK];
    uint32_t hashes[LOCAL_CHUNK];
    int rc = KB_OK;
    while (*done < n && rc == KB_OK) {
        size_t k = 0, want = n - *done < LOCAL_CHUNK ? n - *done : LOCAL_CHUNK;
        for (; k < want; k++) {
            const kb_msg *m = &msgs[*done + k];
            if ((rc = msg_ok(b, t->name, m)) != KB_OK)
                break;
            hashes[k] = kb__fnv1a32(m->key, m->key_len);
            if ((recs[k] = local_rec(t, m)) == NULL) {
                rc = KB_ENOMEM;
                break;
            }
        }
        if (k == 0)
            break;   /* the first event of the chunk failed its checks */
        size_t took = 0;
        int sub = kb_pool_submit_batch(pool, hashes, recs, k, b->enqueue_timeout_ms, &took);
        for (size_t i = took; i < k; i++)
            kb__rec_free(recs[i]);
        *done += took;
        if (sub != KB_OK) {
            rc = sub;
            kb__submit_failed(t, "kb_publish", pool, sub, took < k ? hashes[took] : 0,
                              b->enqueue_timeout_ms);
        }
    }
    return rc;
}

/* A broker's publish: the transport copies each event. */
static int publish_broker(struct kb_topic *t, const kb_msg *msgs, size_t n, size_t *done)
{
    kb_bus *b = t->bus;
    int rc = KB_OK;
    for (; *done < n; (*done)++) {
        kb_msg m = msgs[*done];
        if ((rc = check_msg(b, t->name, &m)) != KB_OK)
            break;
        m.hash = kb_fnv1a32(m.key, m.key_len);
        KB_PROBE4(publish_broker, t->name, m.key, m.key_len, m.hash);
        if ((rc = b->ops->publish(b->t, t->tt, &m)) != KB_OK)
            break;
    }
    return rc;
}

/* Caller holds the RCU read lock: the section kb_close waits out
 * (synchronize_rcu) after it sets `closing`, so no publisher can still be
 * inside once that returns. */
static int publish_locked(struct kb_topic *t, const kb_msg *msgs, size_t n, size_t *done)
{
    kb_bus *b = t->bus;
    if (atomic_load_explicit(&b->closing, memory_order_seq_cst))
        return bus_closing(t);
    if (b->ops->flags & KB_TRANSPORT_F_LOCAL)
        return publish_local(t, msgs, n, done);
    return publish_broker(t, msgs, n, done);
}

/* publish_locked for one event, inlined into the one-event calls: on mem://
 * the checks, the hash, the record and the pool's one-item submit in one
 * frame (the layers of calls cost a fifth of a publish, callgrind). */
static inline __attribute__((always_inline)) int publish_one_locked(struct kb_topic *t,
                                                                     const kb_msg *m)
{
    kb_bus *b = t->bus;
    if (atomic_load_explicit(&b->closing, memory_order_seq_cst))
        return bus_closing(t);
    if (!(b->ops->flags & KB_TRANSPORT_F_LOCAL)) {
        size_t done = 0;
        return publish_broker(t, m, 1, &done);
    }
    kb_pool *pool = kb__topic_pool(t);
    if (pool == NULL)
        return no_subscriber(t);
    int rc = msg_ok(b, t->name, m);
    if (rc != KB_OK)
        return rc;
    uint32_t hash = kb__fnv1a32(m->key, m->key_len);
    kb_rec *r = local_rec(t, m);
    if (r == NULL)
        return KB_ENOMEM;
    rc = kb__pool_submit_one(pool, hash, r, b->enqueue_timeout_ms);
    if (rc != KB_OK) {
        kb__rec_free(r);
        kb__submit_failed(t, "kb_publish", pool, rc, hash, b->enqueue_timeout_ms);
    }
    return rc;
}

static __attribute__((cold)) int batch_arg_null(const kb_topic *t)
{
    kb_errf(NULL, 0, "kb_publish_batch: %s is NULL", t == NULL ? "topic" : "msgs");
    return KB_EINVAL;
}

int kb_publish_batch(kb_topic *t, const kb_msg *msgs, size_t n, size_t *accepted)
{
    size_t done = 0;
    int rc;
    if (t == NULL || (msgs == NULL && n > 0)) {
        rc = batch_arg_null(t);
    } else {
        rcu_read_lock();
        rc = publish_locked(t, msgs, n, &done);
        rcu_read_unlock();
    }
    if (accepted != NULL)
        *accepted = done;
    return rc;
}

/* One event through a handle (kb_publish_ex, kb_publish_to). */
static inline __attribute__((always_inline)) int publish_one(kb_topic *t, const kb_msg *m)
{
    if (t == NULL || m == NULL)
        return batch_arg_null(t);
    rcu_read_lock();
    int rc = publish_one_locked(t, m);
    rcu_read_unlock();
    return rc;
}

int kb_publish_ex(kb_topic *t, const kb_msg *m)
{
    return publish_one(t, m);
}

int kb_publish_to(kb_topic *t, const void *key, size_t key_len, const void *payload,
                  size_t payload_len)
{
    kb_msg m = {key, key_len, payload, payload_len, 0};
    return publish_one(t, &m);
}

int kb_publish(kb_bus *b, const char *topic, const void *key, size_t key_len,
               const void *payload, size_t payload_len)
{
    if (b == NULL) {
        kb_errf(NULL, 0, "kb_publish: bus is NULL");
        return KB_EINVAL;
    }
    kb_msg m = {key, key_len, payload, payload_len, 0};
    /* One read section from the lookup to the end: a kb_close that starts
     * meanwhile frees the topic only after it. A topic known here was
     * validated when it was created. */
    rcu_read_lock();
    struct kb_topic *t = topic != NULL ? find_topic(b, topic) : NULL;
    int rc = t != NULL ? publish_one_locked(t, &m) : KB_ENOTFOUND;
    rcu_read_unlock();
    if (t != NULL)
        return rc;
    if ((rc = check_topic(topic, "kb_publish")) != KB_OK)
        return rc;
    if (b->ops->flags & KB_TRANSPORT_F_LOCAL) {
        kb_errf(NULL, 0, "kb_publish: no subscriber for topic \"%s\" on %s://", topic,
                 b->ops->scheme);
        return KB_ENOTFOUND;
    }
    /* a broker topic this process has not used yet: opened through the gate */
    if (!gate_enter(b, "kb_publish", NULL, 0))
        return KB_ECLOSED;
    if ((t = topic_for_call(b, topic, &rc)) != NULL)
        rc = kb_publish_batch(t, &m, 1, NULL);
    gate_leave(b);
    return rc;
}

static int bus_closing_now(void *arg)
{
    const kb_bus *b = arg;
    return atomic_load_explicit(&b->closing, memory_order_acquire);
}

/* mem://: wait until every lane has finished what it held when the call
 * began, over all topics at once. KB_ECLOSED as soon as kb_close starts:
 * it handles what is queued itself, and waits for this call to leave. */
static int flush_pools(kb_bus *b, int timeout_ms)
{
    int64_t deadline = kb__deadline_ns(timeout_ms);
    kb_pool **pools = NULL;
    size_t n = 0, cap = 0;
    int rc = KB_OK;
    struct cds_lfht_iter it;
    struct kb_topic *t;
    rcu_read_lock();
    cds_lfht_for_each_entry(b->topics, &it, t, node) {
        KB_TSAN_ACQUIRE(t);   /* a subscribe may be adding topics meanwhile */
        kb_pool *pool = kb__topic_pool(t);
        if (pool != NULL && (rc = kb_vec_reserve((void **)&pools, &cap, n + 1, sizeof *pools)) != KB_OK)
            break;
        if (pool != NULL)
            pools[n++] = pool;
    }
    rcu_read_unlock();
    /* Pools live until kb_close, which waits for this call to leave the gate. */
    if (rc == KB_OK)
        rc = kb__pools_flush(pools, n, deadline, bus_closing_now, b);
    free(pools);
    return rc;
}

static int flush_slice(void *arg, int64_t until_ns)
{
    kb_bus *b = arg;
    return b->ops->flush(b->t, kb_deadline_left_ms(until_ns));
}

/* A broker's flush in slices, so that a kb_close starting meanwhile cuts it
 * short with KB_ECLOSED rather than waiting for its deadline. Each slice is
 * a new call whose target, "everything accepted so far", the transport reads
 * again: a flush longer than a slice waits for what was published meanwhile
 * too. */
static int flush_transport(kb_bus *b, int timeout_ms)
{
    return kb_bus_wait_sliced(b, kb__deadline_ns(timeout_ms), flush_slice, b);
}

/* A deadline passed or kb_close came: said first, then what the transport
 * said of it (the events it still holds, the partition it waited on), its
 * own "kb_flush: " prefix dropped. */
static void explain_wait(const char *who, int rc, int timeout_ms, bool drain)
{
    char why[900];
    const char *said = kb_last_error();
    size_t wl = strlen(who);
    if (strncmp(said, who, wl) == 0 && strncmp(said + wl, ": ", 2) == 0)
        said += wl + 2;
    snprintf(why, sizeof why, "%s%s", said[0] != '\0' ? ": " : "", said);
    if (rc == KB_ETIMEDOUT)
        kb_errf(NULL, 0, "%s: %d ms deadline passed%s%s", who, timeout_ms,
                drain ? " before every event was handled" : "", why);
    else
        kb_errf(NULL, 0, "%s: cut short by kb_close%s", who, why);
}

/* kb_flush and kb_drain: KB_EINVAL from a handler, KB_ECLOSED once kb_close began. */
static int wait_call(kb_bus *b, int timeout_ms, bool drain)
{
    const char *who = drain ? "kb_drain" : "kb_flush";
    if (b == NULL) {
        kb_errf(NULL, 0, "%s: bus is NULL", who);
        return KB_EINVAL;
    }
    if (kb__on_executor_thread()) {
        /* It would wait for the lane this handler holds up. */
        kb_errf(NULL, 0, "%s: called from a handler; it would wait for its own lane", who);
        return KB_EINVAL;
    }
    if (!gate_enter(b, who, NULL, 0))
        return KB_ECLOSED;
    /* kb_last_error is the last failed call's: a call that succeeds leaves
     * it; one that fails says what the transport said of it */
    char before[1024];
    snprintf(before, sizeof before, "%s", kb_last_error());
    kb_err_clear();
    int (*op)(kb_transport *, int) = drain ? b->ops->drain : b->ops->flush;
    int rc = op == NULL ? flush_pools(b, timeout_ms)
             : drain    ? op(b->t, timeout_ms)
                        : flush_transport(b, timeout_ms);
    if (rc == KB_OK && !drain)
        rc = kb__publish_failures_take(b, who);   /* its own text: failures, not a wait */
    else if (rc == KB_ETIMEDOUT || rc == KB_ECLOSED)
        explain_wait(who, rc, timeout_ms, drain);
    gate_leave(b);
    if (rc == KB_OK)
        kb_errf(NULL, 0, "%s", before);
    return rc;
}

int kb_flush(kb_bus *b, int timeout_ms)
{
    return wait_call(b, timeout_ms, false);
}

int kb_drain(kb_bus *b, int timeout_ms)
{
    return wait_call(b, timeout_ms, true);
}

static int topic_stats(kb_bus *b, struct kb_topic *t, kb_topic_stats *out);

/* kb_stats inside the gate. */
static int stats(kb_bus *b, const char *topic, kb_topic_stats *out)
{
    int rc = KB_OK;
    struct kb_topic *t = find_topic(b, topic);
    if (t == NULL && (b->ops->flags & KB_TRANSPORT_F_LOCAL)) {
        kb_errf(NULL, 0, "kb_stats: topic \"%s\" unknown here", topic);
        return KB_ENOTFOUND;
    }
    if (t == NULL && (t = topic_for_call(b, topic, &rc)) == NULL)
        return rc;
    return topic_stats(b, t, out);
}

static int topic_stats(kb_bus *b, struct kb_topic *t, kb_topic_stats *out)
{
    int rc;
    kb_pool *pool = kb__topic_pool(t);
    if (pool != NULL) {
        kb_pool_stats ps;
        kb_pool_stats_get(pool, &ps);
        out->received = ps.submitted;
        out->handled = ps.handled;
        out->retried = ps.retried;
        out->dead_lettered = ps.dead;
        out->rejected = ps.rejected;
        out->depth = ps.depth;
        out->max_depth = ps.max_depth;
        out->lanes = ps.lanes;
        out->lanes_allocated = ps.lanes_allocated;
        out->lane_memory_bytes = ps.memory_bytes;
        out->set_aside = ps.set_aside;
        out->aggregates_waiting = ps.aggregates_waiting;
        out->dead_letters_lost =
            atomic_load_explicit(&t->dead_letter_failures, memory_order_relaxed);
    }
    rc = b->ops->stats != NULL ? b->ops->stats(b->t, t->tt, out) : KB_ENOTFOUND;
    if (pool != NULL && rc == KB_ENOTFOUND)
        rc = KB_OK;
    if (rc == KB_ENOTFOUND)
        kb_errf(NULL, 0, "kb_stats: topic \"%s\" unknown here", t->name);
    return rc;
}

int kb_stats(kb_bus *b, const char *topic, kb_topic_stats *out)
{
    if (b == NULL || out == NULL) {
        kb_errf(NULL, 0, "kb_stats: %s is NULL", b == NULL ? "bus" : "out");
        return KB_EINVAL;
    }
    int rc = check_topic(topic, "kb_stats");
    if (rc != KB_OK)
        return rc;
    memset(out, 0, sizeof *out);
    if (!gate_enter(b, "kb_stats", NULL, 0))
        return KB_ECLOSED;
    rc = stats(b, topic, out);
    gate_leave(b);
    return rc;
}

int kb_partition_stats_get(kb_bus *b, const char *topic, uint32_t partition,
                           kb_partition_stats *out)
{
    if (b == NULL || out == NULL || check_topic(topic, "kb_partition_stats_get") != KB_OK)
        return KB_EINVAL;
    memset(out, 0, sizeof *out);
    if (b->ops->partition_stats == NULL) {
        kb_errf(NULL, 0, "%s:// has no partitions", b->ops->scheme);
        return KB_ENOTFOUND;
    }
    if (!gate_enter(b, "kb_partition_stats_get", NULL, 0))
        return KB_ECLOSED;
    int rc;
    struct kb_topic *t = topic_for_call(b, topic, &rc);
    if (t != NULL)
        rc = b->ops->partition_stats(b->t, t->tt, partition, out);
    gate_leave(b);
    return rc;
}

/* Topics, one topic's figures and the serving configuration for the serve
 * floor (bus_calls.h). */

int kb__bus_topics(kb_bus *b, struct kb_topic ***out, size_t *n)
{
    struct kb_topic **all = NULL;
    size_t cap = 0;
    int rc = KB_OK;
    struct cds_lfht_iter it;
    struct kb_topic *t;
    *n = 0;
    rcu_read_lock();
    cds_lfht_for_each_entry(b->topics, &it, t, node) {
        KB_TSAN_ACQUIRE(t);   /* published by cds_lfht_add */
        if ((rc = kb_vec_reserve((void **)&all, &cap, *n + 1, sizeof *all)) != KB_OK)
            break;
        all[(*n)++] = t;
    }
    rcu_read_unlock();
    *out = all;
    return rc;
}

static int closing_now(kb_bus *b, const char *who)
{
    if (!atomic_load_explicit(&b->closing, memory_order_acquire))
        return KB_OK;
    kb_errf(NULL, 0, "%s: bus is closing", who);
    return KB_ECLOSED;
}

int kb__topic_stats(kb_bus *b, struct kb_topic *t, kb_topic_stats *out)
{
    memset(out, 0, sizeof *out);
    int rc = closing_now(b, "kb_stats");
    return rc != KB_OK ? rc : topic_stats(b, t, out);
}

int kb__topic_partition_stats(kb_bus *b, struct kb_topic *t, uint32_t partition,
                              kb_partition_stats *out)
{
    memset(out, 0, sizeof *out);
    if (b->ops->partition_stats == NULL) {
        kb_errf(NULL, 0, "%s:// has no partitions", b->ops->scheme);
        return KB_ENOTFOUND;
    }
    int rc = closing_now(b, "kb_partition_stats_get");
    return rc != KB_OK ? rc : b->ops->partition_stats(b->t, t->tt, partition, out);
}

void kb__bus_serve_conf(const kb_bus *b, kb_serve_conf *out)
{
    out->scheme = b->ops->scheme;
    out->consumer = b->core.consumer;
    out->metrics_listen = b->core.metrics_listen;
    out->metrics_max_connections = b->core.metrics_max_connections;
    out->metrics_max_per_client = b->core.metrics_max_per_client;
    out->metrics_min_interval_ms = b->core.metrics_min_interval_ms;
    out->stats_interval_ms = b->core.stats_interval_ms;
    kb__conf_stats_cb(b->conf, &out->stats_fn, &out->stats_opaque);
}

void kb__bus_set_serve(kb_bus *b, struct kb_serve *s)
{
    b->serve = s;
}

struct kb_serve *kb__bus_serve(const kb_bus *b)
{
    return b->serve;
}

int kb_dead_letters(kb_bus *b, const char *topic, const char *after_id, size_t max,
                    kb_dead_letter_fn fn, void *opaque)
{
    if (b == NULL || fn == NULL || check_topic(topic, "kb_dead_letters") != KB_OK)
        return KB_EINVAL;
    if (b->ops->dead_letters == NULL) {
        kb_errf(NULL, 0, "%s:// keeps no dead-letter store; subscribe to \"%s.dlq\"",
                 b->ops->scheme, topic);
        return KB_ENOTFOUND;
    }
    if (!gate_enter(b, "kb_dead_letters", NULL, 0))
        return KB_ECLOSED;
    int rc;
    struct kb_topic *t = topic_for_call(b, topic, &rc);
    if (t != NULL)
        rc = b->ops->dead_letters(b->t, t->tt, after_id, max, fn, opaque);
    gate_leave(b);
    return rc;
}

int kb_dead_letter_replay(kb_bus *b, const char *topic, const char *id)
{
    if (b == NULL || id == NULL || check_topic(topic, "kb_dead_letter_replay") != KB_OK)
        return KB_EINVAL;
    if (b->ops->dead_letter_replay == NULL) {
        kb_errf(NULL, 0, "%s:// keeps no dead-letter store", b->ops->scheme);
        return KB_ENOTFOUND;
    }
    if (!gate_enter(b, "kb_dead_letter_replay", NULL, 0))
        return KB_ECLOSED;
    int rc;
    struct kb_topic *t = topic_for_call(b, topic, &rc);
    if (t != NULL)
        rc = b->ops->dead_letter_replay(b->t, t->tt, id);
    gate_leave(b);
    return rc;
}

int kb_dead_letter_delete(kb_bus *b, const char *topic, const char *id)
{
    if (b == NULL || id == NULL || check_topic(topic, "kb_dead_letter_delete") != KB_OK)
        return KB_EINVAL;
    if (b->ops->dead_letter_delete == NULL) {
        kb_errf(NULL, 0, "%s:// cannot delete dead letters", b->ops->scheme);
        return KB_ENOTFOUND;
    }
    if (!gate_enter(b, "kb_dead_letter_delete", NULL, 0))
        return KB_ECLOSED;
    int rc;
    struct kb_topic *t = topic_for_call(b, topic, &rc);
    if (t != NULL)
        rc = b->ops->dead_letter_delete(b->t, t->tt, id);
    gate_leave(b);
    return rc;
}

#define PURGE_BATCH 256

struct purge_batch {
    char *ids[PURGE_BATCH];
    size_t n;
    bool nomem;
};

static int purge_collect(const kb_dead_letter *dl, void *opaque)
{
    struct purge_batch *pb = opaque;
    if ((pb->ids[pb->n] = strdup(dl->id)) == NULL) {
        pb->nomem = true;
        return 1;
    }
    pb->n++;
    return 0;
}

int kb_dead_letters_purge(kb_bus *b, const char *topic, uint64_t *removed)
{
    uint64_t done = 0;
    int rc = KB_OK;
    if (b != NULL && b->ops->dead_letter_delete == NULL) {
        kb_errf(NULL, 0, "%s:// cannot delete dead letters", b->ops->scheme);
        rc = KB_ENOTFOUND;
    }
    /* a batch of IDs at a time, deleted after the walk: a broker's walk
     * holds its connection while it calls back */
    for (bool more = rc == KB_OK; more && rc == KB_OK;) {
        struct purge_batch pb = {.n = 0};
        rc = kb_dead_letters(b, topic, NULL, PURGE_BATCH, purge_collect, &pb);
        if (rc == KB_OK && pb.nomem) {
            kb_errf(NULL, 0, "kb_dead_letters_purge: out of memory for dead-letter IDs");
            rc = KB_ENOMEM;
        }
        uint64_t before = done;
        for (size_t i = 0; i < pb.n; i++) {
            int del = rc == KB_OK ? kb_dead_letter_delete(b, topic, pb.ids[i]) : rc;
            if (del == KB_OK)
                done++;
            else if (del != KB_ENOTFOUND)   /* gone meanwhile (a replay): not ours */
                rc = del;
            free(pb.ids[i]);
        }
        more = pb.n == PURGE_BATCH && done > before;
    }
    if (removed != NULL)
        *removed = done;
    return rc;
}

static void shutdown_pools(kb_bus *b)
{
    struct cds_lfht_iter it;
    struct kb_topic *t;
    rcu_read_lock();
    cds_lfht_for_each_entry(b->topics, &it, t, node) {
        KB_TSAN_ACQUIRE(t);   /* a subscribe may be adding topics meanwhile */
        if (kb__topic_pool(t) != NULL)
            kb_pool_shutdown(kb__topic_pool(t));
    }
    rcu_read_unlock();
}

int kb__bus_close_begin(kb_bus *b)
{
    if (b == NULL) {
        kb_errf(NULL, 0, "kb_close: bus is NULL");
        return KB_EINVAL;
    }
    if (kb__on_executor_thread()) {
        /* The executors it would stop include the one running this handler. */
        kb_errf(NULL, 0, "kb_close: called from a handler; close the bus from another thread");
        return KB_EINVAL;
    }
    if (gate_depth > 0) {
        kb_errf(NULL, 0, "kb_close: called inside another keybus call on this thread (a "
                "callback); it would wait for that call");
        return KB_EINVAL;
    }
    /* 1. No new calls or publishes. */
    if (!gate_close(b)) {
        kb_errf(NULL, 0, "kb_close: the bus is already being closed by another thread");
        return KB_ECLOSED;
    }
    return KB_OK;
}

int kb__bus_close_end(kb_bus *b, int64_t deadline)
{
    struct cds_lfht_iter it;
    struct kb_topic *t;

    /* Wake flushers, and publishers and feeders blocked on full lanes. */
    kb__sched_wake_waiters(b->sched);
    shutdown_pools(b);
    /* 2. Every call in progress has left: the gated ones (a subscribe may
     *    have added a pool meanwhile: shut it too), then the publishers. */
    gate_wait_empty(b);
    shutdown_pools(b);
    synchronize_rcu();
    /* 3. Brokers stop reading; what they delivered stays queued. */
    if (b->ops->stop_by != NULL)
        b->ops->stop_by(b->t, deadline);
    else if (b->ops->stop != NULL)
        b->ops->stop(b->t);
    /* 4. Handle what is queued, up to the deadline. */
    int rc = KB_OK;
    rcu_read_lock();
    cds_lfht_for_each_entry(b->topics, &it, t, node)
        if (kb__topic_pool(t) != NULL && kb__pool_drain(kb__topic_pool(t), deadline) != KB_OK)
            rc = KB_ETIMEDOUT;
    rcu_read_unlock();
    /* 5. Stop executors, give back what was not handled (brokers leave it
     *    unacked), close the transport, free. Nothing else runs now. */
    kb__sched_destroy(b->sched);
    size_t n = 0, cap = 0;
    struct kb_topic **all = NULL;
    rcu_read_lock();
    cds_lfht_for_each_entry(b->topics, &it, t, node) {
        if (kb_vec_reserve((void **)&all, &cap, n + 1, sizeof *all) != KB_OK)
            break;   /* out of memory: leak the rest rather than crash */
        all[n++] = t;
    }
    for (size_t i = 0; i < n; i++)
        cds_lfht_del(b->topics, &all[i]->node);
    rcu_read_unlock();
    for (size_t i = 0; i < n; i++) {
        if (kb__topic_pool(all[i]) != NULL)
            kb__pool_free(kb__topic_pool(all[i]));
        for (size_t k = 0; k < all[i]->n_retired; k++)
            kb__pool_free(all[i]->retired[k]);
        free(all[i]->retired);
    }
    int closed = b->ops->close(b->t, deadline);
    if (closed != KB_OK && rc == KB_OK)
        rc = closed;
    if (rc == KB_OK)
        rc = kb__publish_failures_take(b, "kb_close");
    kb__runs_close(b->runs);
    for (size_t i = 0; i < n; i++) {
        kb__topic_metrics_free(all[i]->metrics);
        free(all[i]->name);
        free(all[i]);
    }
    free(all);
    cds_lfht_destroy(b->topics, NULL);
    kb__conf_free(b->conf);
    pthread_mutex_destroy(&b->subscribe_lock);
    pthread_mutex_destroy(&b->gate_lock);
    pthread_mutex_destroy(&b->pub_fail_lock);
    pthread_cond_destroy(&b->gate_left);
    free(b);
    return rc;
}

bool kb__bus_enter(kb_bus *b, const char *who)
{
    return gate_enter(b, who, NULL, 0);
}

void kb__bus_leave(kb_bus *b)
{
    gate_leave(b);
}
