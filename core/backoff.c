/* Backoff with jitter, and the per-bus generator its jitter and the
 * transports' nonces draw from (never the process's rand()/random()). */
#include <stdatomic.h>

#include "bus_int.h"

uint64_t kb_bus_random(kb_bus *b)
{
    /* splitmix64: a counter stepped atomically, then mixed */
    return kb_mix64(atomic_fetch_add_explicit(&b->rng, 0x9E3779B97F4A7C15ULL,
                                              memory_order_relaxed));
}

int64_t kb_backoff_ns(int64_t base_ms, int64_t max_ms, uint32_t failures, uint64_t rnd)
{
    int64_t ms = base_ms;
    for (uint32_t i = 0; i < failures && ms > 0 && ms < max_ms; i++)
        ms = ms > max_ms / 2 ? max_ms : ms * 2;
    if (ms > max_ms)
        ms = max_ms;
    /* "equal jitter": half fixed, half random */
    int64_t half = ms * 1000000 / 2;
    return half + (half > 0 ? (int64_t)(rnd % (uint64_t)(half + 1)) : 0);
}
