/* What docs/transports-redis.md says of the figures and the DLQ: a dead
 * letter keeps every field of the original entry (`a` and fields other
 * clients wrote included) before keybus's four; broker_lag counts entries
 * not yet delivered to the group, also before the group exists, and is
 * checked against the stream's last ID rather than passed through. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/server.h"

static kb_test_server server;

static kb_bus *open_as(const char *consumer)
{
    const char *const kv[] = {"consumer", consumer, "retry.backoff_ms", "1",
                              "retry.max_backoff_ms", "4", NULL};
    return kb_test_open(server.url, kv, NULL);
}

static redisContext *raw(void)
{
    redisContext *c = redisConnect("127.0.0.1", server.port);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    return c;
}

static void unique_topic(char *buf, size_t len, const char *name)
{
    static int seq;
    snprintf(buf, len, "rf.%s.%d.%d", name, (int)getpid(), ++seq);
}

static int dead(const kb_event *ev, void *opaque)
{
    (void)ev;
    atomic_fetch_add((_Atomic int *)opaque, 1);
    kb_event_set_reason(ev, "refused");
    return KB_DEAD;
}

/* The value of field `name` in a flat reply, from position `from` on. */
static const char *field(const redisReply *f, size_t from, const char *name)
{
    for (size_t i = from; i + 1 < f->elements; i += 2)
        if (strcmp(f->element[i]->str, name) == 0)
            return f->element[i + 1]->str;
    return NULL;
}

static int reason_of(const kb_dead_letter *dl, void *opaque)
{
    snprintf(opaque, 64, "%s/%u", dl->reason, dl->attempts);
    return 0;
}

static void dead_letters_keep_every_original_field(void **state)
{
    (void)state;
    char topic[96], stream[160], dlq[160];
    unique_topic(topic, sizeof topic, "fields");
    snprintf(stream, sizeof stream, "kb:{%s}:p:%u", topic, kb_fnv1a32("agg-1", 5) % 8);
    snprintf(dlq, sizeof dlq, "kb:{%s}:dlq", topic);
    redisContext *c = raw();
    /* another client's entry: its own fields, one named like keybus's */
    freeReplyObject(redisCommand(c, "XADD %s * k agg-1 d hello a 1 x extra reason theirs",
                                 stream));
    kb_bus *b = open_as("rf-fields");
    _Atomic int calls = 0;
    kb_assert_ok(kb_subscribe(b, topic, dead, &calls));
    kb_assert_ok(kb_publish(b, topic, "agg-1", 5, "mine", 4));
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(atomic_load(&calls), 2);

    redisReply *r = redisCommand(c, "XRANGE %s - +", dlq);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 2);
    const redisReply *f = r->element[0]->element[1];
    /* the original entry whole, in its order, then keybus's fields */
    const char *want[] = {"k", "agg-1", "d", "hello", "a", "1", "x", "extra", "reason", "theirs",
                          "partition", NULL, "orig_id", NULL, "attempts", "1", "reason",
                          "refused"};
    assert_int_equal(f->elements, sizeof want / sizeof *want);
    for (size_t i = 0; i < f->elements; i++)
        if (want[i] != NULL)
            assert_string_equal(f->element[i]->str, want[i]);
    /* keybus's own event: k, d and a as published */
    f = r->element[1]->element[1];
    assert_string_equal(field(f, 0, "k"), "agg-1");
    assert_string_equal(field(f, 0, "d"), "mine");
    assert_string_equal(field(f, 0, "a"), "1");
    freeReplyObject(r);

    /* kb_dead_letters reads keybus's reason, not the original's field */
    char seen[64] = "";
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 1, reason_of, seen));
    assert_string_equal(seen, "refused/1");
    kb_assert_ok(kb_close(b, 30000));
    redisFree(c);
}

static int handled(const kb_event *ev, void *opaque)
{
    (void)ev;
    atomic_fetch_add((_Atomic int *)opaque, 1);
    return KB_HANDLED;
}

static void lag_counts_entries_not_yet_delivered(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "lag");
    kb_bus *pub = open_as("rf-pub");
    char key[16];
    for (int i = 0; i < 40; i++) {
        int n = snprintf(key, sizeof key, "agg-%d", i);
        kb_assert_ok(kb_publish(pub, topic, key, (size_t)n, "x", 1));
    }
    kb_assert_ok(kb_flush(pub, 30000));
    /* no group yet: every entry waits */
    kb_topic_stats st;
    kb_assert_ok(kb_stats(pub, topic, &st));
    assert_int_equal(st.broker_length, 40);
    assert_int_equal(st.broker_lag, 40);
    uint64_t per_partition = 0;
    for (uint32_t p = 0; p < 8; p++) {
        kb_partition_stats ps;
        kb_assert_ok(kb_partition_stats_get(pub, topic, p, &ps));
        assert_int_equal(ps.lag, ps.length);
        per_partition += ps.lag;
    }
    assert_int_equal(per_partition, 40);

    kb_bus *con = open_as("rf-con");
    _Atomic int calls = 0;
    kb_assert_ok(kb_subscribe(con, topic, handled, &calls));
    kb_assert_ok(kb_drain(pub, 30000));
    kb_assert_ok(kb_close(con, 30000));
    kb_assert_ok(kb_stats(pub, topic, &st));
    assert_int_equal(st.broker_lag, 0);

    /* a server figure that disagrees with the IDs (as after a restart): the
     * group has delivered the last ID, so nothing lags */
    redisContext *c = raw();
    for (uint32_t p = 0; p < 8; p++) {
        redisReply *r = redisCommand(c, "XGROUP SETID kb:{%s}:p:%u keybus $ ENTRIESREAD 0",
                                     topic, p);
        assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
        freeReplyObject(r);
    }
    redisReply *r = redisCommand(c, "XINFO GROUPS kb:{%s}:p:%u", topic,
                                 kb_fnv1a32("agg-0", 5) % 8);
    assert_true(r->elements >= 1);
    redisReply *row = r->element[0];
    long long server_lag = -1;
    for (size_t i = 0; i + 1 < row->elements; i += 2)
        if (strcmp(row->element[i]->str, "lag") == 0 && row->element[i + 1]->type == REDIS_REPLY_INTEGER)
            server_lag = row->element[i + 1]->integer;
    freeReplyObject(r);
    assert_true(server_lag > 0);   /* the server's figure is wrong */
    kb_assert_ok(kb_stats(pub, topic, &st));
    assert_int_equal(st.broker_lag, 0);
    redisFree(c);
    kb_assert_ok(kb_close(pub, 30000));
}

int main(void)
{
    if (kb_test_server_start(&server, "redis", NULL) != 0) {
        fprintf(stderr, "cannot start redis-server\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dead_letters_keep_every_original_field),
        cmocka_unit_test(lag_counts_entries_not_yet_delivered),
    };
    int failed = cmocka_run_group_tests_name("redis_figures", tests, NULL, NULL);
    kb_test_server_stop(&server);
    return failed;
}
