/* The pool under concurrency: per-key order, one handler per key at a time,
 * nothing lost, lanes allocated lazily. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/pool.h>

#define KEYS 1000
#define PRODUCERS 4
#define PER_KEY 40   /* events per key; each producer owns KEYS/PRODUCERS keys */

struct item {
    uint32_t key, seq;
};

struct check {
    uint32_t last[KEYS];
    _Atomic uint32_t busy[KEYS];
    _Atomic uint64_t handled, finished, violations, overlaps;
};

static int check_handle(void *it, uint32_t attempt, void *opaque)
{
    struct check *c = opaque;
    struct item *item = it;
    (void)attempt;
    if (atomic_fetch_add(&c->busy[item->key], 1) != 0)
        c->overlaps++;
    if (item->seq != c->last[item->key] + 1)
        c->violations++;
    c->last[item->key] = item->seq;
    c->handled++;
    atomic_fetch_sub(&c->busy[item->key], 1);
    return KB_HANDLED;
}

static void check_finish(void *it, int outcome, uint32_t attempts, void *opaque)
{
    struct check *c = opaque;
    (void)it;
    assert_int_equal(outcome, KB_HANDLED);
    assert_int_equal(attempts, 1);
    c->finished++;
}

struct producer {
    kb_pool *p;
    struct item *items;   /* this producer's events, in per-key order */
    size_t n;
};

static void *produce(void *arg)
{
    struct producer *pr = arg;
    for (size_t i = 0; i < pr->n; i++) {
        char key[16];
        int len = snprintf(key, sizeof key, "agg-%u", pr->items[i].key);
        /* wait as long as it takes: this test is about order, not timeouts */
        assert_int_equal(kb_pool_submit(pr->p, key, (size_t)len, &pr->items[i], -1), KB_OK);
    }
    return NULL;
}

static void run_order_test(int single_producer)
{
    struct check *c = calloc(1, sizeof *c);
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.threads = 2;
    o.capacity = 8;               /* small lanes: producers hit backpressure */
    o.single_producer = single_producer;
    o.handle = check_handle;
    o.finish = check_finish;
    o.opaque = c;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);

    int producers = single_producer ? 1 : PRODUCERS;
    uint32_t keys_each = KEYS / (uint32_t)producers;
    struct producer pr[PRODUCERS];
    pthread_t th[PRODUCERS];
    for (int t = 0; t < producers; t++) {
        pr[t].p = p;
        pr[t].n = (size_t)keys_each * PER_KEY;
        pr[t].items = malloc(sizeof(struct item) * pr[t].n);
        size_t i = 0;
        for (uint32_t s = 1; s <= PER_KEY; s++)
            for (uint32_t k = 0; k < keys_each; k++)
                pr[t].items[i++] = (struct item){(uint32_t)t * keys_each + k, s};
        pthread_create(&th[t], NULL, produce, &pr[t]);
    }
    for (int t = 0; t < producers; t++)
        pthread_join(th[t], NULL);
    assert_int_equal(kb_pool_flush(p, 30000), KB_OK);

    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.submitted, (uint64_t)KEYS * PER_KEY);
    assert_int_equal(st.handled, (uint64_t)KEYS * PER_KEY);
    assert_int_equal(st.depth, 0);
    assert_true(st.max_depth <= st.capacity);
    assert_int_equal(st.capacity, 15);   /* 8 rounded up to a 16-slot ring */
    assert_int_equal(kb_pool_destroy(p, 1000), KB_OK);

    assert_int_equal(c->handled, (uint64_t)KEYS * PER_KEY);
    assert_int_equal(c->finished, (uint64_t)KEYS * PER_KEY);
    assert_int_equal(c->violations, 0);
    assert_int_equal(c->overlaps, 0);
    for (uint32_t k = 0; k < KEYS; k++)
        assert_int_equal(c->last[k], PER_KEY);
    for (int t = 0; t < producers; t++)
        free(pr[t].items);
    free(c);
}

static void order_with_four_producers(void **state)
{
    (void)state;
    run_order_test(0);
}

