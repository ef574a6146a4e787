/* The kit's publish backlog on a mem:// bus (for its delivery callback):
 * exactly one report per event through resends, refusals and close; flush
 * by ticket; KB_EFULL after the timed wait; KB_ECLOSED after close; one
 * partition's events sent in order through a backoff, a resend only once the
 * earlier events of its partition are no longer in flight; frames taken,
 * resent and reported whole with one report per event; at most one item of
 * a partition in flight when asked, cheap with 65,536 partitions in
 * flight; a frame done with no ID; kb_kit_backlog_done from other threads
 * than the sender's; a conf of the first and second releases' sizes; a
 * bound in bytes, a publisher waiting on it woken by a done, a store or a
 * done event by event on another thread; a frame done event by event; a
 * pipeline stored at once; entries reused with keys of every size, each
 * report with its own key; publishers and flushes waiting at once, each let
 * go by the dones. */
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

#include "core/kit/kit_int.h"   /* the first release's conf, frozen */
#include "support/bus.h"
#include "support/check.h"

#define EVENTS 3000
#define PRODUCERS 3

struct reports {
    _Atomic int ok[EVENTS], failed[EVENTS];
    _Atomic int other;   /* a report whose key is no event of ours */
    char id[EVENTS][32];   /* the ID of its last report */
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
    snprintf(rep->id[i], sizeof rep->id[i], "%s", r->id);
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

/* A frame's event `index` is reported as "<id>.<index + 1>". */
static void event_id(const char *id, uint32_t index, char *out, size_t len)
{
    snprintf(out, len, "%s.%u", id, index + 1);
}

static void setup_limit(struct fixture *f, size_t capacity, int timeout_ms,
                        uint32_t max_attempts, int one_in_flight)
{
    f->rep = calloc(1, sizeof *f->rep);
    assert_non_null(f->rep);
    f->bus = open_bus(f->rep);
    kb_kit_backlog_conf c = {.size = sizeof c, .bus = f->bus, .capacity = capacity,
                             .timeout_ms = timeout_ms, .max_attempts = max_attempts,
                             .backoff_ms = 1, .max_backoff_ms = 4, .free_data = free,
                             .one_in_flight_per_partition = one_in_flight,
                             .event_id = event_id};
    f->b = kb_kit_backlog_new(&c);
    assert_non_null(f->b);
}

static void setup(struct fixture *f, size_t capacity, int timeout_ms, uint32_t max_attempts)
{
    setup_limit(f, capacity, timeout_ms, max_attempts, 0);
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

/* With `limit` (one_in_flight_per_partition), no other event of its
 * partition is in flight or waiting, later ones included. */
static void check_take(const int *state, int i, int limit)
{
    assert_true(state[i] == NOT_TAKEN || state[i] == WAITING);
    for (int j = i - 8; j >= 0; j -= 8) {   /* event i's partition is i % 8 */
        assert_int_not_equal(state[j], WAITING);
        if (state[i] == WAITING || limit)
            assert_int_not_equal(state[j], IN_FLIGHT);
    }
    for (int j = i + 8; limit && j < MODEL_EVENTS; j += 8)
        assert_true(state[j] == NOT_TAKEN);
}

static void pipelined_sender(size_t window, int limit)
{
    struct fixture f;
    setup_limit(&f, MODEL_EVENTS, 50, 1000, limit);   /* no event fails for good */
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
            check_take(state, i, limit);
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
    if (window == 1 || limit)
        assert_int_equal(out_of_order, 0);
    teardown(&f);
}

static void pipelined_sender_keeps_the_rules(void **state)
{
    (void)state;
    pipelined_sender(8, 0);
}

static void one_in_flight_stores_in_order(void **state)
{
    (void)state;
    pipelined_sender(1, 0);
}

/* one_in_flight_per_partition with 8 in flight, answered in any order, a
 * fifth refused: at most one item of a partition out at a time, so each
 * partition is stored in order through the resends. */
static void partition_limit_stores_in_order(void **state)
{
    (void)state;
    pipelined_sender(8, 1);
}

/* Events i .. i + n - 1 as one frame of partition p with malloc'ed data
 * (freed if refused), their keys the ints themselves. */
static int add_frame_data(kb_kit_backlog *b, void *data, int i, uint32_t n, uint32_t p,
                          uint64_t *ticket)
{
    int keys[16];
    kb_kit_key k[16];
    assert_true(n <= 16);
    for (uint32_t j = 0; j < n; j++) {
        keys[j] = i + (int)j;
        k[j] = (kb_kit_key){&keys[j], sizeof keys[j]};
    }
    int rc = kb_kit_backlog_add_frame(b, data, "orders", p, k, n, ticket);
    if (rc != KB_OK)
        free(data);
    return rc;
}

/* The same with an int (i) for data. */
static int add_frame(kb_kit_backlog *b, int i, uint32_t n, uint32_t p, uint64_t *ticket)
{
    int *data = malloc(sizeof *data);
    assert_non_null(data);
    *data = i;
    return add_frame_data(b, data, i, n, p, ticket);
}

/* A frame is one item: taken once, resent whole (the same data, so a
 * broker deduping by message ID stores it once), and reported once per
 * event, each named by event_id; it counts its events against the
 * capacity, in kb_kit_backlog_length and in tickets. */
static void frame_is_one_item_with_a_report_per_event(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 8, 50, 3);
    kb_kit_backlog *b = f.b;
    struct reports *rep = f.rep;
    kb_kit_item *items[4];
    uint64_t t1, t2;
    kb_assert_ok(add_frame(b, 0, 5, 0, &t1));   /* events 0..4, tickets 1..5 */
    assert_int_equal(t1, 5);
    assert_int_equal(kb_kit_backlog_length(b), 5);
    assert_int_equal(kb_kit_backlog_last_ticket(b), 5);
    kb_assert_ok(add_event(b, 9, &t2));   /* partition 1, ticket 6 */
    assert_int_equal(t2, 6);
    /* 5 + 1 held: a frame of 3 does not fit until some are reported */
    assert_int_equal(add_frame(b, 10, 3, 2, NULL), KB_EFULL);
    assert_int_equal(add_frame(b, 10, 9, 2, NULL), KB_EINVAL);   /* over the capacity */
    assert_int_equal(add_frame(b, 10, 0, 2, NULL), KB_EINVAL);
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 2);
    kb_kit_item *frame = items[0];
    assert_int_equal(frame->events, 5);
    assert_int_equal(frame->ticket, 1);
    assert_int_equal(items[1]->events, 1);
    kb_kit_backlog_done(b, items[1], KB_OK, 0, "7", NULL);
    assert_string_equal(rep->id[9], "7");   /* a lone event keeps the ID as it is */
    kb_kit_backlog_done(b, frame, KB_ETRANSPORT, 1, NULL, "no ack");
    for (int i = 0; i < 5; i++)
        assert_int_equal(rep->ok[i] + rep->failed[i], 0);   /* a resend reports nothing */
    assert_int_equal(kb_kit_backlog_flush(b, 1, kb_deadline_ns(20)), KB_ETIMEDOUT);
    const int64_t later = kb_now_ns() + 3600 * 1000000000LL;
    assert_int_equal(kb_kit_backlog_take(b, items, 4, later), 1);
    assert_ptr_equal(items[0], frame);   /* the same item, whole */
    assert_int_equal(*(int *)frame->data, 0);
    assert_int_equal(frame->attempts, 2);
    kb_kit_backlog_done(b, frame, KB_OK, 0, "42", NULL);
    char want[32];
    for (int i = 0; i < 5; i++) {
        assert_int_equal(rep->ok[i], 1);
        snprintf(want, sizeof want, "42.%d", i + 1);
        assert_string_equal(rep->id[i], want);
    }
    kb_assert_ok(kb_kit_backlog_flush(b, t2, kb_deadline_ns(1000)));
    assert_int_equal(kb_kit_backlog_length(b), 0);
    /* a frame failed for good: a failed report per event, told by kb_flush */
    kb_assert_ok(add_frame(b, 20, 3, 3, &t1));
    assert_int_equal(t1, 9);
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 1);
    kb_kit_backlog_done(b, items[0], KB_EINVAL, 0, NULL, "refused");
    for (int i = 20; i < 23; i++)
        assert_int_equal(rep->failed[i], 1);
    assert_int_equal(kb_flush(f.bus, 1000), KB_EINVAL);
    /* and one given up by close */
    kb_assert_ok(add_frame(b, 30, 2, 3, NULL));
    kb_kit_backlog_fail_all(b, KB_ETIMEDOUT, "given up by close");
    assert_int_equal(rep->failed[30] + rep->failed[31], 2);
    assert_int_equal(rep->other, 0);
    teardown(&f);
}

