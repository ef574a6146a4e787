/* Metrics: histogram slots per executor, the snapshot of every topic's
 * figures, kb_metrics_write, and starting and stopping the endpoint and the
 * stats feed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_int.h"
#include "metrics.h"

const int64_t kb__hist_bound_ns[KB_HIST_BOUNDS + 2] = {
    1000,       2500,       5000,       10000,       25000,       50000,
    100000,     250000,     500000,     1000000,     2500000,     5000000,
    10000000,   25000000,   50000000,   100000000,   250000000,   500000000,
    1000000000, 2500000000, 5000000000, 10000000000, INT64_MAX,   INT64_MAX,
};

const char *const kb__hist_bound_text[KB_HIST_BOUNDS] = {
    "1e-06", "2.5e-06", "5e-06", "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025",
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
    "0.25", "0.5", "1", "2.5", "5", "10",
};

uint64_t kb__tsc_mult;

#if defined(__x86_64__)
static bool tsc_invariant(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[4096];
    bool constant = false, nonstop = false;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        constant = strstr(line, " constant_tsc") != NULL;
        nonstop = strstr(line, " nonstop_tsc") != NULL;
        break;
    }
    if (f != NULL)
        fclose(f);
    return constant && nonstop;
}

/* A clock reading bracketed by two TSC readings, so a preemption between
 * them shows as a wide bracket. */
static void tsc_pair(uint64_t *tsc, int64_t *ns, uint64_t *spread)
{
    uint64_t a = __rdtsc();
    *ns = kb__now_ns();
    uint64_t b = __rdtsc();
    *tsc = a + (b - a) / 2;
    *spread = b - a;
}

/* Ticks per ns against the monotonic clock over 10 ms, once per process. */
static void tsc_calibrate(void)
{
    if (!tsc_invariant())
        return;
    for (int tries = 0; tries < 5; tries++) {
        uint64_t t0, t1, s0, s1;
        int64_t n0, n1;
        tsc_pair(&t0, &n0, &s0);
        do
            tsc_pair(&t1, &n1, &s1);
        while (n1 - n0 < 10000000);
        /* brackets of a few µs at most: the error stays under 0.1 % */
        if (t1 > t0 && s0 + s1 < (t1 - t0) / 2000) {
            kb__tsc_mult = (uint64_t)(((unsigned __int128)(n1 - n0) << 32) / (t1 - t0));
            return;
        }
    }
}
#else
static void tsc_calibrate(void)
{
}
#endif

const uint8_t kb__hist_from_log2[35] = {
    0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  1,  1,  2,  3,  4,  5,  6,  7,
    8,  9,  10, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 19, 20, 21, 22,
};

struct kb_topic_metrics *kb__topic_metrics_new(const kb_bus *b)
{
    if (!kb_conf_bool(b->conf, "metrics.enabled"))
        return NULL;
    static pthread_once_t calibrated = PTHREAD_ONCE_INIT;
    pthread_once(&calibrated, tsc_calibrate);
    struct kb_topic_metrics *m = calloc(1, sizeof *m);
    if (m == NULL)
        return NULL;
    m->n = kb__sched_threads(b->sched);
    m->ex = aligned_alloc(KB_CACHELINE, sizeof *m->ex * m->n);
    if (m->ex == NULL) {
        free(m);
        return NULL;
    }
    memset(m->ex, 0, sizeof *m->ex * m->n);
    return m;
}

void kb__topic_metrics_free(struct kb_topic_metrics *m)
{
    if (m != NULL)
        free(m->ex);
    free(m);
}

static void hist_merge(kb_hist_snap *out, struct kb_hist *h)
{
    for (unsigned i = 0; i <= KB_HIST_BOUNDS; i++) {
        uint64_t n = atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        out->bucket[i] += n;
        out->count += n;
    }
    out->sum_ns += atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
}

/* Lane counters per partition: lane and partition come from the low bits of
 * one hash, so with pool.workers a multiple of partitions lane i only ever
 * holds events of partition i % partitions. */
static void partition_lanes(kb_pool *pool, kb_metrics_topic *mt)
{
    kb_pool_stats ps;
    kb_pool_stats_get(pool, &ps);
    if (ps.lanes % mt->n_parts != 0)
        return;
    for (uint32_t i = 0; i < mt->n_parts; i++)
        mt->parts[i].lanes = true;
    for (uint32_t lane = 0; lane < ps.lanes; lane++) {
        kb_lane_stats ls;
        if (kb_pool_lane_stats(pool, lane, &ls) != KB_OK || !ls.allocated)
            continue;
        kb_metrics_part *p = &mt->parts[lane % mt->n_parts];
        p->received += ls.submitted;
        p->handled += ls.handled;
        p->retried += ls.retried;
        p->dead_lettered += ls.dead;
    }
}

