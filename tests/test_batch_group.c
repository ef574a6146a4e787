/* kb_pool_submit_batch regroups a batch whose keys interleave, so each lane's
 * items move with one reservation (issue 24, item 4): per-key order holds
 * and nothing is lost (the prefix a batch meeting a full lane takes, regrouped
 * or not: test_backpressure). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <keybus/pool.h>

#include "support/check.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EVENTS 60000
#else
#define EVENTS 600000
#endif
#define KEYS 3
#define PRODUCERS 2

struct item {
    uint32_t producer, key, seq;
};

struct order {
    uint32_t next[PRODUCERS][KEYS];   /* the handlers': a key's lane has one executor */
    _Atomic uint64_t handled, violations;
};

static int check(void *arg, uint32_t attempt, void *opaque)
{
    struct item *it = arg;
    struct order *o = opaque;
    (void)attempt;
    if (o->next[it->producer][it->key] != it->seq)
        atomic_fetch_add(&o->violations, 1);
    o->next[it->producer][it->key] = it->seq + 1;
    atomic_fetch_add(&o->handled, 1);
    return KB_HANDLED;
}

struct producer {
    kb_pool *p;
    uint32_t id;
    struct item *items;
    int rc;
};

static uint32_t key_hash(uint32_t producer, uint32_t key)
{
    char k[16];
    int len = snprintf(k, sizeof k, "p%u-k%u", producer, key);
    return kb_fnv1a32(k, (size_t)len);
}

/* Batches of 1..64 events over KEYS keys in a shuffled order: runs of one
 * key are short, so regrouping is what makes one reservation per lane. */
static void *produce(void *arg)
{
    struct producer *pr = arg;
    uint32_t seq[KEYS] = {0}, hashes[64];
    void *batch[64];
    uint64_t rng = 0x9e3779b97f4a7c15ull + pr->id;
    size_t made = 0;
    while (made < EVENTS && pr->rc == KB_OK) {
        size_t want = 1 + made % 64;
        if (want > EVENTS - made)
            want = EVENTS - made;
        for (size_t i = 0; i < want; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            uint32_t k = (uint32_t)(rng % KEYS);
            struct item *it = &pr->items[made + i];
            *it = (struct item){pr->id, k, seq[k]++};
            hashes[i] = key_hash(pr->id, k);
            batch[i] = it;
        }
        for (size_t off = 0; off < want;) {
            size_t taken = 0;
            int rc = kb_pool_submit_batch(pr->p, hashes + off, batch + off, want - off, -1, &taken);
            if (rc != KB_OK && rc != KB_EFULL)
                pr->rc = rc;
            if (pr->rc != KB_OK)
                break;
            off += taken;
        }
        made += want;
    }
    return NULL;
}

static void run(uint32_t producers, int single_producer, uint32_t capacity)
{
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.threads = 2;
    o.capacity = capacity;
    o.single_producer = single_producer;
    o.handle = check;
    struct order *ord = calloc(1, sizeof *ord);
    assert_non_null(ord);
    o.opaque = ord;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);
    struct producer pr[PRODUCERS];
    pthread_t th[PRODUCERS];
    for (uint32_t i = 0; i < producers; i++) {
        pr[i] = (struct producer){.p = p, .id = i, .items = calloc(EVENTS, sizeof(struct item))};
        assert_non_null(pr[i].items);
        assert_int_equal(pthread_create(&th[i], NULL, produce, &pr[i]), 0);
    }
    for (uint32_t i = 0; i < producers; i++) {
        pthread_join(th[i], NULL);
        kb_assert_ok(pr[i].rc);
    }
    kb_assert_ok(kb_pool_flush(p, 60000));
    assert_int_equal(atomic_load(&ord->handled), (uint64_t)producers * EVENTS);
    assert_int_equal(atomic_load(&ord->violations), 0);
    kb_assert_ok(kb_pool_destroy(p, 10000));
    for (uint32_t i = 0; i < producers; i++)
        free(pr[i].items);
    free(ord);
}

static void one_producer_keeps_key_order(void **state)
{
    (void)state;
    run(1, 0, 1000);
}

static void one_producer_small_lanes_keeps_key_order(void **state)
{
    (void)state;
    run(1, 0, 8);   /* lanes often too full to regroup: the run-by-run path takes over */
}

static void single_producer_option_keeps_key_order(void **state)
{
    (void)state;
    run(1, 1, 64);
}

static void two_producers_keep_key_order(void **state)
{
    (void)state;
    run(2, 0, 64);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_producer_keeps_key_order),
        cmocka_unit_test(one_producer_small_lanes_keeps_key_order),
        cmocka_unit_test(single_producer_option_keeps_key_order),
        cmocka_unit_test(two_producers_keep_key_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
