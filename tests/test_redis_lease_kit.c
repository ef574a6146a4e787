/* redis:// leases through the kit's lease manager: a partition this process
 * stopped delivering (entries it had read were refused and stay in its
 * pending list) is read again only after a sweep:
 *   - back from draining: a second member joins (the partition is its share,
 *     so ours drains, held up by a handler at a gate) and leaves again before
 *     the hand-back. The kit keeps a leaving partition leaving until it is
 *     handed back and taken again, so this pins the kit's rule end to end;
 *     the transport's own rule (OWNED again only through `gained`) is a
 *     safety net this case does not tell apart;
 *   - a renewal sent after the deadline: the server is stopped just after a
 *     renewal for 0.9 TTL; the keeper's next pass waits on its membership
 *     heartbeat first, so the renewal goes out after the local deadline
 *     (TTL - TTL/5), and any rule that judges a lapse catches it;
 *   - a renewal answered after the deadline: through a proxy that holds
 *     every answer from the moment a renewal reached the server (which
 *     extends the lease) for 2/3 TTL. Renewals come every TTL/4, so the
 *     previous one's deadline (about 0.55 TTL after this one was sent)
 *     passes meanwhile and this one's (0.8 TTL) does not: the round starts
 *     before the deadline and hears back after it, and only a lapse judged
 *     at answer time reports the loss asserted here (the kit's rule, as in
 *     test_kit_members' late_renewal_is_a_loss, or the transport's: either
 *     alone passes, without both the renewal simply extends the lease);
 *   - a lost lease let go: after such a lapse the lease holds our token a
 *     whole TTL more; a second member's share, it is deleted by us once the
 *     partition is idle, and the second member reads on from there.
 * One partition, one key, a lane of one and one worker, so the reader holds
 * entries it could not deliver. Each case asserts every event handled (by
 * either member), in order, once the gate opens (a skipped pending entry never comes back:
 * the count stays short). No timing is asserted: waits are bounds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/forged.h"
#include "support/gate.h"
#include "support/proxy.h"
#include "support/server.h"
#include "support/tracker.h"

#include <keybus/transport.h>

#define TTL_MS 3000
#define FIRST 20   /* events before the stop */
#define LATER 10   /* events published while the partition is stopped */
/* the renewal script's text, not the take's */
#define RENEWAL "KEYS[1])==ARGV[1] then return redis.call('pexpire'"

static kb_test_server server;
static redisContext *c;   /* the test's own look at the server */
static kb_gate gate;
static kb_tracker tracker;

static int gated(const kb_event *ev, void *opaque)
{
    kb_gate_pass(&gate);
    return kb_tracker_handler(ev, opaque);
}

static const char *url;   /* the members': the server's, or a proxy's */
static int ttl_ms;        /* the members' lease TTL */

static kb_bus *open_member(const char *name)
{
    char ttl[16];
    snprintf(ttl, sizeof ttl, "%d", ttl_ms);
    const char *kv[] = {"consumer", name, "partitions", "1", "redis.lease_ttl_ms", ttl,
                        "redis.publish_batch", "1", "redis.read_timeout_ms", "10000",
                        "pool.queue_capacity", "1", "pool.workers", "1", NULL};
    kb_conf *conf = kb_test_conf(url, NULL, kv);
    kb_test_log_capture(conf);
    return kb_test_open_conf(conf);
}

static void publish(kb_bus *b, const char *topic, uint32_t first, uint32_t last)
{
    for (uint32_t s = first; s <= last; s++)
        kb_assert_ok(kb_tracker_publish(b, topic, 0, s, 16));
    kb_assert_ok(kb_flush(b, 10000));
}

/* The lease's time to live is (almost) a whole TTL: renewed just now. */
static bool just_renewed(const char *lease)
{
    redisReply *r = redisCommand(c, "PTTL %s", lease);
    bool yes = r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer >= ttl_ms - 60;
    freeReplyObject(r);
    return yes;
}

/* Entries of partition 0 pending for the group (read, not acked). */
static long long pending(const char *topic)
{
    char stream[96];
    snprintf(stream, sizeof stream, "kb:{%s}:p:0", topic);
    redisReply *r = redisCommand(c, "XPENDING %s keybus", stream);
    assert_non_null(r);
    long long n = r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
                          r->element[0]->type == REDIS_REPLY_INTEGER
                      ? r->element[0]->integer
                      : 0;
    freeReplyObject(r);
    return n;
}

