/* What the pool floor (core/pool/) gives the bus above it: calls on pools
 * that share one scheduler, and the pieces the publish path inlines (the
 * record, FNV-1a, the clock and fences, trace points). The bus includes this
 * header alone from the floor and sees no pool, lane or executor layout:
 * how a lane counts what it finished is pool.c's business only. */
#ifndef KB_CORE_POOL_CALLS_H
#define KB_CORE_POOL_CALLS_H

#include <stdbool.h>
#include <stdint.h>

#include <keybus/pool.h>

#include "hash.h"
#include "probes.h"
#include "rec.h"
#include "sync.h"

/* Executors shared by every pool made on them (a bus's topics). */
typedef struct kb_sched kb_sched;

/* The bus's own handle result: give the item back unhandled, as
 * finish(KB_ECLOSED) — a broker partition whose lease was lost. */
enum { KB_POOL_SKIP = 3 };

/* Start `threads` executors waiting by `idle`; NULL with errstr on failure. */
kb_sched *kb__sched_new(uint32_t threads, kb_idle idle, char *errstr, size_t errlen);
/* Stop and join every executor, then free. Work still queued stays queued. */
void kb__sched_destroy(kb_sched *s);
/* How many executors there are: slots per executor are indexed below it. */
uint32_t kb__sched_threads(const kb_sched *s);
/* Wake whoever waits in kb__pools_flush or kb__pool_drain on `s`, so that
 * it looks at its stop condition again. */
void kb__sched_wake_waiters(kb_sched *s);

/* A pool on executors the caller owns (kb_pool_new makes its own), whose
 * handle may return KB_POOL_SKIP. */
kb_pool *kb__pool_new_on(kb_sched *s, const kb_pool_options *o, char *errstr, size_t errlen);
/* kb_pool_submit_hash without the exported symbol's indirection and its
 * argument checks (p and item not NULL). */
int kb__pool_submit_one(kb_pool *p, uint32_t hash, void *item, int timeout_ms);
/* The lane a hash routes to: the one rule, used by submits and by messages. */
uint32_t kb__pool_lane(const kb_pool *p, uint32_t hash);
/* True when the calling thread is the executor that drains `lane`: a submit
 * there waiting for room waits for itself. */
bool kb__pool_lane_is_ours(const kb_pool *p, uint32_t lane);
/* Wait until every lane of the `n` pools (on one scheduler) has finished
 * what it held at the call, or the deadline passes (KB_ETIMEDOUT), or
 * cut(arg) turns true with lanes left (KB_ECLOSED); cut is looked at
 * whenever an item finishes and at kb__sched_wake_waiters. KB_ENOMEM. */
int kb__pools_flush(kb_pool *const *pools, size_t n, int64_t deadline_ns, int (*cut)(void *),
                    void *arg);
/* Wait until nothing is queued or running, up to the deadline. */
int kb__pool_drain(kb_pool *p, int64_t deadline_ns);
/* Free a pool whose scheduler is stopped; leftovers finish with KB_ECLOSED. */
void kb__pool_free(kb_pool *p);

/* The executor the calling thread is, counted from 1; 0 on any other
 * thread. Handlers run on executors. */
extern _Thread_local uint32_t kb__executor_number;
static inline bool kb__on_executor_thread(void)
{
    return kb__executor_number != 0;
}
/* On an executor thread: its index below kb__sched_threads. */
static inline uint32_t kb__executor_index(void)
{
    return kb__executor_number - 1;
}
/* This executor settles a broker's deliveries: its idle waits get shorter
 * (idle.h says why). */
void kb__executor_fed_by_transport(void);

/* Parse pool.idle: "spin" | "yield" | "block" | "adaptive"; -1 when unknown. */
int kb__idle_parse(const char *s);

#endif /* KB_CORE_POOL_CALLS_H */
