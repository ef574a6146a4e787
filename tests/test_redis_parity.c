/* Redis transport parity (issue 9): kb_drain waits for consumers wherever
 * they run (and for one to exist), headers as "h.<name>" entry fields both
 * ways with plain hiredis, malformed header fields dead-lettered with their
 * reason, replay restores headers and counts as published once, and a
 * monitor bus that never published or subscribed reads the broker figures. */
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
#include "support/server.h"
#include "support/tracker.h"

static kb_test_server server;

static kb_bus *open_as(const char *consumer)
{
    const char *const kv[] = {"consumer", consumer, "retry.backoff_ms", "1",
                              "retry.max_backoff_ms", "4", "redis.lease_ttl_ms", "2000", NULL};
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
    snprintf(buf, len, "rp.%s.%d.%d", name, (int)getpid(), ++seq);
}

static void partition_of(char *buf, size_t len, const char *topic, const char *key)
{
    snprintf(buf, len, "kb:{%s}:p:%u", topic, kb_fnv1a32(key, strlen(key)) % 8);
}

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- kb_drain ---- */

struct timed {
    kb_tracker t;
    _Atomic int64_t last_us;   /* when the last handler call ended */
};

static int timed_handler(const kb_event *ev, void *opaque)
{
    struct timed *tm = opaque;
    int rc = kb_tracker_handler(ev, &tm->t);
    atomic_store(&tm->last_us, mono_us());
    return rc;
}

static void report_latency(const char *what, const struct timed *tm)
{
    fprintf(stderr, "kb_drain returned %.2f ms after the last handled event (%s)\n",
            (double)(mono_us() - atomic_load(&tm->last_us)) / 1000.0, what);
}

/* Publisher and consumer on different buses (as two processes would be):
 * kb_drain first times out while no consumer exists, then returns once the
 * other bus has handled every event, with nothing left to handle. */
static void drain_waits_for_consumers_elsewhere(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "elsewhere");
    kb_bus *pub = open_as("rp-publisher");
    for (uint32_t seq = 1; seq <= 20; seq++)
        for (uint32_t k = 0; k < 10; k++)
            kb_assert_ok(kb_tracker_publish(pub, topic, k, seq, 16));
    assert_int_equal(kb_drain(pub, 200), KB_ETIMEDOUT);   /* no group, no consumer */

    kb_bus *con = open_as("rp-consumer");
    struct timed tm = {0};
    kb_tracker_init(&tm.t, 10);
    kb_assert_ok(kb_subscribe(con, topic, timed_handler, &tm));
    kb_assert_ok(kb_drain(pub, 30000));
    report_latency("consumer on another bus, polled", &tm);
    assert_int_equal(kb_tracker_distinct(&tm.t), 200);

    /* more while it runs: the second drain waits for those too */
    for (uint32_t k = 0; k < 10; k++)
        kb_assert_ok(kb_tracker_publish(pub, topic, k, 21, 16));
    kb_assert_ok(kb_drain(pub, 30000));
    assert_int_equal(kb_tracker_distinct(&tm.t), 210);
    assert_int_equal(tm.t.order_violations, 0);
    assert_int_equal(tm.t.duplicates, 0);
    kb_assert_ok(kb_close(con, 30000));
    kb_assert_ok(kb_close(pub, 30000));
    kb_tracker_destroy(&tm.t);
}

/* Entries other clients added do not count: with none of its own, a bus
 * drains at once although nobody consumes the topic. */
static void drain_ignores_foreign_entries(void **state)
{
    (void)state;
    char topic[96], stream[160];
    unique_topic(topic, sizeof topic, "foreign");
    partition_of(stream, sizeof stream, topic, "agg-1");
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "XADD %s * k agg-1 d foreign", stream));
    kb_bus *b = open_as("rp-foreign");
    struct timed tm = {0};
    kb_tracker_init(&tm.t, 5);
    kb_assert_ok(kb_drain(b, 30000));
    /* its own events on the same bus, consumed here: woken by its own acks */
    kb_assert_ok(kb_subscribe(b, topic, timed_handler, &tm));
    for (uint32_t seq = 1; seq <= 10; seq++)
        for (uint32_t k = 0; k < 5; k++)
            kb_assert_ok(kb_tracker_publish(b, topic, k, seq, 16));
    kb_assert_ok(kb_drain(b, 30000));
    report_latency("consumer on the same bus, woken by its acks", &tm);
    assert_int_equal(kb_tracker_distinct(&tm.t), 50);
    kb_assert_ok(kb_close(b, 30000));
    kb_tracker_destroy(&tm.t);
    redisFree(c);
}

