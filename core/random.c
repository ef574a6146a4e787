/* The bus's own generator, which retry jitter and the transports' nonces
 * draw from (never the process's rand()/random()); seeded at kb_open. */
#include <stdatomic.h>

#include "bus_int.h"

uint64_t kb_bus_random(kb_bus *b)
{
    /* splitmix64: a counter stepped atomically, then mixed */
    return kb_mix64(atomic_fetch_add_explicit(&b->rng, 0x9E3779B97F4A7C15ULL,
                                              memory_order_relaxed));
}
