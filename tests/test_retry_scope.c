/* Key-level retry on the pool (retry_scope): while one key waits for its
 * retry, the other keys of its lane go on; the key's later items are set
 * aside and run after it, in order; keys are told apart by their bytes; set
 * aside items count against the lane's capacity. With KB_RETRY_SCOPE_LANE the
 * whole lane waits, as before. One lane, one executor: every key shares it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <keybus/pool.h>

#include "support/check.h"

#define MAX_ITEMS 4096

struct item {
    char key[16];
    size_t key_len;
    int seq;                       /* per key, from 1 */
};

struct world {
    struct item items[MAX_ITEMS];
    int n_items;
    /* the item that fails (key, seq) until `release` is set */
    const char *fail_key;
    size_t fail_key_len;
    int fail_seq;
    _Atomic int release;
    _Atomic uint32_t fail_calls;
    /* what the handler saw, in order */
    struct item *handled[MAX_ITEMS];
    _Atomic int n_handled;
    _Atomic int finished, closed;
};

static int handle(void *p, uint32_t attempt, void *opaque)
{
    struct world *w = opaque;
    struct item *it = p;
    (void)attempt;
    if (it->seq == w->fail_seq && it->key_len == w->fail_key_len &&
        memcmp(it->key, w->fail_key, it->key_len) == 0 && !atomic_load(&w->release)) {
        atomic_fetch_add(&w->fail_calls, 1);
        return KB_RETRY;
    }
    int n = atomic_load(&w->n_handled);
    w->handled[n] = it;
    atomic_store(&w->n_handled, n + 1);
    return KB_HANDLED;
}

static void finish(void *p, int outcome, uint32_t attempts, void *opaque)
{
    (void)p;
    (void)attempts;
    struct world *w = opaque;
    atomic_fetch_add(&w->finished, 1);
    if (outcome == KB_ECLOSED)
        atomic_fetch_add(&w->closed, 1);
}

static const void *key_of(const void *p, size_t *len, void *opaque)
{
    (void)opaque;
    const struct item *it = p;
    *len = it->key_len;
    return it->key;
}

/* Nothing seen yet; the first item of `key` fails until released. */
static void world_reset(struct world *w, const char *key, size_t key_len)
{
    memset(w, 0, sizeof *w);
    w->fail_key = key;
    w->fail_key_len = key_len;
    w->fail_seq = 1;
}

static kb_pool *pool_new(struct world *w, kb_retry_scope scope, uint32_t capacity)
{
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.lanes = 1;
    o.threads = 1;
    o.capacity = capacity;
    o.max_attempts = 0;          /* retry until released */
    o.backoff_ms = 1;
    o.max_backoff_ms = 2;
    o.retry_scope = scope;
    o.key = key_of;
    o.handle = handle;
    o.finish = finish;
    o.opaque = w;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    if (p == NULL)
        fail_msg("%s", err);
    return p;
}

static struct item *item_new(struct world *w, const char *key, size_t key_len, int seq)
{
    assert_true(w->n_items < MAX_ITEMS);
    struct item *it = &w->items[w->n_items++];
    memcpy(it->key, key, key_len);
    it->key_len = key_len;
    it->seq = seq;
    return it;
}

static int submit(kb_pool *p, struct world *w, const char *key, size_t key_len, int seq,
                  int timeout_ms)
{
    struct item *it = item_new(w, key, key_len, seq);
    int rc = kb_pool_submit(p, key, key_len, it, timeout_ms);
    if (rc != KB_OK)
        w->n_items--;
    return rc;
}

static void pause_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Poll `cond` up to 30 s (a generous bound: the asserts after it say what
 * was missing). */
#define WAIT_UNTIL(cond)                                                                   \
    do {                                                                                   \
        for (int waited_ = 0; !(cond) && waited_ < 30000; waited_++)                       \
            pause_ms(1);                                                                   \
    } while (0)

