/* Delivery reports, connection states and lease changes, from transports to the
 * application's callbacks (kb_conf_set_delivery_cb, kb_conf_set_state_cb);
 * publishes that failed after they were accepted, for kb_flush and kb_close. */
#include <stdio.h>

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

void kb_bus_publish_failed(kb_bus *b, const kb_delivery_report *r)
{
    pthread_mutex_lock(&b->pub_fail_lock);
    b->pub_failed++;
    b->pub_fail_rc = r->result < 0 ? r->result : KB_ETRANSPORT;
    snprintf(b->pub_fail_error, sizeof b->pub_fail_error, "%s: %s", r->topic,
             r->error != NULL && r->error[0] ? r->error : kb_strerror(b->pub_fail_rc));
    pthread_mutex_unlock(&b->pub_fail_lock);
    kb_bus_delivery_report(b, r);
}

int kb__publish_failures_take(kb_bus *b, const char *who)
{
    pthread_mutex_lock(&b->pub_fail_lock);
    uint64_t n = b->pub_failed;
    int rc = n > 0 ? b->pub_fail_rc : KB_OK;
    if (n > 0)
        kb_errf(NULL, 0, "%s: %llu published events failed since the last kb_flush (the "
                "latest: %s)", who, (unsigned long long)n, b->pub_fail_error);
    b->pub_failed = 0;
    pthread_mutex_unlock(&b->pub_fail_lock);
    return rc;
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
