/* Metrics recording: the bucket table, histogram slots per executor and
 * their sum on read. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (!b->core.metrics_enabled)
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

static void hist_merge(kb_hist_snap *out, const struct kb_hist *h)
{
    for (unsigned i = 0; i <= KB_HIST_BOUNDS; i++) {
        uint64_t n = atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        out->bucket[i] += n;
        out->count += n;
    }
    out->sum_ns += atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
}

void kb__topic_view(const struct kb_topic *t, kb_topic_view *out)
{
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->pool = kb__topic_pool((struct kb_topic *)t);
    if (t->metrics == NULL)
        return;
    out->hist = true;
    for (uint32_t i = 0; i < t->metrics->n; i++) {
        hist_merge(&out->latency, &t->metrics->ex[i].latency);
        hist_merge(&out->duration, &t->metrics->ex[i].duration);
    }
}
