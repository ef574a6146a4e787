/* Delivery reports, connection states and lease changes, from transports to the
 * application's callbacks (kb_conf_set_delivery_cb, kb_conf_set_state_cb). */
#include "bus_int.h"
#include "conf_int.h"

int kb_bus_delivery_wanted(const kb_bus *b)
{
    kb_delivery_fn fn;
    void *opaque;
    kb__conf_delivery(b->conf, &fn, &opaque);
    return fn != NULL;
}

void kb_bus_delivery_report(kb_bus *b, const kb_delivery_report *r)
{
    kb_delivery_fn fn;
    void *opaque;
    kb__conf_delivery(b->conf, &fn, &opaque);
    if (fn != NULL)
        fn(r, opaque);
}

void kb_bus_state_report(kb_bus *b, kb_state state, const char *reason)
{
    kb_state_fn fn;
    void *opaque;
    kb__conf_state(b->conf, &fn, &opaque);
    if (fn != NULL)
        fn(b->ops->scheme, state, reason != NULL ? reason : "", opaque);
}

/* One site per trace point name, so `perf probe` can attach to each. */
void kb_bus_lease_changed(kb_bus *b, const char *stream, uint32_t partition, int gained)
{
    (void)b;
    if (gained)
        KB_PROBE2(lease_gain, stream, partition);
    else
        KB_PROBE2(lease_loss, stream, partition);
}