/* one_in_flight_per_partition: an item of a partition with one in flight
 * is not taken (nor due) until that one is done, a resend included;
 * partitions 1024 apart are told apart. */
static void one_item_of_a_partition_in_flight(void **state)
{
    (void)state;
    struct fixture f;
    setup_limit(&f, 16, 50, 3, 1);
    kb_kit_backlog *b = f.b;
    kb_kit_item *items[8], *p0, *p1;
    const int64_t later = kb_now_ns() + 3600 * 1000000000LL;
    kb_assert_ok(add_frame(b, 0, 2, 0, NULL));      /* partition 0 */
    kb_assert_ok(add_frame(b, 2, 1, 0, NULL));      /* partition 0 */
    kb_assert_ok(add_frame(b, 3, 1, 1, NULL));      /* partition 1 */
    kb_assert_ok(add_frame(b, 4, 1, 1, NULL));      /* partition 1 */
    kb_assert_ok(add_frame(b, 5, 1, 1024, NULL));   /* partition 1024 */
    kb_assert_ok(add_frame(b, 6, 1, 1024, NULL));
    assert_int_equal(kb_kit_backlog_take(b, items, 8, kb_now_ns()), 3);
    assert_int_equal(*(int *)items[0]->data, 0);
    assert_int_equal(*(int *)items[1]->data, 3);
    assert_int_equal(*(int *)items[2]->data, 5);
    p0 = items[0], p1 = items[1];
    assert_int_equal(kb_kit_backlog_take(b, items, 8, later), 0);
    assert_int_equal(kb_kit_backlog_next_due(b), INT64_MAX);   /* only a done helps */
    kb_kit_backlog_done(b, items[2], KB_OK, 0, "3", NULL);     /* 1024's first */
    assert_true(kb_kit_backlog_next_due(b) <= kb_now_ns());
    assert_int_equal(kb_kit_backlog_take(b, items, 8, kb_now_ns()), 1);
    assert_int_equal(*(int *)items[0]->data, 6);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "4", NULL);
    /* partition 1 refused: its resend comes before its next, one at a time */
    kb_kit_backlog_done(b, p1, KB_ETRANSPORT, 1, NULL, "refused once");
    assert_int_equal(kb_kit_backlog_take(b, items, 8, later), 1);
    assert_ptr_equal(items[0], p1);
    assert_int_equal(kb_kit_backlog_take(b, items, 8, later), 0);
    kb_kit_backlog_done(b, p1, KB_OK, 0, "5", NULL);
    assert_int_equal(kb_kit_backlog_take(b, items, 8, later), 1);
    assert_int_equal(*(int *)items[0]->data, 4);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "6", NULL);
    kb_kit_backlog_done(b, p0, KB_OK, 0, "1", NULL);
    assert_int_equal(kb_kit_backlog_take(b, items, 8, later), 1);
    assert_int_equal(*(int *)items[0]->data, 2);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "2", NULL);
    assert_int_equal(kb_kit_backlog_length(b), 0);
    for (int i = 0; i < 7; i++)
        assert_int_equal(f.rep->ok[i], 1);
    teardown(&f);
}

/* A bus with no delivery callback, one item of a partition in flight:
 * stored events build no report (nothing to call) yet their tickets pass
 * (flush, length), a failure still counts for the bus's next kb_flush, and
 * fail_all gives up an item queued for its resend, reported failed once. */
