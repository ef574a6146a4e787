/* keybus-torture's own parts without a broker: the checker against written
 * histories whose findings are known, and the schedule (the same for a seed,
 * and within the model's limits). */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/suite.h"
#include "torture.h"

static char dir[64];
static const int64_t S = 1000000000;   /* one second in ns */

static void put(const char *file, const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* A producer log accepting seq 1..n of keys 0..keys-1 in a window of 0..10 s,
 * kb_drain returning at drained_s (0: not recorded). */
static void accepted_until(uint32_t keys, uint32_t n, const char *more, int drained_s)
{
    char buf[8192];
    size_t at = 0;
    for (uint32_t k = 0; k < keys; k++)
        for (uint32_t s = 1; s <= n; s++)
            at += (size_t)snprintf(buf + at, sizeof buf - at, "P %lld %u %u 0\n",
                                   (long long)s * S / 10, k, s);
    if (drained_s > 0)
        snprintf(buf + at, sizeof buf - at, "%sW 0 %lld 0 -8 %lld\n", more, (long long)10 * S,
                 (long long)drained_s * S);
    else
        snprintf(buf + at, sizeof buf - at, "%sW 0 %lld 0 0\n", more, (long long)10 * S);
    put("producer.log", buf);
}

static void accepted(uint32_t keys, uint32_t n, const char *more)
{
    accepted_until(keys, n, more, 0);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/keybus-torture-test-XXXXXX");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static int check(kb_torture_result *r, int64_t max_pause_ms)
{
    kb_torture_params p = {.broker = "redis", .partitions = 1, .keys = 2,
                           .max_pause_ms = max_pause_ms};
    FILE *devnull = fopen("/dev/null", "w");
    int rc = kb_torture_check(dir, &p, 0, devnull, r);
    fclose(devnull);
    return rc;
}

/* Handled lines: "H <s> 0 name 1 key seq 1" for each (t_s, key, seq). */
static void handled(const char *file, const int (*ev)[3], size_t n)
{
    char buf[4096];
    size_t at = 0;
    for (size_t i = 0; i < n; i++)
        at += (size_t)snprintf(buf + at, sizeof buf - at, "H %lld 0 %s 1 %d %d 1\n",
                               (long long)ev[i][0] * S, file, ev[i][1], ev[i][2]);
    put(file, buf);
}

static void clean_history_passes(void **state)
{
    (void)state;
    accepted(2, 3, "");
    static const int ev[][3] = {{1, 0, 1}, {2, 1, 1}, {3, 0, 2}, {4, 1, 2}, {5, 0, 3}, {6, 1, 3},
                                {7, 0, 3}, {8, 1, 3}, {9, 1, 3}};
    handled("c0-1.log", ev, 9);
    kb_torture_result r;
    assert_int_equal(check(&r, 10000), 0);
    assert_int_equal(r.accepted, 6);
    assert_int_equal(r.distinct, 6);
    assert_int_equal(r.lost + r.order_violations + r.phantom, 0);
    assert_int_equal(r.duplicates, 3);
    assert_int_equal(r.max_pause_ms, 1000);   /* the window's start to the first, and so on */

    /* a consumer that crashed, or a sanitizer's report, fails the same history */
    put("nemesis.log", "N 1 kill9 0 1\nX 2 123 unasked signal 11\n");
    assert_int_equal(check(&r, 10000), 1);
    assert_int_equal(r.crashes, 1);
    put("nemesis.log", "N 1 kill9 0 1\n");
    put("c0-1.err", "==1==ERROR: AddressSanitizer: heap-use-after-free\n");
    assert_int_equal(check(&r, 10000), 1);
    assert_int_equal(r.crashes, 1);
}

/* A process killed after handling 1..3 of key 0 (acked up to 1), the next one
 * handles 2..3 again, then 4: a suffix re-run, duplicates, no violation. A
 * handled 2 after 3 that was never handled before is one. */
static void redelivered_suffix_is_no_violation(void **state)
{
    (void)state;
    accepted(1, 4, "");
    static const int a[][3] = {{1, 0, 1}, {2, 0, 2}, {3, 0, 3}};
    static const int b[][3] = {{4, 0, 2}, {5, 0, 3}, {6, 0, 4}};
    handled("c0-1.log", a, 3);
    handled("c1-1.log", b, 3);
    kb_torture_result r;
    assert_int_equal(check(&r, 10000), 0);
    assert_int_equal(r.duplicates, 2);
    assert_int_equal(r.order_violations, 0);

    static const int c[][3] = {{1, 0, 1}, {2, 0, 3}};
    static const int d[][3] = {{3, 0, 2}, {4, 0, 4}};
    handled("c0-1.log", c, 2);
    handled("c1-1.log", d, 2);
    assert_int_equal(check(&r, 10000), 1);
    assert_int_equal(r.order_violations, 1);
    assert_int_equal(r.duplicates, 0);
}

/* An accepted event never handled is lost, unless its delivery report failed. */
static void unhandled_is_lost_unless_failed(void **state)
{
    (void)state;
    accepted(1, 3, "");
    static const int ev[][3] = {{1, 0, 1}, {2, 0, 2}};
    handled("c0-1.log", ev, 2);
    kb_torture_result r;
    assert_int_equal(check(&r, 10000), 1);
    assert_int_equal(r.lost, 1);
    accepted(1, 3, "D 5 0 -4\n");
    assert_int_equal(check(&r, 10000), 0);
    assert_int_equal(r.lost, 0);
    assert_int_equal(r.unhandled, 1);
}

/* The longest stretch of the window without a handled event, over the bound. */
static void pause_over_the_bound_fails(void **state)
{
    (void)state;
    accepted(1, 4, "");
    static const int ev[][3] = {{1, 0, 1}, {2, 0, 2}, {8, 0, 3}, {9, 0, 4}};
    handled("c0-1.log", ev, 4);
    kb_torture_result r;
    assert_int_equal(check(&r, 7000), 0);
    assert_int_equal(r.max_pause_ms, 6000);
    assert_int_equal(check(&r, 5000), 1);

    /* seq 5 never handled: the partition's last gap lasts until kb_drain gave up */
    accepted_until(1, 5, "", 20);
    assert_int_equal(check(&r, 60000), 1);
    assert_int_equal(r.lost, 1);
    assert_int_equal(r.max_pause_ms, 11000);
}

static void schedule_is_the_seeds(void **state)
{
    (void)state;
    kb_torture_plan a, b, c;
    assert_int_equal(kb_torture_plan_make(&a, 7, 3, 3, 5, 600000, 2000, 6000), 0);
    assert_int_equal(kb_torture_plan_make(&b, 7, 3, 3, 5, 600000, 2000, 6000), 0);
    assert_int_equal(kb_torture_plan_make(&c, 8, 3, 3, 5, 600000, 2000, 6000), 0);
    assert_true(a.n > 100);
    assert_int_equal(a.n, b.n);
    int differs = a.n != c.n;
    for (size_t i = 0; i < a.n; i++) {
        assert_int_equal(a.steps[i].at_ms, b.steps[i].at_ms);
        assert_int_equal(a.steps[i].op, b.steps[i].op);
        assert_int_equal(a.steps[i].target, b.steps[i].target);
        differs |= i < c.n && (a.steps[i].at_ms != c.steps[i].at_ms || a.steps[i].op != c.steps[i].op);
    }
    assert_true(differs);
    /* the model's limits: a consumer always up, one node down at most, each
     * stopped slot back before it is stopped again */
    int up[KB_TORTURE_MAX_SLOTS] = {1, 1, 1}, nodes_down = 0, left_down = 0, seen[KB_T_HEAL + 1] = {0};
    for (size_t i = 0; i < a.n; i++) {
        const kb_torture_step *st = &a.steps[i];
        assert_true(i == 0 || st->at_ms >= a.steps[i - 1].at_ms);
        seen[st->op]++;
        switch (st->op) {
        case KB_T_KILL9:
        case KB_T_TERM:
        case KB_T_LEAVE:
            assert_true(up[st->target]);
            up[st->target] = 0;
            break;
        case KB_T_JOIN:
        case KB_T_START:
            assert_false(up[st->target]);
            up[st->target] = 1;
            break;
        case KB_T_NODE_KILL:
        case KB_T_NODE_DOWN:
            assert_int_equal(nodes_down, 0);
            nodes_down++;
            left_down += st->op == KB_T_NODE_DOWN;
            break;
        case KB_T_NODE_START:
            nodes_down--;
            break;
        default:
            break;
        }
        int live = 0;
        for (int s = 0; s < KB_TORTURE_MAX_SLOTS; s++)
            live += up[s];
        assert_true(live >= 1);
    }
    assert_true(left_down <= 1);
    for (int op = 0; op <= KB_T_HEAL; op++)
        assert_true(seen[op] > 0);   /* ten minutes hold every move */
    kb_torture_plan_free(&a);
    kb_torture_plan_free(&b);
    kb_torture_plan_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(clean_history_passes, setup, teardown),
        cmocka_unit_test_setup_teardown(redelivered_suffix_is_no_violation, setup, teardown),
        cmocka_unit_test_setup_teardown(unhandled_is_lost_unless_failed, setup, teardown),
        cmocka_unit_test_setup_teardown(pause_over_the_bound_fails, setup, teardown),
        cmocka_unit_test(schedule_is_the_seeds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
