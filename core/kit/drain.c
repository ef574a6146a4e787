/* kb_drain's wait, once for every transport: flush, note the targets, then
 * ask the broker until the group settled them. A consumer in this process
 * settles most drains' events, so its settling wakes the wait at once;
 * consumers elsewhere are only seen by asking, on a capped backoff. */
#include <errno.h>
#include <time.h>

#include "kit_int.h"

static int conf_ok(const kb_kit_drain_conf *c)
{
    const char *bad = c == NULL                       ? "no conf"
                      : c->size != sizeof *c          ? "size"
                      : c->flush == NULL              ? "flush"
                      : c->settled == NULL            ? "settled"
                      : c->poll_min_ms < 1            ? "poll_min_ms (>= 1)"
                      : c->poll_max_ms < c->poll_min_ms ? "poll_max_ms (>= poll_min_ms)"
                      : c->confirm_ms < 0             ? "confirm_ms (>= 0)"
                      : (c->progress == NULL) != (c->local == NULL) ? "progress and local (both or neither)"
                                                                    : NULL;
    if (bad == NULL)
        return 1;
    kb_errf(NULL, 0, "kb_kit_drain: bad conf: %s (size %zu, this kit's %zu)", bad,
            c != NULL ? c->size : 0, sizeof *c);
    return 0;
}

static void sleep_until(int64_t deadline_ns)
{
    struct timespec ts = {deadline_ns / 1000000000, deadline_ns % 1000000000};
    while (kb_now_ns() < deadline_ns &&
           clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

int kb_kit_drain(kb_bus *b, int timeout_ms, const kb_kit_drain_conf *conf)
{
    if (!conf_ok(conf))
        return KB_EINVAL;
    const kb_kit_drain_conf copy = *conf, *c = &copy;
    int64_t deadline = kb_deadline_ns(timeout_ms);
    int rc = kb_bus_wait_sliced(b, deadline, c->flush, c->opaque);
    if (rc == KB_OK && c->targets != NULL)
        rc = c->targets(c->opaque);
    if (rc == KB_OK)
        kb_err_clear();   /* a flush slice's "not yet confirmed" is stale now */
    int64_t poll_ms = c->poll_min_ms;
    while (rc == KB_OK) {
        if (kb_bus_closing(b))
            return KB_ECLOSED;   /* kb_close waits for this call: end it */
        int settled = c->settled(c->opaque, deadline);
        if (settled != 0)
            return settled > 0 ? KB_OK : settled;
        int64_t now = kb_now_ns();
        if (now >= deadline)
            return KB_ETIMEDOUT;
        int mine = c->local != NULL && c->local(c->opaque);
        int64_t next = now + (mine ? c->confirm_ms : poll_ms) * 1000000;
        if (next > deadline)
            next = deadline;
        if (mine || c->progress == NULL)
            sleep_until(next);
        else if (kb_signal_wait(c->progress, c->local, c->opaque, next))
            continue;   /* our own settling: ask again, same period */
        if (!mine)
            poll_ms = poll_ms * 2 < c->poll_max_ms ? poll_ms * 2 : c->poll_max_ms;
    }
    return rc;
}