static void no_callback_counts_only_failures(void **state)
{
    (void)state;
    kb_bus *bus = kb_test_open("mem://", NULL, NULL);
    kb_kit_backlog_conf c = {.size = sizeof c, .bus = bus, .capacity = 16, .timeout_ms = 50,
                             .max_attempts = 3, .backoff_ms = 1, .max_backoff_ms = 4,
                             .free_data = free, .one_in_flight_per_partition = 1,
                             .event_id = event_id};
    kb_kit_backlog *b = kb_kit_backlog_new(&c);
    assert_non_null(b);
    kb_kit_item *items[8];
    uint64_t frame_ticket = 0, lone_ticket = 0;
    kb_assert_ok(add_frame(b, 0, 3, 0, &frame_ticket));   /* partition 0: a frame of 3 */
    kb_assert_ok(add_frame(b, 3, 1, 1, &lone_ticket));    /* partition 1 */
    kb_assert_ok(add_frame(b, 4, 1, 0, NULL));            /* partition 0, behind the frame */
    assert_int_equal(kb_kit_backlog_take(b, items, 8, kb_now_ns()), 2);
    const char *ids[] = {"7"};
    kb_kit_backlog_stored(b, &items[0], ids, 1);
    kb_kit_backlog_done(b, items[1], KB_EINVAL, 0, NULL, "refused for good");
    kb_assert_ok(kb_kit_backlog_flush(b, lone_ticket, kb_deadline_ns(1000)));
    assert_true(frame_ticket < lone_ticket);
    assert_int_equal(kb_kit_backlog_length(b), 1);
    assert_int_equal(kb_flush(bus, 1000), KB_EINVAL);   /* the failure, counted by the bus */
    assert_non_null(strstr(kb_last_error(), "refused for good"));
    kb_assert_ok(kb_flush(bus, 1000));                   /* and counted once */
    assert_int_equal(kb_kit_backlog_take(b, items, 8, kb_now_ns()), 1);
    assert_int_equal(*(int *)items[0]->data, 4);
    kb_kit_backlog_done(b, items[0], KB_ETRANSPORT, 1, NULL, "lost");   /* queued to resend */
    kb_kit_backlog_fail_all(b, KB_ETRANSPORT, "given up by close");
    assert_int_equal(kb_kit_backlog_length(b), 0);
    assert_int_equal(kb_flush(bus, 1000), KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "1 published events failed"));
    assert_non_null(strstr(kb_last_error(), "given up by close"));
    kb_kit_backlog_free(b);
    kb_close(bus, 1000);
}

/* one_in_flight_per_partition with many partitions in flight: whether one
 * is busy is looked up, not searched for, so the add, take and done of one
 * more partition stay cheap. A search of the backlog per item taken (65,536
 * entries here, some 300 us) would need several seconds for the rounds; they
 * need milliseconds, and get a budget of 30 s (sanitizers, a loaded machine;
 * the search took 26 s for a quarter of them). */
#define MANY 65536
#define ROUNDS 20000

static void many_partitions_in_flight(void **state)
{
    (void)state;
    struct fixture f;
    setup_limit(&f, MANY + 2, 50, 3, 1);
    kb_kit_backlog *b = f.b;
    kb_kit_item *items[64];
    for (uint32_t p = 1; p <= MANY; p++)
        kb_assert_ok(kb_kit_backlog_add(b, NULL, "orders", p, NULL, 0, NULL));
    size_t taken = 0;
    for (size_t n; (n = kb_kit_backlog_take(b, items, 64, kb_now_ns())) > 0;)
        taken += n;
    assert_int_equal(taken, MANY);
    kb_assert_ok(kb_kit_backlog_add(b, NULL, "orders", MANY / 2, NULL, 0, NULL));
    assert_int_equal(kb_kit_backlog_take(b, items, 64, kb_now_ns()), 0);   /* busy */
    const int64_t budget = kb_deadline_ns(30000);
    int i = 0;
    for (; i < ROUNDS && kb_now_ns() < budget; i++) {   /* partition 0: none in flight */
        kb_assert_ok(kb_kit_backlog_add(b, NULL, "orders", 0, NULL, 0, NULL));
        assert_int_equal(kb_kit_backlog_take(b, items, 64, kb_now_ns()), 1);
        assert_int_equal(items[0]->partition, 0);
        kb_kit_backlog_done(b, items[0], KB_OK, 0, "1", NULL);
    }
    assert_int_equal(i, ROUNDS);
    assert_int_equal(kb_kit_backlog_length(b), MANY + 1);
    kb_kit_backlog_fail_all(b, KB_ETIMEDOUT, "given up by close");
    teardown(&f);
}

/* done(KB_OK) with no ID: each event of a frame reported with an empty ID,
 * event_id not called (it would be handed NULL). */
static void frame_done_without_an_id(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 8, 50, 3);
    kb_kit_item *items[4];
    kb_assert_ok(add_frame(f.b, 0, 3, 0, NULL));
    assert_int_equal(kb_kit_backlog_take(f.b, items, 4, kb_now_ns()), 1);
    kb_kit_backlog_done(f.b, items[0], KB_OK, 0, NULL, NULL);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(f.rep->ok[i], 1);
        assert_string_equal(f.rep->id[i], "");
    }
    teardown(&f);
}

/* kb_kit_backlog_done from threads other than the sender's (a broker
 * client's acknowledgement threads), several at once, with the partition
 * limit: the sender sleeps until next_due (INT64_MAX when only a done can
 * help, no polling), so it goes on only because each done wakes it. Every
 * event reported once; frames and lone events mixed. */
#define ACKERS 2
#define ACK_RING 64

struct acks {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kb_kit_item *ring[ACK_RING];
    size_t head, len;
    int stop;
    kb_kit_backlog *b;
    _Atomic int sends;
};

/* The item the sender handed to the ackers' ring first, taken out; NULL
 * when it holds none. */
static kb_kit_item *ring_pop(struct acks *a)
{
    kb_kit_item *it = NULL;
    pthread_mutex_lock(&a->mu);
    if (a->len > 0) {
        it = a->ring[a->head];
        a->head = (a->head + 1) % ACK_RING;
        a->len--;
    }
    pthread_mutex_unlock(&a->mu);
    return it;
}

