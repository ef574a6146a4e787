/* The kit's lease manager over a fake broker of callbacks (an in-memory
 * owner per partition and a member list): fair share among two and three
 * managers, hand-over only once the partition's queue is idle, generations
 * for still_owned, and leases lost to silence or to another owner. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include <keybus/kit.h>

#include "support/check.h"

#define PARTS 8
#define MANAGERS 3

struct broker {
    const char *owner[PARTS];
    const char *live[MANAGERS];
    int renew_answer;            /* what renew says when we own it: 1, or -1 (silent) */
};

struct member {
    struct broker *br;
    const char *name;
    kb_kit_queue *queues[PARTS];
    kb_kit_members *m;
    int lost;
};

static int try_take(void *opaque, uint32_t p)
{
    struct member *me = opaque;
    if (me->br->owner[p] != NULL && me->br->owner[p] != me->name)
        return 0;
    me->br->owner[p] = me->name;
    return me->queues[p] == NULL || kb_kit_queue_restart(me->queues[p], 0) == KB_OK;
}

static int renew(void *opaque, uint32_t p)
{
    struct member *me = opaque;
    if (me->br->owner[p] != me->name)
        return 0;
    return me->br->renew_answer;
}

static int give_back(void *opaque, uint32_t p)
{
    struct member *me = opaque;
    if (me->br->owner[p] == me->name)
        me->br->owner[p] = NULL;
    return KB_OK;
}

static void lost(void *opaque, uint32_t p)
{
    (void)p;
    ((struct member *)opaque)->lost++;
}

static int members(void *opaque, kb_names *out)
{
    struct member *me = opaque;
    for (int i = 0; i < MANAGERS; i++)
        if (me->br->live[i] != NULL && kb_names_add(out, me->br->live[i], strlen(me->br->live[i])) != KB_OK)
            return KB_ENOMEM;
    return KB_OK;
}

static void member_init(struct member *me, struct broker *br, const char *name, int64_t lease_ns)
{
    *me = (struct member){.br = br, .name = name};
    for (uint32_t p = 0; p < PARTS; p++) {
        me->queues[p] = kb_kit_queue_new(p, 0, NULL);
        assert_non_null(me->queues[p]);
    }
    kb_kit_members_conf c = {
        .me = name, .partitions = PARTS, .queues = me->queues, .lease_ns = lease_ns,
        .broker = {.opaque = me, .try_take = try_take, .renew = renew, .give_back = give_back,
                   .lost = lost, .members = members},
    };
    me->m = kb_kit_members_new(&c);
    assert_non_null(me->m);
}

static void member_fini(struct member *me)
{
    kb_kit_members_leave(me->m);
    kb_kit_members_free(me->m);
    for (uint32_t p = 0; p < PARTS; p++)
        kb_kit_queue_free(me->queues[p]);
}

/* Ticks every member a few rounds, as their threads would. */
static void rounds(struct member *ms, int n, int64_t now)
{
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < n; i++)
            kb_kit_members_tick(ms[i].m, now);
}

static void check_disjoint(struct member *ms, int n)
{
    for (uint32_t p = 0; p < PARTS; p++) {
        int holders = 0;
        for (int i = 0; i < n; i++)
            holders += kb_kit_members_generation(ms[i].m, p) != 0;
        assert_true(holders <= 1);
    }
}

static void fair_share(void **state)
{
    (void)state;
    struct broker br = {.renew_answer = 1};
    struct member ms[MANAGERS];
    const char *names[MANAGERS] = {"alpha-1", "beta-2", "gamma-3"};
    for (int i = 0; i < MANAGERS; i++)
        member_init(&ms[i], &br, names[i], 0);
    br.live[0] = names[0];
    rounds(ms, 1, 0);
    assert_int_equal(kb_kit_members_held(ms[0].m), PARTS);   /* alone: everything */
    br.live[1] = names[1];
    rounds(ms, 2, 0);
    assert_int_equal(kb_kit_members_held(ms[0].m), PARTS / 2);   /* idle queues: handed over */
    assert_int_equal(kb_kit_members_held(ms[1].m), PARTS / 2);
    check_disjoint(ms, 2);
    br.live[2] = names[2];
    rounds(ms, 3, 0);
    uint32_t total = 0;
    for (int i = 0; i < MANAGERS; i++) {
        uint32_t held = kb_kit_members_held(ms[i].m);
        assert_in_range(held, 2, 3);   /* ceil(8 / 3) at most, the rest shared */
        assert_int_equal(kb_kit_members_live(ms[i].m), 3);
        total += held;
    }
    assert_int_equal(total, PARTS);
    check_disjoint(ms, 3);
    /* one leaves: its partitions go to the other two, 4 and 4 */
    br.live[2] = NULL;
    kb_kit_members_leave(ms[2].m);
    rounds(ms, 2, 0);
    assert_int_equal(kb_kit_members_held(ms[0].m), PARTS / 2);
    assert_int_equal(kb_kit_members_held(ms[1].m), PARTS / 2);
    for (int i = 0; i < MANAGERS; i++)
        member_fini(&ms[i]);
}

