/* Condition variables of the serve floor's threads, on the monotonic clock
 * their deadlines are taken from (a wall-clock step must not stretch a
 * wait). Below every other file of the floor. */
#include <pthread.h>
#include <time.h>

#include "serve.h"

void kb__serve_cond_init(pthread_cond_t *c)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(c, &ca);
    pthread_condattr_destroy(&ca);
}
