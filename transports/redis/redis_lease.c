/* Partition leases: kb:{topic}:lease:N holds the owner's token with a TTL.
 * Which partitions to hold, when to hand one back (once idle) and when a
 * lease counts as lost are the kit's lease manager's (<keybus/kit.h>): the
 * keeper ticks it once per round with the heartbeat's members, and this file
 * is its broker side — every renewal and take of the round in one pipeline,
 * the hand-back script, and the partition states the reader and the fencing
 * read (state, deadline, epoch), kept in step with the manager. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/kit.h>

#include "redis_int.h"

static const char RENEW_LUA[] =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('pexpire',KEYS[1],ARGV[2]) end "
    "return 0";
/* A take keeps a lease still holding our token (a lapse: the local deadline
 * passed before the server's TTL) instead of waiting for it to expire. */
static const char TAKE_LUA[] =
    "local v=redis.call('get',KEYS[1]) "
    "if v==ARGV[1] then return redis.call('pexpire',KEYS[1],ARGV[2]) end "
    "if v then return 0 end redis.call('set',KEYS[1],ARGV[1],'px',ARGV[2]) return 1";
static const char RELEASE_LUA[] =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0";

/* A topic's lease manager and what one round hands its callbacks. */
struct kb_redis_leases {
    kb_kit_members *m;
    kb_transport_topic *tt;
    const char *const *members;          /* this round's heartbeat */
    size_t n;
    void (*send_acks)(kb_transport *t);
    bool taken;                          /* this round took a partition */
    bool closing;                        /* release_all deleted the leases already */
    bool *lost;                          /* lost, its lease maybe still holding our token */
    const char *names[];                 /* each partition's stream, for the traces */
};

/* A deadline seen passed by anyone of this process: the lease lapsed here. */
#define LAPSED INT64_MIN

bool kb__redis_lease_valid(kb_redis_part *p)
{
    if (atomic_load(&p->state) == KB_PART_FREE)
        return false;
    /* the clock before the deadline: a renewal stored after this look is
     * seen by the exchange below, which then keeps the lease */
    int64_t now = kb_now_ns();
    int64_t d = atomic_load(&p->deadline_ns);
    while (now >= d) {
        /* whatever is refused now stays in our pending list: mark the lapse,
         * so the renewal that would extend it reports a loss instead and
         * the partition is swept before it is read again */
        if (d == LAPSED || atomic_compare_exchange_weak(&p->deadline_ns, &d, LAPSED))
            return false;
    }
    return true;
}

bool kb__redis_part_live(kb_redis_part *p)
{
    return atomic_load(&p->state) == KB_PART_OWNED && kb__redis_lease_valid(p);
}

/* A renewal answered 1: extend the local deadline unless it passed before
 * the answer, whether or not anyone here looked (then it is lost: a gap in
 * reading must end in a sweep). */
static int extend(kb_redis_part *p, int64_t deadline)
{
    int64_t d = atomic_load(&p->deadline_ns);
    while (d != LAPSED && kb_now_ns() < d)
        if (atomic_compare_exchange_weak(&p->deadline_ns, &d, deadline))
            return 1;
    return 0;
}

static int64_t lease_margin_ns(const kb_transport *t)
{
    /* stop well before the server would expire the lease: one fifth of the TTL */
    return (int64_t)t->lease_ttl_ms * 1000000 / 5;
}

static int members_cb(void *opaque, kb_names *out)
{
    struct kb_redis_leases *ls = opaque;
    for (size_t i = 0; i < ls->n; i++)
        if (kb_names_add(out, ls->members[i], strlen(ls->members[i])) != KB_OK)
            return KB_ENOMEM;
    return KB_OK;
}

static int idle_cb(void *opaque, uint32_t i)
{
    return atomic_load(&((struct kb_redis_leases *)opaque)->tt->parts[i].inflight) == 0;
}