/* Handled items of `key` arrive with seq 1, 2, ... */
static int in_order(const struct world *w, const char *key, size_t key_len, int expect)
{
    int next = 1;
    for (int i = 0; i < w->n_handled; i++) {
        const struct item *it = w->handled[i];
        if (it->key_len != key_len || memcmp(it->key, key, key_len) != 0)
            continue;
        if (it->seq != next)
            return 0;
        next++;
    }
    return next == expect + 1;
}

static int handled_of(const struct world *w, const char *key, size_t key_len)
{
    int n = 0;
    for (int i = 0; i < w->n_handled; i++)
        n += w->handled[i]->key_len == key_len && memcmp(w->handled[i]->key, key, key_len) == 0;
    return n;
}

/* A waits (its first item fails until released) with 4 later items set
 * aside; 50 items of B, submitted after all of A's, are handled meanwhile;
 * released, A's five run in order. The stats say 4 set aside, 1 waiting. */
static void waiting_key_leaves_its_lane_flowing(void **state)
{
    (void)state;
    static struct world w;
    world_reset(&w, "A", 1);
    kb_pool *p = pool_new(&w, KB_RETRY_SCOPE_KEY, 256);
    for (int s = 1; s <= 5; s++)
        kb_assert_ok(submit(p, &w, "A", 1, s, 1000));
    for (int s = 1; s <= 50; s++)
        kb_assert_ok(submit(p, &w, "B", 1, s, 1000));
    WAIT_UNTIL(handled_of(&w, "B", 1) == 50);
    assert_int_equal(handled_of(&w, "B", 1), 50);
    assert_int_equal(handled_of(&w, "A", 1), 0);
    assert_true(atomic_load(&w.fail_calls) >= 1);
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.set_aside, 4);
    assert_int_equal(st.aggregates_waiting, 1);
    kb_lane_stats ls;
    kb_assert_ok(kb_pool_lane_stats(p, 0, &ls));
    assert_int_equal(ls.set_aside, 4);
    assert_int_equal(ls.aggregates_waiting, 1);

    /* a newer item of A, submitted while it waits, runs after the set-aside ones */
    kb_assert_ok(submit(p, &w, "A", 1, 6, 1000));
    atomic_store(&w.release, 1);
    kb_assert_ok(kb_pool_flush(p, 30000));
    assert_true(in_order(&w, "A", 1, 6));
    assert_true(in_order(&w, "B", 1, 50));
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.set_aside, 0);
    assert_int_equal(st.aggregates_waiting, 0);
    assert_int_equal(st.handled, 56);
    kb_assert_ok(kb_pool_destroy(p, 30000));
    assert_int_equal(w.finished, 56);
    assert_int_equal(w.closed, 0);
}

/* The same with KB_RETRY_SCOPE_LANE: B waits with A (as before key scope). */
static void lane_scope_holds_the_lane(void **state)
{
    (void)state;
    static struct world w;
    world_reset(&w, "A", 1);
    kb_pool *p = pool_new(&w, KB_RETRY_SCOPE_LANE, 256);
    for (int s = 1; s <= 5; s++)
        kb_assert_ok(submit(p, &w, "A", 1, s, 1000));
    for (int s = 1; s <= 50; s++)
        kb_assert_ok(submit(p, &w, "B", 1, s, 1000));
    WAIT_UNTIL(atomic_load(&w.fail_calls) >= 5);
    assert_true(atomic_load(&w.fail_calls) >= 5);
    assert_int_equal(atomic_load(&w.n_handled), 0);
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.set_aside, 0);
    assert_int_equal(st.aggregates_waiting, 0);
    atomic_store(&w.release, 1);
    kb_assert_ok(kb_pool_flush(p, 30000));
    assert_int_equal(w.n_handled, 55);
    assert_true(in_order(&w, "A", 1, 5));
    assert_true(in_order(&w, "B", 1, 50));
    assert_int_equal(w.handled[0]->key[0], 'A');   /* A's first, then everything behind it */
    kb_assert_ok(kb_pool_destroy(p, 30000));
}

