/* keybus-bench internals: the plan of a run (plan.c) and its driver
 * (scenario.c), the receiving side that checks order, loss and duplicates and
 * measures latency (collect.c), the runners (run_bus.c, baseline_*.c) and the
 * report (report.c). */
#ifndef KB_BENCH_H
#define KB_BENCH_H

#include <ck_pr.h>
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/resource.h>
#include <time.h>

#include <keybus/keybus.h>
#include <keybus/transport.h>   /* kb_now_ns */

#include "hist.h"

#define KB_BENCH_KEY_MAX 32

typedef enum { KB_SC_SINGLE, KB_SC_MULTI, KB_SC_MIXED } kb_scenario;

/* What one run publishes. Aggregate a gets events/aggregates events (the first
 * events%aggregates one more), numbered 0.. in publish order; producer p
 * publishes the aggregates with a % producers == p, so each aggregate has one
 * publisher and a defined order. */
typedef struct kb_plan {
    kb_scenario scenario;
    uint64_t events;
    uint32_t aggregates;
    uint32_t producers;
    uint32_t payload_bytes;     /* at least the 24-byte header below */
    uint32_t handler_us;        /* busy-wait per handled event */
    uint64_t rate;              /* offered events/s over all producers; 0 = as fast as possible */
    bool pace_sleep;            /* under a rate, sleep to each send time instead of spinning */
    uint32_t batch;             /* events per kb_publish_batch call; 0/1 = one publish each */
    double fail_rate;           /* fraction of events whose handler asks for one retry (bus runs) */
    const char *label;          /* for progress lines */
} kb_plan;

/* Start of every payload. t_ns is CLOCK_MONOTONIC at publish or, under --rate,
 * the scheduled send time (so a producer falling behind shows up as latency
 * instead of being hidden: no coordinated omission). */
typedef struct kb_bench_hdr {
    uint32_t agg;
    uint32_t reserved;
    uint64_t seq;
    uint64_t t_ns;
} kb_bench_hdr;

typedef struct kb_result {
    const char *scenario;
    const char *kind;           /* origin, large, sweep-events, sweep-threads, custom */
    char transport[160];        /* URL without password, or baseline:ring / baseline:mutex */
    uint64_t events;
    uint32_t aggregates, producers, threads, payload_bytes, handler_us;
    uint64_t rate;
    bool pace_sleep;            /* the plan's: producers slept to their send times */
    double seconds, events_per_s;
    uint64_t handled, order_violations, lost, duplicates, corrupt;
    uint64_t publish_retries;   /* publishes that met a full lane and were retried */
    int error;                  /* a publish or setup failed: the run is invalid */
    uint64_t rss_bytes;         /* peak RSS during the run */
    double origin_events_per_s;
    double ratio_ring, ratio_mutex;   /* 0: not measured in this run */
    double ratio_raw;           /* over baseline:redis-raw / nats-raw; 0: not measured */
    double ratio_xadd;          /* over baseline:redis-xadd (the server's ceiling); 0: not measured */
    double idle_cpu_pct;        /* CPU over a quiet second after the run; < 0: not measured */
    double cpu_ns_per_event;    /* process user + sys CPU from the first publish to the last
                                 * handled event, over the events handled */
    uint32_t batch;             /* the plan's batch (1: single publishes) */
    char idle[16];              /* pool.idle of a bus run ("" for baselines) */
    double fail_rate;           /* the plan's */
    char retry_scope[8];        /* retry.scope of a bus run with fail_rate > 0, else "" */
    kb_hist hist;               /* publish-to-handle latency, ns; with fail_rate > 0 only of
                                 * events published while their own aggregate did not wait
                                 * for a retry: the other aggregates' */
} kb_result;

/* How the bus runner opens keybus. */
typedef struct kb_bus_opts {
    const char *transport;      /* NULL: from the config file, env or default */
    const char *config;         /* INI file for kb_conf_load, or NULL */
    uint32_t threads;           /* pool.threads; 0 = library default */
    const char *idle;           /* pool.idle, or NULL for the configured one */
    int idle_cpu;               /* measure CPU over a quiet second after the run */
    const char *retry_scope;    /* retry.scope, or NULL for the configured one */
} kb_bus_opts;

