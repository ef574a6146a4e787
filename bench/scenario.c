/* The driver: producers publish the plan's events in order, at the plan's
 * rate; then the wait for them to be handled. */
#include <pthread.h>
#include <sys/prctl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>

#include "bench.h"

#define KB_STALL_NS (10 * 1000000000ull)   /* give up when nothing is handled for this long */

struct producer {
    const kb_plan *plan;
    uint32_t index, active;     /* this producer, producers that own an aggregate */
    kb_publish_fn fn;
    kb_publish_batch_fn batch_fn;
    void *ctx;
    pthread_t thread;
    uint64_t retries;
    int error;
    char errmsg[200];
};

static atomic_int start_gate;
static atomic_uint producers_done;

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void producer_fail(struct producer *pr, int rc)
{
    pr->error = rc;
    snprintf(pr->errmsg, sizeof pr->errmsg, "publish: %s (%s)", kb_strerror(rc), kb_last_error());
}

/* Events gathered for one kb_publish_batch call, payloads copied. */
struct batch {
    uint32_t size, n;
    kb_msg *msgs;
    unsigned char *slab;        /* size payloads */
};

/* Send what the batch holds, resending the rest after KB_EFULL. */
static int send_batch(struct producer *pr, struct batch *b)
{
    size_t off = 0;
    int rc = KB_OK;
    while (off < b->n) {
        size_t taken = 0;
        rc = pr->batch_fn(pr->ctx, b->msgs + off, b->n - off, &taken);
        off += taken;
        if (rc == KB_EFULL)
            pr->retries++;
        else if (rc != KB_OK)
            break;
    }
    b->n = 0;
    return rc;
}