static void hand_over_once_settled(void **state)
{
    (void)state;
    struct broker br = {.renew_answer = 1};
    struct member a, b;
    member_init(&a, &br, "alpha-1", 0);
    member_init(&b, &br, "beta-2", 0);
    br.live[0] = a.name;
    rounds(&a, 1, 0);
    /* a delivery out on every partition of a */
    kb_kit_pending *pe[PARTS];
    for (uint32_t p = 0; p < PARTS; p++)
        kb_assert_ok(kb_kit_queue_push(a.queues[p], 1, kb_kit_members_generation(a.m, p), &pe[p]));
    br.live[1] = b.name;
    struct member both[2] = {a, b};
    rounds(both, 2, 0);
    assert_int_equal(kb_kit_members_held(a.m), PARTS);   /* nothing settled: nothing moves */
    assert_int_equal(kb_kit_members_held(b.m), 0);
    uint32_t leaving = 0;
    for (uint32_t p = 0; p < PARTS; p++)
        leaving += !kb_kit_members_reading(a.m, p);   /* b's share: a reads no more */
    assert_int_equal(leaving, PARTS / 2);
    for (uint32_t p = 0; p < PARTS; p++) {
        int moving = !kb_kit_members_reading(a.m, p);
        kb_kit_settle(pe[p]);
        rounds(both, 2, 0);
        assert_ptr_equal(br.owner[p], moving ? b.name : a.name);   /* once settled: b's */
    }
    assert_int_equal(kb_kit_members_held(a.m), PARTS / 2);
    assert_int_equal(kb_kit_members_held(b.m), PARTS / 2);
    member_fini(&a);
    member_fini(&b);
}

static void generations(void **state)
{
    (void)state;
    struct broker br = {.renew_answer = 1};
    struct member a;
    member_init(&a, &br, "alpha-1", 1000);   /* leases held 1000 ns from each tick */
    br.live[0] = a.name;
    kb_kit_members_tick(a.m, 0);
    uint64_t g = kb_kit_members_generation(a.m, 0);
    assert_int_not_equal(g, 0);
    assert_true(kb_kit_members_still_owned(a.m, 0, g, 500));
    assert_false(kb_kit_members_still_owned(a.m, 0, g, 1000));   /* past the deadline */
    assert_false(kb_kit_members_still_owned(a.m, 0, g + 1000, 500));
    kb_kit_members_tick(a.m, 900);                                /* renewed */
    assert_true(kb_kit_members_still_owned(a.m, 0, g, 1500));
    /* the broker goes silent: kept until the deadline, then lost */
    br.renew_answer = -1;
    kb_kit_members_tick(a.m, 1200);
    assert_true(kb_kit_members_still_owned(a.m, 0, g, 1500));
    assert_int_equal(a.lost, 0);
    kb_kit_pending *pe;   /* a delivery out when the lease goes */
    kb_assert_ok(kb_kit_queue_push(a.queues[0], 1, g, &pe));
    kb_kit_members_tick(a.m, 2000);
    assert_int_equal(a.lost, PARTS);
    assert_false(kb_kit_members_still_owned(a.m, 0, g, 2000));
    assert_int_equal(kb_kit_members_generation(a.m, 0), 0);
    /* another owner took partition 1 meanwhile: renew says 0 */
    br.renew_answer = 1;
    for (uint32_t p = 0; p < PARTS; p++)
        br.owner[p] = NULL;
    kb_kit_members_tick(a.m, 3000);
    assert_int_equal(kb_kit_members_held(a.m), PARTS - 1);   /* not 0: its delivery is out */
    kb_kit_release(pe);
    kb_kit_members_tick(a.m, 3000);
    uint64_t g2 = kb_kit_members_generation(a.m, 0);
    assert_true(g2 != 0 && g2 != g);   /* a new lease, a new generation */
    assert_false(kb_kit_members_still_owned(a.m, 0, g, 3000));
    uint64_t g1 = kb_kit_members_generation(a.m, 1);
    br.owner[1] = "someone-else";
    kb_kit_members_tick(a.m, 3500);
    assert_false(kb_kit_members_still_owned(a.m, 1, g1, 3500));
    assert_int_equal(a.lost, PARTS + 1);
    br.owner[1] = NULL;
    member_fini(&a);
}