/* Keys are compared by bytes: "costarring" and "liquid" share their FNV-1a
 * hash, "a\0b" and "a\0c" differ only after a NUL. While the first of each
 * pair waits, the second flows. */
static void keys_compared_by_bytes(void **state)
{
    (void)state;
    assert_int_equal(kb_fnv1a32("costarring", 10), kb_fnv1a32("liquid", 6));
    static const struct {
        const char *waits, *flows;
        size_t waits_len, flows_len;
    } pairs[] = {{"costarring", "liquid", 10, 6}, {"a\0b", "a\0c", 3, 3}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        static struct world w;
        world_reset(&w, pairs[i].waits, pairs[i].waits_len);
        kb_pool *p = pool_new(&w, KB_RETRY_SCOPE_KEY, 64);
        for (int s = 1; s <= 3; s++) {
            kb_assert_ok(submit(p, &w, pairs[i].waits, pairs[i].waits_len, s, 1000));
            kb_assert_ok(submit(p, &w, pairs[i].flows, pairs[i].flows_len, s, 1000));
        }
        WAIT_UNTIL(handled_of(&w, pairs[i].flows, pairs[i].flows_len) == 3);
        assert_int_equal(handled_of(&w, pairs[i].flows, pairs[i].flows_len), 3);
        assert_int_equal(handled_of(&w, pairs[i].waits, pairs[i].waits_len), 0);
        kb_pool_stats st;
        kb_pool_stats_get(p, &st);
        assert_int_equal(st.aggregates_waiting, 1);
        assert_int_equal(st.set_aside, 2);
        atomic_store(&w.release, 1);
        kb_assert_ok(kb_pool_flush(p, 30000));
        assert_true(in_order(&w, pairs[i].waits, pairs[i].waits_len, 3));
        assert_true(in_order(&w, pairs[i].flows, pairs[i].flows_len, 3));
        kb_assert_ok(kb_pool_destroy(p, 30000));
    }
}

/* Set-aside items count against the lane's capacity: a key that keeps
 * failing fills its lane, and then every key of the lane gets KB_EFULL (after
 * the timeout, here none) rather than memory growing. Nothing is lost: once
 * released, all of it runs in order. */
static void set_aside_items_fill_the_lane(void **state)
{
    (void)state;
    static struct world w;
    world_reset(&w, "A", 1);
    kb_pool *p = pool_new(&w, KB_RETRY_SCOPE_KEY, 8);   /* ring of 16: 15 slots */
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    uint32_t capacity = st.capacity;
    kb_assert_ok(submit(p, &w, "A", 1, 1, 1000));
    WAIT_UNTIL(atomic_load(&w.fail_calls) >= 1);
    int accepted = 1, rc = KB_OK;
    for (int s = 2; s < 200 && rc == KB_OK; s++) {
        rc = submit(p, &w, "A", 1, s, 0);
        if (rc == KB_OK)
            accepted++;
        else if (rc == KB_EFULL) {   /* the executor may still be setting items aside */
            pause_ms(5);
            rc = submit(p, &w, "A", 1, s, 0);
            accepted += rc == KB_OK;
        }
    }
    assert_int_equal(rc, KB_EFULL);
    /* the ring's slots, plus the few the executor had taken ahead (up to 16) */
    assert_true(accepted >= (int)capacity);
    assert_true(accepted <= (int)capacity + 1 + 16);
    assert_int_equal(submit(p, &w, "B", 1, 1, 0), KB_EFULL);   /* the lane pushes back */
    kb_pool_stats_get(p, &st);
    assert_true(st.set_aside + st.aggregates_waiting + st.depth >= capacity);
    assert_true(st.rejected >= 2);
    atomic_store(&w.release, 1);
    kb_assert_ok(kb_pool_flush(p, 30000));
    kb_assert_ok(submit(p, &w, "B", 1, 1, 1000));
    kb_assert_ok(kb_pool_flush(p, 30000));
    assert_true(in_order(&w, "A", 1, accepted));
    assert_int_equal(handled_of(&w, "B", 1), 1);
    kb_assert_ok(kb_pool_destroy(p, 30000));
}