static void *produce(void *arg)
{
    struct producer *pr = arg;
    const kb_plan *p = pr->plan;
    struct batch b = {.size = pr->batch_fn != NULL && p->batch > 1 ? p->batch : 0};
    uint32_t mine = 0;
    for (uint32_t a = pr->index; a < p->aggregates; a += p->producers)
        mine++;
    uint32_t *aggs = malloc(sizeof *aggs * (mine ? mine : 1));
    char (*keys)[KB_BENCH_KEY_MAX] = malloc(sizeof *keys * (mine ? mine : 1));
    size_t *key_len = malloc(sizeof *key_len * (mine ? mine : 1));
    unsigned char *payload = malloc(p->payload_bytes);
    if (b.size > 0) {
        b.msgs = malloc(sizeof *b.msgs * b.size);
        b.slab = malloc((size_t)p->payload_bytes * b.size);
    }
    if (!aggs || !keys || !key_len || !payload || (b.size > 0 && (!b.msgs || !b.slab))) {
        pr->error = KB_ENOMEM;
        snprintf(pr->errmsg, sizeof pr->errmsg, "producer: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < p->payload_bytes; i++)
        payload[i] = (unsigned char)i;
    uint64_t rounds = p->events / p->aggregates + (p->events % p->aggregates != 0);
    /* Each producer offers rate/active; event k is due at t0 + k/share. */
    double gap_ns = p->rate ? 1e9 * pr->active / (double)p->rate : 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ pr->index, k = 0;

    if (p->pace_sleep)
        prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);   /* wake at the send time, not 50 us late */
    while (!atomic_load_explicit(&start_gate, memory_order_acquire))
        ck_pr_stall();
    uint64_t t0 = kb_collect_start_ns();

    for (uint64_t r = 0; r < rounds && !pr->error; r++) {
        /* This round's aggregates: all of mine that still have an event r. */
        uint32_t n = 0;
        for (uint32_t a = pr->index; a < p->aggregates; a += p->producers)
            if (r < kb_plan_count(p, a))
                aggs[n++] = a;
        if (p->scenario == KB_SC_MIXED)   /* interleave unpredictably, keep each aggregate's order */
            for (uint32_t i = n; i > 1; i--) {
                uint32_t j = (uint32_t)(xorshift(&rng) % i), t = aggs[i - 1];
                aggs[i - 1] = aggs[j];
                aggs[j] = t;
            }
        for (uint32_t i = 0; i < n; i++) {
            uint32_t a = aggs[i];
            uint32_t slot = a / p->producers;
            if (r == 0)
                key_len[slot] = kb_plan_key(p, a, keys[slot]);
            kb_bench_hdr h = {.agg = a, .seq = r};
            if (gap_ns > 0) {
                h.t_ns = t0 + (uint64_t)(gap_ns * (double)k++);
                if (p->pace_sleep)
                    kb_sleep_until(h.t_ns);
                else
                    kb_spin_until(h.t_ns);
            } else {
                h.t_ns = kb_now_ns();
            }
            memcpy(payload, &h, sizeof h);
            int rc = KB_OK;
            if (b.size > 0) {
                unsigned char *copy = b.slab + (size_t)b.n * p->payload_bytes;
                memcpy(copy, payload, p->payload_bytes);
                b.msgs[b.n++] = (kb_msg){keys[slot], key_len[slot], copy, p->payload_bytes, 0};
                if (b.n == b.size)
                    rc = send_batch(pr, &b);
            } else {
                while ((rc = pr->fn(pr->ctx, keys[slot], key_len[slot], payload,
                                    p->payload_bytes)) == KB_EFULL)
                    pr->retries++;
            }
            if (rc != KB_OK) {
                producer_fail(pr, rc);
                break;
            }
        }
    }
    if (b.n > 0 && !pr->error) {
        int rc = send_batch(pr, &b);
        if (rc != KB_OK)
            producer_fail(pr, rc);
    }
out:
    free(b.msgs);
    free(b.slab);
    free(aggs);
    free(keys);
    free(key_len);
    free(payload);
    atomic_fetch_add(&producers_done, 1);
    return NULL;
}

static void progress(const kb_plan *p, uint64_t start, uint64_t *next_report)
{
    uint64_t now = kb_now_ns();
    if (now - start < 2000000000ull || now < *next_report)
        return;
    *next_report = now + 1000000000ull;
    fprintf(stderr, "keybus-bench: %s: %.1f s, %llu of %llu events handled\n", p->label,
            (double)(now - start) / 1e9, (unsigned long long)kb_collect_handled(),
            (unsigned long long)p->events);
}

void kb_drive(const kb_plan *p, kb_publish_fn fn, kb_publish_batch_fn batch_fn, void *ctx,
              kb_result *r)
{
    struct producer *prs = calloc(p->producers, sizeof *prs);
    if (prs == NULL) {
        r->error = KB_ENOMEM;
        return;
    }
    uint32_t active = p->producers < p->aggregates ? p->producers : p->aggregates;
    atomic_store(&start_gate, 0);
    atomic_store(&producers_done, 0);
    uint32_t started = 0;
    for (uint32_t i = 0; i < p->producers; i++) {
        prs[i] = (struct producer){.plan = p, .index = i, .active = active, .fn = fn,
                                   .batch_fn = batch_fn, .ctx = ctx};
        if (pthread_create(&prs[i].thread, NULL, produce, &prs[i]) != 0) {
            r->error = KB_ENOMEM;
            break;
        }
        started++;
    }
    kb_collect_mark_start();
    double cpu_start = kb_cpu_seconds();
    atomic_store_explicit(&start_gate, 1, memory_order_release);

    uint64_t start = kb_now_ns(), next_report = 0, last_handled = 0, last_move = start;
    struct timespec tick = {0, 1000000};   /* polling does not affect the timing: handlers stamp it */
    while (atomic_load(&producers_done) < started) {
        nanosleep(&tick, NULL);
        progress(p, start, &next_report);
    }
    /* A failed producer leaves events unpublished: wait only for what is in flight. */
    uint64_t stall_ns = KB_STALL_NS;
    for (uint32_t i = 0; i < started; i++)
        if (prs[i].error)
            stall_ns = 1000000000ull;
    for (;;) {
        uint64_t handled = kb_collect_handled(), now = kb_now_ns();
        if (handled >= p->events)
            break;
        if (handled != last_handled) {
            last_handled = handled;
            last_move = now;
        } else if (now - last_move > stall_ns) {
            fprintf(stderr, "keybus-bench: %s: nothing handled for %llu s, %llu of %llu; giving up\n",
                    p->label, (unsigned long long)(stall_ns / 1000000000u),
                    (unsigned long long)handled, (unsigned long long)p->events);
            break;
        }
        nanosleep(&tick, NULL);
        progress(p, start, &next_report);
    }
    uint64_t handled = kb_collect_handled();
    if (handled > 0)
        r->cpu_ns_per_event = (kb_cpu_seconds() - cpu_start) * 1e9 / (double)handled;
    for (uint32_t i = 0; i < started; i++) {
        pthread_join(prs[i].thread, NULL);
        r->publish_retries += prs[i].retries;
        if (prs[i].error && !r->error) {
            r->error = prs[i].error;
            fprintf(stderr, "keybus-bench: %s: producer %u: %s\n", p->label, i, prs[i].errmsg);
        }
    }
    free(prs);
}
