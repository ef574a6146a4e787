/* kb_close: stop intake, wake blocked publishers with KB_ECLOSED, drain to the
 * deadline, and an idle bus that burns no CPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/check.h"
#include "support/gate.h"

struct slow {
    kb_gate gate;
    _Atomic int handled;
    int sleep_us;
};

static int slow_handler(const kb_event *ev, void *opaque)
{
    struct slow *s = opaque;
    (void)ev;
    kb_gate_pass(&s->gate);
    if (s->sleep_us > 0)
        usleep((useconds_t)s->sleep_us);
    s->handled++;
    return KB_HANDLED;
}

static kb_bus *open_bus(const char *capacity, const char *timeout_ms)
{
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "pool.queue_capacity", capacity, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "pool.enqueue_timeout_ms", timeout_ms, err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    return b;
}

struct publisher {
    kb_bus *b;
    int rc;
    double returned_at;
};

static void *publish_into_full_lane(void *arg)
{
    struct publisher *p = arg;
    p->rc = kb_publish(p->b, "t", "k", 1, "late", 4);
    p->returned_at = kb_test_now_ms();
    return NULL;
}

struct closer {
    kb_bus *b;
    int timeout_ms, rc;
};

static void *close_bus(void *arg)
{
    struct closer *c = arg;
    c->rc = kb_close(c->b, c->timeout_ms);
    return NULL;
}

static void blocked_publisher_wakes_with_eclosed(void **state)
{
    (void)state;
    kb_bus *b = open_bus("1", "60000");
    struct slow s = {0};
    kb_assert_ok(kb_subscribe(b, "t", slow_handler, &s));
    kb_assert_ok(kb_publish(b, "t", "k", 1, "a", 1));
    kb_gate_wait_for_waiter(&s.gate);
    kb_assert_ok(kb_publish(b, "t", "k", 1, "b", 1));   /* fills the lane */

    struct publisher p = {b, -100, 0};
    pthread_t pub, clo;
    pthread_create(&pub, NULL, publish_into_full_lane, &p);
    usleep(50000);
    double t0 = kb_test_now_ms();
    struct closer c = {b, 5000, -100};
    pthread_create(&clo, NULL, close_bus, &c);
    pthread_join(pub, NULL);
    assert_int_equal(p.rc, KB_ECLOSED);
    assert_true(p.returned_at - t0 < 20000.0);   /* woken, not the 60 s enqueue timeout */
    s.gate.open = 1;
    pthread_join(clo, NULL);
    kb_assert_ok(c.rc);
    assert_int_equal(s.handled, 2);              /* both accepted events drained */
}

static void close_drains_everything_queued(void **state)
{
    (void)state;
    kb_bus *b = open_bus("1000", "200");
    struct slow s = {.sleep_us = 20};
    s.gate.open = 1;
    kb_assert_ok(kb_subscribe(b, "t", slow_handler, &s));
    for (int i = 0; i < 2000; i++) {
        char key[16];
        int len = snprintf(key, sizeof key, "k%d", i % 50);
        kb_assert_ok(kb_publish(b, "t", key, (size_t)len, "x", 1));
    }
    kb_assert_ok(kb_close(b, -1));
    assert_int_equal(s.handled, 2000);
}

static void close_stops_at_the_deadline(void **state)
{
    (void)state;
    kb_bus *b = open_bus("1000", "200");
    struct slow s = {.sleep_us = 20000};   /* 20 ms per event, one key: 2 s of work */
    s.gate.open = 1;
    kb_assert_ok(kb_subscribe(b, "t", slow_handler, &s));
    for (int i = 0; i < 100; i++)
        kb_assert_ok(kb_publish(b, "t", "k", 1, "x", 1));
    /* the executor is at work (a loaded machine may start it late) */
    kb_wait_until(s.handled >= 1, 3000, "the executor started on the slow handler");
    double t0 = kb_test_now_ms();
    assert_int_equal(kb_close(b, 150), KB_ETIMEDOUT);
    double took = kb_test_now_ms() - t0;
    assert_true(took >= 140.0);
    assert_true(took < 5000.0);   /* deadline plus the event in flight, with slack */
    assert_true(s.handled >= 1);
    assert_true(s.handled < 100);
}

/* Handlers that began after kb_close's deadline: only the one in hand may
 * run, not the events the executor had already taken off the ring. */
