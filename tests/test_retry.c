/* Ordered retry: a retried item is handled again before anything behind it in
 * its lane, with growing, jittered delays that stall only that lane. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <keybus/pool.h>

#include "core/pool/pool_int.h"   /* KB_POOL_SKIP, skip_ok: a bus pool's own result */

#include "support/check.h"
#include "support/gate.h"

#define MAX_CALLS 64

struct call {
    char key;
    int seq;
    uint32_t attempt;
    double at_ms;
};

struct script {
    struct call calls[MAX_CALLS];
    _Atomic int n;
    int fail_seq;            /* item that fails ... */
    uint32_t fail_times;     /* ... this many times (then succeeds) */
    int result_on_fail;      /* KB_RETRY, KB_DEAD or any other value */
    struct {
        int seq, outcome;
        uint32_t attempts;
    } finished[MAX_CALLS];
    _Atomic int n_finished;
};

struct item {
    char key;
    int seq;
};

static int script_handle(void *it, uint32_t attempt, void *opaque)
{
    struct script *s = opaque;
    struct item *item = it;
    int i = s->n++;
    if (i < MAX_CALLS)
        s->calls[i] = (struct call){item->key, item->seq, attempt, kb_test_now_ms()};
    if (item->seq == s->fail_seq && attempt <= s->fail_times)
        return s->result_on_fail;
    return KB_HANDLED;
}

static void script_finish(void *it, int outcome, uint32_t attempts, void *opaque)
{
    struct script *s = opaque;
    struct item *item = it;
    int i = s->n_finished++;
    if (i < MAX_CALLS) {
        s->finished[i].seq = item->seq;
        s->finished[i].outcome = outcome;
        s->finished[i].attempts = attempts;
    }
}

static kb_pool *script_pool(struct script *s, uint32_t max_attempts, uint32_t backoff_ms,
                            uint32_t max_backoff_ms)
{
    kb_pool_options o;
    kb_pool_options_init(&o);
    o.threads = 1;             /* every lane on one executor: stalls would show */
    o.max_attempts = max_attempts;
    o.backoff_ms = backoff_ms;
    o.max_backoff_ms = max_backoff_ms;
    o.handle = script_handle;
    o.finish = script_finish;
    o.opaque = s;
    char err[128];
    kb_pool *p = kb_pool_new(&o, err, sizeof err);
    assert_non_null(p);
    return p;
}

static void submit_all(kb_pool *p, struct item *items, int n)
{
    for (int i = 0; i < n; i++)
        kb_assert_ok(kb_pool_submit(p, &items[i].key, 1, &items[i], -1));
}

static void retried_item_runs_before_later_items(void **state)
{
    (void)state;
    struct script s = {.fail_seq = 2, .fail_times = 2, .result_on_fail = KB_RETRY};
    kb_pool *p = script_pool(&s, 5, 5, 100);
    struct item items[] = {{'A', 1}, {'A', 2}, {'A', 3}, {'A', 4}};
    submit_all(p, items, 4);
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(s.n, 6);
    const int seqs[] = {1, 2, 2, 2, 3, 4};
    const uint32_t attempts[] = {1, 1, 2, 3, 1, 1};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(s.calls[i].seq, seqs[i]);
        assert_int_equal(s.calls[i].attempt, attempts[i]);
    }
    /* Equal jitter: the n-th delay lies in [d/2, d] with d = 5 ms * 2^(n-1). */
    double gap1 = s.calls[2].at_ms - s.calls[1].at_ms;
    double gap2 = s.calls[3].at_ms - s.calls[2].at_ms;
    assert_true(gap1 >= 2.4);
    assert_true(gap2 >= 4.9);
    assert_int_equal(s.finished[1].seq, 2);
    assert_int_equal(s.finished[1].outcome, KB_HANDLED);
    assert_int_equal(s.finished[1].attempts, 3);

    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.retried, 2);
    assert_int_equal(st.handled, 4);
    assert_int_equal(st.dead, 0);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

