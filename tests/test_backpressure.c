/* Timed backpressure: a full lane makes submit/publish wait, then fail with
 * KB_EFULL after about the timeout; nothing accepted is lost. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <keybus/pool.h>

#include "support/check.h"
#include "support/gate.h"

struct gated {
    kb_gate gate;
    _Atomic int handled;
};

static int gated_handle(void *item, uint32_t attempt, void *opaque)
{
    struct gated *g = opaque;
    (void)item, (void)attempt;
    kb_gate_pass(&g->gate);
    g->handled++;
    return KB_HANDLED;
}

static kb_pool *one_lane_pool(struct gated *g, uint32_t capacity)
{
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.lanes = 1;
    o.threads = 1;
    o.capacity = capacity;
    o.handle = gated_handle;
    o.opaque = g;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);
    return p;
}

static void full_lane_times_out_with_efull(void **state)
{
    (void)state;
    struct gated g = {0};
    kb_pool *p = one_lane_pool(&g, 4);   /* ring of 8: 7 slots */
    static int items[16];
    /* One item is taken by the executor and blocks at the gate; 7 fill the ring. */
    kb_assert_ok(kb_pool_submit(p, "k", 1, &items[0], 0));
    kb_gate_wait_for_waiter(&g.gate);
    for (int i = 1; i <= 7; i++)
        kb_assert_ok(kb_pool_submit(p, "k", 1, &items[i], 0));

    double t0 = kb_test_now_ms();
    assert_int_equal(kb_pool_submit(p, "k", 1, &items[8], 150), KB_EFULL);
    double waited = kb_test_now_ms() - t0;
    assert_true(waited >= 140.0);
    assert_true(waited < 2000.0);
    /* Zero timeout: refused at once. */
    t0 = kb_test_now_ms();
    assert_int_equal(kb_pool_submit(p, "k", 1, &items[9], 0), KB_EFULL);
    assert_true(kb_test_now_ms() - t0 < 100.0);

    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.rejected, 2);
    assert_int_equal(st.depth, 7);
    assert_int_equal(st.max_depth, 7);

    g.gate.open = 1;
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(g.handled, 8);   /* every accepted item, none of the refused */
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

/* max_depth is the deepest the lane really was: items handled one at a time
 * never stand two deep, however many pass through the ring. */
static void max_depth_follows_the_lane(void **state)
{
    (void)state;
    struct gated g = {.gate.open = 1};
    kb_pool *p = one_lane_pool(&g, 100);   /* ring of 128 */
    static int items[400];
    for (int i = 0; i < 400; i++) {
        kb_assert_ok(kb_pool_submit(p, "k", 1, &items[i], 1000));
        kb_assert_ok(kb_pool_flush(p, 10000));
    }
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.handled, 400);
    assert_int_equal(st.max_depth, 1);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

struct blocked_submit {
    kb_pool *p;
    kb_gate *gate;
    int rc;
    int gate_was_open;   /* at return: the slot came from the executor */
    double waited_ms;
};

static void *submit_blocking(void *arg)
{
    struct blocked_submit *b = arg;
    static int item;
    double t0 = kb_test_now_ms();
    b->rc = kb_pool_submit(b->p, "k", 1, &item, 10000);
    b->gate_was_open = b->gate->open;
    b->waited_ms = kb_test_now_ms() - t0;
    return NULL;
}