/* ---- headers ---- */

#define MAX_HEADERS_SEEN 4

/* The headers of the last call; the main thread reads them once `calls`
 * (stored after them) says the call it waits for happened. */
struct header_seen {
    _Atomic int calls;
    int n_headers;
    char names[MAX_HEADERS_SEEN][80], values[MAX_HEADERS_SEEN][80];
    int dead_first;            /* KB_DEAD on the first call */
};

static int header_handler(const kb_event *ev, void *opaque)
{
    struct header_seen *hs = opaque;
    memset(hs->names, 0, sizeof hs->names);
    memset(hs->values, 0, sizeof hs->values);
    hs->n_headers = (int)ev->n_headers;
    for (size_t i = 0; i < ev->n_headers && i < MAX_HEADERS_SEEN; i++) {
        snprintf(hs->names[i], sizeof hs->names[i], "%s", ev->headers[i].name);
        snprintf(hs->values[i], sizeof hs->values[i], "%.*s", (int)ev->headers[i].value_len,
                 (const char *)ev->headers[i].value);
    }
    bool dead = hs->dead_first && atomic_load(&hs->calls) == 0;
    if (dead)
        kb_event_set_reason(ev, "first call of %.*s", (int)ev->key_len, (const char *)ev->key);
    atomic_fetch_add(&hs->calls, 1);
    return dead ? KB_DEAD : KB_HANDLED;
}

#define TRACEPARENT "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

/* A plain XADD with h.* fields reaches the handler as headers, in order; a
 * keybus publish with headers shows them as h.* fields to a plain XRANGE. */
static void headers_interop(void **state)
{
    (void)state;
    char topic[96], stream[160];
    unique_topic(topic, sizeof topic, "hinterop");
    partition_of(stream, sizeof stream, topic, "order-1");
    redisContext *c = raw();
    kb_bus *b = open_as("rp-hinterop");
    struct header_seen hs = {0};
    kb_assert_ok(kb_subscribe(b, topic, header_handler, &hs));
    redisReply *r = redisCommand(c, "XADD %s * k order-1 d created h.traceparent %s h.ce-type %s",
                                 stream, TRACEPARENT, "com.example.order.created");
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    freeReplyObject(r);
    /* a keybus event of the same key behind it: kb_drain covers both */
    kb_topic *t = kb_topic_get(b, topic, NULL, 0);
    assert_non_null(t);
    kb_header h[2] = {{"traceparent", TRACEPARENT, strlen(TRACEPARENT)}, {"empty", "", 0}};
    kb_msg m = {"order-1", 7, "paid", 4, 0, h, 2};
    kb_assert_ok(kb_publish_ex(t, &m));
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(hs.calls, 2);
    assert_int_equal(hs.n_headers, 2);   /* the second event's */
    assert_string_equal(hs.names[0], "traceparent");
    assert_string_equal(hs.values[0], TRACEPARENT);
    assert_string_equal(hs.names[1], "empty");
    assert_string_equal(hs.values[1], "");

    r = redisCommand(c, "XRANGE %s - +", stream);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 2);
    const redisReply *f = r->element[1]->element[1];
    const char *want[] = {"k", "order-1", "d", "paid", "a", "1", "h.traceparent", TRACEPARENT,
                          "h.empty", ""};
    assert_int_equal(f->elements, 10);
    for (size_t i = 0; i < 10; i++)
        assert_string_equal(f->element[i]->str, want[i]);
    freeReplyObject(r);
    kb_assert_ok(kb_close(b, 30000));
    redisFree(c);
}

struct dl_seen {
    int n, malformed;
    char reason[8][200];
    int n_headers[8];
};

