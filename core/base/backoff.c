/* The retry delay: exponential backoff with jitter, for the pool's retries
 * and the transports' reconnects. The jitter comes from the caller
 * (kb_bus_random), never from the process's rand()/random(). */
#include <keybus/transport.h>

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