static int collect_topic(kb_bus *b, struct kb_topic *t, bool partitions, kb_metrics_topic *mt)
{
    if ((mt->name = strdup(t->name)) == NULL)
        return KB_ENOMEM;
    mt->rc = kb_stats(b, t->name, &mt->s);
    if (mt->rc == KB_ECLOSED)
        return KB_ECLOSED;
    kb_pool *pool = kb__topic_pool(t);
    mt->pool = pool != NULL;
    if (t->metrics != NULL) {
        mt->hist = true;
        for (uint32_t i = 0; i < t->metrics->n; i++) {
            hist_merge(&mt->latency, &t->metrics->ex[i].latency);
            hist_merge(&mt->duration, &t->metrics->ex[i].duration);
        }
    }
    if (!partitions || mt->rc != KB_OK || mt->s.partitions == 0)
        return KB_OK;
    mt->parts = calloc(mt->s.partitions, sizeof *mt->parts);
    if (mt->parts == NULL)
        return KB_ENOMEM;
    mt->n_parts = mt->s.partitions;
    for (uint32_t i = 0; i < mt->n_parts; i++) {
        mt->parts[i].rc = kb_partition_stats_get(b, t->name, i, &mt->parts[i].ps);
        if (mt->parts[i].rc == KB_ECLOSED)
            return KB_ECLOSED;
    }
    if (pool != NULL)
        partition_lanes(pool, mt);
    return KB_OK;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const kb_metrics_topic *)a)->name, ((const kb_metrics_topic *)b)->name);
}

int kb__metrics_collect(kb_bus *b, bool partitions, kb_metrics_snap *out)
{
    memset(out, 0, sizeof *out);
    if (!kb__bus_enter(b, "kb_metrics_write"))
        return KB_ECLOSED;
    /* Topics live until kb_close, which waits for this call to leave the
     * gate: the pointers stay valid after the read section. */
    struct kb_topic **all = NULL;
    size_t n = 0, cap = 0;
    int rc = KB_OK;
    struct cds_lfht_iter it;
    struct kb_topic *t;
    rcu_read_lock();
    cds_lfht_for_each_entry(b->topics, &it, t, node) {
        KB_TSAN_ACQUIRE(t);   /* published by cds_lfht_add */
        if ((rc = kb_vec_reserve((void **)&all, &cap, n + 1, sizeof *all)) != KB_OK)
            break;
        all[n++] = t;
    }
    rcu_read_unlock();
    if (rc == KB_OK && n > 0 && (out->t = calloc(n, sizeof *out->t)) == NULL)
        rc = KB_ENOMEM;
    for (size_t i = 0; rc == KB_OK && i < n; i++) {
        out->n++;
        rc = collect_topic(b, all[i], partitions, &out->t[i]);
    }
    free(all);
    kb__bus_leave(b);
    if (rc == KB_OK && out->n > 1)
        qsort(out->t, out->n, sizeof *out->t, by_name);
    if (rc == KB_ENOMEM)
        kb_errf(NULL, 0, "kb_metrics_write: out of memory");
    return rc;
}

void kb__metrics_snap_free(kb_metrics_snap *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->t[i].name);
        free(s->t[i].parts);
    }
    free(s->t);
    memset(s, 0, sizeof *s);
}

int kb_metrics_write(kb_bus *b, char *buf, size_t len, size_t *needed)
{
    if (b == NULL || (buf == NULL && len > 0)) {
        kb_errf(NULL, 0, "kb_metrics_write: %s is NULL", b == NULL ? "bus" : "buf");
        return KB_EINVAL;
    }
    kb_metrics_snap s;
    int rc = kb__metrics_collect(b, true, &s);
    size_t size = 0;
    char *text = rc == KB_OK ? kb__metrics_prom(&s, &size) : NULL;
    kb__metrics_snap_free(&s);
    if (rc != KB_OK)
        return rc;
    if (text == NULL) {
        kb_errf(NULL, 0, "kb_metrics_write: out of memory");
        return KB_ENOMEM;
    }
    if (needed != NULL)
        *needed = size + 1;
    if (len < size + 1) {
        free(text);
        kb_errf(NULL, 0, "kb_metrics_write: %zu bytes needed, the buffer has %zu", size + 1,
                len);
        return KB_ETOOBIG;
    }
    memcpy(buf, text, size + 1);
    free(text);
    return KB_OK;
}

int kb__metrics_open(kb_bus *b, char *errstr, size_t errlen)
{
    const char *listen = kb_conf_str(b->conf, "metrics.listen");
    if (listen[0] != '\0') {
        int rc = kb__metrics_http_start(b, listen, &b->metrics_http, errstr, errlen);
        if (rc != KB_OK)
            return rc;
    }
    kb_stats_fn fn;
    void *opaque;
    kb__conf_stats_cb(b->conf, &fn, &opaque);
    int64_t interval = kb_conf_int(b->conf, "stats.interval_ms");
    if (fn == NULL || interval == 0)
        return KB_OK;
    return kb__stats_feed_start(b, interval, fn, opaque, &b->stats_feed, errstr, errlen);
}

void kb__metrics_close(kb_bus *b)
{
    kb__stats_feed_stop(b->stats_feed);
    b->stats_feed = NULL;
    kb__metrics_http_stop(b->metrics_http);
    b->metrics_http = NULL;
}
