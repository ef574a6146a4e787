/* A gate handlers can wait on, so tests control when lanes drain. */
#ifndef KB_TEST_GATE_H
#define KB_TEST_GATE_H

#include <stdatomic.h>
#include <time.h>

typedef struct kb_gate {
    _Atomic int open;
    _Atomic int waiting;   /* handlers blocked at the gate now */
} kb_gate;

static inline void kb_gate_pass(kb_gate *g)
{
    struct timespec nap = {0, 200000};
    g->waiting++;
    while (!g->open)
        nanosleep(&nap, NULL);
    g->waiting--;
}

static inline void kb_gate_wait_for_waiter(kb_gate *g)
{
    struct timespec nap = {0, 200000};
    for (int i = 0; i < 25000 && g->waiting == 0; i++)
        nanosleep(&nap, NULL);
}

static inline double kb_test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif /* KB_TEST_GATE_H */