/* A waiting producer is woken as soon as the executor frees a slot. */
static void waiting_producer_gets_space(void **state)
{
    (void)state;
    struct gated g = {0};
    kb_pool *p = one_lane_pool(&g, 1);   /* ring of 2: one slot */
    static int items[2];
    kb_assert_ok(kb_pool_submit(p, "k", 1, &items[0], 0));
    kb_gate_wait_for_waiter(&g.gate);
    kb_assert_ok(kb_pool_submit(p, "k", 1, &items[1], 0));

    struct blocked_submit b = {p, &g.gate, -100, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, submit_blocking, &b);
    struct timespec nap = {0, 100 * 1000000L};
    nanosleep(&nap, NULL);
    g.gate.open = 1;
    pthread_join(th, NULL);
    kb_assert_ok(b.rc);
    /* Order, not time: the submit returned only once the gate let the
     * executor free a slot, and well before its own 10 s deadline. */
    assert_true(b.gate_was_open);
    assert_true(b.waited_ms < 5000.0);
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(g.handled, 3);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

/* A batch that meets a full lane takes an exact prefix: nothing after the
 * item that did not fit, even on lanes with room. */
static void batch_takes_an_exact_prefix(void **state)
{
    (void)state;
    struct gated g = {0};
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.lanes = 2;
    o.threads = 1;
    o.capacity = 1;   /* ring of 2: one slot per lane */
    o.handle = gated_handle;
    o.opaque = &g;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);
    static int items[8];
    /* lane 0 (hash 0): its first item holds the only executor at the gate */
    kb_assert_ok(kb_pool_submit_hash(p, 0, &items[0], 0));
    kb_gate_wait_for_waiter(&g.gate);

    /* lane 1 takes one item, the second does not fit: the lane-0 items behind
     * it must stay out although lane 0 has room */
    uint32_t hashes[5] = {1, 1, 0, 0, 1};
    void *batch[5] = {&items[1], &items[2], &items[3], &items[4], &items[5]};
    size_t taken = 99;
    assert_int_equal(kb_pool_submit_batch(p, hashes, batch, 5, 0, &taken), KB_EFULL);
    assert_int_equal(taken, 1);
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.submitted, 2);
    assert_int_equal(st.rejected, 1);

    /* the rest, resent, goes through once the lanes drain */
    g.gate.open = 1;
    kb_assert_ok(kb_pool_submit_batch(p, hashes + taken, batch + taken, 5 - taken, 5000,
                                      &taken));
    assert_int_equal(taken, 4);
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(g.handled, 6);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

/* Interleaved lanes with room take the whole batch (regrouped by lane); once one of them is
 * full the batch takes only the prefix before its first item there. */
static void full_lane_still_takes_a_prefix(void **state)
{
    (void)state;
    struct gated g = {0};
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.lanes = 4;
    o.threads = 1;
    o.capacity = 4;   /* ring of 8: 7 slots */
    o.handle = gated_handle;
    o.opaque = &g;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);
    static int items[32];
    /* lane 3 (hash 3): its first item holds the only executor at the gate */
    kb_assert_ok(kb_pool_submit_hash(p, 3, &items[0], 0));
    kb_gate_wait_for_waiter(&g.gate);

    uint32_t hashes[16] = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
    void *batch[16];
    for (int i = 0; i < 16; i++)
        batch[i] = &items[1 + i];
    size_t taken = 99;
    kb_assert_ok(kb_pool_submit_batch(p, hashes, batch, 10, 0, &taken));
    assert_int_equal(taken, 10);   /* 5 on each lane */
    /* each lane has room for 2 more: of 0,1,0,1,0,1 the third 0 does not fit,
     * and the 1 behind it stays out although its lane has room */
    assert_int_equal(kb_pool_submit_batch(p, hashes, batch + 10, 6, 0, &taken), KB_EFULL);
    assert_int_equal(taken, 4);
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.submitted, 15);

    g.gate.open = 1;
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(g.handled, 15);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

/* The same through the bus: pool.enqueue_timeout_ms and an errstr. */
struct bus_gated {
    kb_gate gate;
    _Atomic int handled;
};

static int bus_handler(const kb_event *ev, void *opaque)
{
    struct bus_gated *g = opaque;
    (void)ev;
    kb_gate_pass(&g->gate);
    g->handled++;
    return KB_HANDLED;
}

