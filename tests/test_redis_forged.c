/* Coordination data another client forged (docs/security.md): members scored
 * in the far future are dropped (they had left partitions unowned); a
 * foreign attempt count `a` is capped at retry.max_attempts (it had sent the
 * entry straight to the DLQ); a dead letter's partition and attempts fields
 * are range-checked and a replay says the partition it used. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/forged.h"
#include "support/server.h"

static kb_test_server server;

static redisContext *raw(void)
{
    redisContext *c = redisConnect("127.0.0.1", server.port);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    return c;
}

static void topic_name(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "rfg.%s.%d", what, (int)getpid());
}

typedef struct seen {
    _Atomic int calls;
    _Atomic uint32_t max_attempt;
} seen;

static int handled(const kb_event *ev, void *opaque)
{
    seen *s = opaque;
    atomic_fetch_add(&s->calls, 1);
    if (ev->attempt > atomic_load(&s->max_attempt))
        atomic_store(&s->max_attempt, ev->attempt);
    return KB_HANDLED;
}

static kb_bus *open_logged(const char *consumer)
{
    const char *const kv[] = {"consumer", consumer, "redis.lease_ttl_ms", "1000", NULL};
    kb_conf *c = kb_test_conf(server.url, kv, NULL);
    kb_test_log_capture(c);
    return kb_test_open_conf(c);
}

/* Three members scored a year ahead, no process behind them: 4 of 8
 * partitions stayed unowned (9 of 16 events handled after 30 s). */
static void future_members_are_dropped(void **state)
{
    (void)state;
    char topic[64], members[128];
    topic_name(topic, sizeof topic, "members");
    snprintf(members, sizeof members, "kb:{%s}:members", topic);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long year = (long long)ts.tv_sec * 1000 + 365LL * 24 * 3600 * 1000;
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "ZADD %s %lld ghost-1 %lld ghost-2 %lld ghost-3", members,
                                 year, year, year));
    kb_bus *b = open_logged("rfg-members");
    seen s = {0};
    kb_assert_ok(kb_subscribe(b, topic, handled, &s));
    for (int i = 0; i < 16; i++) {
        char key[16];
        int n = snprintf(key, sizeof key, "agg-%d", i);
        kb_assert_ok(kb_publish(b, topic, key, (size_t)n, "x", 1));
    }
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(atomic_load(&s.calls), 16);
    redisReply *r = redisCommand(c, "ZRANGE %s 0 -1", members);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < r->elements; i++)
        assert_null(strstr(r->element[i]->str, "ghost"));
    freeReplyObject(r);
    assert_true(kb_test_logged("scored past now"));
    kb_assert_ok(kb_close(b, 30000));
    redisFree(c);
}

/* A foreign `a` of 99 (retry.max_attempts 5) sent the entry to the DLQ
 * without a run; now the handler runs it, as its last allowed attempt. */
static void foreign_attempt_is_capped(void **state)
{
    (void)state;
    char topic[64], stream[128];
    topic_name(topic, sizeof topic, "attempt");
    snprintf(stream, sizeof stream, "kb:{%s}:p:%u", topic, kb_fnv1a32("agg-a", 5) % 8);
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "XADD %s * k agg-a d x a 99", stream));
    kb_bus *b = open_logged("rfg-attempt");
    seen s = {0};
    kb_assert_ok(kb_subscribe(b, topic, handled, &s));
    for (int i = 0; i < 300 && atomic_load(&s.calls) == 0; i++)
        usleep(20000);
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(atomic_load(&s.calls), 1);
    assert_int_equal(atomic_load(&s.max_attempt), 5);
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.dlq_length, 0);
    kb_assert_ok(kb_close(b, 30000));
    redisFree(c);
}

/* A dead letter whose partition says 999 (of 8) and attempts 11 digits: it
 * lists with the key's partition and 0 attempts; the replay goes to the
 * key's partition and says so. */
static void forged_dead_letter_fields_are_range_checked(void **state)
{
    (void)state;
    char topic[64], dlq[128];
    topic_name(topic, sizeof topic, "dlq");
    snprintf(dlq, sizeof dlq, "kb:{%s}:dlq", topic);
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "XADD %s * k agg-d d x partition 999 orig_id 1-1 "
                                    "attempts 99999999999 reason forged", dlq));
    kb_bus *b = open_logged("rfg-dlq");
    seen s = {0};
    kb_assert_ok(kb_subscribe(b, topic, handled, &s));
    kb_test_forged_dead_letter_replays(b, topic, "agg-d", &s.calls);
    assert_true(kb_test_logged("its partition field said \"999\""));
    kb_assert_ok(kb_close(b, 30000));
    redisFree(c);
}

static int setup(void **state)
{
    (void)state;
    return kb_test_server_start(&server, "redis", NULL);
}

static int teardown(void **state)
{
    (void)state;
    kb_test_server_stop(&server);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(future_members_are_dropped),
        cmocka_unit_test(foreign_attempt_is_capped),
        cmocka_unit_test(forged_dead_letter_fields_are_range_checked),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
