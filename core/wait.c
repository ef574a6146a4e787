/* Waits that serve an application call (kb_flush, kb_drain), cut short by
 * kb_close: it holds until they return; and how long a publish may wait for
 * room, as the bus resolved it. */
#include <stdatomic.h>

#include "bus_int.h"

/* A slice is short enough that kb_close is not kept waiting noticeably. */
#define WAIT_SLICE_NS 100000000

int kb_bus_closing(const kb_bus *b)
{
    return atomic_load_explicit(&b->closing, memory_order_acquire);
}

int kb_bus_enqueue_timeout_ms(const kb_bus *b)
{
    return b->enqueue_timeout_ms;
}

int kb_bus_wait_sliced(kb_bus *b, int64_t deadline_ns, int (*step)(void *arg, int64_t until_ns),
                       void *arg)
{
    for (;;) {
        int64_t now = kb__now_ns();
        int64_t until = deadline_ns - now > WAIT_SLICE_NS ? now + WAIT_SLICE_NS : deadline_ns;
        int rc = step(arg, until);
        if (rc != KB_ETIMEDOUT || until == deadline_ns)
            return rc;
        if (kb_bus_closing(b))
            return KB_ECLOSED;
    }
}
