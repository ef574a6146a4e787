/* The kit's lease manager over a fake broker of callbacks (an in-memory
 * owner per partition and a member list): fair share among two and three
 * managers, hand-over only once the partition's queue is idle, generations
 * for still_owned, leases lost to silence or to another owner, a late
 * renewal handled as a loss, and a hand-back finished when the share
 * changes back. And the fair share alone (kb_kit_share). */
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
    int lost, gained;
    int64_t answer_at;           /* the clock once a tick's answers are in; 0: the tick's now */
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

static void gained(void *opaque, uint32_t p)
{
    (void)p;
    ((struct member *)opaque)->gained++;
}

static int64_t clock_cb(void *opaque)
{
    return ((struct member *)opaque)->answer_at;
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
        .size = sizeof c, .me = name, .partitions = PARTS, .queues = me->queues,
        .lease_ns = lease_ns,
        .broker = {.opaque = me, .try_take = try_take, .renew = renew, .give_back = give_back,
                   .gained = gained, .lost = lost, .members = members, .now = clock_cb},
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

/* kb_kit_share alone, for 5 members over 64 partitions: every partition is
 * exactly one member's, each holds at most ceil(64 / 5) = 13, the listing
 * order changes nothing, salt 0 ranks each partition by its number as plain
 * rendezvous does where no member is full, and a salt moves some. Nobody
 * listed: every partition is ours to try. */
#define SHARE_PARTS 64
#define SHARE_MEMBERS 5
static void share_alone(void **state)
{
    (void)state;
    const char *names[SHARE_MEMBERS] = {"m-1", "m-2", "m-3", "m-4", "m-5"};
    const char *reversed[SHARE_MEMBERS];
    for (int i = 0; i < SHARE_MEMBERS; i++)
        reversed[i] = names[SHARE_MEMBERS - 1 - i];
    unsigned char mine[SHARE_MEMBERS][SHARE_PARTS], again[SHARE_PARTS], salted[SHARE_PARTS];
    int owners[SHARE_PARTS] = {0}, moved = 0;
    for (int i = 0; i < SHARE_MEMBERS; i++) {
        kb_kit_share(names, SHARE_MEMBERS, names[i], SHARE_PARTS, 0, mine[i]);
        kb_kit_share(reversed, SHARE_MEMBERS, names[i], SHARE_PARTS, 0, again);
        assert_memory_equal(mine[i], again, SHARE_PARTS);
        kb_kit_share(names, SHARE_MEMBERS, names[i], SHARE_PARTS, 0x9e3779b9u, salted);
        int held = 0;
        for (int p = 0; p < SHARE_PARTS; p++) {
            held += mine[i][p];
            owners[p] += mine[i][p];
            moved += mine[i][p] != salted[p];
        }
        assert_in_range(held, 12, 13);
    }
    for (int p = 0; p < SHARE_PARTS; p++)
        assert_int_equal(owners[p], 1);
    assert_true(moved > 0);
    /* the first partition goes to its plain rendezvous owner (nobody is full
     * yet), ranked by its number, or with a salt by the number mixed with it
     * as nats:// ranked before the bound: kb_mix64(salt << 32 | p) */
    long first = kb_rendezvous_owner(names, SHARE_MEMBERS, 0);
    assert_int_equal(mine[first][0], 1);
    first = kb_rendezvous_owner(names, SHARE_MEMBERS, (uint32_t)kb_mix64((uint64_t)0x9e3779b9u << 32));
    kb_kit_share(names, SHARE_MEMBERS, names[first], SHARE_PARTS, 0x9e3779b9u, salted);
    assert_int_equal(salted[0], 1);
    memset(again, 0, sizeof again);
    kb_kit_share(names, 0, "m-1", SHARE_PARTS, 0, again);
    for (int p = 0; p < SHARE_PARTS; p++)
        assert_int_equal(again[p], 1);
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

/* a holds every partition with a delivery out on each (pe[p], read under
 * g[p]) when b joins: b's share is leaving, nothing moves yet. */
struct busy {
    struct broker br;
    struct member a, b;
    kb_kit_pending *pe[PARTS];
    uint64_t g[PARTS];
};

static void joined_while_busy(struct busy *w)
{
    w->br.renew_answer = 1;
    member_init(&w->a, &w->br, "alpha-1", 0);
    member_init(&w->b, &w->br, "beta-2", 0);
    w->br.live[0] = w->a.name;
    rounds(&w->a, 1, 0);
    for (uint32_t p = 0; p < PARTS; p++) {
        w->g[p] = kb_kit_members_generation(w->a.m, p);
        kb_assert_ok(kb_kit_queue_push(w->a.queues[p], 1, w->g[p], &w->pe[p]));
    }
    w->br.live[1] = w->b.name;
    struct member both[2] = {w->a, w->b};
    rounds(both, 2, 0);
    assert_int_equal(kb_kit_members_held(w->a.m), PARTS);   /* nothing settled: nothing moves */
    assert_int_equal(kb_kit_members_held(w->b.m), 0);
    uint32_t leaving = 0;
    for (uint32_t p = 0; p < PARTS; p++)
        leaving += !kb_kit_members_reading(w->a.m, p);   /* b's share: a reads no more */
    assert_int_equal(leaving, PARTS / 2);
}

static void hand_over_once_settled(void **state)
{
    (void)state;
    struct busy w = {0};
    joined_while_busy(&w);
    struct member both[2] = {w.a, w.b};
    for (uint32_t p = 0; p < PARTS; p++) {
        int moving = !kb_kit_members_reading(w.a.m, p);
        kb_kit_settle(w.pe[p]);
        rounds(both, 2, 0);
        assert_ptr_equal(w.br.owner[p], moving ? w.b.name : w.a.name);   /* once settled: b's */
    }
    assert_int_equal(kb_kit_members_held(w.a.m), PARTS / 2);
    assert_int_equal(kb_kit_members_held(w.b.m), PARTS / 2);
    member_fini(&w.a);
    member_fini(&w.b);
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
    int rounds;
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
    gained(&((struct batched *)opaque)->me, p);
}

static void lost_cb(void *opaque, uint32_t p)
{
    lost(&((struct batched *)opaque)->me, p);
}

static int64_t clock_b(void *opaque)
{
    return clock_cb(&((struct batched *)opaque)->me);
}

static int give_back_b(void *opaque, uint32_t p)
{
    return give_back(&((struct batched *)opaque)->me, p);
}

static int members_b(void *opaque, kb_names *out)
{
    return members(&((struct batched *)opaque)->me, out);
}

static kb_kit_members *batched_new(struct batched *b)
{
    kb_kit_members_conf c = {
        .size = sizeof c, .me = "alpha-1", .partitions = PARTS, .lease_ns = 1000,
        .broker = {.opaque = b, .round = round_cb, .give_back = give_back_b,
                   .gained = gained_cb, .lost = lost_cb, .idle = idle_cb, .members = members_b,
                   .now = clock_b},
    };
    kb_kit_members *m = kb_kit_members_new(&c);
    assert_non_null(m);
    return m;
}

static void one_round_per_tick(void **state)
{
    (void)state;
    struct broker br = {.renew_answer = 1, .live = {"alpha-1"}};
    struct batched b = {.me = {.br = &br, .name = "alpha-1"}};
    kb_kit_members *m = batched_new(&b);
    b.inflight[5] = 1;   /* out from an earlier lease: not taken yet */
    kb_kit_members_tick(m, 0);
    assert_int_equal(b.rounds, 1);
    assert_int_equal(b.last_round, PARTS - 1);
    assert_int_equal(b.me.gained, PARTS - 1);
    assert_int_equal(kb_kit_members_generation(m, 5), 0);
    b.inflight[5] = 0;
    kb_kit_members_tick(m, 100);   /* seven renewals and one take, one round */
    assert_int_equal(b.rounds, 2);
    assert_int_equal(b.last_round, PARTS);
    assert_int_equal(kb_kit_members_held(m), PARTS);
    /* silent past the deadline, then answering: a lapse is a loss, and the
     * next tick takes it again with a new generation */
    uint64_t g = kb_kit_members_generation(m, 0);
    br.renew_answer = -1;
    kb_kit_members_tick(m, 500);
    br.renew_answer = 1;
    b.me.gained = 0;
    kb_kit_members_tick(m, 1101);   /* renewed or taken at 100: deadlines at 1100 */
    assert_int_equal(kb_kit_members_held(m), 0);
    assert_int_equal(b.me.lost, PARTS);
    assert_int_equal(b.me.gained, 0);
    kb_kit_members_tick(m, 1102);
    assert_int_equal(kb_kit_members_held(m), PARTS);
    assert_int_equal(b.me.gained, PARTS);
    assert_true(kb_kit_members_generation(m, 0) != g);
    assert_false(kb_kit_members_still_owned(m, 0, g, 1102));
    assert_true(kb_kit_members_still_owned(m, 0, kb_kit_members_generation(m, 0), 1102));
    kb_kit_members_leave(m);
    kb_kit_members_free(m);
}

/* A tick that starts before the deadline and hears back after it: a lapse,
 * judged by when the answer came. The partition with a delivery of the old
 * generation still out is taken again only once it came back. */
static void late_renewal_is_a_loss(void **state)
{
    (void)state;
    struct broker br = {.renew_answer = 1, .live = {"alpha-1"}};
    struct batched b = {.me = {.br = &br, .name = "alpha-1"}};
    kb_kit_members *m = batched_new(&b);
    kb_kit_members_tick(m, 0);   /* every partition taken: deadlines at 1000 */
    assert_int_equal(b.me.gained, PARTS);
    uint64_t g = kb_kit_members_generation(m, 0);
    b.inflight[0] = 1;           /* a delivery of generation g still out */
    b.me.answer_at = 1200;
    kb_kit_members_tick(m, 900);
    assert_int_equal(b.me.lost, PARTS);
    assert_int_equal(b.me.gained, PARTS);   /* no gained while a delivery is out */
    assert_int_equal(kb_kit_members_held(m), 0);
    assert_false(kb_kit_members_still_owned(m, 0, g, 900));
    b.me.answer_at = 0;
    kb_kit_members_tick(m, 1300);
    assert_int_equal(kb_kit_members_held(m), PARTS - 1);
    assert_int_equal(kb_kit_members_generation(m, 0), 0);   /* not while its delivery is out */
    b.inflight[0] = 0;
    kb_kit_members_tick(m, 1400);
    assert_int_equal(kb_kit_members_held(m), PARTS);
    assert_int_equal(b.me.gained, 2 * PARTS);
    uint64_t g2 = kb_kit_members_generation(m, 0);
    assert_true(g2 != 0 && g2 != g);
    kb_kit_members_leave(m);
    kb_kit_members_free(m);
}

/* A joiner leaves while partitions are leaving: they are not flipped back
 * without a word (the feeder may have refused deliveries while they
 * drained); handed back once idle, they are taken again with a new
 * generation and `gained`. */
static void leaving_finishes_the_hand_back(void **state)
{
    (void)state;
    struct busy w = {0};
    joined_while_busy(&w);
    int leaving[PARTS];
    for (uint32_t p = 0; p < PARTS; p++)
        leaving[p] = !kb_kit_members_reading(w.a.m, p);
    w.br.live[1] = NULL;   /* the joiner goes: every partition is a's share again */
    kb_kit_members_leave(w.b.m);
    w.a.gained = 0;
    rounds(&w.a, 1, 0);
    for (uint32_t p = 0; p < PARTS; p++)
        assert_int_equal(kb_kit_members_reading(w.a.m, p), !leaving[p]);   /* still draining */
    assert_int_equal(w.a.gained, 0);
    for (uint32_t p = 0; p < PARTS; p++)
        kb_kit_settle(w.pe[p]);
    rounds(&w.a, 1, 0);
    assert_int_equal(kb_kit_members_held(w.a.m), PARTS);
    assert_int_equal(w.a.gained, PARTS / 2);
    for (uint32_t p = 0; p < PARTS; p++) {
        assert_true(kb_kit_members_reading(w.a.m, p));
        uint64_t now_g = kb_kit_members_generation(w.a.m, p);
        assert_true(leaving[p] ? now_g != w.g[p] : now_g == w.g[p]);
    }
    member_fini(&w.a);
    member_fini(&w.b);
}

/* The conf's size is checked: a struct of another layout is refused. */
static void conf_size_checked(void **state)
{
    (void)state;
    kb_kit_queue *q = kb_kit_queue_new(0, 0, NULL);
    assert_non_null(q);
    kb_kit_members_conf c = {
        .size = sizeof c - 1, .me = "alpha-1", .partitions = 1, .queues = &q,
        .broker = {.try_take = try_take, .give_back = give_back, .members = members},
    };
    assert_null(kb_kit_members_new(&c));
    assert_non_null(strstr(kb_last_error(), "size"));
    c.size = sizeof c;
    kb_kit_members *m = kb_kit_members_new(&c);
    assert_non_null(m);
    kb_kit_members_free(m);
    kb_kit_queue_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fair_share),
        cmocka_unit_test(share_alone),
        cmocka_unit_test(hand_over_once_settled),
        cmocka_unit_test(generations),
        cmocka_unit_test(one_round_per_tick),
        cmocka_unit_test(late_renewal_is_a_loss),
        cmocka_unit_test(leaving_finishes_the_hand_back),
        cmocka_unit_test(conf_size_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