static size_t ring_len(struct acks *a)
{
    pthread_mutex_lock(&a->mu);
    size_t n = a->len;
    pthread_mutex_unlock(&a->mu);
    return n;
}

static void *acker(void *arg)
{
    struct acks *a = arg;
    uint64_t x = (uint64_t)(uintptr_t)&x | 1;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        while (a->len == 0 && !a->stop)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->len == 0) {
            pthread_mutex_unlock(&a->mu);
            return NULL;
        }
        pthread_mutex_unlock(&a->mu);
        kb_kit_item *it = ring_pop(a);   /* NULL: the other acker took it */
        if (it == NULL)
            continue;
        int refuse = next_rand(&x) % 4 == 0;   /* resent, up to max_attempts */
        kb_kit_backlog_done(a->b, it, refuse ? KB_ETRANSPORT : KB_OK, refuse, "9",
                            "refused for now");
    }
}

struct acked_sender {
    struct acks *a;
    _Atomic int stop;
    int64_t due;   /* next_due when the sender went to sleep */
};

/* Something is due now, or sooner than the sender last looked (a done or an
 * add moved it): take again, or sleep to the new time. */
static int sender_may_go(void *arg)
{
    struct acked_sender *s = arg;
    int64_t due = kb_kit_backlog_next_due(s->a->b);
    return atomic_load(&s->stop) || due <= kb_now_ns() || due < s->due;
}

static void *acked_send(void *arg)
{
    struct acked_sender *s = arg;
    struct acks *a = s->a;
    kb_kit_item *items[8];
    while (!atomic_load(&s->stop)) {
        size_t room;
        pthread_mutex_lock(&a->mu);
        room = ACK_RING - a->len;
        pthread_mutex_unlock(&a->mu);
        size_t n = kb_kit_backlog_take(a->b, items, room < 8 ? room : 8, kb_now_ns());
        pthread_mutex_lock(&a->mu);
        for (size_t k = 0; k < n; k++) {
            a->ring[(a->head + a->len++) % ACK_RING] = items[k];
            atomic_fetch_add(&a->sends, 1);
        }
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        if (n == 0) {   /* until a backoff ends, else until a done or an add */
            s->due = kb_kit_backlog_next_due(a->b);
            kb_signal_wait(kb_kit_backlog_signal(a->b), sender_may_go, s, s->due);
        }
    }
    return NULL;
}

static void done_from_other_threads(void **state)
{
    (void)state;
    struct fixture f;
    setup_limit(&f, 64, 1000, 1000, 1);   /* no event fails for good */
    struct acks a = {.b = f.b};
    struct acked_sender s = {.a = &a};
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    pthread_t snd, ack[ACKERS];
    assert_int_equal(pthread_create(&snd, NULL, acked_send, &s), 0);
    for (int k = 0; k < ACKERS; k++)
        assert_int_equal(pthread_create(&ack[k], NULL, acker, &a), 0);
    uint64_t last = 0;
    for (int i = 0; i < EVENTS;) {
        uint32_t n = i % 3 == 0 && i + 4 <= EVENTS ? 4 : 1;   /* frames and lone events */
        int rc = add_frame(f.b, i, n, (uint32_t)i % 13, &last);
        if (rc == KB_EFULL)
            continue;
        kb_assert_ok(rc);
        i += (int)n;
    }
    assert_int_equal(last, EVENTS);
    kb_assert_ok(kb_kit_backlog_flush(f.b, last, kb_deadline_ns(30000)));
    atomic_store(&s.stop, 1);
    kb_signal_notify(kb_kit_backlog_signal(f.b));
    pthread_join(snd, NULL);
    pthread_mutex_lock(&a.mu);
    a.stop = 1;
    pthread_cond_broadcast(&a.cv);
    pthread_mutex_unlock(&a.mu);
    for (int k = 0; k < ACKERS; k++)
        pthread_join(ack[k], NULL);
    for (int i = 0; i < EVENTS; i++)
        assert_int_equal(f.rep->ok[i], 1);
    assert_int_equal(f.rep->other, 0);
    assert_true(atomic_load(&a.sends) > EVENTS / 2 * 5 / 4 / 2);   /* some were resent */
    pthread_cond_destroy(&a.cv);
    pthread_mutex_destroy(&a.mu);
    teardown(&f);
}

/* The same, one step at a time: the sender asleep with nothing due by time
 * (INT64_MAX: the next item waits behind one in flight), a done on this
 * thread makes it due and must wake the sender; so must a done that asks
 * for a resend (its backoff is a new due time). */
static void done_on_another_thread_wakes_the_sender(void **state)
{
    (void)state;
    struct fixture f;
    setup_limit(&f, 16, 1000, 3, 1);
    struct acks a = {.b = f.b};
    struct acked_sender s = {.a = &a};
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    pthread_t snd;
    assert_int_equal(pthread_create(&snd, NULL, acked_send, &s), 0);
    kb_assert_ok(add_frame(f.b, 0, 1, 0, NULL));
    kb_assert_ok(add_frame(f.b, 1, 2, 0, NULL));   /* behind 0: same partition */
    kb_wait_until(ring_len(&a) == 1, 10000, "the sender took event 0");
    usleep(50 * 1000);   /* let it fall asleep: the case to test, not a bound */
    assert_int_equal(kb_kit_backlog_next_due(f.b), INT64_MAX);
    kb_kit_item *it = ring_pop(&a);
    assert_int_equal(*(int *)it->data, 0);
    kb_kit_backlog_done(f.b, it, KB_OK, 0, "1", NULL);
    kb_wait_until(ring_len(&a) == 1, 10000, "a done woke the sender for the frame");
    usleep(50 * 1000);
    it = ring_pop(&a);
    assert_int_equal(*(int *)it->data, 1);
    kb_kit_backlog_done(f.b, it, KB_ETRANSPORT, 1, NULL, "refused once");
    kb_wait_until(ring_len(&a) == 1, 10000, "a resend's done woke the sender");
    it = ring_pop(&a);
    assert_int_equal(it->attempts, 2);
    kb_kit_backlog_done(f.b, it, KB_OK, 0, "2", NULL);
    assert_int_equal(f.rep->ok[0] + f.rep->ok[1] + f.rep->ok[2], 3);
    atomic_store(&s.stop, 1);
    kb_signal_notify(kb_kit_backlog_signal(f.b));
    pthread_join(snd, NULL);
    pthread_cond_destroy(&a.cv);
    pthread_mutex_destroy(&a.mu);
    teardown(&f);
}

