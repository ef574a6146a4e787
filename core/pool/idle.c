#include "idle.h"

#include <ck_pr.h>
#include <sched.h>
#include <string.h>

#include "pool_calls.h"
#include "sync.h"

_Thread_local bool kb__idle_fed_by_transport;

void kb__executor_fed_by_transport(void)
{
    kb__idle_fed_by_transport = true;
}

bool kb__idle_wait_step(kb_idle_wait *w, int64_t *now_ns)
{
    if (w->idle == KB_IDLE_BLOCK)
        return true;
    if ((w->steps++ & 63) == 0) {
        *now_ns = kb__now_ns();
        if (w->phase_start_ns == 0)
            w->phase_start_ns = *now_ns;
    }
    int64_t waited = *now_ns - w->phase_start_ns;
    switch (w->idle) {
    case KB_IDLE_SPIN:
        ck_pr_stall();
        return false;
    case KB_IDLE_YIELD:
        sched_yield();
        return false;
    case KB_IDLE_ADAPTIVE:
    case KB_IDLE_BLOCK:
        break;
    }
    if (waited < w->spin_ns) {
        ck_pr_stall();
        return false;
    }
    if (waited < w->yield_ns) {
        sched_yield();
        return false;
    }
    return true;
}

int kb__idle_parse(const char *s)
{
    static const char *const names[] = {"adaptive", "spin", "yield", "block"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}
