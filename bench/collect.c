/* The receiving side of every run. Each aggregate's state is only touched by
 * the one thread that handles its lane, so the checks need no atomics; each
 * handler thread keeps its own latency histogram, merged at the end. */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

struct agg_state {
    uint64_t count, next, seen, order, dups;
    uint64_t *bits;                        /* one bit per sequence number: duplicates */
    int waiting;                           /* an event of it asked for a retry */
    uint64_t waited_until_ns;              /* when its last retried event was handled */
} __attribute__((aligned(64)));

struct thread_state {
    _Atomic uint64_t handled;              /* read by the progress loop */
    uint64_t last_ns, corrupt;
    struct thread_state *next;
    kb_hist hist;
};

static struct {
    struct agg_state *aggs;
    uint32_t n_aggs, handler_us;
    uint64_t fail_below;                   /* events whose hash is below fail once */
    uint64_t start_ns;
    unsigned gen;                          /* bumped per run: thread states are per run */
    pthread_mutex_t lock;                  /* guards `threads` */
    struct thread_state *threads;
} C = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local struct thread_state *tls;
static _Thread_local unsigned tls_gen;     /* tls is stale (freed) unless this matches C.gen */

/* Linux >= 4.0 resets VmHWM to the current RSS when "5" is written to
 * clear_refs; trimming the heap first drops what earlier runs freed, so each
 * run reports its own peak. Where that fails the peak is the process's so far. */
