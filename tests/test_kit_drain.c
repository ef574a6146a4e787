/* The kit's kb_drain wait (kb_kit_drain) on a mem:// bus, with scripted
 * callbacks: a flush sliced until it is done, errors of each step ending
 * the drain with their code, this process's own progress waking the wait
 * long before the backoff would, the deadline (the flush's time counts in
 * it), no deadline, asks every confirm_ms while this process's settling
 * says so, and confs it refuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <keybus/kit.h>

#include "support/bus.h"

struct script {
    int flush_slices;       /* KB_ETIMEDOUT this many times, then flush_rc */
    int flush_rc, targets_rc, settled_rc;
    int settled_after;      /* > 0: settled from this ask on */
    _Atomic int flushes, targets, asks;
    _Atomic int done_here;  /* set by the "executor" thread: settled says 1 */
    kb_signal *progress;
};

static int flush(void *opaque, int64_t until_ns)
{
    struct script *s = opaque;
    (void)until_ns;
    return atomic_fetch_add(&s->flushes, 1) < s->flush_slices ? KB_ETIMEDOUT : s->flush_rc;
}

static int targets(void *opaque)
{
    struct script *s = opaque;
    atomic_fetch_add(&s->targets, 1);
    return s->targets_rc;
}

static int settled(void *opaque, int64_t deadline_ns)
{
    struct script *s = opaque;
    (void)deadline_ns;
    int asked = atomic_fetch_add(&s->asks, 1) + 1;
    return atomic_load(&s->done_here) || (s->settled_after > 0 && asked >= s->settled_after)
               ? 1
               : s->settled_rc;
}

static int local(void *opaque)
{
    return atomic_load(&((struct script *)opaque)->done_here);
}

static kb_kit_drain_conf conf_of(struct script *s)
{
    kb_kit_drain_conf c = {.size = sizeof c, .opaque = s, .flush = flush, .targets = targets,
                           .settled = settled, .poll_min_ms = 1, .poll_max_ms = 4};
    return c;
}

static void flush_in_slices_then_targets(void **state)
{
    (void)state;
    kb_bus *bus = kb_test_open("mem://", NULL, NULL);
    struct script s = {.flush_slices = 3, .done_here = 1};
    kb_kit_drain_conf c = conf_of(&s);
    assert_int_equal(kb_kit_drain(bus, 10000, &c), KB_OK);
    assert_int_equal(atomic_load(&s.flushes), 4);   /* three slices not done, then done */
    assert_int_equal(atomic_load(&s.targets), 1);
    assert_int_equal(atomic_load(&s.asks), 1);
    kb_close(bus, 1000);
}

static void each_step_error_ends_it(void **state)
{
    (void)state;
    kb_bus *bus = kb_test_open("mem://", NULL, NULL);
    struct script s = {.flush_rc = KB_ETRANSPORT};
    kb_kit_drain_conf c = conf_of(&s);
    assert_int_equal(kb_kit_drain(bus, 10000, &c), KB_ETRANSPORT);
    assert_int_equal(atomic_load(&s.targets), 0);

    struct script t = {.targets_rc = KB_ENOMEM};
    c = conf_of(&t);
    assert_int_equal(kb_kit_drain(bus, 10000, &c), KB_ENOMEM);
    assert_int_equal(atomic_load(&t.asks), 0);

    struct script u = {.settled_rc = KB_ETRANSPORT};
    c = conf_of(&u);
    assert_int_equal(kb_kit_drain(bus, 10000, &c), KB_ETRANSPORT);
    assert_int_equal(atomic_load(&u.asks), 1);
    kb_close(bus, 1000);
}

static void deadline_ends_it(void **state)
{
    (void)state;
    kb_bus *bus = kb_test_open("mem://", NULL, NULL);
    struct script s = {0};
    kb_kit_drain_conf c = conf_of(&s);
    assert_int_equal(kb_kit_drain(bus, 60, &c), KB_ETIMEDOUT);
    assert_true(atomic_load(&s.asks) >= 2);   /* asked again on the backoff */
    kb_close(bus, 1000);
}

static void *settle_later(void *arg)
{
    struct script *s = arg;
    while (atomic_load(&s->asks) == 0)   /* the drain asked once and waits */
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    nanosleep(&(struct timespec){0, 30000000}, NULL);
    atomic_store(&s->done_here, 1);
    kb_signal_notify(s->progress);
    return NULL;
}