static int collect(const kb_dead_letter *dl, void *opaque)
{
    struct dl_seen *s = opaque;
    if (s->n < 8) {
        snprintf(s->reason[s->n], sizeof s->reason[0], "%s", dl->reason);
        s->n_headers[s->n] = (int)dl->n_headers;
    }
    s->malformed += strstr(dl->reason, "malformed header field") != NULL;
    s->n++;
    return 0;
}

/* Header fields other clients wrote that break the kb_header rules go to the
 * DLQ, kept whole, with the rule in the reason; the key's later events are
 * handled. */
static void malformed_headers_dead_lettered(void **state)
{
    (void)state;
    char topic[96], stream[160];
    unique_topic(topic, sizeof topic, "hbad");
    partition_of(stream, sizeof stream, topic, "agg-1");
    redisContext *c = raw();
    const char *bad[][2] = {
        {"h.bad name", "v"},     /* space in the name */
        {"h.Kb-attempt", "3"},   /* reserved prefix */
        {"h.", "v"},             /* empty name */
        {"h.x", "a\r\nb"},       /* CR LF in the value */
        {"h.nul\0x", "v"},       /* NUL in the name (its length says 7) */
    };
    for (size_t i = 0; i < 5; i++) {
        const char *argv[] = {"XADD", stream, "*", "k", "agg-1", "d", "p", bad[i][0], bad[i][1]};
        size_t lens[] = {4, strlen(stream), 1, 1, 5, 1, 1, i == 4 ? 7 : strlen(bad[i][0]),
                         strlen(bad[i][1])};
        redisReply *r = redisCommandArgv(c, 9, argv, lens);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        freeReplyObject(r);
    }
    kb_bus *b = open_as("rp-hbad");
    struct header_seen hs = {0};
    kb_assert_ok(kb_subscribe(b, topic, header_handler, &hs));
    kb_assert_ok(kb_publish(b, topic, "agg-1", 5, "fine", 4));
    kb_assert_ok(kb_drain(b, 30000));   /* covers the entries before ours */
    assert_int_equal(hs.calls, 1);
    struct dl_seen s = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 100, collect, &s));
    assert_int_equal(s.n, 5);
    assert_int_equal(s.malformed, 5);
    assert_non_null(strstr(s.reason[0], "allowed: letters"));
    assert_non_null(strstr(s.reason[1], "reserved"));
    assert_non_null(strstr(s.reason[2], "empty"));
    assert_non_null(strstr(s.reason[3], "CR"));
    assert_non_null(strstr(s.reason[4], "NUL"));
    assert_int_equal(s.n_headers[0], 1);   /* kept as stored */
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.dlq_length, 5);
    assert_int_equal(st.broker_pending, 0);
    kb_assert_ok(kb_close(b, 30000));
    redisFree(c);
}

/* ---- replay ---- */

static int first_id(const kb_dead_letter *dl, void *opaque)
{
    snprintf(opaque, 64, "%s", dl->id);
    return 1;
}

/* A dead letter keeps its headers and its time (the DLQ entry ID's ms);
 * replayed, the event comes back with its headers, counts as published, and
 * leaves the DLQ: a second replay finds nothing. */
static void replay_restores_headers_once(void **state)
{
    (void)state;
    char topic[96], id[64] = "";
    unique_topic(topic, sizeof topic, "replay");
    kb_bus *b = open_as("rp-replay");
    struct header_seen hs = {.dead_first = 1};
    kb_assert_ok(kb_subscribe(b, topic, header_handler, &hs));
    kb_topic *t = kb_topic_get(b, topic, NULL, 0);
    kb_header h[1] = {{"ce-id", "42", 2}};
    kb_msg m = {"order-9", 7, "x", 1, 0, h, 1};
    kb_assert_ok(kb_publish_ex(t, &m));
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(hs.calls, 1);
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.published, 1);
    assert_int_equal(st.dlq_length, 1);
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 1, first_id, id));
    struct dl_seen s = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 10, collect, &s));
    assert_int_equal(s.n, 1);
    assert_string_equal(s.reason[0], "first call of order-9");
    assert_int_equal(s.n_headers[0], 1);

    kb_assert_ok(kb_dead_letter_replay(b, topic, id));
    assert_int_equal(kb_dead_letter_replay(b, topic, id), KB_ENOTFOUND);
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(hs.calls, 2);
    assert_int_equal(hs.n_headers, 1);
    assert_string_equal(hs.names[0], "ce-id");
    assert_string_equal(hs.values[0], "42");
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.published, 2);
    assert_int_equal(st.dlq_length, 0);
    assert_int_equal(st.broker_length, 2);
    assert_int_equal(st.broker_pending, 0);
    kb_assert_ok(kb_close(b, 30000));
}