/* Subscribed with the gate shut: the handler holds event 1, the lane event
 * 2, and the reader the rest it read (pending, undelivered). */
static kb_bus *held_up(const char *name, const char *topic)
{
    kb_bus *a = open_member(name);
    kb_assert_ok(kb_subscribe(a, topic, gated, &tracker));
    kb_wait_until(kb_test_owned(a, topic) == 1, 10000, "%s takes the partition", name);
    publish(a, topic, 1, FIRST);
    kb_gate_wait_for_waiter(&gate);
    /* read beyond what the lane holds */
    kb_wait_until(pending(topic) >= 3, 10000, "%s reads ahead", name);
    return a;
}

/* Open the gate: every event comes, in order, each once at least. */
static void all_handled(kb_bus *a, const char *topic, uint32_t total)
{
    atomic_store(&gate.open, 1);
    kb_wait_until(kb_tracker_distinct(&tracker) >= total, 30000,
                  "%u events handled in order (a pending entry skipped never comes)", total);
    assert_int_equal(kb_tracker_distinct(&tracker), total);
    assert_int_equal(atomic_load(&tracker.order_violations), 0);
    assert_int_equal(kb_test_owned(a, topic), 1);
}

/* A name that ranks before `a` for partition 0: the partition is its share. */
static void outranking(const char *a, char *out, size_t len)
{
    for (int i = 0;; i++) {
        snprintf(out, len, "lease-kit-b%d", i);
        const char *names[] = {a, out};
        if (kb_rendezvous_owner(names, 2, 0) == 1)
            return;
    }
}

static void back_from_draining(void **state)
{
    (void)state;
    const char *topic = "lk-return";
    kb_bus *a = held_up("lease-kit-a", topic);
    char bname[32];
    outranking("lease-kit-a", bname, sizeof bname);
    kb_bus *b = open_member(bname);
    kb_tracker other;
    kb_tracker_init(&other, 1);
    kb_assert_ok(kb_subscribe(b, topic, kb_tracker_handler, &other));
    /* a sees b: its partition drains (not idle: the gate holds event 1) */
    kb_wait_until(kb_test_owned(a, topic) == 0, 10000, "a drains when b joins");
    kb_assert_ok(kb_close(b, 10000));   /* the share comes back to a before the hand-back */
    publish(a, topic, FIRST + 1, FIRST + LATER);
    /* several keeper rounds with the share back: still not read (the refused
     * entries wait in a's pending list until a hand-back and a sweep) */
    for (int i = 0; i < 200; i++) {
        assert_int_equal(kb_test_owned(a, topic), 0);
        usleep(10000);
    }
    assert_int_equal(atomic_load(&other.handled), 0);   /* b never had it */
    all_handled(a, topic, FIRST + LATER);
    kb_tracker_destroy(&other);
    kb_assert_ok(kb_close(a, 10000));
}

/* held_up, then the server just renewed (renewals come every TTL/4) stopped
 * for 0.9 TTL: the next renewal is sent, after its heartbeat, past the local
 * deadline, and run by the server at SIGCONT (a whole TTL more). */
static kb_bus *lapsed(const char *topic)
{
    kb_bus *a = held_up("lease-kit-a", topic);
    char lease[96];
    snprintf(lease, sizeof lease, "kb:{%s}:lease:0", topic);
    kb_wait_until(just_renewed(lease), 20000, "a renewal of %s", lease);
    kb_test_server_signal(&server, SIGSTOP);
    usleep((useconds_t)ttl_ms * 900);
    kb_test_server_signal(&server, SIGCONT);
    return a;
}

static void renewal_after_deadline(void **state)
{
    (void)state;
    const char *topic = "lk-lapse";
    kb_bus *a = lapsed(topic);
    publish(a, topic, FIRST + 1, FIRST + LATER);
    all_handled(a, topic, FIRST + LATER);
    kb_assert_ok(kb_close(a, 10000));
}

