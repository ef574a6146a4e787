/* The kit's publish backlog on a mem:// bus (for its delivery callback):
 * exactly one report per event through resends, refusals and close; flush
 * by ticket; KB_EFULL after the timed wait; KB_ECLOSED after close; one
 * partition's events sent in order through a backoff, a resend only once the
 * earlier events of its partition are no longer in flight. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/kit.h>

#include "support/bus.h"
#include "support/check.h"

#define EVENTS 3000
#define PRODUCERS 3

struct reports {
    _Atomic int ok[EVENTS], failed[EVENTS];
    _Atomic int other;   /* a report whose key is no event of ours */
};

static void on_report(const kb_delivery_report *r, void *opaque)
{
    struct reports *rep = opaque;
    int i = -1;
    if (r->key_len == sizeof i)
        memcpy(&i, r->key, sizeof i);
    if (i < 0 || i >= EVENTS) {
        atomic_fetch_add(&rep->other, 1);
        return;
    }
    atomic_fetch_add(r->result == KB_OK ? &rep->ok[i] : &rep->failed[i], 1);
}

static kb_bus *open_bus(struct reports *rep)
{
    kb_conf *c = kb_test_conf("mem://", NULL, NULL);
    kb_conf_set_delivery_cb(c, on_report, rep);
    return kb_test_open_conf(c);
}

struct fixture {
    struct reports *rep;
    kb_bus *bus;
    kb_kit_backlog *b;
};

static void setup(struct fixture *f, size_t capacity, int timeout_ms, uint32_t max_attempts)
{
    f->rep = calloc(1, sizeof *f->rep);
    assert_non_null(f->rep);
    f->bus = open_bus(f->rep);
    kb_kit_backlog_conf c = {.size = sizeof c, .bus = f->bus, .capacity = capacity,
                             .timeout_ms = timeout_ms, .max_attempts = max_attempts,
                             .backoff_ms = 1, .max_backoff_ms = 4, .free_data = free};
    f->b = kb_kit_backlog_new(&c);
    assert_non_null(f->b);
}

static void teardown(struct fixture *f)
{
    kb_kit_backlog_free(f->b);
    kb_close(f->bus, 1000);
    free(f->rep);
}

/* Event i: its data and its key are one malloc'ed int. */
static int add_event(kb_kit_backlog *b, int i, uint64_t *ticket)
{
    int *data = malloc(sizeof *data);
    assert_non_null(data);
    *data = i;
    int rc = kb_kit_backlog_add(b, data, "orders", (uint32_t)i % 8, data, sizeof *data, ticket);
    if (rc != KB_OK)
        free(data);   /* refused: still ours */
    return rc;
}

struct world {
    kb_kit_backlog *b;
    _Atomic int stop;
    _Atomic int sends;
};

/* The broker's answers, by event: every 10th refuses its first two sends
 * (stored at the third), every 50th fails every send (max_attempts then
 * gives up), every 50th + 9 is refused for good at once. */
static void answer(int i, const kb_kit_item *it, int *result, int *retry)
{
    *result = KB_OK;
    *retry = 0;
    if (i % 50 == 7 || (i % 10 == 3 && it->attempts < 3))
        *result = KB_ETRANSPORT, *retry = 1;
    else if (i % 50 == 9)
        *result = KB_EINVAL;
}

static int due_or_stop(void *arg)
{
    struct world *w = arg;
    return atomic_load(&w->stop) || kb_kit_backlog_next_due(w->b) <= kb_now_ns();
}

static void *sender(void *arg)
{
    struct world *w = arg;
    kb_kit_item *items[16];
    while (!atomic_load(&w->stop)) {
        size_t n = kb_kit_backlog_take(w->b, items, 16, kb_now_ns());
        for (size_t k = 0; k < n; k++) {
            int i = *(int *)items[k]->data, result, retry;
            answer(i, items[k], &result, &retry);
            char id[32];
            snprintf(id, sizeof id, "1-%d", i);
            atomic_fetch_add(&w->sends, 1);
            kb_kit_backlog_done(w->b, items[k], result, retry, id, "refused by the fake broker");
        }
        if (n == 0) {
            int64_t due = kb_kit_backlog_next_due(w->b), limit = kb_deadline_ns(20);
            kb_signal_wait(kb_kit_backlog_signal(w->b), due_or_stop, w, due < limit ? due : limit);
        }
    }
    return NULL;
}

struct producer {
    struct world *w;
    int first;
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    for (int i = p->first; i < EVENTS; i += PRODUCERS) {
        int rc;
        while ((rc = add_event(p->w->b, i, NULL)) == KB_EFULL)
            ;   /* full for the whole wait: the test waits on */
        if (rc != KB_OK)
            abort();
    }
    return NULL;
}