/* While key A waits 300 ms for its retry, key B on the same executor runs. */
static void delayed_lane_does_not_stall_others(void **state)
{
    (void)state;
    struct script s = {.fail_seq = 1, .fail_times = 1, .result_on_fail = KB_RETRY};
    kb_pool *p = script_pool(&s, 5, 600, 600);   /* first delay 300..600 ms */
    struct item a = {'A', 1};
    struct item bs[] = {{'B', 10}, {'B', 11}, {'B', 12}};
    submit_all(p, &a, 1);
    while (s.n < 1)
        ;
    double t0 = kb_test_now_ms();
    submit_all(p, bs, 3);
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(s.n, 5);
    /* B's three events ran right away, before A's retry. */
    for (int i = 1; i <= 3; i++) {
        assert_int_equal(s.calls[i].key, 'B');
        assert_true(s.calls[i].at_ms - t0 < 250.0);
    }
    assert_int_equal(s.calls[4].key, 'A');
    assert_int_equal(s.calls[4].attempt, 2);
    assert_true(s.calls[4].at_ms - s.calls[0].at_ms >= 295.0);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

static void exhausted_retries_end_dead(void **state)
{
    (void)state;
    struct script s = {.fail_seq = 1, .fail_times = 100, .result_on_fail = 42};   /* not a result: retry */
    kb_pool *p = script_pool(&s, 3, 0, 0);
    struct item items[] = {{'A', 1}, {'A', 2}};
    submit_all(p, items, 2);
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(s.n, 4);   /* three attempts of 1, then 2 */
    assert_int_equal(s.calls[2].attempt, 3);
    assert_int_equal(s.calls[3].seq, 2);
    assert_int_equal(s.finished[0].seq, 1);
    assert_int_equal(s.finished[0].outcome, KB_DEAD);
    assert_int_equal(s.finished[0].attempts, 3);
    assert_int_equal(s.finished[1].outcome, KB_HANDLED);
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.dead, 1);
    assert_int_equal(st.retried, 2);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

static void kb_dead_is_immediate(void **state)
{
    (void)state;
    struct script s = {.fail_seq = 1, .fail_times = 100, .result_on_fail = KB_DEAD};
    kb_pool *p = script_pool(&s, 5, 1000, 1000);
    struct item items[] = {{'A', 1}, {'A', 2}};
    submit_all(p, items, 2);
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(s.n, 2);
    assert_int_equal(s.finished[0].outcome, KB_DEAD);
    assert_int_equal(s.finished[0].attempts, 1);
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.retried, 0);
    assert_int_equal(st.dead, 1);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

/* KB_POOL_SKIP gives the item back unhandled (a lost broker lease) on a
 * bus's pool; on a standalone pool the same value is just another retry. */
static void skip_releases_without_counting(void **state)
{
    (void)state;
    struct script r = {.fail_seq = 1, .fail_times = 1, .result_on_fail = KB_POOL_SKIP};
    kb_pool *alone = script_pool(&r, 5, 1, 1);
    struct item one[] = {{'A', 1}};
    submit_all(alone, one, 1);
    kb_assert_ok(kb_pool_flush(alone, 10000));
    assert_int_equal(r.n, 2);                              /* retried, then handled */
    assert_int_equal(r.finished[0].outcome, KB_HANDLED);
    assert_int_equal(r.finished[0].attempts, 2);
    kb_assert_ok(kb_pool_destroy(alone, 1000));

    struct script s = {.fail_seq = 1, .fail_times = 100, .result_on_fail = KB_POOL_SKIP};
    kb_pool *p = script_pool(&s, 5, 1000, 1000);
    p->skip_ok = true;   /* as kb_subscribe sets it */
    struct item items[] = {{'A', 1}, {'A', 2}};
    submit_all(p, items, 2);
    kb_assert_ok(kb_pool_flush(p, 10000));
    assert_int_equal(s.n, 2);
    assert_int_equal(s.finished[0].outcome, KB_ECLOSED);
    assert_int_equal(s.finished[1].outcome, KB_HANDLED);
    kb_pool_stats st;
    kb_pool_stats_get(p, &st);
    assert_int_equal(st.handled, 1);
    assert_int_equal(st.dead, 0);
    assert_int_equal(st.retried, 0);
    kb_assert_ok(kb_pool_destroy(p, 1000));
}

/* Through the bus: retry.max_attempts counts deliveries; the handler sees them. */
struct bus_script {
    _Atomic int calls;
    uint32_t last_attempt;
};

static int always_retry(const kb_event *ev, void *opaque)
{
    struct bus_script *s = opaque;
    s->calls++;
    s->last_attempt = ev->attempt;
    return KB_RETRY;
}

static int count_dead(const kb_dead_letter *dl, void *opaque)
{
    (void)dl;
    (*(int *)opaque)++;
    return 0;
}

static void bus_dead_letters_after_max_attempts(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "retry.max_attempts", "4", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "retry.backoff_ms", "1", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    struct bus_script s = {0};
    int dead = 0;
    kb_assert_ok(kb_subscribe(b, "jobs", always_retry, &s));
    kb_assert_ok(kb_publish(b, "jobs", "job-1", 5, "x", 1));
    kb_assert_ok(kb_flush(b, 10000));
    assert_int_equal(s.calls, 4);
    assert_int_equal(s.last_attempt, 4);
    kb_assert_ok(kb_dead_letters(b, "jobs", NULL, 10, count_dead, &dead));
    assert_int_equal(dead, 1);
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, "jobs", &st));
    assert_int_equal(st.retried, 3);
    assert_int_equal(st.dead_lettered, 1);
    assert_int_equal(st.dead_letters_lost, 0);
    kb_assert_ok(kb_close(b, 1000));
}