static void renewal_answered_after_deadline(void **state)
{
    (void)state;
    const char *topic = "lk-answer";
    kb_test_proxy *proxy = kb_test_proxy_start(server.port);
    assert_non_null(proxy);
    char proxied[64];
    snprintf(proxied, sizeof proxied, "redis://127.0.0.1:%d", kb_test_proxy_port(proxy));
    url = proxied;
    kb_bus *a = held_up("lease-kit-a", topic);
    /* the renewal reached the server, which extended the lease; its answer
     * (and everything else) is held past the previous renewal's deadline,
     * not past its own */
    assert_int_equal(kb_test_proxy_blackhole_after(proxy, RENEWAL, 10000), 0);
    usleep((useconds_t)ttl_ms * 2 / 3 * 1000);
    kb_test_proxy_blackhole(proxy, 0);
    kb_wait_until(kb_test_logged("lost the lease of kb:{lk-answer}:p:0"), 10000,
                  "the renewal answered after its deadline is a loss");
    publish(a, topic, FIRST + 1, FIRST + LATER);
    all_handled(a, topic, FIRST + LATER);
    kb_assert_ok(kb_close(a, 10000));
    kb_test_proxy_stop(proxy);
}

/* `name` is in the topic's member set: its heartbeat came. */
static bool member(const char *topic, const char *name)
{
    redisReply *r = redisCommand(c, "ZSCORE kb:{%s}:members %s", topic, name);
    bool yes = r != NULL && r->type == REDIS_REPLY_STRING;
    freeReplyObject(r);
    return yes;
}

/* A lapse (the SIGSTOP case's) leaves the lease holding our token for a
 * whole TTL from the renewal the server ran at SIGCONT; the partition is
 * then b's share. Once it is idle (the gate opens) a deletes that lease
 * itself, as a hand-back does, instead of leaving b waiting out the TTL:
 * a says so, and b reads the partition. A longer TTL here leaves the
 * keeper's rounds (TTL/4) room before the lease would expire anyway. */
static void lost_lease_is_let_go(void **state)
{
    (void)state;
    const char *topic = "lk-let-go";
    /* a must see b (two of its rounds) before a's late-renewed lease runs
     * out by itself: both margins grow with the TTL, so slow builds and a
     * loaded machine get a longer one */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    ttl_ms = 10 * TTL_MS;
#else
    ttl_ms = 5 * TTL_MS;
#endif
    kb_bus *a = lapsed(topic);
    kb_wait_until(kb_test_logged("lost the lease of kb:{lk-let-go}:p:0"), 20000,
                  "a's renewal after its deadline is a loss");
    char bname[32];
    outranking("lease-kit-a", bname, sizeof bname);
    kb_bus *b = open_member(bname);
    /* a's numbering goes on: distinct counts from 1, which a handled */
    kb_assert_ok(kb_subscribe(b, topic, kb_tracker_handler, &tracker));
    kb_wait_until(member(topic, bname), 10000, "%s's heartbeat", bname);
    usleep((useconds_t)ttl_ms * 500);   /* two of a's rounds (TTL/4 apart): it sees b */
    atomic_store(&gate.open, 1);
    kb_wait_until(kb_test_logged("let go of the lease of kb:{lk-let-go}:p:0"), 20000,
                  "a deletes the lease it lost but still holds");
    kb_wait_until(kb_test_owned(b, topic) == 1, 20000, "%s takes the partition", bname);
    /* event 1 was a's; b sweeps the rest a left pending, in order */
    kb_wait_until(kb_tracker_distinct(&tracker) >= FIRST, 30000, "%s handles what a left", bname);
    assert_int_equal(atomic_load(&tracker.order_violations), 0);
    kb_assert_ok(kb_close(b, 10000));
    kb_assert_ok(kb_close(a, 10000));
}

static int setup(void **state)
{
    (void)state;
    memset(&gate, 0, sizeof gate);
    kb_tracker_init(&tracker, 1);
    if (kb_test_server_start(&server, "redis", NULL) != 0)
        return -1;
    url = server.url;
    ttl_ms = TTL_MS;
    c = redisConnect("127.0.0.1", server.port);
    return c != NULL && c->err == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    atomic_store(&gate.open, 1);
    kb_test_server_signal(&server, SIGCONT);
    if (c != NULL)
        redisFree(c);
    c = NULL;
    kb_test_server_stop(&server);
    kb_tracker_destroy(&tracker);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(back_from_draining, setup, teardown),
        cmocka_unit_test_setup_teardown(renewal_after_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(renewal_answered_after_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(lost_lease_is_let_go, setup, teardown),
    };
    return cmocka_run_group_tests_name("redis_lease_kit", tests, NULL, NULL);
}