static void one_report_per_event(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 64, 50, 4);
    struct reports *rep = f.rep;
    struct world w = {.b = f.b};
    pthread_t s, p[PRODUCERS];
    struct producer args[PRODUCERS];
    assert_int_equal(pthread_create(&s, NULL, sender, &w), 0);
    for (int k = 0; k < PRODUCERS; k++) {
        args[k] = (struct producer){&w, k};
        assert_int_equal(pthread_create(&p[k], NULL, produce, &args[k]), 0);
    }
    for (int k = 0; k < PRODUCERS; k++)
        pthread_join(p[k], NULL);
    uint64_t last = kb_kit_backlog_last_ticket(w.b);
    assert_int_equal(last, EVENTS);
    kb_assert_ok(kb_kit_backlog_flush(w.b, last, kb_deadline_ns(30000)));
    assert_int_equal(kb_kit_backlog_length(w.b), 0);
    int ok = 0, failed = 0;
    for (int i = 0; i < EVENTS; i++) {
        assert_int_equal(rep->ok[i] + rep->failed[i], 1);   /* exactly one each */
        int fails = i % 50 == 7 || i % 50 == 9;
        assert_int_equal(rep->failed[i], fails);
        ok += rep->ok[i];
        failed += rep->failed[i];
    }
    assert_int_equal(rep->other, 0);
    assert_int_equal(failed, 2 * EVENTS / 50);
    /* each 10th + 3 took 3 sends, each 50th + 7 max_attempts (4), the rest 1 */
    assert_int_equal(atomic_load(&w.sends), EVENTS + 2 * (EVENTS / 10) + 3 * (EVENTS / 50));
    /* the failures are the bus's to tell at the next kb_flush, with the code
     * of the latest: refused (KB_EINVAL) or sends used up (KB_ETRANSPORT),
     * whichever came last (the producers' pace decides) */
    int rc = kb_flush(f.bus, 1000);
    assert_true(rc == KB_ETRANSPORT || rc == KB_EINVAL);
    kb_assert_ok(kb_flush(f.bus, 1000));   /* told once */
    atomic_store(&w.stop, 1);
    kb_signal_notify(kb_kit_backlog_signal(w.b));
    pthread_join(s, NULL);
    teardown(&f);
}

static void flush_by_ticket(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 16, 50, 1);
    kb_kit_backlog *b = f.b;
    struct reports *rep = f.rep;
    uint64_t t[3];
    for (int i = 0; i < 3; i++) {
        kb_assert_ok(add_event(b, i, &t[i]));
        assert_int_equal(t[i], (uint64_t)i + 1);
    }
    kb_kit_item *items[3];
    assert_int_equal(kb_kit_backlog_take(b, items, 3, kb_now_ns()), 3);
    assert_int_equal(kb_kit_backlog_take(b, items, 3, kb_now_ns()), 0);   /* in flight */
    kb_kit_backlog_done(b, items[1], KB_OK, 0, "1-1", NULL);   /* the second first */
    assert_int_equal(kb_kit_backlog_flush(b, t[1], kb_deadline_ns(30)), KB_ETIMEDOUT);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "1-0", NULL);
    kb_assert_ok(kb_kit_backlog_flush(b, t[1], kb_deadline_ns(1000)));   /* 1 and 2: done */
    assert_int_equal(kb_kit_backlog_flush(b, t[2], kb_deadline_ns(30)), KB_ETIMEDOUT);
    assert_int_equal(rep->ok[0] + rep->ok[1], 2);
    assert_int_equal(kb_kit_backlog_length(b), 1);
    /* close gives up on the third (in flight: the sender stopped) */
    kb_kit_backlog_fail_all(b, KB_ETIMEDOUT, "given up by close");
    assert_int_equal(rep->failed[2], 1);
    kb_assert_ok(kb_kit_backlog_flush(b, t[2], kb_deadline_ns(1000)));
    assert_int_equal(add_event(b, 3, NULL), KB_ECLOSED);
    teardown(&f);
}

static void full_after_the_wait(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 4, 100, 1);
    kb_kit_backlog *b = f.b;
    struct reports *rep = f.rep;
    for (int i = 0; i < 4; i++)
        kb_assert_ok(add_event(b, i, NULL));
    int64_t t0 = kb_now_ns();
    assert_int_equal(add_event(b, 4, NULL), KB_EFULL);
    assert_true(kb_now_ns() - t0 >= 90 * 1000000LL);   /* it waited (wide slack above) */
    kb_kit_backlog_fail_all(b, KB_ETIMEDOUT, "given up by close");
    for (int i = 0; i < 4; i++)
        assert_int_equal(rep->failed[i], 1);
    assert_int_equal(rep->failed[4] + rep->ok[4], 0);   /* refused: no report */
    teardown(&f);
}