struct logged {
    _Atomic int warnings;
    char last[512];
};

static void capture_log(int level, const char *msg, void *opaque)
{
    struct logged *l = opaque;
    if (level <= 4) {
        snprintf(l->last, sizeof l->last, "%s", msg);
        l->warnings++;
    }
}

static int dead_at_once(const kb_event *ev, void *opaque)
{
    (void)ev, (void)opaque;
    return KB_DEAD;
}

/* mem:// with no room for dead letters: counted and logged, never silent. */
static void unstored_dead_letter_is_counted_and_logged(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    struct logged l = {0};
    kb_conf_set_log(c, capture_log, &l);
    char err[256];
    kb_assert_ok(kb_conf_set(c, "mem.dlq_capacity", "0", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    kb_assert_ok(kb_subscribe(b, "jobs", dead_at_once, NULL));
    kb_assert_ok(kb_publish(b, "jobs", "job-9", 5, "x", 1));
    kb_assert_ok(kb_flush(b, 10000));
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, "jobs", &st));
    assert_int_equal(st.dead_lettered, 1);
    assert_int_equal(st.dead_letters_lost, 1);
    assert_int_equal(l.warnings, 1);
    assert_non_null(strstr(l.last, "mem.dlq_capacity"));
    assert_non_null(strstr(l.last, "job-9"));
    kb_assert_ok(kb_close(b, 1000));
}

/* A full mem:// store drops its oldest dead letter, counted and logged; where
 * dead letters go never depends on the topic's length. */
static void full_store_drops_the_oldest(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    struct logged l = {0};
    kb_conf_set_log(c, capture_log, &l);
    char err[256], topic[201];
    memset(topic, 't', 200);   /* the longest topic name */
    topic[200] = '\0';
    kb_assert_ok(kb_conf_set(c, "mem.dlq_capacity", "2", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    kb_assert_ok(kb_subscribe(b, topic, dead_at_once, NULL));
    for (char k = '1'; k <= '3'; k++)
        kb_assert_ok(kb_publish(b, topic, &k, 1, "x", 1));
    kb_assert_ok(kb_flush(b, 10000));
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.dead_lettered, 3);
    assert_int_equal(st.dlq_length, 2);
    assert_int_equal(st.dead_letters_lost, 1);
    assert_int_equal(l.warnings, 1);
    assert_non_null(strstr(l.last, "dropped the oldest"));
    int dead = 0;
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 10, count_dead, &dead));
    assert_int_equal(dead, 2);
    assert_int_equal(kb_dead_letters(b, topic, "x1", 10, count_dead, &dead), KB_EINVAL);
    kb_assert_ok(kb_close(b, 1000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(retried_item_runs_before_later_items),
        cmocka_unit_test(delayed_lane_does_not_stall_others),
        cmocka_unit_test(exhausted_retries_end_dead),
        cmocka_unit_test(kb_dead_is_immediate),
        cmocka_unit_test(skip_releases_without_counting),
        cmocka_unit_test(bus_dead_letters_after_max_attempts),
        cmocka_unit_test(unstored_dead_letter_is_counted_and_logged),
        cmocka_unit_test(full_store_drops_the_oldest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
