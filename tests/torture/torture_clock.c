/* The clocks of a torture history: CLOCK_MONOTONIC is one clock for every
 * process of the machine, so handled times of several processes compare. */
#include <time.h>

#include "torture.h"

int64_t kb_torture_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t kb_torture_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
