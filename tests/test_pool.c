/* The pool under concurrency: per-key order, one handler per key at a time,
 * nothing lost, with single and batch submits and every idle strategy; lanes
 * allocated lazily. Threads other than the main one only record what they
 * see; the main thread asserts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#include <keybus/pool.h>

#include "support/check.h"

#define KEYS 1000
#define PRODUCERS 4
#define PER_KEY 40   /* events per key; each producer owns KEYS/PRODUCERS keys */

struct item {
    uint32_t key, seq;
};

struct check {
    uint32_t last[KEYS];
    _Atomic uint32_t busy[KEYS];
    _Atomic uint64_t handled, finished, violations, overlaps, bad_finishes;
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
    if (outcome != KB_HANDLED || attempts != 1)
        c->bad_finishes++;
    c->finished++;
}

struct producer {
    kb_pool *p;
    struct item *items;   /* this producer's events, in per-key order */
    size_t n;
    uint32_t batch;       /* 0: kb_pool_submit; else kb_pool_submit_batch, 1..batch at once */
    int rc;               /* first failure */
};

static uint32_t hash_of(const struct item *it)
{
    char key[16];
    int len = snprintf(key, sizeof key, "agg-%u", it->key);
    return kb_fnv1a32(key, (size_t)len);
}

static void *produce(void *arg)
{
    struct producer *pr = arg;
    uint32_t hashes[64];
    void *items[64];
    for (size_t i = 0; i < pr->n && pr->rc == KB_OK;) {
        /* batches of 1, 2, ... pr->batch items, cycling; a KB_EFULL prefix is
         * resent, as a publisher would */
        size_t want = pr->batch ? 1 + i % pr->batch : 1;
        if (want > pr->n - i)
            want = pr->n - i;
        for (size_t k = 0; k < want; k++) {
            hashes[k] = hash_of(&pr->items[i + k]);
            items[k] = &pr->items[i + k];
        }
        size_t taken = 0;
        /* wait as long as it takes: this test is about order, not timeouts */
        int rc = pr->batch ? kb_pool_submit_batch(pr->p, hashes, items, want, -1, &taken)
                           : kb_pool_submit_hash(pr->p, hashes[0], items[0], -1);
        if (!pr->batch && rc == KB_OK)
            taken = 1;
        if (rc != KB_OK && rc != KB_EFULL)
            pr->rc = rc;
        i += taken;
    }
    return NULL;
}

static void run_order_test(int single_producer, kb_idle idle, uint32_t batch)
{
    struct check *c = calloc(1, sizeof *c);
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.threads = 2;
    o.capacity = 8;               /* small lanes: producers hit backpressure */
    o.single_producer = single_producer;
    o.idle = idle;
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
        pr[t] = (struct producer){.p = p, .n = (size_t)keys_each * PER_KEY, .batch = batch};
        pr[t].items = malloc(sizeof(struct item) * pr[t].n);
        size_t i = 0;
        for (uint32_t s = 1; s <= PER_KEY; s++)
            for (uint32_t k = 0; k < keys_each; k++)
                pr[t].items[i++] = (struct item){(uint32_t)t * keys_each + k, s};
        pthread_create(&th[t], NULL, produce, &pr[t]);
    }
    for (int t = 0; t < producers; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < producers; t++)
        kb_assert_ok(pr[t].rc);
    kb_assert_ok(kb_pool_flush(p, 30000));

    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.submitted, (uint64_t)KEYS * PER_KEY);
    assert_int_equal(st.handled, (uint64_t)KEYS * PER_KEY);
    assert_int_equal(st.depth, 0);
    assert_true(st.max_depth <= st.capacity);
    assert_int_equal(st.capacity, 15);   /* 8 rounded up to a 16-slot ring */
    kb_assert_ok(kb_pool_destroy(p, 1000));

    assert_int_equal(c->handled, (uint64_t)KEYS * PER_KEY);
    assert_int_equal(c->finished, (uint64_t)KEYS * PER_KEY);
    assert_int_equal(c->bad_finishes, 0);
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
    run_order_test(0, KB_IDLE_ADAPTIVE, 0);
}

/* A pool fed by one thread pushes without a CAS until a second producer
 * arrives; the switch happens mid-stream, on shared lanes, hundreds of times
 * (every round is a new pool; half the rounds start both producers at once). */
struct late {
    kb_pool *p;
    struct item *items;
    size_t n;
    _Atomic int *go;      /* NULL: start at once; else wait until it is set */
    int rc;
};

static void *produce_late(void *arg)
{
    struct late *l = arg;
    if (l->go != NULL)
        while (atomic_load(l->go) == 0)
            sched_yield();
    for (size_t i = 0; i < l->n && l->rc == KB_OK; i++)
        l->rc = kb_pool_submit_hash(l->p, hash_of(&l->items[i]), &l->items[i], -1);
    return NULL;
}