/* While an event waits out its backoff, the later events of its partition
 * wait behind it (another partition's go): one key's events stay in order. */
static void backoff_keeps_partition_order(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 16, 50, 3);
    kb_kit_backlog *b = f.b;
    kb_kit_item *items[4];
    kb_assert_ok(add_event(b, 0, NULL));   /* events i go to partition i % 8 */
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 1);
    int64_t t0 = kb_now_ns();
    kb_kit_backlog_done(b, items[0], KB_ETRANSPORT, 1, NULL, "refused once");
    kb_assert_ok(add_event(b, 8, NULL));   /* partition 0, behind event 0 */
    kb_assert_ok(add_event(b, 1, NULL));   /* partition 1 */
    assert_int_equal(kb_kit_backlog_take(b, items, 4, t0), 1);
    assert_int_equal(*(int *)items[0]->data, 1);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "1-1", NULL);
    int64_t due = kb_kit_backlog_next_due(b);
    assert_true(due > t0 && due < INT64_MAX);   /* event 0's backoff, not event 8's 0 */
    assert_int_equal(kb_kit_backlog_take(b, items, 4, due), 2);
    assert_int_equal(*(int *)items[0]->data, 0);   /* in order */
    assert_int_equal(*(int *)items[1]->data, 8);
    for (int i = 0; i < 2; i++)
        kb_kit_backlog_done(b, items[i], KB_OK, 0, "1-2", NULL);
    assert_int_equal(f.rep->ok[0] + f.rep->ok[8] + f.rep->ok[1], 3);
    assert_int_equal(kb_kit_backlog_length(b), 0);
    teardown(&f);
}

/* Ids of what one take handed out, in order, into got[] (at most 4). */
static size_t take_ids(kb_kit_backlog *b, kb_kit_item **items, int64_t now, int *got)
{
    size_t n = kb_kit_backlog_take(b, items, 4, now);
    for (size_t k = 0; k < n; k++)
        got[k] = *(int *)items[k]->data;
    return n;
}

/* A resend waits for the earlier events of its partition still in flight:
 * sent before them, it would be stored first if they fail and are resent
 * too. The later events of its partition wait behind it; other events,
 * and those of a partition with events in flight but none waiting, go. */
static void resend_waits_for_earlier_in_flight(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 16, 50, 3);
    kb_kit_backlog *b = f.b;
    kb_kit_item *items[4], *first;
    int got[4];
    const int64_t later = kb_now_ns() + 3600 * 1000000000LL;   /* every backoff is over */
    kb_assert_ok(add_event(b, 0, NULL));   /* partition 0 */
    kb_assert_ok(add_event(b, 8, NULL));   /* partition 0 */
    assert_int_equal(take_ids(b, items, kb_now_ns(), got), 2);
    assert_int_equal(got[0], 0);
    first = items[0];
    kb_kit_backlog_done(b, items[1], KB_ETRANSPORT, 1, NULL, "refused once");   /* 8 */
    assert_int_equal(kb_kit_backlog_take(b, items, 4, later), 0);   /* 0 is in flight */
    assert_int_equal(kb_kit_backlog_next_due(b), INT64_MAX);   /* 0's done decides */
    kb_assert_ok(add_event(b, 16, NULL));   /* partition 0, behind the resend of 8 */
    kb_assert_ok(add_event(b, 1, NULL));    /* partition 1 */
    kb_assert_ok(add_event(b, 9, NULL));    /* partition 1, while 1 is in flight */
    assert_int_equal(take_ids(b, items, later, got), 2);
    assert_int_equal(got[0], 1);
    assert_int_equal(got[1], 9);
    for (int k = 0; k < 2; k++)
        kb_kit_backlog_done(b, items[k], KB_OK, 0, "1-1", NULL);
    /* 0 fails too: its resend goes first, 8's waits for it */
    kb_kit_backlog_done(b, first, KB_ETRANSPORT, 1, NULL, "refused once");
    int64_t due = kb_kit_backlog_next_due(b);
    assert_true(due > 0 && due < INT64_MAX);
    assert_int_equal(take_ids(b, items, later, got), 1);
    assert_int_equal(got[0], 0);
    assert_int_equal(kb_kit_backlog_take(b, items + 1, 3, later), 0);
    assert_int_equal(kb_kit_backlog_next_due(b), INT64_MAX);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "1-0", NULL);
    assert_int_equal(take_ids(b, items, later, got), 2);   /* then 8 and 16, in order */
    assert_int_equal(got[0], 8);
    assert_int_equal(got[1], 16);
    for (int k = 0; k < 2; k++)
        kb_kit_backlog_done(b, items[k], KB_OK, 0, "1-2", NULL);
    assert_int_equal(kb_kit_backlog_length(b), 0);
    const int events[] = {0, 1, 8, 9, 16};
    for (size_t k = 0; k < sizeof events / sizeof events[0]; k++)
        assert_int_equal(f.rep->ok[events[k]], 1);
    teardown(&f);
}