static void rss_reset(void)
{
    malloc_trim(0);
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static uint64_t rss_peak(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

static void free_aggs(void)
{
    for (uint32_t a = 0; a < C.n_aggs; a++)
        free(C.aggs[a].bits);
    free(C.aggs);
    C.aggs = NULL;
    C.n_aggs = 0;
}

int kb_collect_begin(const kb_plan *p)
{
    /* aligned: one aggregate's counters per cache line, no false sharing */
    C.aggs = aligned_alloc(64, p->aggregates * sizeof *C.aggs);
    if (C.aggs != NULL)
        memset(C.aggs, 0, p->aggregates * sizeof *C.aggs);
    if (C.aggs == NULL)
        return -1;
    C.n_aggs = p->aggregates;
    for (uint32_t a = 0; a < p->aggregates; a++) {
        C.aggs[a].count = kb_plan_count(p, a);
        C.aggs[a].bits = calloc(C.aggs[a].count / 64 + 1, sizeof(uint64_t));
        if (C.aggs[a].bits == NULL) {
            free_aggs();
            return -1;
        }
    }
    C.handler_us = p->handler_us;
    C.fail_below = p->fail_rate >= 1 ? UINT64_MAX : (uint64_t)(p->fail_rate * 18446744073709551616.0);
    C.gen++;
    rss_reset();
    return 0;
}

static struct thread_state *thread_state(void)
{
    if (tls != NULL && tls_gen == C.gen)
        return tls;
    struct thread_state *t = calloc(1, sizeof *t);
    if (t == NULL)
        abort();   /* nothing sensible to measure without it */
    tls_gen = C.gen;
    pthread_mutex_lock(&C.lock);
    t->next = C.threads;
    C.threads = t;
    pthread_mutex_unlock(&C.lock);
    return tls = t;
}

void kb_collect_event(const void *payload, size_t len)
{
    uint64_t now = kb_now_ns();
    struct thread_state *t = thread_state();
    kb_bench_hdr h;
    if (len < sizeof h) {
        t->corrupt++;
    } else {
        memcpy(&h, payload, sizeof h);
        struct agg_state *s = h.agg < C.n_aggs ? &C.aggs[h.agg] : NULL;
        if (s == NULL || h.seq >= s->count) {
            t->corrupt++;
        } else if (s->bits[h.seq / 64] & (1ull << (h.seq % 64))) {
            s->dups++;
        } else {
            s->bits[h.seq / 64] |= 1ull << (h.seq % 64);
            s->seen++;
            if (h.seq < s->next)
                s->order++;   /* arrived after a later event of its aggregate */
            else
                s->next = h.seq + 1;
        }
        /* In key order, the first event of a waiting aggregate collected is
         * the retried one. It and what its aggregate published before it
         * passed wait for the retry by design: only the others are measured. */
        int own_wait = s != NULL && (s->waiting || h.t_ns < s->waited_until_ns);
        if (s != NULL && s->waiting) {
            s->waiting = 0;
            s->waited_until_ns = now;
        }
        if (!own_wait)
            kb_hist_record(&t->hist, now > h.t_ns ? now - h.t_ns : 0);
    }
    t->last_ns = now;
    atomic_store_explicit(&t->handled, atomic_load_explicit(&t->handled, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    if (C.handler_us)
        kb_spin_until(now + C.handler_us * 1000ull);
}

static uint64_t mix64(uint64_t x)
{
    /* splitmix64's finaliser: neighbouring sequences land far apart */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

int kb_collect_fails(const void *payload, size_t len)
{
    kb_bench_hdr h;
    if (C.fail_below == 0 || len < sizeof h)
        return 0;
    memcpy(&h, payload, sizeof h);
    return mix64(((uint64_t)h.agg << 40) ^ h.seq) < C.fail_below;
}

void kb_collect_retried(const void *payload, size_t len)
{
    kb_bench_hdr h;
    if (len < sizeof h)
        return;
    memcpy(&h, payload, sizeof h);
    if (h.agg < C.n_aggs)
        C.aggs[h.agg].waiting = 1;
}

uint64_t kb_collect_handled(void)
{
    uint64_t n = 0;
    pthread_mutex_lock(&C.lock);
    for (struct thread_state *t = C.threads; t; t = t->next)
        n += atomic_load_explicit(&t->handled, memory_order_relaxed);
    pthread_mutex_unlock(&C.lock);
    return n;
}

void kb_collect_mark_start(void)
{
    C.start_ns = kb_now_ns();
}

uint64_t kb_collect_start_ns(void)
{
    return C.start_ns;
}

void kb_result_plan(kb_result *r, const kb_plan *p)
{
    r->events = p->events;
    r->aggregates = p->aggregates;
    r->producers = p->producers;
    r->payload_bytes = p->payload_bytes;
    r->handler_us = p->handler_us;
    r->rate = p->rate;
    r->pace_sleep = p->pace_sleep;
    r->batch = p->batch > 1 ? p->batch : 1;
    r->fail_rate = p->fail_rate;
    r->scenario = kb_scenario_name(p->scenario);
    r->origin_events_per_s = kb_scenario_origin_eps(p->scenario);
}

/* Call after every handler thread has stopped. */
void kb_collect_end(const kb_plan *p, kb_result *r)
{
    uint64_t last = C.start_ns;
    kb_hist_reset(&r->hist);
    pthread_mutex_lock(&C.lock);
    while (C.threads) {
        struct thread_state *t = C.threads;
        C.threads = t->next;
        r->handled += atomic_load(&t->handled);
        r->corrupt += t->corrupt;
        if (t->last_ns > last)
            last = t->last_ns;
        kb_hist_merge(&r->hist, &t->hist);
        free(t);
    }
    pthread_mutex_unlock(&C.lock);
    uint64_t distinct = 0;
    for (uint32_t a = 0; a < C.n_aggs; a++) {
        struct agg_state *s = &C.aggs[a];
        r->order_violations += s->order;
        r->duplicates += s->dups;
        r->lost += s->count - s->seen;
        distinct += s->seen;
    }
    free_aggs();
    r->rss_bytes = rss_peak();
    kb_result_plan(r, p);
    r->seconds = (double)(last - C.start_ns) / 1e9;
    r->events_per_s = r->seconds > 0 ? (double)distinct / r->seconds : 0;
}