/* User + system CPU of the whole process so far (every thread), seconds. */
static inline double kb_cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static inline void kb_spin_until(uint64_t deadline_ns)
{
    while ((uint64_t)kb_now_ns() < deadline_ns)
        ck_pr_stall();
}

/* Wait for a send time without holding a CPU, as a producer waiting for
 * requests or a socket would (the thread's timer slack is set to 1 ns). */
static inline void kb_sleep_until(uint64_t deadline_ns)
{
    if ((uint64_t)kb_now_ns() >= deadline_ns)
        return;
    struct timespec ts = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* The ring baseline's spin waits, which yield after a while: on a busy 2-core
 * machine a spinner can share a core with the thread it waits for, and a pure
 * spin then burns whole time slices. (The baseline measures a bare ring, so it
 * keeps away from keybus's own wait strategies.) */
static inline void bench_spin_pause(unsigned *spins)
{
    if (++*spins < 1024)
        ck_pr_stall();
    else
        sched_yield();
}

/* plan.c */
const char *kb_scenario_name(kb_scenario s);
double kb_scenario_origin_eps(kb_scenario s);
/* Events of aggregate agg; inline: producers ask once per event. */
static inline uint64_t kb_plan_count(const kb_plan *p, uint32_t agg)
{
    return p->events / p->aggregates + (agg < p->events % p->aggregates);
}
/* The aggregate's key: "order-N"; mixed alternates order-/user-/product- keys. */
size_t kb_plan_key(const kb_plan *p, uint32_t agg, char out[KB_BENCH_KEY_MAX]);

/* scenario.c */
/* Publish one event; KB_EFULL is retried, any other error stops the producer. */
typedef int (*kb_publish_fn)(void *ctx, const void *key, size_t key_len, const void *payload,
                             size_t len);
/* Publish msgs[0..n) as kb_publish_batch does: *accepted is the prefix taken;
 * KB_EFULL makes the producer resend the rest. */
typedef int (*kb_publish_batch_fn)(void *ctx, const kb_msg *msgs, size_t n, size_t *accepted);
/* Run the plan's producers against `fn` (or `batch_fn`, when not NULL and the
 * plan batches), then wait until everything is handled (or nothing moved for
 * 10 s). Prints progress on stderr after 2 s. Between kb_collect_begin and
 * kb_collect_end. */
void kb_drive(const kb_plan *p, kb_publish_fn fn, kb_publish_batch_fn batch_fn, void *ctx,
              kb_result *r);

/* collect.c: every runner's handler calls kb_collect_event. */
int kb_collect_begin(const kb_plan *p);
void kb_collect_event(const void *payload, size_t len);
/* Should this event's first handler run ask for a retry (the plan's fail_rate,
 * picked by a hash of aggregate and sequence)? */
int kb_collect_fails(const void *payload, size_t len);
/* The handler asked for a retry of this event: its aggregate waits until the
 * event is collected; what it published meanwhile stays out of the latency. */
void kb_collect_retried(const void *payload, size_t len);
uint64_t kb_collect_handled(void);
uint64_t kb_collect_start_ns(void);
void kb_collect_mark_start(void);
void kb_collect_end(const kb_plan *p, kb_result *r);
/* The plan's figures in *r (kb_collect_end does it; for runs that fail before). */
void kb_result_plan(kb_result *r, const kb_plan *p);

/* Runners: fill *r (kind and ratios are the caller's). */
void kb_run_bus(const kb_plan *p, const kb_bus_opts *o, kb_result *r);
void kb_run_ring(const kb_plan *p, kb_result *r);
void kb_run_mutex(const kb_plan *p, uint32_t threads, kb_result *r);
/* baseline_redis.c (built with the Redis transport): plain hiredis against `url`. */
void kb_run_redis_raw(const kb_plan *p, const char *url, kb_result *r);
/* baseline:redis-xadd: pipelined XADD only, the server's ceiling (baseline_redis.c). */
void kb_run_redis_xadd(const kb_plan *p, const char *url, kb_result *r);
/* baseline_nats.c (built with the NATS transport): plain nats.c against `url`. */
void kb_run_nats_raw(const kb_plan *p, const char *url, kb_result *r);

/* report.c */
void kb_report_header(FILE *out);
void kb_report_row(FILE *out, const kb_result *r);
void kb_report_json(FILE *out, const kb_result *r);
void kb_report_cdf(FILE *out, const kb_result *r);

#endif