/* A caller built before one_in_flight_per_partition and event_id passes the
 * sizeof of the first release's conf (frozen in kit_int.h: on a 32-bit ABI
 * that aligns int64_t to 8 it has tail padding, so it is not the offset of
 * the first later field): accepted, nothing past it read (the conf is
 * allocated to its own end: AddressSanitizer sees a read past it), the
 * later fields off; a size the kit never had is refused. */
static void conf_of_an_older_kit(void **state)
{
    (void)state;
    struct reports *rep = calloc(1, sizeof *rep);
    assert_non_null(rep);
    kb_bus *bus = open_bus(rep);
    struct kb__kit_backlog_conf_v1 *c = malloc(sizeof *c);
    assert_non_null(c);
    *c = (struct kb__kit_backlog_conf_v1){.size = sizeof *c, .bus = bus, .capacity = 8,
                                          .timeout_ms = 50, .max_attempts = 1,
                                          .free_data = free};
    kb_kit_backlog *b = kb_kit_backlog_new((const kb_kit_backlog_conf *)c);
    assert_non_null(b);
    kb_assert_ok(add_event(b, 0, NULL));
    kb_assert_ok(add_event(b, 8, NULL));   /* partition 0 too: no limit, both go */
    kb_kit_item *items[4];
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 2);
    for (int k = 0; k < 2; k++)
        kb_kit_backlog_done(b, items[k], KB_OK, 0, "5", NULL);
    assert_int_equal(rep->ok[0] + rep->ok[8], 2);
    kb_kit_backlog_free(b);
    struct kb__kit_backlog_conf_v2 *c2 = malloc(sizeof *c2);
    assert_non_null(c2);
    *c2 = (struct kb__kit_backlog_conf_v2){.size = sizeof *c2, .bus = bus, .capacity = 1,
                                           .timeout_ms = 50, .max_attempts = 1,
                                           .free_data = free};
    b = kb_kit_backlog_new((const kb_kit_backlog_conf *)c2);
    assert_non_null(b);
    kb_assert_ok(add_event(b, 1, NULL));   /* no byte bound read past its size */
    assert_int_equal(add_event(b, 2, NULL), KB_EFULL);   /* its capacity of 1 */
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 1);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "6", NULL);
    assert_int_equal(rep->ok[1], 1);
    kb_kit_backlog_free(b);
    free(c2);
    kb_kit_backlog_conf full = {.size = sizeof full + 8, .bus = bus, .capacity = 8,
                                .timeout_ms = 50, .max_attempts = 1};
    assert_null(kb_kit_backlog_new(&full));
    free(c);
    kb_close(bus, 1000);
    free(rep);
}

/* kb_kit_backlog_done_each: a frame whose events went apart (sent again one
 * message each, one refused) gets each event's own report, event_id not
 * called; the item is done for good: flush by its ticket returns, nothing
 * is left to take. */
static void frame_done_event_by_event(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 8, 50, 3);
    uint64_t t;
    kb_assert_ok(add_frame(f.b, 0, 3, 0, &t));   /* events 0..2 */
    kb_kit_item *items[4];
    assert_int_equal(kb_kit_backlog_take(f.b, items, 4, kb_now_ns()), 1);
    kb_kit_backlog *b = f.b;
    struct reports *rep = f.rep;
    const kb_kit_result results[3] = {
        {KB_OK, "9-1", NULL}, {KB_ETOOBIG, NULL, "over the server's limit"}, {KB_OK, NULL, NULL}};
    kb_kit_backlog_done_each(b, items[0], results);
    assert_int_equal(rep->ok[0], 1);
    assert_string_equal(rep->id[0], "9-1");   /* its own ID, not "<id>.1" */
    assert_int_equal(rep->failed[1], 1);
    assert_int_equal(rep->ok[1], 0);
    assert_int_equal(rep->ok[2], 1);
    assert_string_equal(rep->id[2], "");   /* no ID: an empty one */
    kb_assert_ok(kb_kit_backlog_flush(b, t, kb_deadline_ns(1000)));
    assert_int_equal(kb_kit_backlog_length(b), 0);
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns() + 3600 * 1000000000LL), 0);
    kb_kit_backlog_fail_all(b, KB_ETIMEDOUT, "given up by close");
    for (int i = 0; i < 3; i++)
        assert_int_equal(rep->ok[i] + rep->failed[i], 1);   /* one report each */
    teardown(&f);
}

/* kb_kit_backlog_stored: a pipeline's items confirmed at once, each
 * reported stored with its own ID (a frame's events named by event_id, no
 * ID an empty one), the backlog empty after, flush by the last ticket done;
 * none at all changes nothing. */
static void pipeline_stored_at_once(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 8, 50, 3);
    uint64_t t;
    kb_assert_ok(add_event(f.b, 0, NULL));
    kb_assert_ok(add_frame(f.b, 1, 2, 1, NULL));   /* events 1, 2 */
    kb_assert_ok(add_event(f.b, 3, &t));
    kb_kit_item *items[4];
    assert_int_equal(kb_kit_backlog_take(f.b, items, 4, kb_now_ns()), 3);
    kb_kit_backlog_stored(f.b, items, NULL, 0);
    assert_int_equal(kb_kit_backlog_length(f.b), 4);
    const char *ids[3] = {"5-0", "5-1", NULL};
    kb_kit_backlog_stored(f.b, items, ids, 3);
    kb_assert_ok(kb_kit_backlog_flush(f.b, t, kb_deadline_ns(1000)));
    assert_int_equal(kb_kit_backlog_length(f.b), 0);
    const char *want[4] = {"5-0", "5-1.1", "5-1.2", ""};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(f.rep->ok[i], 1);
        assert_string_equal(f.rep->id[i], want[i]);
    }
    kb_kit_backlog_fail_all(f.b, KB_ETIMEDOUT, "given up by close");
    for (int i = 0; i < 4; i++)
        assert_int_equal(f.rep->failed[i], 0);
    teardown(&f);
}