/* Renew what we hold, take what the share gives us: one pipeline. */
static void round_cb(void *opaque, kb_kit_lease_op *ops, size_t n)
{
    struct kb_redis_leases *ls = opaque;
    kb_transport *t = ls->tt->t;
    for (size_t i = 0; i < n; i++)
        ops[i].result = KB_ETRANSPORT;   /* no answer: kept until the local deadline */
    redisContext *c = kb__redis_conn_get(&t->kc, NULL, 0);
    if (c == NULL)
        return;
    char ttl[16];
    snprintf(ttl, sizeof ttl, "%d", t->lease_ttl_ms);
    int64_t sent = kb_now_ns();
    for (size_t i = 0; i < n; i++)
        redisAppendCommand(c, "EVAL %s 1 %s %s %s", ops[i].take ? TAKE_LUA : RENEW_LUA,
                           ls->tt->parts[ops[i].partition].lease, t->token, ttl);
    for (size_t i = 0; i < n; i++) {
        kb_redis_part *p = &ls->tt->parts[ops[i].partition];
        redisReply *x = NULL;
        if (redisGetReply(c, (void **)&x) != REDIS_OK) {
            kb__redis_conn_fail(&t->kc, c->errstr);
            return;
        }
        int64_t deadline = sent + (int64_t)t->lease_ttl_ms * 1000000 - lease_margin_ns(t);
        if (x->type == REDIS_REPLY_INTEGER && x->integer == 1 && ops[i].take) {
            ops[i].result = 1;   /* free here: nobody reads it until gained */
            atomic_store(&p->deadline_ns, deadline);
        } else if (x->type == REDIS_REPLY_INTEGER && x->integer == 1) {
            ops[i].result = extend(p, deadline);
        } else if (x->type == REDIS_REPLY_ERROR) {
            kb_log(t->bus, KB_LOG_WARNING, "redis: %s: lease of %s: %s", t->consumer, p->stream,
                   x->str);
        } else {
            ops[i].result = 0;   /* another consumer's, or expired */
        }
        kb__redis_reply_free(x);
    }
}

/* A new generation (taken, or taken again after a lapse or a hand-back
 * that the share undid): the epoch first, so the reader sweeps the
 * partition's pending entries before it reads anything newer. The only way
 * a partition becomes OWNED. */
static void gained_cb(void *opaque, uint32_t i)
{
    struct kb_redis_leases *ls = opaque;
    kb_redis_part *p = &ls->tt->parts[i];
    atomic_fetch_add(&p->epoch, 1);
    /* taken again after a loss: the acks queued since go before the sweep,
     * which would hand their entries out again */
    if (ls->lost[i])
        ls->send_acks(ls->tt->t);
    ls->lost[i] = false;
    atomic_store(&p->state, KB_PART_OWNED);
    kb_log(ls->tt->t->bus, KB_LOG_INFO, "redis: %s took %s", ls->tt->t->consumer, p->stream);
    ls->taken = true;
}

static void lost_cb(void *opaque, uint32_t i)
{
    struct kb_redis_leases *ls = opaque;
    kb_redis_part *p = &ls->tt->parts[i];
    atomic_store(&p->state, KB_PART_FREE);
    ls->lost[i] = true;   /* a late renewal may have kept our token: deleted once idle */
    kb_log(ls->tt->t->bus, KB_LOG_WARNING,
           "redis: %s lost the lease of %s (taken, expired, or renewed after its deadline)",
           ls->tt->t->consumer, p->stream);
}

/* Idle: every ack of the partition is queued; send them before the next
 * owner can claim the entries, then delete the lease if it still holds our
 * token. 1 deleted, 0 not ours, -1 without an answer. */
static int hand_back(struct kb_redis_leases *ls, kb_redis_part *p)
{
    kb_transport *t = ls->tt->t;
    ls->send_acks(t);
    const char *argv[] = {"EVAL", RELEASE_LUA, "1", p->lease, t->token};
    redisReply *r = kb__redis_cmd(&t->kc, 5, argv, NULL);
    int rc = r == NULL ? -1 : r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    kb__redis_reply_free(r);
    return rc;
}

static int give_back_cb(void *opaque, uint32_t i)
{
    struct kb_redis_leases *ls = opaque;
    kb_transport *t = ls->tt->t;
    kb_redis_part *p = &ls->tt->parts[i];
    if (!ls->closing) {
        /* the reader stops first; a delivery it made meanwhile waits a round */
        atomic_store(&p->state, KB_PART_DRAINING);
        if (atomic_load(&p->inflight) != 0)
            return KB_EINVAL;
        if (hand_back(ls, p) < 0)
            return KB_ETRANSPORT;   /* still draining: next round */
        kb_log(t->bus, KB_LOG_INFO, "redis: %s handed back %s", t->consumer, p->stream);
    }
    atomic_store(&p->state, KB_PART_FREE);
    return KB_OK;
}