struct timed {
    _Atomic int handled;
    _Atomic int64_t deadline_ns;     /* 0 until kb_close is called */
    _Atomic int started_after;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int timed_handler(const kb_event *ev, void *opaque)
{
    struct timed *t = opaque;
    (void)ev;
    int64_t deadline = t->deadline_ns;
    if (deadline != 0 && mono_ns() > deadline)
        t->started_after++;
    usleep(50000);
    t->handled++;
    return KB_HANDLED;
}

static void close_deadline_cuts_the_lookahead_short(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "pool.threads", "1", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    struct timed t = {0};
    kb_assert_ok(kb_subscribe(b, "t", timed_handler, &t));
    for (int i = 0; i < 20; i++)   /* one key: the executor pops 8 ahead at once */
        kb_assert_ok(kb_publish(b, "t", "k", 1, "x", 1));
    t.deadline_ns = mono_ns() + 100 * 1000000LL;
    assert_int_equal(kb_close(b, 100), KB_ETIMEDOUT);
    /* one handler may start between the deadline and the executor's stop */
    assert_true(t.started_after <= 2);
    assert_true(t.handled < 20);
}

struct reentrant {
    kb_bus *b;
    _Atomic int calls;
    int close_rc, flush_rc;
    char close_err[160];
};

static int closing_handler(const kb_event *ev, void *opaque)
{
    struct reentrant *r = opaque;
    (void)ev;
    if (r->calls++ == 0) {
        r->close_rc = kb_close(r->b, 1000);
        snprintf(r->close_err, sizeof r->close_err, "%s", kb_last_error());
        r->flush_rc = kb_flush(r->b, -1);
    }
    return KB_HANDLED;
}

/* kb_close and kb_flush from a handler would wait on the handler itself. */
static void close_and_flush_from_a_handler_are_refused(void **state)
{
    (void)state;
    kb_bus *b = open_bus("1000", "200");
    struct reentrant r = {.b = b, .close_rc = 1, .flush_rc = 1};
    kb_assert_ok(kb_subscribe(b, "t", closing_handler, &r));
    kb_assert_ok(kb_publish(b, "t", "k", 1, "x", 1));
    kb_assert_ok(kb_publish(b, "t", "k", 1, "y", 1));
    kb_assert_ok(kb_flush(b, 10000));
    assert_int_equal(r.calls, 2);   /* the bus still works afterwards */
    assert_int_equal(r.close_rc, KB_EINVAL);
    assert_int_equal(r.flush_rc, KB_EINVAL);
    assert_non_null(strstr(r.close_err, "handler"));
    kb_assert_ok(kb_close(b, 1000));
}

static int nop_handler(const kb_event *ev, void *opaque)
{
    (void)ev, (void)opaque;
    return KB_HANDLED;
}

static double cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

/* Executors park when idle: no busy spinning. */
static void idle_bus_uses_no_cpu(void **state)
{
    (void)state;
    kb_bus *b = open_bus("1000", "200");
    kb_assert_ok(kb_subscribe(b, "t", nop_handler, NULL));
    kb_assert_ok(kb_publish(b, "t", "k", 1, "x", 1));
    kb_assert_ok(kb_flush(b, 1000));
    usleep(100000);
    double c0 = cpu_ms(), t0 = kb_test_now_ms();
    usleep(500000);
    double used = cpu_ms() - c0, wall = kb_test_now_ms() - t0;
    assert_true(used < wall * 0.05);   /* under 5% of one core */
    kb_assert_ok(kb_close(b, 1000));
}

static void publish_after_close_started_is_refused(void **state)
{
    (void)state;
    kb_bus *b = open_bus("1", "60000");
    struct slow s = {0};
    kb_assert_ok(kb_subscribe(b, "t", slow_handler, &s));
    kb_assert_ok(kb_publish(b, "t", "k", 1, "a", 1));
    kb_gate_wait_for_waiter(&s.gate);
    struct closer c = {b, 5000, -100};
    pthread_t clo;
    pthread_create(&clo, NULL, close_bus, &c);
    usleep(50000);   /* close is now waiting for the blocked handler */
    assert_int_equal(kb_publish(b, "t", "k2", 2, "b", 1), KB_ECLOSED);
    assert_int_equal(kb_subscribe(b, "t2", nop_handler, NULL), KB_ECLOSED);
    s.gate.open = 1;
    pthread_join(clo, NULL);
    kb_assert_ok(c.rc);
    assert_int_equal(s.handled, 1);
}

static int dead_at_once(const kb_event *ev, void *opaque)
{
    (void)ev;
    (void)opaque;
    return KB_DEAD;
}

struct inner_close {
    kb_bus *b;
    int rc;
    char why[200];
};

static int close_from_callback(const kb_dead_letter *dl, void *opaque)
{
    struct inner_close *ic = opaque;
    (void)dl;
    ic->rc = kb_close(ic->b, 1000);
    snprintf(ic->why, sizeof ic->why, "%s", kb_last_error());
    return 1;
}

/* kb_close from a callback inside another keybus call (here kb_dead_letters)
 * would wait for that call: KB_EINVAL at once, saying why; the bus stays
 * usable and closes normally afterwards. */
static void close_inside_a_callback_is_refused(void **state)
{
    (void)state;
    kb_bus *b = open_bus("64", "100");
    kb_assert_ok(kb_subscribe(b, "t", dead_at_once, NULL));
    kb_assert_ok(kb_publish(b, "t", "k", 1, "x", 1));
    kb_assert_ok(kb_drain(b, 10000));
    struct inner_close ic = {.b = b, .rc = -1};
    kb_assert_ok(kb_dead_letters(b, "t", NULL, 10, close_from_callback, &ic));
    assert_int_equal(ic.rc, KB_EINVAL);
    assert_non_null(strstr(ic.why, "inside another keybus call"));
    kb_assert_ok(kb_close(b, 1000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(blocked_publisher_wakes_with_eclosed),
        cmocka_unit_test(close_drains_everything_queued),
        cmocka_unit_test(close_stops_at_the_deadline),
        cmocka_unit_test(idle_bus_uses_no_cpu),
        cmocka_unit_test(publish_after_close_started_is_refused),
        cmocka_unit_test(close_deadline_cuts_the_lookahead_short),
        cmocka_unit_test(close_and_flush_from_a_handler_are_refused),
        cmocka_unit_test(close_inside_a_callback_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