/* An item of the byte bound's tests: its first event's number and the
 * bytes it stands for. */
struct sized {
    int i;
    size_t bytes;
};

static size_t sized_bytes(const void *data)
{
    return ((const struct sized *)data)->bytes;
}

/* Events i .. i + events - 1 standing for `bytes`: one through
 * kb_kit_backlog_add, more as a frame. */
static int add_sized(kb_kit_backlog *b, int i, uint32_t events, size_t bytes)
{
    struct sized *d = malloc(sizeof *d);
    assert_non_null(d);
    *d = (struct sized){i, bytes};
    if (events > 1)
        return add_frame_data(b, d, i, events, (uint32_t)i % 8, NULL);
    int rc = kb_kit_backlog_add(b, d, "orders", (uint32_t)i % 8, &d->i, sizeof d->i, NULL);
    if (rc != KB_OK)
        free(d);
    return rc;
}

/* capacity_bytes: add waits while the bytes held and its own would pass the
 * bound (the event count far from its own), KB_EFULL after timeout_ms; a
 * done makes room; an item over the bound alone goes once nothing is held.
 * Without data_bytes the conf is refused. */
static void bytes_bound(void **state)
{
    (void)state;
    struct reports *rep = calloc(1, sizeof *rep);
    assert_non_null(rep);
    kb_bus *bus = open_bus(rep);
    kb_kit_backlog_conf c = {.size = sizeof c, .bus = bus, .capacity = 1000, .timeout_ms = 100,
                             .max_attempts = 1, .free_data = free, .capacity_bytes = 100};
    assert_null(kb_kit_backlog_new(&c));   /* no data_bytes */
    c.data_bytes = sized_bytes;
    kb_kit_backlog *b = kb_kit_backlog_new(&c);
    assert_non_null(b);
    kb_assert_ok(add_sized(b, 0, 1, 40));
    kb_assert_ok(add_sized(b, 1, 1, 40));
    int64_t t0 = kb_now_ns();
    assert_int_equal(add_sized(b, 2, 1, 40), KB_EFULL);   /* 120 bytes: over */
    assert_true(kb_now_ns() - t0 >= 90 * 1000000LL);   /* it waited (wide slack above) */
    assert_int_equal(kb_kit_backlog_length(b), 2);
    kb_kit_item *items[4];
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 2);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "1-0", NULL);
    kb_assert_ok(add_sized(b, 2, 1, 40));   /* 80 again */
    /* over the bound alone: waits for empty */
    assert_int_equal(add_sized(b, 3, 1, 500), KB_EFULL);
    kb_kit_backlog_done(b, items[1], KB_OK, 0, "1-1", NULL);
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 1);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "1-2", NULL);
    kb_assert_ok(add_sized(b, 3, 1, 500));   /* nothing held: it goes */
    assert_int_equal(add_sized(b, 4, 1, 1), KB_EFULL);   /* and holds the bound until done */
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 1);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "1-3", NULL);
    kb_assert_ok(add_sized(b, 4, 1, 1));
    kb_kit_backlog_fail_all(b, KB_ETIMEDOUT, "given up by close");
    for (int i = 0; i < 4; i++)
        assert_int_equal(rep->ok[i], 1);
    assert_int_equal(rep->failed[4], 1);
    assert_int_equal(rep->ok[4] + rep->failed[0] + rep->failed[1] + rep->failed[2] +
                         rep->failed[3], 0);
    kb_kit_backlog_free(b);
    kb_close(bus, 1000);
    free(rep);
}

/* An add of test byte_bound_wait_ends_at_a_done, on a thread of its own. */
struct waiting_add {
    kb_kit_backlog *b;
    int i;
    uint32_t events;
    size_t bytes;
    pthread_t t;
    _Atomic int returned;
    int rc;
    int64_t took;   /* ns */
};

static void *add_and_note(void *arg)
{
    struct waiting_add *a = arg;
    int64_t t0 = kb_now_ns();
    a->rc = add_sized(a->b, a->i, a->events, a->bytes);
    a->took = kb_now_ns() - t0;
    atomic_store(&a->returned, 1);
    return NULL;
}

/* Starts the add and checks it waits (the bytes held and its own pass the
 * bound). */
static void start_waiting_add(struct waiting_add *a, kb_kit_backlog *b, int i, uint32_t events,
                              size_t bytes)
{
    *a = (struct waiting_add){.b = b, .i = i, .events = events, .bytes = bytes};
    assert_int_equal(pthread_create(&a->t, NULL, add_and_note, a), 0);
    usleep(100 * 1000);   /* let it fall asleep on the bound: the case to test, not a bound */
    assert_int_equal(atomic_load(&a->returned), 0);
}

/* The add went once room was made: not at the end of its 20 s wait. */
static void waiting_add_went(struct waiting_add *a)
{
    pthread_join(a->t, NULL);
    assert_int_equal(a->rc, KB_OK);
    assert_true(a->took < 10 * 1000000000LL);
}

/* A publisher waiting on capacity_bytes (the event count far from its
 * own) is woken by the bytes a done on another thread frees, and its add
 * goes at once rather than at its timeout: a plain event freed by
 * kb_kit_backlog_done, a frame by kb_kit_backlog_stored, a plain event
 * behind that frame by kb_kit_backlog_done_each. */