static struct kb_redis_leases *leases_of(kb_transport *t, kb_transport_topic *tt)
{
    if (tt->leases != NULL)
        return tt->leases;
    struct kb_redis_leases *ls = calloc(1, sizeof *ls + tt->nparts * sizeof ls->names[0]);
    if (ls == NULL)
        return NULL;
    ls->lost = calloc(tt->nparts, sizeof ls->lost[0]);
    if (ls->lost == NULL) {
        free(ls);
        return NULL;
    }
    ls->tt = tt;
    for (uint32_t i = 0; i < tt->nparts; i++)
        ls->names[i] = tt->parts[i].stream;
    kb_kit_members_conf c = {
        .size = sizeof c, .bus = t->bus, .me = t->consumer, .partitions = tt->nparts,
        .names = ls->names,
        .lease_ns = (int64_t)t->lease_ttl_ms * 1000000 - lease_margin_ns(t),
        .broker = {.opaque = ls, .round = round_cb, .give_back = give_back_cb,
                   .gained = gained_cb, .lost = lost_cb, .idle = idle_cb, .members = members_cb},
    };
    ls->m = kb_kit_members_new(&c);
    if (ls->m == NULL) {
        free(ls->lost);
        free(ls);
        return NULL;   /* out of memory: the next round tries again */
    }
    return tt->leases = ls;
}

/* A lease lost to a late renewal that the server answered 1 still holds our
 * token for a TTL, and the kit only hands back partitions it holds: once the
 * partition is idle and not taken again, send its acks and delete the lease,
 * so a new owner need not wait the TTL out. */
static void forget_lost(struct kb_redis_leases *ls)
{
    for (uint32_t i = 0; i < ls->tt->nparts; i++) {
        kb_redis_part *p = &ls->tt->parts[i];
        if (!ls->lost[i] || atomic_load(&p->state) != KB_PART_FREE ||
            atomic_load(&p->inflight) != 0)
            continue;
        int rc = hand_back(ls, p);
        ls->lost[i] = rc < 0;   /* no answer: next round */
        if (rc == 1)
            kb_log(ls->tt->t->bus, KB_LOG_INFO,
                   "redis: %s let go of the lease of %s (lost, still holding our token)",
                   ls->tt->t->consumer, p->stream);
    }
}

void kb__redis_lease_round(kb_transport *t, kb_transport_topic *tt, const char *const *members,
                           size_t n, void (*send_acks)(kb_transport *t))
{
    struct kb_redis_leases *ls = leases_of(t, tt);
    if (ls == NULL)
        return;
    ls->members = members;
    ls->n = n;
    ls->send_acks = send_acks;
    ls->taken = false;
    kb_kit_members_tick(ls->m, kb_now_ns());
    ls->members = NULL;   /* the heartbeat's, valid during this round only */
    ls->n = 0;
    forget_lost(ls);
    /* held but no longer ours: the reader stops delivering it. Never back:
     * what it refused meanwhile is in our pending list, so it is read again
     * only after a hand-back and a new generation (gained_cb: a sweep). */
    for (uint32_t i = 0; i < tt->nparts; i++)
        if (atomic_load(&tt->parts[i].state) == KB_PART_OWNED &&
            !kb_kit_members_reading(ls->m, i))
            atomic_store(&tt->parts[i].state, KB_PART_DRAINING);
    if (ls->taken) {   /* the reader sweeps, then reads the partition */
        atomic_fetch_add(&t->leases_taken, 1);
        kb_signal_notify(t->reader_wake);
    }
}

void kb__redis_lease_release_all(kb_transport *t, kb_transport_topic *tt)
{
    redisContext *c = kb__redis_conn_get(&t->kc, NULL, 0);
    if (c == NULL)
        return;   /* the leases expire after their TTL */
    for (uint32_t i = 0; i < tt->nparts; i++)
        redisAppendCommand(c, "EVAL %s 1 %s %s", RELEASE_LUA, tt->parts[i].lease, t->token);
    for (uint32_t i = 0; i < tt->nparts; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            kb__redis_conn_fail(&t->kc, c->errstr);
            return;
        }
        kb__redis_reply_free(r);
    }
    if (tt->leases != NULL) {
        tt->leases->closing = true;   /* deleted above: the manager only lets go */
        kb_kit_members_leave(tt->leases->m);
    }
    for (uint32_t i = 0; i < tt->nparts; i++)
        atomic_store(&tt->parts[i].state, KB_PART_FREE);
    kb_log(t->bus, KB_LOG_INFO, "redis: %s handed back the partitions of %s", t->consumer,
           tt->name);
}

void kb__redis_lease_free(kb_transport_topic *tt)
{
    if (tt->leases == NULL)
        return;
    kb_kit_members_free(tt->leases->m);
    free(tt->leases->lost);
    free(tt->leases);
    tt->leases = NULL;
}