static void owner_then_shared_keeps_order(void **state)
{
    (void)state;
    for (int round = 0; round < 300; round++) {
        struct check *c = calloc(1, sizeof *c);
        kb_pool_options o;
        kb_pool_options_init(&o);
        o.lanes = 4;              /* both producers' keys share lanes */
        o.threads = 1;
        o.capacity = 8;
        o.handle = check_handle;
        o.finish = check_finish;
        o.opaque = c;
        char err[128];
        kb_pool *p = kb_pool_new(&o, err, sizeof err);
        assert_non_null(p);
        enum { N = 400 };
        struct item *a = malloc(sizeof *a * N), *b = malloc(sizeof *b * N);
        for (uint32_t i = 0; i < N; i++) {
            a[i] = (struct item){i % 8, i / 8 + 1};          /* keys 0..7 */
            b[i] = (struct item){8 + i % 8, i / 8 + 1};      /* keys 8..15 */
        }
        _Atomic int go = 0;
        struct late first = {p, a, N, NULL, KB_OK}, second = {p, b, N, &go, KB_OK};
        pthread_t t1, t2;
        pthread_create(&t2, NULL, produce_late, &second);
        pthread_create(&t1, NULL, produce_late, &first);
        /* let the first one own the pool for a while, or not at all */
        while (round % 2 == 1 && atomic_load(&c->handled) < (uint64_t)(round % 300))
            sched_yield();
        atomic_store(&go, 1);
        pthread_join(t1, NULL);
        pthread_join(t2, NULL);
        kb_assert_ok(first.rc);
        kb_assert_ok(second.rc);
        kb_assert_ok(kb_pool_flush(p, 30000));
        kb_assert_ok(kb_pool_destroy(p, 1000));
        assert_int_equal(c->handled, 2 * N);
        assert_int_equal(c->violations, 0);
        assert_int_equal(c->overlaps, 0);
        for (uint32_t k = 0; k < 16; k++)
            assert_int_equal(c->last[k], N / 8);
        free(a);
        free(b);
        free(c);
    }
}

static void order_with_batches_under_every_idle_strategy(void **state)
{
    (void)state;
    const kb_idle all[] = {KB_IDLE_ADAPTIVE, KB_IDLE_SPIN, KB_IDLE_YIELD, KB_IDLE_BLOCK};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        run_order_test(0, all[i], 37);   /* 4 producers, batches of 1..37 */
        run_order_test(1, all[i], 64);   /* one producer, SPSC rings */
    }
}

static int count_handle(void *it, uint32_t attempt, void *opaque);

static void order_with_single_producer_rings(void **state)
{
    (void)state;
    run_order_test(1, KB_IDLE_ADAPTIVE, 0);
}

/* 0 threads: every CPU but the publisher's when executors spin. */
static void default_thread_count_leaves_the_publisher_a_cpu(void **state)
{
    (void)state;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(kb_pool_default_threads(KB_IDLE_BLOCK), (uint32_t)cpus);
    assert_int_equal(kb_pool_default_threads(KB_IDLE_ADAPTIVE), cpus > 1 ? (uint32_t)cpus - 1 : 1);
    assert_int_equal(kb_pool_default_threads(KB_IDLE_SPIN), cpus > 1 ? (uint32_t)cpus - 1 : 1);
    kb_pool_options o;
    kb_pool_options_init(&o);
    assert_int_equal(o.idle, KB_IDLE_ADAPTIVE);
    o.handle = count_handle;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.threads, kb_pool_default_threads(KB_IDLE_ADAPTIVE));
    kb_assert_ok(kb_pool_destroy(p, 1000));
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
        kb_assert_ok(kb_pool_submit(p, key, (size_t)len, &dummy, -1));
    }
    kb_assert_ok(kb_pool_flush(p, 10000));
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.lanes_allocated, expect);
    /* design: a topic whose events touched 100 aggregates holds about 1 MiB */
    assert_true(st.memory_bytes <= 1024 * 1024);
    assert_int_equal(count, 100);
    kb_lane_stats ls;
    kb_assert_ok(kb_pool_lane_stats(p, kb_pool_lane_of(p, "order-000", 9), &ls));
    assert_int_equal(ls.allocated, 1);
    assert_true(ls.handled >= 1);
    assert_int_equal(kb_pool_lane_stats(p, 1024, &ls), KB_EINVAL);
    kb_assert_ok(kb_pool_destroy(p, 1000));
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
    o.max_backoff_ms = 100;
    o.idle = (kb_idle)7;
    assert_null(kb_pool_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "idle"));
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
    kb_assert_ok(kb_pool_submit(p, "k", 1, &item, 0));
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(count, 1);
    /* a batch stops at a NULL item: what came before it is taken */
    uint32_t hashes[3] = {1, 2, 3};
    void *items[3] = {&item, NULL, &item};
    size_t taken = 99;
    assert_int_equal(kb_pool_submit_batch(p, hashes, items, 3, 0, &taken), KB_EINVAL);
    assert_int_equal(taken, 1);
    assert_int_equal(kb_pool_submit_batch(p, NULL, items, 3, 0, &taken), KB_EINVAL);
    assert_int_equal(taken, 0);
    kb_assert_ok(kb_pool_submit_batch(p, hashes, items, 0, 0, &taken));
    assert_int_equal(taken, 0);
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(count, 2);
    kb_pool_shutdown(p);
    assert_int_equal(kb_pool_submit(p, "k", 1, &item, 0), KB_ECLOSED);
    assert_int_equal(kb_pool_submit_batch(p, hashes, items, 1, 0, &taken), KB_ECLOSED);
    assert_int_equal(taken, 0);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(order_with_four_producers),
        cmocka_unit_test(order_with_single_producer_rings),
        cmocka_unit_test(order_with_batches_under_every_idle_strategy),
        cmocka_unit_test(owner_then_shared_keeps_order),
        cmocka_unit_test(default_thread_count_leaves_the_publisher_a_cpu),
        cmocka_unit_test(lanes_allocated_lazily),
        cmocka_unit_test(bad_options_are_named),
        cmocka_unit_test(bad_submit_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