static void byte_bound_wait_ends_at_a_done(void **state)
{
    (void)state;
    struct reports *rep = calloc(1, sizeof *rep);
    assert_non_null(rep);
    kb_bus *bus = open_bus(rep);
    kb_kit_backlog_conf c = {.size = sizeof c, .bus = bus, .capacity = 1000,
                             .timeout_ms = 20000, .max_attempts = 1, .free_data = free,
                             .capacity_bytes = 100, .data_bytes = sized_bytes};
    kb_kit_backlog *b = kb_kit_backlog_new(&c);
    assert_non_null(b);
    kb_kit_item *items[4], *first[2];
    kb_assert_ok(add_sized(b, 0, 1, 60));
    kb_assert_ok(add_sized(b, 1, 1, 30));
    assert_int_equal(kb_kit_backlog_take(b, first, 2, kb_now_ns()), 2);
    struct waiting_add a;
    start_waiting_add(&a, b, 2, 1, 40);   /* 130 bytes */
    kb_kit_backlog_done(b, first[0], KB_OK, 0, "1-0", NULL);   /* 30 held */
    waiting_add_went(&a);
    start_waiting_add(&a, b, 3, 3, 50);   /* events 3..5: 120 bytes */
    assert_int_equal(kb_kit_backlog_length(b), 2);
    kb_kit_backlog_stored(b, &first[1], (const char *const[]){"1-1"}, 1);   /* 40 held */
    waiting_add_went(&a);
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 2);   /* 2, the frame */
    assert_int_equal(((struct sized *)items[1]->data)->i, 3);
    start_waiting_add(&a, b, 6, 1, 30);   /* 120 bytes */
    const kb_kit_result results[3] = {{KB_OK, "1-3", NULL}, {KB_OK, "1-4", NULL},
                                      {KB_OK, "1-5", NULL}};
    kb_kit_backlog_done_each(b, items[1], results);   /* 40 held */
    waiting_add_went(&a);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "1-2", NULL);
    assert_int_equal(kb_kit_backlog_take(b, items, 4, kb_now_ns()), 1);
    kb_kit_backlog_done(b, items[0], KB_OK, 0, "1-6", NULL);
    assert_int_equal(kb_kit_backlog_length(b), 0);
    for (int i = 0; i < 7; i++)
        assert_int_equal(rep->ok[i], 1);
    assert_int_equal(rep->other, 0);
    kb_kit_backlog_fail_all(b, KB_ETIMEDOUT, "given up by close");
    kb_kit_backlog_free(b);
    kb_close(bus, 1000);
    free(rep);
}

/* Test reused_entries_report_their_own_keys: the keys reported, in order. */
#define KEYED_ITEMS 2000
#define KEY_MAX 200
struct key_log {
    size_t n;
    size_t len[KEYED_ITEMS * 5];
    unsigned char key[KEYED_ITEMS * 5][KEY_MAX];
    int bad;   /* a report with a key over KEY_MAX */
};

static void on_keyed_report(const kb_delivery_report *r, void *opaque)
{
    struct key_log *log = opaque;
    if (r->key_len > KEY_MAX || log->n == KEYED_ITEMS * 5) {
        log->bad++;
        return;
    }
    log->len[log->n] = r->key_len;
    if (r->key_len > 0)
        memcpy(log->key[log->n], r->key, r->key_len);
    log->n++;
}

/* Event e's key: its length cycles round the sizes a kept entry holds and
 * does not (0 and a spare's edges), its bytes come from e. */
static size_t keyed_len(size_t e)
{
    static const size_t sizes[] = {0, 1, 16, 47, 48, 49, 64, KEY_MAX};
    return sizes[e % (sizeof sizes / sizeof *sizes)];
}

static void keyed_bytes(size_t e, unsigned char *out)
{
    for (size_t k = 0; k < keyed_len(e); k++)
        out[k] = (unsigned char)(e * 31 + k);
}

/* Add item i: a frame of 1 to 5 events (events *e on), keys of every size. */
static void add_keyed(kb_kit_backlog *b, int i, size_t *e)
{
    unsigned char keys[5][KEY_MAX];
    kb_kit_key k[5];
    uint32_t n = 1 + (uint32_t)i % 5;
    for (uint32_t j = 0; j < n; j++) {
        keyed_bytes(*e + j, keys[j]);
        k[j] = (kb_kit_key){keyed_len(*e + j) > 0 ? keys[j] : NULL, keyed_len(*e + j)};
    }
    if (n == 1)
        kb_assert_ok(kb_kit_backlog_add(b, NULL, "orders", 0, k[0].key, k[0].key_len,
                                        NULL));
    else
        kb_assert_ok(kb_kit_backlog_add_frame(b, NULL, "orders", 0, k, n, NULL));
    *e += n;
}

/* An entry done with is kept for the next add when its keys fit, else
 * freed: each report still has its own event's key, of any length, after
 * thousands of reuses, and after more items in flight at once than are
 * kept (ASan builds see every entry freed at the end). */
static void reused_entries_report_their_own_keys(void **state)
{
    (void)state;
    struct key_log *log = calloc(1, sizeof *log);
    assert_non_null(log);
    kb_conf *conf = kb_test_conf("mem://", NULL, NULL);
    kb_conf_set_delivery_cb(conf, on_keyed_report, log);
    kb_bus *bus = kb_test_open_conf(conf);
    kb_kit_backlog_conf c = {.size = sizeof c, .bus = bus, .capacity = 600, .timeout_ms = 50,
                             .max_attempts = 1};
    kb_kit_backlog *b = kb_kit_backlog_new(&c);
    assert_non_null(b);
    size_t events = 0;
    kb_kit_item *items[600];
    for (int i = 0; i < KEYED_ITEMS / 2; i++) {   /* one at a time */
        add_keyed(b, i, &events);
        assert_int_equal(kb_kit_backlog_take(b, items, 1, kb_now_ns()), 1);
        kb_kit_backlog_done(b, items[0], KB_OK, 0, "1-0", NULL);
    }
    for (int round = 0; round < 2; round++) {   /* hundreds at once, twice */
        int held = 0;
        for (int i = 0; i < KEYED_ITEMS / 4; i++)
            if (kb_kit_backlog_length(b) + 5 <= 600) {
                add_keyed(b, i, &events);
                held++;
            }
        assert_int_equal(kb_kit_backlog_take(b, items, 600, kb_now_ns()), held);
        for (int i = 0; i < held; i++)
            kb_kit_backlog_done(b, items[i], KB_OK, 0, "1-0", NULL);
    }
    assert_int_equal(log->bad, 0);
    assert_int_equal(log->n, events);
    for (size_t e = 0; e < events; e++) {
        unsigned char want[KEY_MAX];
        keyed_bytes(e, want);
        assert_int_equal(log->len[e], keyed_len(e));
        if (keyed_len(e) > 0)
            assert_memory_equal(log->key[e], want, keyed_len(e));
    }
    kb_kit_backlog_fail_all(b, KB_ETIMEDOUT, "given up by close");
    kb_kit_backlog_free(b);
    kb_close(bus, 1000);
    free(log);
}