/* A broker that answers a tick in one round, knows idleness without a
 * queue (an in-flight count, as redis:// keeps) and is told of each new
 * generation. */
struct batched {
    struct member me;
    int rounds, gained;
    size_t last_round;
    int inflight[PARTS];
};

static void round_cb(void *opaque, kb_kit_lease_op *ops, size_t n)
{
    struct batched *b = opaque;
    b->rounds++;
    b->last_round = n;
    for (size_t i = 0; i < n; i++)
        ops[i].result = ops[i].take ? try_take(&b->me, ops[i].partition)
                                    : renew(&b->me, ops[i].partition);
}

static int idle_cb(void *opaque, uint32_t p)
{
    return ((struct batched *)opaque)->inflight[p] == 0;
}

static void gained_cb(void *opaque, uint32_t p)
{
    (void)p;
    ((struct batched *)opaque)->gained++;
}

static int give_back_b(void *opaque, uint32_t p)
{
    return give_back(&((struct batched *)opaque)->me, p);
}

static int members_b(void *opaque, kb_names *out)
{
    return members(&((struct batched *)opaque)->me, out);
}

static void one_round_per_tick(void **state)
{
    (void)state;
    struct broker br = {.renew_answer = 1, .live = {"alpha-1"}};
    struct batched b = {.me = {.br = &br, .name = "alpha-1"}};
    kb_kit_members_conf c = {
        .me = "alpha-1", .partitions = PARTS, .lease_ns = 1000,
        .broker = {.opaque = &b, .round = round_cb, .give_back = give_back_b,
                   .gained = gained_cb, .idle = idle_cb, .members = members_b},
    };
    kb_kit_members *m = kb_kit_members_new(&c);
    assert_non_null(m);
    b.inflight[5] = 1;   /* out from an earlier lease: not taken yet */
    kb_kit_members_tick(m, 0);
    assert_int_equal(b.rounds, 1);
    assert_int_equal(b.last_round, PARTS - 1);
    assert_int_equal(b.gained, PARTS - 1);
    assert_int_equal(kb_kit_members_generation(m, 5), 0);
    b.inflight[5] = 0;
    kb_kit_members_tick(m, 100);   /* seven renewals and one take, one round */
    assert_int_equal(b.rounds, 2);
    assert_int_equal(b.last_round, PARTS);
    assert_int_equal(kb_kit_members_held(m), PARTS);
    /* silent past the deadline, then answering: a lapse is a new generation */
    uint64_t g = kb_kit_members_generation(m, 0);
    br.renew_answer = -1;
    kb_kit_members_tick(m, 500);
    br.renew_answer = 1;
    b.gained = 0;
    kb_kit_members_tick(m, 1101);   /* renewed or taken at 100: deadlines at 1100 */
    assert_int_equal(kb_kit_members_held(m), PARTS);
    assert_int_equal(b.gained, PARTS);
    assert_true(kb_kit_members_generation(m, 0) != g);
    assert_false(kb_kit_members_still_owned(m, 0, g, 1101));
    assert_true(kb_kit_members_still_owned(m, 0, kb_kit_members_generation(m, 0), 1101));
    kb_kit_members_leave(m);
    kb_kit_members_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fair_share),
        cmocka_unit_test(hand_over_once_settled),
        cmocka_unit_test(generations),
        cmocka_unit_test(one_round_per_tick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
