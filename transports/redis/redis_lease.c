/* Partition leases: kb:{topic}:lease:N holds the owner's token with a TTL.
 * The keeper renews what this process holds and takes what rendezvous
 * hashing gives it among the live members, and hands back, once idle, what
 * is no longer its share. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

static const char RENEW_LUA[] =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('pexpire',KEYS[1],ARGV[2]) end "
    "return 0";
static const char RELEASE_LUA[] =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0";

bool kb__redis_part_live(const kb_redis_part *p)
{
    return atomic_load(&p->state) == KB_PART_OWNED && kb_now_ns() < atomic_load(&p->deadline_ns);
}

/* Rendezvous hashing: a partition goes to the live member with the highest
 * score, so a member joining or leaving moves only its own share. No member
 * listed (the heartbeat was not seen yet): ours to try. */
static bool mine(const kb_transport *t, const char *const *members, size_t n, uint32_t part)
{
    long owner = kb_rendezvous_owner(members, n, part);
    return owner < 0 || strcmp(members[owner], t->consumer) == 0;
}

static int64_t lease_margin_ns(const kb_transport *t)
{
    /* stop well before the server would expire the lease: one fifth of the TTL */
    return (int64_t)t->lease_ttl_ms * 1000000 / 5;
}

void kb__redis_lease_round(kb_transport *t, kb_transport_topic *tt, const char *const *members,
                           size_t n)
{
    redisContext *c = kb__redis_conn_get(&t->kc, NULL, 0);
    if (c == NULL)
        return;
    char ttl[16];
    snprintf(ttl, sizeof ttl, "%d", t->lease_ttl_ms);
    /* Renew what we hold, try what rendezvous gives us; one pipeline. */
    int64_t sent = kb_now_ns();
    for (uint32_t i = 0; i < tt->nparts; i++) {
        kb_redis_part *p = &tt->parts[i];
        int st = atomic_load(&p->state);
        if (st != KB_PART_FREE)
            redisAppendCommand(c, "EVAL %s 1 %s %s %s", RENEW_LUA, p->lease, t->token, ttl);
        else if (mine(t, members, n, i))
            redisAppendCommand(c, "SET %s %s NX PX %s", p->lease, t->token, ttl);
    }
    bool taken = false;
    for (uint32_t i = 0; i < tt->nparts; i++) {
        kb_redis_part *p = &tt->parts[i];
        int st = atomic_load(&p->state);
        if (st == KB_PART_FREE && !mine(t, members, n, i))
            continue;
        redisReply *x = NULL;
        if (redisGetReply(c, (void **)&x) != REDIS_OK) {
            kb__redis_conn_fail(&t->kc, c->errstr);
            return;
        }
        bool held = (x->type == REDIS_REPLY_INTEGER && x->integer == 1) ||
                    (x->type == REDIS_REPLY_STATUS && strcmp(x->str, "OK") == 0);
        int64_t deadline = sent + (int64_t)t->lease_ttl_ms * 1000000 - lease_margin_ns(t);
        if (held) {
            /* a lapse (renewed only after the local deadline) counts as a new
             * acquisition: the consumer re-sweeps before reading new entries */
            bool fresh = st == KB_PART_FREE || kb_now_ns() >= atomic_load(&p->deadline_ns);
            atomic_store(&p->deadline_ns, deadline);
            if (fresh) {
                kb_bus_lease_changed(t->bus, p->stream, p->index, 1);
                atomic_fetch_add(&p->epoch, 1);
                taken = true;
            }
            if (st == KB_PART_FREE) {
                atomic_store(&p->state, KB_PART_OWNED);
                kb_log(t->bus, KB_LOG_INFO, "redis: %s took %s", t->consumer, p->stream);
            }
        } else if (st != KB_PART_FREE) {
            atomic_store(&p->state, KB_PART_FREE);
            kb_bus_lease_changed(t->bus, p->stream, p->index, 0);
            kb_log(t->bus, KB_LOG_WARNING, "redis: %s lost the lease of %s (%s)", t->consumer,
                   p->stream, x->type == REDIS_REPLY_ERROR ? x->str : "taken or expired");
        }
        kb__redis_reply_free(x);
    }
    /* Owned but no longer ours by rendezvous: stop reading, hand back when idle. */
    for (uint32_t i = 0; i < tt->nparts; i++)
        if (atomic_load(&tt->parts[i].state) == KB_PART_OWNED && !mine(t, members, n, i))
            atomic_store(&tt->parts[i].state, KB_PART_DRAINING);
    if (taken) {   /* the reader sweeps, then reads the partition */
        atomic_fetch_add(&t->leases_taken, 1);
        kb_signal_notify(t->reader_wake);
    }
}

void kb__redis_lease_handback(kb_transport *t, kb_transport_topic *tt,
                              void (*send_acks)(kb_transport *t))
{
    for (uint32_t i = 0; i < tt->nparts; i++) {
        kb_redis_part *p = &tt->parts[i];
        if (atomic_load(&p->state) != KB_PART_DRAINING || atomic_load(&p->inflight) != 0)
            continue;
        /* inflight is 0: every ack of the partition is queued; send them before
         * the next owner can claim the entries */
        send_acks(t);
        const char *argv[] = {"EVAL", RELEASE_LUA, "1", p->lease, t->token};
        redisReply *r = kb__redis_cmd(&t->kc, 5, argv, NULL);
        kb__redis_reply_free(r);
        if (r != NULL) {
            atomic_store(&p->state, KB_PART_FREE);
            kb_bus_lease_changed(t->bus, p->stream, p->index, 0);
            kb_log(t->bus, KB_LOG_INFO, "redis: %s handed back %s", t->consumer, p->stream);
        }
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
    for (uint32_t i = 0; i < tt->nparts; i++)
        atomic_store(&tt->parts[i].state, KB_PART_FREE);
    kb_log(t->bus, KB_LOG_INFO, "redis: %s handed back the partitions of %s", t->consumer,
           tt->name);
}