/* Test waits_end_as_dones_come: producers of frames, flushes, and how long
 * the longest of each waited. */
#define WAIT_PRODUCERS 3
#define WAIT_FRAMES 300
struct waits {
    struct world *w;
    _Atomic int producing;
    _Atomic int64_t add_max, flush_max;   /* ns */
    _Atomic int flushes, flush_errors;
};

static void note_max(_Atomic int64_t *max, int64_t v)
{
    int64_t m = atomic_load(max);
    while (v > m && !atomic_compare_exchange_weak(max, &m, v))
        ;
}

struct wait_producer {
    struct waits *ws;
    int k;
};

/* Frames of 1 to 3 events (events k * 900 on) into a backlog of 4: most
 * adds wait for room, several publishers at once. */
static void *produce_frames(void *arg)
{
    struct wait_producer *p = arg;
    for (int j = 0; j < WAIT_FRAMES; j++) {
        int64_t t0 = kb_now_ns();
        if (add_frame(p->ws->w->b, p->k * 900 + j * 3, 1 + (uint32_t)j % 3, (uint32_t)j % 8,
                      NULL) != KB_OK)
            abort();
        note_max(&p->ws->add_max, kb_now_ns() - t0);
    }
    atomic_fetch_sub(&p->ws->producing, 1);
    return NULL;
}

static void *flush_often(void *arg)
{
    struct waits *ws = arg;
    while (atomic_load(&ws->producing) > 0) {
        uint64_t t = kb_kit_backlog_last_ticket(ws->w->b);
        int64_t t0 = kb_now_ns();
        if (t > 0 && kb_kit_backlog_flush(ws->w->b, t, kb_deadline_ns(20000)) != KB_OK)
            atomic_fetch_add(&ws->flush_errors, 1);
        note_max(&ws->flush_max, kb_now_ns() - t0);
        atomic_fetch_add(&ws->flushes, 1);
    }
    return NULL;
}

/* Publishers waiting for room and flushes waiting for reports, several of
 * each at once, are let go by the dones as they come (a done wakes them once
 * per wait, and each registers again): none sleeps out its 20 s wait though
 * room or its reports came (the longest wait stays far below it), every
 * event is reported exactly once. */
static void waits_end_as_dones_come(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 4, 20000, 4);
    struct world w = {.b = f.b};
    struct waits ws = {.w = &w, .producing = WAIT_PRODUCERS};
    pthread_t s, fl[2], p[WAIT_PRODUCERS];
    struct wait_producer args[WAIT_PRODUCERS];
    assert_int_equal(pthread_create(&s, NULL, sender, &w), 0);
    for (int k = 0; k < 2; k++)
        assert_int_equal(pthread_create(&fl[k], NULL, flush_often, &ws), 0);
    for (int k = 0; k < WAIT_PRODUCERS; k++) {
        args[k] = (struct wait_producer){&ws, k};
        assert_int_equal(pthread_create(&p[k], NULL, produce_frames, &args[k]), 0);
    }
    for (int k = 0; k < WAIT_PRODUCERS; k++)
        pthread_join(p[k], NULL);
    for (int k = 0; k < 2; k++)
        pthread_join(fl[k], NULL);
    kb_assert_ok(kb_kit_backlog_flush(f.b, kb_kit_backlog_last_ticket(f.b),
                                      kb_deadline_ns(20000)));
    atomic_store(&w.stop, 1);
    kb_signal_notify(kb_kit_backlog_signal(f.b));
    pthread_join(s, NULL);
    assert_true(atomic_load(&ws.flushes) > 0);
    assert_int_equal(atomic_load(&ws.flush_errors), 0);
    assert_true(atomic_load(&ws.add_max) < 10 * 1000000000LL);
    assert_true(atomic_load(&ws.flush_max) < 10 * 1000000000LL);
    int events = 0;
    for (int k = 0; k < WAIT_PRODUCERS; k++)
        for (int j = 0; j < WAIT_FRAMES; j++)
            for (int e = 0; e < 1 + j % 3; e++, events++)
                assert_int_equal(f.rep->ok[k * 900 + j * 3 + e] +
                                     f.rep->failed[k * 900 + j * 3 + e], 1);
    int reported = 0;
    for (int i = 0; i < EVENTS; i++)
        reported += f.rep->ok[i] + f.rep->failed[i];
    assert_int_equal(reported, events);
    assert_int_equal(f.rep->other, 0);
    kb_kit_backlog_fail_all(f.b, KB_ETIMEDOUT, "given up by close");
    teardown(&f);
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
        cmocka_unit_test(partition_limit_stores_in_order),
        cmocka_unit_test(frame_is_one_item_with_a_report_per_event),
        cmocka_unit_test(one_item_of_a_partition_in_flight),
        cmocka_unit_test(no_callback_counts_only_failures),
        cmocka_unit_test(many_partitions_in_flight),
        cmocka_unit_test(frame_done_without_an_id),
        cmocka_unit_test(done_from_other_threads),
        cmocka_unit_test(done_on_another_thread_wakes_the_sender),
        cmocka_unit_test(conf_of_an_older_kit),
        cmocka_unit_test(bytes_bound),
        cmocka_unit_test(byte_bound_wait_ends_at_a_done),
        cmocka_unit_test(frame_done_event_by_event),
        cmocka_unit_test(pipeline_stored_at_once),
        cmocka_unit_test(reused_entries_report_their_own_keys),
        cmocka_unit_test(waits_end_as_dones_come),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
