/* NATS transport against a real nats-server -js: other clients' messages on
 * the partition subjects, foreign and malformed messages, dead-letter replay,
 * stats, dotted topics and connection failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/check.h"
#include "support/suite.h"
#include "support/tracker.h"

static kb_test_server server;

static kb_bus *open_bus(void)
{
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "transport", server.url, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "retry.backoff_ms", "1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "retry.max_backoff_ms", "2", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open: %s", err);
    return b;
}

static void wait_distinct(kb_tracker *t, uint64_t n)
{
    for (int i = 0; i < 2000 && kb_tracker_distinct(t) < n; i++)
        usleep(10000);
}

/* A plain nats.c client publishes on kb.<topic>.N with the Kb-Key header:
 * keybus consumes it in order per key. */
static void plain_client_messages_in_order(void **state)
{
    (void)state;
    kb_bus *b = open_bus();
    const char *topic = "interop.plain";
    kb_tracker t;
    kb_tracker_init(&t, 20);
    kb_assert_ok(kb_subscribe(b, topic, kb_tracker_handler, &t));

    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    for (uint32_t seq = 1; seq <= 25; seq++)
        for (uint32_t k = 0; k < 20; k++) {
            char key[32], subj[64];
            int klen = snprintf(key, sizeof key, "agg-%u", k);
            snprintf(subj, sizeof subj, "kb.%s.%u", topic, kb_fnv1a32(key, (size_t)klen) % 8);
            unsigned char payload[8];
            memcpy(payload, &k, 4);
            memcpy(payload + 4, &seq, 4);
            natsMsg *m = NULL;
            assert_int_equal(natsMsg_Create(&m, subj, NULL, (const char *)payload, 8), NATS_OK);
            assert_int_equal(natsMsgHeader_Set(m, "Kb-Key", key), NATS_OK);
            assert_int_equal(js_PublishMsgAsync(js, &m, NULL), NATS_OK);
        }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 10000;
    assert_int_equal(js_PublishAsyncComplete(js, &po), NATS_OK);
    wait_distinct(&t, 500);
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(kb_tracker_distinct(&t), 500);
    assert_int_equal(t.order_violations, 0);
    assert_int_equal(t.concurrent, 0);
    kb_tracker_destroy(&t);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

struct dl_seen {
    int n;
    char ids[8][24];
    char reasons[8][128];
};

static int collect(const kb_dead_letter *dl, void *opaque)
{
    struct dl_seen *s = opaque;
    if (s->n < 8) {
        snprintf(s->ids[s->n], sizeof s->ids[0], "%s", dl->id);
        snprintf(s->reasons[s->n], sizeof s->reasons[0], "%s", dl->reason);
    }
    s->n++;
    return 0;
}

static _Atomic int good_seen;

static int count_good(const kb_event *ev, void *opaque)
{
    (void)opaque;
    if (ev->payload_len == 4 && memcmp(ev->payload, "good", 4) == 0)
        good_seen++;
    return KB_HANDLED;
}

/* Messages keybus did not write (no key header), with a bad key encoding or
 * on the wrong partition go to the dead letters with a reason; a replayed
 * dead letter with a key is consumed. */
static void foreign_messages_dead_letter_and_replay(void **state)
{
    (void)state;
    kb_bus *b = open_bus();
    const char *topic = "interop.foreign";
    good_seen = 0;
    kb_assert_ok(kb_subscribe(b, topic, count_good, NULL));
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    jsPubAck *pa = NULL;
    assert_int_equal(js_Publish(&pa, js, "kb.interop.foreign.0", "raw", 3, NULL, NULL), NATS_OK);
    jsPubAck_Destroy(pa);
    natsMsg *m = NULL;
    assert_int_equal(natsMsg_Create(&m, "kb.interop.foreign.1", NULL, "x", 1), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Kb-Bin-Key", "%%%"), NATS_OK);
    assert_int_equal(js_PublishMsg(&pa, js, m, NULL, NULL), NATS_OK);
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
    /* "k" hashes to one partition; publish it on another one. */
    uint32_t home = kb_fnv1a32("k", 1) % 8;
    char subj[64];
    snprintf(subj, sizeof subj, "kb.interop.foreign.%u", (home + 1) % 8);
    assert_int_equal(natsMsg_Create(&m, subj, NULL, "good", 4), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Kb-Key", "k"), NATS_OK);
    assert_int_equal(js_PublishMsg(&pa, js, m, NULL, NULL), NATS_OK);
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);

    kb_topic_stats st = {0};
    for (int i = 0; i < 1000; i++) {
        kb_assert_ok(kb_stats(b, topic, &st));
        if (st.dlq_length == 3 && st.partitions_owned == 8)   /* leases settle under load */
            break;
        usleep(10000);
    }
    assert_int_equal(st.dlq_length, 3);
    assert_int_equal(st.partitions, 8);
    assert_int_equal(st.partitions_owned, 8);
    struct dl_seen seen = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 10, collect, &seen));
    assert_int_equal(seen.n, 3);
    /* Partitions are consumed in parallel: the order of the three varies. */
    int keyless = -1, malformed = -1, misrouted = -1;
    for (int i = 0; i < 3; i++) {
        if (strstr(seen.reasons[i], "not written by keybus"))
            keyless = i;
        else if (strstr(seen.reasons[i], "malformed"))
            malformed = i;
        else if (strstr(seen.reasons[i], "belongs to partition"))
            misrouted = i;
    }
    assert_true(keyless >= 0 && malformed >= 0 && misrouted >= 0);
    /* Paging: after the first one, two remain. */
    struct dl_seen rest = {0};
    kb_assert_ok(kb_dead_letters(b, topic, seen.ids[0], 10, collect, &rest));
    assert_int_equal(rest.n, 2);
    /* The keyless one cannot be replayed; the misrouted one can. */
    assert_int_equal(kb_dead_letter_replay(b, topic, seen.ids[keyless]), KB_EINVAL);
    kb_assert_ok(kb_dead_letter_replay(b, topic, seen.ids[misrouted]));
    kb_wait_until(good_seen >= 1, 10000, "the replayed dead letter handled");
    assert_int_equal(good_seen, 1);
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.dlq_length, 2);
    kb_partition_stats ps;
    kb_assert_ok(kb_partition_stats_get(b, topic, home, &ps));
    assert_int_equal(ps.length, 1);
    assert_int_equal(ps.consumers, 1);
    assert_true(ps.owner[0] != '\0');
    assert_int_equal(kb_partition_stats_get(b, topic, 8, &ps), KB_ENOTFOUND);
    kb_assert_ok(kb_close(b, 10000));
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

