/* The lease manager: one round per kb_kit_members_tick on the transport's
 * thread. Per partition a state (free, held, leaving) and a generation that
 * changes at every take, published with atomics so executors answer
 * still_owned without a lock. Hand-over waits for the partition to be idle:
 * the next owner then starts at a committed offset that covers everything
 * this member delivered, so per-key order holds across it. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kit_int.h"

enum { PART_FREE = 0, PART_HELD = 1, PART_LEAVING = 2 };

struct kit_part {
    _Atomic int state;
    _Atomic uint64_t generation;   /* 0 while free */
    _Atomic int64_t deadline;      /* INT64_MAX with lease_ns 0 */
};

struct kb_kit_members {
    kb_kit_members_conf c;
    char *me;
    struct kit_part *parts;
    unsigned char *mine;
    kb_kit_lease_op *ops;          /* a tick's requests (tick thread) */
    uint64_t generations;          /* the last one handed out (tick thread) */
    _Atomic uint32_t held, live;
};

kb_kit_members *kb_kit_members_new(const kb_kit_members_conf *c)
{
    const kb_kit_broker *br = &c->broker;
    if (c->size != sizeof *c) {
        kb_errf(NULL, 0, "kit: kb_kit_members_conf.size is %zu, this kit's is %zu (set it to "
                "sizeof the struct)", c->size, sizeof *c);
        return NULL;
    }
    if (c->me == NULL || c->partitions == 0 || (c->queues == NULL && br->idle == NULL) ||
        (br->try_take == NULL && br->round == NULL) || br->give_back == NULL ||
        br->members == NULL || (c->lease_ns > 0 && br->renew == NULL && br->round == NULL)) {
        kb_errf(NULL, 0, "kit: a lease manager needs a name, partitions, their queues (or "
                "idle) and the try_take (or round), give_back and members callbacks (renew "
                "or round with a lease time)");
        return NULL;
    }
    kb_kit_members *m = calloc(1, sizeof *m);
    if (m != NULL) {
        m->c = *c;
        m->me = strdup(c->me);
        m->parts = calloc(c->partitions, sizeof *m->parts);
        m->mine = calloc(c->partitions, 1);
        m->ops = calloc(c->partitions, sizeof *m->ops);
    }
    if (m == NULL || m->me == NULL || m->parts == NULL || m->mine == NULL || m->ops == NULL) {
        kb_kit_members_free(m);
        kb_errf(NULL, 0, "kit: out of memory for a lease manager");
        return NULL;
    }
    m->c.me = m->me;
    return m;
}

void kb_kit_members_free(kb_kit_members *m)
{
    if (m == NULL)
        return;
    free(m->me);
    free(m->parts);
    free(m->mine);
    free(m->ops);
    free(m);
}

static void changed(kb_kit_members *m, uint32_t p, int gained)
{
    if (m->c.bus != NULL && m->c.names != NULL)
        kb_bus_lease_changed(m->c.bus, m->c.names[p], p, gained);
}

static int idle(const kb_kit_members *m, uint32_t p)
{
    const kb_kit_broker *br = &m->c.broker;
    return br->idle != NULL ? br->idle(br->opaque, p)
                            : kb_kit_queue_outstanding(m->c.queues[p]) == 0;
}

/* Not held any more: executors holding deliveries of it see still_owned 0. */
static void drop(kb_kit_members *m, uint32_t p)
{
    struct kit_part *s = &m->parts[p];
    atomic_store_explicit(&s->generation, 0, memory_order_release);
    atomic_store_explicit(&s->state, PART_FREE, memory_order_release);
    atomic_fetch_sub(&m->held, 1);
    changed(m, p, 0);
}

/* A new generation of p's lease: taken (free and idle). */
static void gain(kb_kit_members *m, uint32_t p, int64_t now)
{
    struct kit_part *s = &m->parts[p];
    atomic_store_explicit(&s->deadline, m->c.lease_ns > 0 ? now + m->c.lease_ns : INT64_MAX,
                          memory_order_relaxed);
    atomic_store_explicit(&s->generation, ++m->generations, memory_order_release);
    atomic_store_explicit(&s->state, PART_HELD, memory_order_release);
    atomic_fetch_add(&m->held, 1);
    changed(m, p, 1);
    if (m->c.broker.gained != NULL)
        m->c.broker.gained(m->c.broker.opaque, p);
}

/* Lost: renew said 0, or its deadline passed before an answer came. A
 * renewal answered only after the deadline is lost too (a lapse): deliveries
 * of the old generation may still be out, so the partition is taken again by
 * the normal path, once idle, with a new generation. */