/* The backoff is 20 s: only the progress signal can end the drain within
 * the test's bound. */
static void own_progress_wakes_the_wait(void **state)
{
    (void)state;
    kb_bus *bus = kb_test_open("mem://", NULL, NULL);
    struct script s = {.progress = kb_signal_new()};
    assert_non_null(s.progress);
    kb_kit_drain_conf c = conf_of(&s);
    c.progress = s.progress;
    c.local = local;
    c.poll_min_ms = c.poll_max_ms = 20000;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, settle_later, &s), 0);
    int64_t start = kb_now_ns();
    assert_int_equal(kb_kit_drain(bus, 60000, &c), KB_OK);
    assert_true(kb_now_ns() - start < 15000000000LL);
    assert_int_equal(atomic_load(&s.asks), 2);
    pthread_join(th, NULL);
    kb_signal_free(s.progress);
    kb_close(bus, 1000);
}

/* The flush's slices count in the drain's deadline: a flush that never
 * finishes ends the drain at it, with nothing asked. */
static void flush_counts_in_the_deadline(void **state)
{
    (void)state;
    kb_bus *bus = kb_test_open("mem://", NULL, NULL);
    struct script s = {.flush_slices = 1 << 30};
    kb_kit_drain_conf c = conf_of(&s);
    assert_int_equal(kb_kit_drain(bus, 50, &c), KB_ETIMEDOUT);
    assert_true(atomic_load(&s.flushes) >= 1);
    assert_int_equal(atomic_load(&s.targets), 0);
    assert_int_equal(atomic_load(&s.asks), 0);
    kb_close(bus, 1000);
}

/* No deadline (timeout < 0): it asks until the group settled. */
static void no_deadline_asks_until_settled(void **state)
{
    (void)state;
    kb_bus *bus = kb_test_open("mem://", NULL, NULL);
    struct script s = {.settled_after = 5};
    kb_kit_drain_conf c = conf_of(&s);
    assert_int_equal(kb_kit_drain(bus, -1, &c), KB_OK);
    assert_int_equal(atomic_load(&s.asks), 5);
    kb_close(bus, 1000);
}

static int always(void *opaque)
{
    (void)opaque;
    return 1;
}

/* While this process's own settling says the targets may be reached, the
 * broker is asked again every confirm_ms, not on the (here 20 s) backoff. */
static void own_settling_asks_after_confirm_ms(void **state)
{
    (void)state;
    kb_bus *bus = kb_test_open("mem://", NULL, NULL);
    struct script s = {.progress = kb_signal_new(), .settled_after = 4};
    assert_non_null(s.progress);
    kb_kit_drain_conf c = conf_of(&s);
    c.progress = s.progress;
    c.local = always;
    c.poll_min_ms = c.poll_max_ms = 20000;
    c.confirm_ms = 2;
    int64_t start = kb_now_ns();
    assert_int_equal(kb_kit_drain(bus, 60000, &c), KB_OK);
    assert_true(kb_now_ns() - start < 15000000000LL);
    assert_int_equal(atomic_load(&s.asks), 4);
    kb_signal_free(s.progress);
    kb_close(bus, 1000);
}

static void bad_confs_refused(void **state)
{
    (void)state;
    kb_bus *bus = kb_test_open("mem://", NULL, NULL);
    struct script s = {.done_here = 1};
    kb_kit_drain_conf c = conf_of(&s);
    c.size = sizeof c + 8;
    assert_int_equal(kb_kit_drain(bus, 1000, &c), KB_EINVAL);
    c = conf_of(&s);
    c.local = local;   /* without progress */
    assert_int_equal(kb_kit_drain(bus, 1000, &c), KB_EINVAL);
    c = conf_of(&s);
    c.poll_max_ms = 0;
    assert_int_equal(kb_kit_drain(bus, 1000, &c), KB_EINVAL);
    assert_int_equal(atomic_load(&s.flushes), 0);
    kb_close(bus, 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(flush_in_slices_then_targets),
        cmocka_unit_test(each_step_error_ends_it),
        cmocka_unit_test(deadline_ends_it),
        cmocka_unit_test(own_progress_wakes_the_wait),
        cmocka_unit_test(flush_counts_in_the_deadline),
        cmocka_unit_test(no_deadline_asks_until_settled),
        cmocka_unit_test(own_settling_asks_after_confirm_ms),
        cmocka_unit_test(bad_confs_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