static _Atomic int refused_runs;

/* The first event goes to the dead letters, the rest are handled. */
static int dead_first(const kb_event *ev, void *opaque)
{
    (void)ev;
    (void)opaque;
    return atomic_fetch_add(&refused_runs, 1) == 0 ? KB_DEAD : KB_HANDLED;
}

/* Room for what the stream holds and no more (max < 0: no limit), new
 * messages refused: a publish gets a JetStream error. */
static void stream_max_msgs(jsCtx *js, const char *topic, bool full)
{
    char stream[64];
    kb_test_nats_stream(topic, stream, sizeof stream);
    jsStreamInfo *si = NULL, *up = NULL;
    assert_int_equal(js_GetStreamInfo(&si, js, stream, NULL, NULL), NATS_OK);
    si->Config->MaxMsgs = full ? (int64_t)si->State.Msgs : -1;
    si->Config->Discard = js_DiscardNew;
    assert_int_equal(js_UpdateStream(&up, js, si->Config, NULL, NULL), NATS_OK);
    jsStreamInfo_Destroy(up);
    jsStreamInfo_Destroy(si);
}

static uint64_t dlq_length(kb_bus *b, const char *topic)
{
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    return st.dlq_length;
}

/* A dead letter whose republish the server refuses (the stream is full) is
 * kept: kb_dead_letter_replay returns KB_ETRANSPORT, and kb_drain and
 * kb_flush the refusal; once there is room, the replay goes through and
 * removes it. */
static void refused_replay_keeps_the_dead_letter(void **state)
{
    (void)state;
    kb_bus *b = open_bus();
    const char *topic = "interop.refused";
    refused_runs = 0;
    kb_assert_ok(kb_subscribe(b, topic, dead_first, NULL));
    kb_assert_ok(kb_publish(b, topic, "k", 1, "v", 1));
    kb_assert_ok(kb_flush(b, 10000));
    for (int i = 0; i < 1000 && dlq_length(b, topic) < 1; i++)
        usleep(10000);
    struct dl_seen seen = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 10, collect, &seen));
    assert_int_equal(seen.n, 1);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    stream_max_msgs(js, topic, true);
    assert_int_equal(kb_dead_letter_replay(b, topic, seen.ids[0]), KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "kept"));
    assert_int_equal(dlq_length(b, topic), 1);
    assert_int_equal(kb_drain(b, 10000), KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "1 published events refused"));
    assert_int_equal(kb_flush(b, 10000), KB_ETRANSPORT);
    kb_assert_ok(kb_flush(b, 10000));
    kb_assert_ok(kb_drain(b, 10000));
    stream_max_msgs(js, topic, false);
    kb_assert_ok(kb_dead_letter_replay(b, topic, seen.ids[0]));
    assert_int_equal(dlq_length(b, topic), 0);
    kb_wait_until(atomic_load(&refused_runs) >= 2, 10000, "the replayed dead letter handled");
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(atomic_load(&refused_runs), 2);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

/* A dotted topic maps to a valid stream name; "a.b" and "a_b" stay apart. */
static void dotted_topics_do_not_collide(void **state)
{
    (void)state;
    kb_bus *b = open_bus();
    kb_tracker t1, t2;
    kb_tracker_init(&t1, 5);
    kb_tracker_init(&t2, 5);
    kb_assert_ok(kb_subscribe(b, "orders.events", kb_tracker_handler, &t1));
    kb_assert_ok(kb_subscribe(b, "orders_events", kb_tracker_handler, &t2));
    for (uint32_t s = 1; s <= 10; s++)
        for (uint32_t k = 0; k < 5; k++) {
            kb_assert_ok(kb_tracker_publish(b, "orders.events", k, s, 16));
            if (s <= 4)
                kb_assert_ok(kb_tracker_publish(b, "orders_events", k, s, 16));
        }
    kb_assert_ok(kb_flush(b, 10000));
    wait_distinct(&t1, 50);
    wait_distinct(&t2, 20);
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(kb_tracker_distinct(&t1), 50);
    assert_int_equal(kb_tracker_distinct(&t2), 20);
    assert_int_equal(t1.order_violations + t2.order_violations, 0);
    kb_tracker_destroy(&t1);
    kb_tracker_destroy(&t2);
}

