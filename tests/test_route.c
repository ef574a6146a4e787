/* Routing: FNV-1a 32 pinned by vectors, lanes stable, executors spread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdbool.h>
#include <string.h>

#include <keybus/pool.h>

#include "support/check.h"

static void fnv1a32_vectors(void **state)
{
    (void)state;
    /* Reference values of FNV-1a 32 (offset basis 2166136261, prime 16777619). */
    assert_int_equal(kb_fnv1a32("", 0), 0x811c9dc5u);
    assert_int_equal(kb_fnv1a32("a", 1), 0xe40c292cu);
    assert_int_equal(kb_fnv1a32("foobar", 6), 0xbf9cf968u);
    assert_int_equal(kb_fnv1a32("order-123", 9), 0xa508cf1au);
    /* Keys are bytes: an embedded NUL is hashed, not a terminator. */
    assert_int_equal(kb_fnv1a32("a\0b", 3), 0x10f3abd2u);
    assert_int_not_equal(kb_fnv1a32("a\0b", 3), kb_fnv1a32("a", 1));
}

static int noop(void *item, uint32_t attempt, void *opaque)
{
    (void)item, (void)attempt, (void)opaque;
    return KB_HANDLED;
}

static kb_pool *make_pool(uint32_t lanes, uint32_t threads)
{
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.lanes = lanes;
    o.threads = threads;
    o.handle = noop;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);
    return p;
}

static void lanes_are_stable(void **state)
{
    (void)state;
    kb_pool *p = make_pool(1024, 2);
    /* Pinned: changing the hash or the modulo would move every aggregate. */
    assert_int_equal(kb_pool_lane_of(p, "order-123", 9), 794);
    assert_int_equal(kb_pool_lane_of(p, "user-456", 8), 244);
    assert_int_equal(kb_pool_lane_of(p, "a", 1), 300);
    for (int i = 0; i < 100; i++)
        assert_int_equal(kb_pool_lane_of(p, "order-123", 9), 794);
    /* Lane ownership never changes for the pool's life. */
    uint32_t ex = kb_pool_executor_of(p, 794);
    for (int i = 0; i < 100; i++)
        assert_int_equal(kb_pool_executor_of(p, 794), ex);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

/* A process owning only some broker partitions sees only lanes with
 * lane % partitions in that set; those lanes must still use every executor. */
static void partition_subsets_spread_over_all_executors(void **state)
{
    (void)state;
    const uint32_t threads_list[] = {2, 3, 4, 8};
    for (size_t t = 0; t < sizeof threads_list / sizeof *threads_list; t++) {
        uint32_t threads = threads_list[t];
        kb_pool *p = make_pool(1024, threads);
        const uint32_t partition_counts[] = {2, 4, 8, 16};
        for (size_t pc = 0; pc < 4; pc++) {
            uint32_t parts = partition_counts[pc];
            for (uint32_t owned = 0; owned < parts; owned++) {
                bool used[8] = {false};
                for (uint32_t lane = owned; lane < 1024; lane += parts)
                    used[kb_pool_executor_of(p, lane)] = true;
                for (uint32_t e = 0; e < threads; e++)
                    if (!used[e])
                        fail_msg("threads=%u partitions=%u partition %u leaves executor %u idle",
                                 threads, parts, owned, e);
            }
        }
        kb_assert_ok(kb_pool_destroy(p, 1000));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fnv1a32_vectors),
        cmocka_unit_test(lanes_are_stable),
        cmocka_unit_test(partition_subsets_spread_over_all_executors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