static void renewed(kb_kit_members *m, uint32_t p, int r, int64_t now, int64_t answered)
{
    struct kit_part *s = &m->parts[p];
    int64_t deadline = atomic_load_explicit(&s->deadline, memory_order_relaxed);
    if (r != 0 && answered < deadline) {
        if (r == 1)
            atomic_store_explicit(&s->deadline, now + m->c.lease_ns, memory_order_release);
        return;
    }
    drop(m, p);
    if (m->c.broker.lost != NULL)
        m->c.broker.lost(m->c.broker.opaque, p);
}

/* When the round's answers came: a tick that starts before a deadline and
 * hears back after it has lapsed. */
static int64_t answered_at(const kb_kit_members *m, int64_t now)
{
    const kb_kit_broker *br = &m->c.broker;
    int64_t t = br->now != NULL ? br->now(br->opaque) : kb_now_ns();
    return t > now ? t : now;
}

/* The takes and renewals of this tick, in one round when the broker can. */
static void requests(kb_kit_members *m, int64_t now)
{
    const kb_kit_broker *br = &m->c.broker;
    size_t n = 0;
    for (uint32_t p = 0; p < m->c.partitions; p++) {
        int st = atomic_load_explicit(&m->parts[p].state, memory_order_relaxed);
        /* deliveries of an earlier lease still out: they must come back first */
        if (st == PART_FREE && m->mine[p] && idle(m, p))
            m->ops[n++] = (kb_kit_lease_op){p, 1, 0};
        else if (st != PART_FREE && m->c.lease_ns > 0)
            m->ops[n++] = (kb_kit_lease_op){p, 0, 0};
    }
    if (n == 0)
        return;
    if (br->round != NULL)
        br->round(br->opaque, m->ops, n);
    else
        for (size_t i = 0; i < n; i++)
            m->ops[i].result = m->ops[i].take ? br->try_take(br->opaque, m->ops[i].partition)
                                              : br->renew(br->opaque, m->ops[i].partition);
    int64_t answered = answered_at(m, now);
    for (size_t i = 0; i < n; i++) {
        const kb_kit_lease_op *op = &m->ops[i];
        if (!op->take)
            renewed(m, op->partition, op->result, now, answered);
        else if (op->result == 1)
            gain(m, op->partition, now);
    }
}

uint32_t kb_kit_members_tick(kb_kit_members *m, int64_t now)
{
    kb_names live = {0};
    if (m->c.broker.members(m->c.broker.opaque, &live) == KB_OK) {
        kb_kit_share((const char *const *)live.v, live.n, m->me, m->c.partitions, 0, m->mine);
        atomic_store(&m->live, live.n > 0 ? (uint32_t)live.n : 1);
    }
    kb_names_free(&live);   /* a failed listing keeps the last share */
    requests(m, now);
    for (uint32_t p = 0; p < m->c.partitions; p++) {
        struct kit_part *s = &m->parts[p];
        int st = atomic_load_explicit(&s->state, memory_order_relaxed);
        if (st == PART_FREE)
            continue;
        /* leaving stays leaving when the share changes back: the feeder may
         * have refused deliveries meanwhile; handed back once idle, the next
         * tick takes it again with a new generation and `gained` */
        if (st == PART_HELD && !m->mine[p])
            atomic_store_explicit(&s->state, st = PART_LEAVING, memory_order_release);
        if (st == PART_LEAVING && idle(m, p) &&
            m->c.broker.give_back(m->c.broker.opaque, p) == KB_OK)
            drop(m, p);
    }
    return atomic_load(&m->held);
}

void kb_kit_members_leave(kb_kit_members *m)
{
    for (uint32_t p = 0; p < m->c.partitions; p++)
        if (atomic_load(&m->parts[p].state) != PART_FREE) {
            m->c.broker.give_back(m->c.broker.opaque, p);   /* failed: it expires */
            drop(m, p);
        }
}

uint64_t kb_kit_members_generation(const kb_kit_members *m, uint32_t p)
{
    return atomic_load_explicit(&m->parts[p].generation, memory_order_acquire);
}

int kb_kit_members_still_owned(const kb_kit_members *m, uint32_t p, uint64_t generation,
                               int64_t now)
{
    const struct kit_part *s = &m->parts[p];
    return generation != 0 &&
           atomic_load_explicit(&s->generation, memory_order_acquire) == generation &&
           now < atomic_load_explicit(&s->deadline, memory_order_acquire);
}

int kb_kit_members_reading(const kb_kit_members *m, uint32_t p)
{
    return atomic_load_explicit(&m->parts[p].state, memory_order_acquire) == PART_HELD;
}

uint32_t kb_kit_members_held(const kb_kit_members *m)
{
    return atomic_load(&m->held);
}

uint32_t kb_kit_members_live(const kb_kit_members *m)
{
    return atomic_load(&m->live);
}