static void order_with_single_producer_rings(void **state)
{
    (void)state;
    run_order_test(1);
}

static int count_handle(void *it, uint32_t attempt, void *opaque)
{
    (void)it, (void)attempt;
    atomic_fetch_add((_Atomic uint64_t *)opaque, 1);
    return KB_HANDLED;
}

/* One executor, default lanes; the handler counts into *count. */
static kb_pool *counting_pool(_Atomic uint64_t *count)
{
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.threads = 1;
    o.handle = count_handle;
    o.opaque = count;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);
    return p;
}

/* Rings are allocated when a key first routes to a lane. */
static void lanes_allocated_lazily(void **state)
{
    (void)state;
    _Atomic uint64_t count = 0;
    kb_pool *p = counting_pool(&count);
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.lanes, 1024);
    assert_int_equal(st.lanes_allocated, 0);
    assert_true(st.memory_bytes <= 16 * 1024);   /* an idle topic: the lane table */

    static int dummy;
    int distinct_lanes[1024] = {0};
    uint32_t expect = 0;
    for (int k = 0; k < 100; k++) {
        char key[16];
        int len = snprintf(key, sizeof key, "order-%03d", k);
        uint32_t lane = kb_pool_lane_of(p, key, (size_t)len);
        if (!distinct_lanes[lane]++)
            expect++;
        assert_int_equal(kb_pool_submit(p, key, (size_t)len, &dummy, -1), KB_OK);
    }
    assert_int_equal(kb_pool_flush(p, 10000), KB_OK);
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.lanes_allocated, expect);
    /* design: a topic whose events touched 100 aggregates holds about 1 MiB */
    assert_true(st.memory_bytes <= 1024 * 1024);
    assert_int_equal(count, 100);
    kb_lane_stats ls;
    assert_int_equal(kb_pool_lane_stats(p, kb_pool_lane_of(p, "order-000", 9), &ls), KB_OK);
    assert_int_equal(ls.allocated, 1);
    assert_true(ls.handled >= 1);
    assert_int_equal(kb_pool_lane_stats(p, 1024, &ls), KB_EINVAL);
    assert_int_equal(kb_pool_destroy(p, 1000), KB_OK);
}

static void bad_options_are_named(void **state)
{
    (void)state;
    kb_pool_options o;
    kb_pool_options_init(&o);
    char err[128] = "";
    assert_null(kb_pool_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "handle"));
    o.handle = count_handle;
    o.lanes = 0;
    assert_null(kb_pool_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "lanes"));
    o.lanes = 16;
    o.capacity = 0;
    assert_null(kb_pool_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "capacity"));
    o.capacity = 4;
    o.backoff_ms = 100;
    o.max_backoff_ms = 10;
    assert_null(kb_pool_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "max_backoff_ms"));
    assert_null(kb_pool_new(NULL, err, sizeof err));
}

static void bad_submit_arguments(void **state)
{
    (void)state;
    _Atomic uint64_t count = 0;
    kb_pool *p = counting_pool(&count);
    static int item;
    assert_int_equal(kb_pool_submit(p, NULL, 1, &item, 0), KB_EINVAL);
    assert_int_equal(kb_pool_submit(p, "k", 0, &item, 0), KB_EINVAL);
    assert_int_equal(kb_pool_submit(p, "k", 1, NULL, 0), KB_EINVAL);
    assert_int_equal(kb_pool_submit(p, "k", 1, &item, 0), KB_OK);
    assert_int_equal(kb_pool_flush(p, 10000), KB_OK);
    assert_int_equal(count, 1);
    kb_pool_shutdown(p);
    assert_int_equal(kb_pool_submit(p, "k", 1, &item, 0), KB_ECLOSED);
    assert_int_equal(kb_pool_destroy(p, 1000), KB_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(order_with_four_producers),
        cmocka_unit_test(order_with_single_producer_rings),
        cmocka_unit_test(lanes_allocated_lazily),
        cmocka_unit_test(bad_options_are_named),
        cmocka_unit_test(bad_submit_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
