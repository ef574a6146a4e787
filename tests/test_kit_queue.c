/* The kit's pending queue: the committed offset follows the settled prefix,
 * never passing an unsettled event, with executors settling out of order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <keybus/kit.h>

#include "support/check.h"

static int always(void *arg)
{
    (void)arg;
    return 1;
}

static void prefix_in_order(void **state)
{
    (void)state;
    kb_signal *moved = kb_signal_new();
    kb_kit_queue *q = kb_kit_queue_new(3, 100, moved);
    assert_non_null(q);
    kb_kit_pending *pe[5];
    for (int i = 0; i < 5; i++)
        kb_assert_ok(kb_kit_queue_push(q, 110 + 10 * (uint64_t)i, 7, &pe[i]));
    assert_int_equal(kb_kit_pending_partition(pe[2]), 3);
    assert_int_equal(kb_kit_pending_end(pe[2]), 130);
    assert_int_equal(kb_kit_pending_generation(pe[2]), 7);
    assert_int_equal(kb_kit_queue_outstanding(q), 5);
    assert_int_equal(kb_kit_settle(pe[2]), 0);    /* 1 and 2 are not settled: stays */
    assert_int_equal(kb_kit_settle(pe[1]), 0);
    assert_int_equal(kb_kit_queue_committed(q), 100);
    assert_int_equal(kb_kit_settle(pe[0]), 1);    /* 1..3 settled: past the third */
    assert_int_equal(kb_kit_queue_committed(q), 130);
    assert_true(kb_signal_wait(moved, always, NULL, kb_deadline_ns(1000)));
    kb_kit_queue_cancel(q, pe[4]);                /* the sink refused the last one */
    assert_int_equal(kb_kit_queue_outstanding(q), 1);
    assert_int_equal(kb_kit_settle(pe[3]), 1);
    assert_int_equal(kb_kit_queue_committed(q), 140);
    assert_int_equal(kb_kit_queue_outstanding(q), 0);
    kb_kit_queue_free(q);
    kb_signal_free(moved);
}

static void released_stops_the_prefix(void **state)
{
    (void)state;
    kb_kit_queue *q = kb_kit_queue_new(0, 0, NULL);
    assert_non_null(q);
    kb_kit_pending *a, *b, *c;
    kb_assert_ok(kb_kit_queue_push(q, 1, 1, &a));
    kb_assert_ok(kb_kit_queue_push(q, 2, 1, &b));
    kb_assert_ok(kb_kit_queue_push(q, 3, 1, &c));
    kb_kit_settle(a);
    kb_kit_release(b);            /* handed back unhandled: the next owner repeats it */
    kb_kit_settle(c);
    assert_int_equal(kb_kit_queue_committed(q), 1);
    assert_int_equal(kb_kit_queue_outstanding(q), 0);
    kb_kit_pending *d;
    kb_assert_ok(kb_kit_queue_push(q, 4, 2, &d));
    assert_int_equal(kb_kit_queue_restart(q, 1), KB_EINVAL);   /* d is still out */
    kb_kit_settle(d);
    kb_assert_ok(kb_kit_queue_restart(q, 1));    /* frees b and c: read again from 1 */
    assert_int_equal(kb_kit_queue_committed(q), 1);
    kb_assert_ok(kb_kit_queue_push(q, 2, 3, &b));
    kb_kit_settle(b);
    assert_int_equal(kb_kit_queue_committed(q), 2);
    kb_assert_ok(kb_kit_queue_push(q, 3, 3, &c));   /* left in the queue: free takes it */
    kb_kit_queue_free(q);
}

#define EVENTS 20000
#define SETTLERS 4
#define BLOCK 64

struct race {
    kb_kit_queue *q;
    kb_kit_pending *_Atomic pe[EVENTS];
    _Atomic unsigned char settled[EVENTS];
    _Atomic int pushed;
    _Atomic int done;
};

/* The feeder: pushes in log order, event i ending at i + 1. */
static void *feeder(void *arg)
{
    struct race *r = arg;
    for (int i = 0; i < EVENTS; i++) {
        kb_kit_pending *pe;
        if (kb_kit_queue_push(r->q, (uint64_t)i + 1, 1, &pe) != KB_OK)
            abort();
        atomic_store_explicit(&r->pe[i], pe, memory_order_release);
        atomic_store_explicit(&r->pushed, i + 1, memory_order_release);
    }
    return NULL;
}

/* Settler k: blocks k, k + SETTLERS, ... each settled last to first. */
static void *settler(void *arg)
{
    struct race *r = ((struct race **)arg)[0];
    int k = (int)(intptr_t)((void **)arg)[1];
    for (int first = k * BLOCK; first < EVENTS; first += SETTLERS * BLOCK) {
        int last = first + BLOCK - 1 < EVENTS ? first + BLOCK - 1 : EVENTS - 1;
        for (int i = last; i >= first; i--) {
            kb_kit_pending *pe;
            while ((pe = atomic_load_explicit(&r->pe[i], memory_order_acquire)) == NULL)
                sched_yield();
            atomic_store(&r->settled[i], 1);   /* before: the offset may pass it after */
            kb_kit_settle(pe);
        }
    }
    return NULL;
}

/* Every event at or below the committed offset must be settled already;
 * and a queue seen idle has its offset past everything pushed before (what
 * a hand-over stores for the next owner). */
static void *watcher(void *arg)
{
    struct race *r = arg;
    uint64_t verified = 0;
    long violations = 0;
    while (!atomic_load(&r->done) || verified < kb_kit_queue_committed(r->q)) {
        uint64_t pushed = (uint64_t)atomic_load_explicit(&r->pushed, memory_order_acquire);
        if (kb_kit_queue_outstanding(r->q) == 0 && kb_kit_queue_committed(r->q) < pushed)
            violations++;
        uint64_t c = kb_kit_queue_committed(r->q);
        for (; verified < c; verified++)
            violations += !atomic_load(&r->settled[verified]);
    }
    return (void *)violations;
}

static void many_threads_out_of_order(void **state)
{
    (void)state;
    struct race *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->q = kb_kit_queue_new(0, 0, NULL);
    assert_non_null(r->q);
    pthread_t f, w, s[SETTLERS];
    void *args[SETTLERS][2];
    assert_int_equal(pthread_create(&w, NULL, watcher, r), 0);
    assert_int_equal(pthread_create(&f, NULL, feeder, r), 0);
    for (int k = 0; k < SETTLERS; k++) {
        args[k][0] = r;
        args[k][1] = (void *)(intptr_t)k;
        assert_int_equal(pthread_create(&s[k], NULL, settler, args[k]), 0);
    }
    pthread_join(f, NULL);
    for (int k = 0; k < SETTLERS; k++)
        pthread_join(s[k], NULL);
    atomic_store(&r->done, 1);
    void *violations;
    pthread_join(w, &violations);
    assert_int_equal((long)violations, 0);
    assert_int_equal(kb_kit_queue_committed(r->q), EVENTS);   /* all settled: at the end */
    assert_int_equal(kb_kit_queue_outstanding(r->q), 0);
    kb_kit_queue_free(r->q);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prefix_in_order),
        cmocka_unit_test(released_stops_the_prefix),
        cmocka_unit_test(many_threads_out_of_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