/* A pipelined sender checked against what the backlog promises: up to
 * `window` events in flight, answered in any order, a fifth of the sends
 * refused for a resend. Each event handed out has no earlier event of its
 * partition waiting for a resend, and a resend none in flight either. With
 * one event in flight at a time each partition is stored in order. */
#define MODEL_EVENTS 2000
enum { NOT_TAKEN, IN_FLIGHT, WAITING, STORED };

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;   /* xorshift64 */
    return *x;
}

static void check_take(const int *state, int i)
{
    assert_true(state[i] == NOT_TAKEN || state[i] == WAITING);
    for (int j = i - 8; j >= 0; j -= 8) {   /* event i's partition is i % 8 */
        assert_int_not_equal(state[j], WAITING);
        if (state[i] == WAITING)
            assert_int_not_equal(state[j], IN_FLIGHT);
    }
}

static void pipelined_sender(size_t window)
{
    struct fixture f;
    setup(&f, MODEL_EVENTS, 50, 1000);   /* no event fails for good */
    kb_kit_backlog *b = f.b;
    static int state[MODEL_EVENTS];
    kb_kit_item *flight[8];
    size_t in_flight = 0;
    int added = 0, stored = 0, resends = 0, out_of_order = 0, last[8];
    uint64_t x = 0x9e3779b97f4a7c15u;
    memset(state, 0, sizeof state);
    memset(last, -1, sizeof last);
    while (stored < MODEL_EVENTS) {
        for (int k = 0; k < 3 && added < MODEL_EVENTS; k++)
            kb_assert_ok(add_event(b, added++, NULL));
        /* half the takes after every backoff: the in-flight rule alone holds */
        int64_t now = kb_now_ns() + (next_rand(&x) % 2 ? 3600 * 1000000000LL : 0);
        size_t n = kb_kit_backlog_take(b, flight + in_flight, window - in_flight, now);
        for (size_t k = in_flight; k < in_flight + n; k++) {
            int i = *(int *)flight[k]->data;
            check_take(state, i);
            resends += state[i] == WAITING;
            state[i] = IN_FLIGHT;
        }
        in_flight += n;
        for (size_t answers = next_rand(&x) % (in_flight + 1); answers > 0; answers--) {
            size_t k = next_rand(&x) % in_flight;
            kb_kit_item *it = flight[k];
            int i = *(int *)it->data;
            flight[k] = flight[--in_flight];
            if (next_rand(&x) % 5 == 0) {
                state[i] = WAITING;
                kb_kit_backlog_done(b, it, KB_ETRANSPORT, 1, NULL, "refused for now");
                continue;
            }
            state[i] = STORED;
            stored++;
            out_of_order += i < last[i % 8];
            if (i > last[i % 8])
                last[i % 8] = i;
            kb_kit_backlog_done(b, it, KB_OK, 0, "1-1", NULL);
        }
    }
    assert_int_equal(in_flight, 0);
    assert_int_equal(kb_kit_backlog_length(b), 0);
    assert_true(resends > MODEL_EVENTS / 10);   /* the resend rules were exercised */
    for (int i = 0; i < MODEL_EVENTS; i++)
        assert_int_equal(f.rep->ok[i], 1);
    if (window == 1)
        assert_int_equal(out_of_order, 0);
    teardown(&f);
}

static void pipelined_sender_keeps_the_rules(void **state)
{
    (void)state;
    pipelined_sender(8);
}

static void one_in_flight_stores_in_order(void **state)
{
    (void)state;
    pipelined_sender(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_report_per_event),
        cmocka_unit_test(flush_by_ticket),
        cmocka_unit_test(full_after_the_wait),
        cmocka_unit_test(backoff_keeps_partition_order),
        cmocka_unit_test(resend_waits_for_earlier_in_flight),
        cmocka_unit_test(pipelined_sender_keeps_the_rules),
        cmocka_unit_test(one_in_flight_stores_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