static int time_of(const kb_dead_letter *dl, void *opaque)
{
    int64_t *ms = opaque;
    *ms = dl->time_ms == strtoll(dl->id, NULL, 10) ? dl->time_ms : -1;
    return 1;
}

/* ---- stats from a monitor ---- */

/* A bus that never published or subscribed the topic reads its broker
 * figures; `published` is the publishing process's alone; no frames here. */
static void monitor_reads_broker_figures(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "monitor");
    kb_bus *mon = open_as("rp-monitor");
    kb_topic_stats st;
    assert_int_equal(kb_stats(mon, topic, &st), KB_ENOTFOUND);
    kb_bus *pub = open_as("rp-mpub");
    for (uint32_t seq = 1; seq <= 3; seq++)
        for (uint32_t k = 0; k < 10; k++)
            kb_assert_ok(kb_tracker_publish(pub, topic, k, seq, 16));
    kb_assert_ok(kb_flush(pub, 30000));
    kb_assert_ok(kb_stats(mon, topic, &st));
    assert_int_equal(st.published, 0);
    assert_int_equal(st.broker_length, 30);
    assert_int_equal(st.partitions, 8);
    assert_int_equal(st.partitions_owned, 0);
    assert_int_equal(st.broker_frames, 0);
    kb_assert_ok(kb_stats(pub, topic, &st));
    assert_int_equal(st.published, 30);

    kb_bus *con = open_as("rp-mcon");
    kb_tracker t;
    kb_tracker_init(&t, 10);
    kb_assert_ok(kb_subscribe(con, topic, kb_tracker_handler, &t));
    /* an entry without payload from another client, dead-lettered, so the
     * DLQ shows up in the monitor too; our next event of its key covers it */
    char stream[160];
    partition_of(stream, sizeof stream, topic, "agg-0");
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "XADD %s * k agg-0", stream));
    redisFree(c);
    kb_assert_ok(kb_tracker_publish(pub, topic, 0, 4, 16));
    kb_assert_ok(kb_drain(pub, 30000));
    kb_assert_ok(kb_stats(mon, topic, &st));
    assert_int_equal(st.published, 0);
    assert_int_equal(st.broker_length, 32);
    assert_int_equal(st.broker_pending, 0);
    assert_int_equal(st.broker_lag, 0);
    assert_int_equal(st.dlq_length, 1);
    assert_int_equal(st.broker_frames, 0);
    int64_t ms = 0;
    kb_assert_ok(kb_dead_letters(mon, topic, NULL, 1, time_of, &ms));
    assert_true(ms > 0);
    uint32_t owned = 0;
    for (uint32_t p = 0; p < 8; p++) {
        kb_partition_stats ps;
        kb_assert_ok(kb_partition_stats_get(mon, topic, p, &ps));
        owned += strcmp(ps.owner, "rp-mcon") == 0;
        assert_int_equal(ps.pending, 0);
    }
    assert_int_equal(owned, 8);
    kb_assert_ok(kb_close(con, 30000));
    kb_assert_ok(kb_close(pub, 30000));
    kb_assert_ok(kb_close(mon, 30000));
    assert_int_equal(kb_tracker_distinct(&t), 31);
    kb_tracker_destroy(&t);
}

int main(void)
{
    if (kb_test_server_start(&server, "redis", NULL) != 0) {
        fprintf(stderr, "cannot start redis-server\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(drain_waits_for_consumers_elsewhere),
        cmocka_unit_test(drain_ignores_foreign_entries),
        cmocka_unit_test(headers_interop),
        cmocka_unit_test(malformed_headers_dead_lettered),
        cmocka_unit_test(replay_restores_headers_once),
        cmocka_unit_test(monitor_reads_broker_figures),
    };
    int failed = cmocka_run_group_tests_name("redis_parity", tests, NULL, NULL);
    kb_test_server_stop(&server);
    return failed;
}