/* Retries run out: the failing item finishes KB_DEAD, then the set-aside items
 * of its key run in order, each on its first attempt. */
static int always_fail_seq1(void *p, uint32_t attempt, void *opaque)
{
    struct world *w = opaque;
    struct item *it = p;
    if (it->seq == 1 && it->key[0] == 'A') {
        atomic_fetch_add(&w->fail_calls, 1);
        return KB_RETRY;
    }
    if (attempt != 1)
        return KB_DEAD;   /* noticed below: nothing else may be retried */
    return handle(p, attempt, opaque);
}

static int dead_count;

static void count_dead(void *p, int outcome, uint32_t attempts, void *opaque)
{
    struct item *it = p;
    if (outcome == KB_DEAD && it->seq == 1 && it->key[0] == 'A' && attempts == 3)
        dead_count++;
    finish(p, outcome, attempts, opaque);
}

static void dead_letter_releases_the_set_aside(void **state)
{
    (void)state;
    static struct world w;
    memset(&w, 0, sizeof w);
    dead_count = 0;
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.lanes = 1;
    o.threads = 1;
    o.max_attempts = 3;
    o.backoff_ms = 1;
    o.max_backoff_ms = 2;
    o.key = key_of;
    o.handle = always_fail_seq1;
    o.finish = count_dead;
    o.opaque = &w;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);
    for (int s = 1; s <= 10; s++) {
        kb_assert_ok(submit(p, &w, "A", 1, s, 1000));
        kb_assert_ok(submit(p, &w, "B", 1, s, 1000));
    }
    kb_assert_ok(kb_pool_flush(p, 30000));
    assert_int_equal(atomic_load(&w.fail_calls), 3);
    assert_int_equal(dead_count, 1);
    assert_int_equal(handled_of(&w, "A", 1), 9);
    int next = 2;   /* A's 2..10 in order */
    for (int i = 0; i < w.n_handled; i++)
        if (w.handled[i]->key[0] == 'A')
            assert_int_equal(w.handled[i]->seq, next++);
    assert_true(in_order(&w, "B", 1, 10));
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.dead, 1);
    assert_int_equal(st.retried, 2);
    assert_int_equal(st.set_aside, 0);
    kb_assert_ok(kb_pool_destroy(p, 30000));
}

/* Destroyed while a key waits: its items come back once each, KB_ECLOSED. */
static void destroy_returns_set_aside_items(void **state)
{
    (void)state;
    static struct world w;
    world_reset(&w, "A", 1);
    kb_pool *p = pool_new(&w, KB_RETRY_SCOPE_KEY, 64);
    for (int s = 1; s <= 20; s++)
        kb_assert_ok(submit(p, &w, "A", 1, s, 1000));
    kb_assert_ok(submit(p, &w, "B", 1, 1, 1000));
    WAIT_UNTIL(handled_of(&w, "B", 1) == 1);
    kb_pool_stats st;
    WAIT_UNTIL((kb_pool_stats_get(p, &st), st.set_aside == 19));
    assert_int_equal(st.set_aside, 19);
    assert_int_equal(kb_pool_destroy(p, 100), KB_ETIMEDOUT);
    assert_int_equal(w.finished, 21);
    assert_int_equal(w.closed, 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(waiting_key_leaves_its_lane_flowing),
        cmocka_unit_test(lane_scope_holds_the_lane),
        cmocka_unit_test(keys_compared_by_bytes),
        cmocka_unit_test(set_aside_items_fill_the_lane),
        cmocka_unit_test(dead_letter_releases_the_set_aside),
        cmocka_unit_test(destroy_returns_set_aside_items),
    };
    return cmocka_run_group_tests_name("retry_scope", tests, NULL, NULL);
}