/* Unreachable server: KB_ETRANSPORT at once, an errstr naming the URL, and
 * never the password. */
static void unreachable_server_fails_open(void **state)
{
    (void)state;
    char url[128], err[256] = "";
    snprintf(url, sizeof url, "nats://alice:s3cret@127.0.0.1:%d", kb_test_free_port());
    kb_conf *c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
    assert_null(kb_open(c, err, sizeof err));
    assert_non_null(strstr(err, "127.0.0.1"));
    assert_null(strstr(err, "s3cret"));
    kb_conf_destroy(c);
}

/* Memory storage by configuration. */
static void memory_storage(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "transport", server.url, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "nats.storage", "memory", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    kb_tracker t;
    kb_tracker_init(&t, 3);
    kb_assert_ok(kb_subscribe(b, "interop.mem", kb_tracker_handler, &t));
    for (uint32_t s = 1; s <= 5; s++)
        for (uint32_t k = 0; k < 3; k++)
            kb_assert_ok(kb_tracker_publish(b, "interop.mem", k, s, 8));
    kb_assert_ok(kb_flush(b, 10000));
    wait_distinct(&t, 15);
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(kb_tracker_distinct(&t), 15);
    kb_tracker_destroy(&t);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    char name[64];
    snprintf(name, sizeof name, "KB_interop_mem_%08x", kb_fnv1a32("interop.mem", 11));
    assert_int_equal(js_GetStreamInfo(&si, js, name, NULL, NULL), NATS_OK);
    assert_int_equal(si->Config->Storage, js_MemoryStorage);
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

struct seen {
    _Atomic uint32_t count, first, last, backwards;
};

static int record_seq(const kb_event *ev, void *opaque)
{
    struct seen *sn = opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (atomic_load(&sn->count) == 0)
        atomic_store(&sn->first, seq);
    if (seq <= atomic_load(&sn->last))
        atomic_fetch_add(&sn->backwards, 1);
    atomic_store(&sn->last, seq);
    atomic_fetch_add(&sn->count, 1);
    return KB_HANDLED;
}

/* Limits set on the stream by hand (MaxMsgs 10) remove 20 of 30 events
 * before anyone reads them: the lone member's wide consumer starts past
 * them, counts them in broker_trimmed (and logs their sequences), handles
 * the 10 left in order, and kb_drain does not wait for the removed ones. */
static void stream_limits_trim_unread(void **state)
{
    (void)state;
    kb_bus *b = open_bus();
    const char *topic = "interop.trim";
    for (uint32_t seq = 1; seq <= 30; seq++) {
        kb_assert_ok(kb_tracker_publish(b, topic, 0, seq, 16));
        kb_assert_ok(kb_flush(b, 10000));   /* one message per event */
    }
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    char stream[64];
    kb_test_nats_stream(topic, stream, sizeof stream);
    jsStreamInfo *si = NULL;
    assert_int_equal(js_GetStreamInfo(&si, js, stream, NULL, NULL), NATS_OK);
    si->Config->MaxMsgs = 10;
    jsStreamInfo *up = NULL;
    assert_int_equal(js_UpdateStream(&up, js, si->Config, NULL, NULL), NATS_OK);
    jsStreamInfo_Destroy(up);
    jsStreamInfo_Destroy(si);

    struct seen sn = {0};
    kb_assert_ok(kb_subscribe(b, topic, record_seq, &sn));
    for (int i = 0; i < 2000 && atomic_load(&sn.count) < 10; i++)
        usleep(10000);
    kb_assert_ok(kb_drain(b, 10000));
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(atomic_load(&sn.count), 10);
    assert_int_equal(atomic_load(&sn.first), 21);
    assert_int_equal(atomic_load(&sn.last), 30);
    assert_int_equal(atomic_load(&sn.backwards), 0);
    assert_int_equal(st.broker_trimmed, 20);
    assert_int_equal(st.broker_length, 10);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    kb_assert_ok(kb_close(b, 10000));
}

int main(void)
{
    if (kb_test_server_start(&server, "nats", NULL) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_client_messages_in_order),
        cmocka_unit_test(foreign_messages_dead_letter_and_replay),
        cmocka_unit_test(refused_replay_keeps_the_dead_letter),
        cmocka_unit_test(dotted_topics_do_not_collide),
        cmocka_unit_test(unreachable_server_fails_open),
        cmocka_unit_test(memory_storage),
        cmocka_unit_test(stream_limits_trim_unread),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    kb_test_server_stop(&server);
    nats_Close();
    return failed;
}