static void publish_returns_efull_after_timeout(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "pool.queue_capacity", "2", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "pool.enqueue_timeout_ms", "100", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "pool.threads", "1", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    struct bus_gated g = {0};
    kb_assert_ok(kb_subscribe(b, "orders.events", bus_handler, &g));
    kb_assert_ok(kb_publish(b, "orders.events", "order-1", 7, "e0", 2));
    kb_gate_wait_for_waiter(&g.gate);
    int accepted = 1;
    while (kb_publish(b, "orders.events", "order-1", 7, "eN", 2) == KB_OK)
        accepted++;
    assert_int_equal(accepted, 1 + 3);   /* ring of 4 holds 3 */

    double t0 = kb_test_now_ms();
    assert_int_equal(kb_publish(b, "orders.events", "order-1", 7, "late", 4), KB_EFULL);
    double waited = kb_test_now_ms() - t0;
    assert_true(waited >= 95.0);
    assert_true(waited < 2000.0);
    assert_non_null(strstr(kb_last_error(), "full"));

    /* A batch through the handle stops at the same place, with the same text. */
    kb_topic *t = kb_topic_get(b, "orders.events", err, sizeof err);
    assert_non_null(t);
    kb_msg msgs[2] = {{"order-1", 7, "b1", 2, 0}, {"order-2", 7, "b2", 2, 0}};
    size_t taken = 99;
    assert_int_equal(kb_publish_batch(t, msgs, 2, &taken), KB_EFULL);
    assert_int_equal(taken, 0);
    assert_non_null(strstr(kb_last_error(), "full"));

    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, "orders.events", &st));
    assert_int_equal(st.rejected, 3);
    g.gate.open = 1;
    kb_assert_ok(kb_flush(b, 10000));
    assert_int_equal(g.handled, accepted);
    kb_assert_ok(kb_close(b, 1000));
}

/* A handler publishing into a full lane of its own executor gets KB_EFULL at
 * once (the lane cannot drain while it waits), not after the timeout. */
struct self_publisher {
    kb_bus *b;
    _Atomic int calls;
    int rcs[2];
    char err[200];
};

static int publish_to_self(const kb_event *ev, void *opaque)
{
    struct self_publisher *sp = opaque;
    (void)ev;
    if (sp->calls++ == 0) {
        sp->rcs[0] = kb_publish(sp->b, "self", "k", 1, "again", 5);   /* the one free slot */
        sp->rcs[1] = kb_publish(sp->b, "self", "k", 1, "again", 5);   /* full */
        snprintf(sp->err, sizeof sp->err, "%s", kb_last_error());
    }
    return KB_HANDLED;
}

static void handler_into_its_own_full_lane_is_refused_at_once(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "pool.threads", "1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "pool.workers", "1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "pool.queue_capacity", "1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "pool.enqueue_timeout_ms", "600000", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    struct self_publisher sp = {.b = b, .rcs = {1, 1}};
    kb_assert_ok(kb_subscribe(b, "self", publish_to_self, &sp));
    kb_assert_ok(kb_publish(b, "self", "k", 1, "first", 5));
    kb_assert_ok(kb_drain(b, 30000));
    kb_assert_ok(sp.rcs[0]);
    assert_int_equal(sp.rcs[1], KB_EFULL);
    assert_non_null(strstr(sp.err, "own executor"));
    assert_int_equal(sp.calls, 2);   /* the first and the one that fitted */
    kb_assert_ok(kb_close(b, 1000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(full_lane_times_out_with_efull),
        cmocka_unit_test(max_depth_follows_the_lane),
        cmocka_unit_test(waiting_producer_gets_space),
        cmocka_unit_test(publish_returns_efull_after_timeout),
        cmocka_unit_test(batch_takes_an_exact_prefix),
        cmocka_unit_test(full_lane_still_takes_a_prefix),
        cmocka_unit_test(handler_into_its_own_full_lane_is_refused_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
