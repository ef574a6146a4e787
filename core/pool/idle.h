/* Wait strategies (pool.idle): how a thread with nothing to do waits — an
 * executor whose lanes are empty, a producer facing a full lane. Each wait
 * goes through phases, spin then yield then block, and the strategy picks
 * which phases exist. Blocking itself is the caller's (a kb_signal), since
 * only it knows what to wait on. */
#ifndef KB_CORE_IDLE_H
#define KB_CORE_IDLE_H

#include <stdbool.h>
#include <stdint.h>

#include <keybus/pool.h>

/* Adaptive phases: spinning covers a burst's gaps at a few µs of wake-up
 * latency; yielding then lets a thread that shares our CPU run; after that
 * the wait is long enough that a futex wake (~12 µs) no longer matters. */
#define KB_IDLE_SPIN_NS 50000
#define KB_IDLE_YIELD_NS 2000000
/* Adaptive on an executor fed by a transport (below): a read's partitions
 * come microseconds apart, the next read a broker round trip later. */
#define KB_IDLE_FED_SPIN_NS 15000

typedef struct kb_idle_wait {
    kb_idle idle;
    uint32_t steps;
    int64_t phase_start_ns;   /* 0: not read yet */
    int64_t spin_ns, yield_ns;   /* adaptive: the ends of its spin and yield phases */
} kb_idle_wait;

/* Set on an executor thread once it settled a transport's delivery (a
 * broker, not mem://). Its work then comes in reads a broker round trip
 * apart, and yielding through those gaps only takes CPU from the reader and
 * the broker on the same CPUs (client CPU per event about halved, 2 vCPUs):
 * its own idle waits spin briefly, then block. Executors serve one bus, so
 * the mark never mixes transports. */
extern _Thread_local bool kb__idle_fed_by_transport;

/* A wait by `idle`'s phases: a producer facing a full lane, including a
 * handler publishing from a transport-fed executor. */
static inline void kb__idle_wait_init(kb_idle_wait *w, kb_idle idle)
{
    w->idle = idle;
    w->steps = 0;
    w->phase_start_ns = 0;
    w->spin_ns = KB_IDLE_SPIN_NS;
    w->yield_ns = KB_IDLE_YIELD_NS;
}

/* An executor's wait for work: as kb__idle_wait_init, with the short spin and
 * no yield once the executor is transport-fed. */
static inline void kb__idle_wait_init_executor(kb_idle_wait *w, kb_idle idle)
{
    kb__idle_wait_init(w, idle);
    if (kb__idle_fed_by_transport)
        w->spin_ns = w->yield_ns = KB_IDLE_FED_SPIN_NS;
}

/* The awaited thing moved (a consumer made progress): start spinning again. */
static inline void kb__idle_wait_reset(kb_idle_wait *w)
{
    w->phase_start_ns = 0;
}

/* One step of waiting: a pause or a yield. true: stop spinning and block now.
 * `now_ns` is refreshed every 64 steps (for the caller's deadline checks too). */
bool kb__idle_wait_step(kb_idle_wait *w, int64_t *now_ns);

#endif /* KB_CORE_IDLE_H */
