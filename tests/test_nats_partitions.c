/* The partition count is part of a NATS topic (issue 25, item 1): stored in
 * the stream's Description when it is made, checked at publish and subscribe
 * in every process; another count is refused naming both, and nothing
 * published is lost or acked unread. Messages on a subject that is not a
 * partition, or on another partition than their key's, reach the dead
 * letters with a reason. And nats.lease_ttl_ms is applied to a lease bucket
 * that exists with another TTL (issue 31, item 5). Two members share a
 * topic's partitions by the kit's fair share (issue 42). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/suite.h"

static kb_test_server server, guarded;

static kb_bus *open_bus_at(const char *url, const char *const *kv)
{
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
    for (; kv != NULL && kv[0] != NULL; kv += 2)
        if (kb_conf_set(c, kv[0], kv[1], err, sizeof err) != KB_OK)
            fail_msg("%s: %s", kv[0], err);
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open: %s", err);
    return b;
}

static kb_bus *open_parts(const char *partitions)
{
    const char *const kv[] = {"partitions", partitions, NULL};
    return open_bus_at(server.url, kv);
}

typedef struct client {
    natsConnection *nc;
    jsCtx *js;
} client;

static void client_open(client *c, const char *url)
{
    assert_int_equal(natsConnection_ConnectTo(&c->nc, url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&c->js, c->nc, NULL), NATS_OK);
}

static void client_close(client *c)
{
    jsCtx_Destroy(c->js);
    natsConnection_Destroy(c->nc);
}

/* A plain message with a Kb-Key header, as any client may publish it. */
static void raw_publish(client *c, const char *subject, const char *key, const char *payload)
{
    natsMsg *m = NULL;
    assert_int_equal(natsMsg_Create(&m, subject, NULL, payload, (int)strlen(payload)), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Kb-Key", key), NATS_OK);
    jsPubAck *pa = NULL;
    assert_int_equal(js_PublishMsg(&pa, c->js, m, NULL, NULL), NATS_OK);
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
}

static int consumers_of(client *c, const char *topic)
{
    char stream[256];
    kb_test_nats_stream(topic, stream, sizeof stream);
    jsConsumerInfoList *list = NULL;
    natsStatus s = js_Consumers(&list, c->js, stream, NULL, NULL);
    assert_true(s == NATS_OK || s == NATS_NOT_FOUND);
    int n = list != NULL ? list->Count : 0;
    jsConsumerInfoList_Destroy(list);
    return n;
}

static int count(const kb_event *ev, void *opaque)
{
    (void)ev;
    atomic_fetch_add((_Atomic int *)opaque, 1);
    return KB_HANDLED;
}

static void wait_count(_Atomic int *n, int want)
{
    for (int i = 0; i < 2000 && atomic_load(n) < want; i++)
        usleep(10000);
}

static void names_both_counts(void)
{
    assert_non_null(strstr(kb_last_error(), "partitions=8"));
    assert_non_null(strstr(kb_last_error(), "partitions=4"));
}

/* The reproducer: 10 events published with partitions=8; a process
 * with partitions=4 is refused at subscribe and at publish, creates no
 * consumer (so nothing is acked unread), and one with partitions=8 then
 * handles all 10. */
static void another_count_is_refused_and_nothing_lost(void **state)
{
    (void)state;
    const char *topic = "mm.t";
    kb_bus *eight = open_parts("8");
    for (int i = 0; i < 10; i++) {
        char key[16];
        int len = snprintf(key, sizeof key, "order-%d", i);
        kb_assert_ok(kb_publish(eight, topic, key, (size_t)len, "e", 1));
    }
    kb_assert_ok(kb_flush(eight, 10000));
    kb_assert_ok(kb_close(eight, 10000));

    kb_bus *four = open_parts("4");
    kb_topic_stats mis;   /* figures by the wrong count would mislead: refused */
    assert_int_equal(kb_stats(four, topic, &mis), KB_EINVAL);
    names_both_counts();
    _Atomic int wrong = 0;
    assert_int_equal(kb_subscribe(four, topic, count, &wrong), KB_EINVAL);
    names_both_counts();
    assert_int_equal(kb_publish(four, topic, "k", 1, "v", 1), KB_EINVAL);
    names_both_counts();
    assert_int_equal(kb_publish(four, topic, "k", 1, "v", 1), KB_EINVAL);   /* every time */
    names_both_counts();
    kb_assert_ok(kb_close(four, 10000));
    assert_int_equal(atomic_load(&wrong), 0);

    client c;
    client_open(&c, server.url);
    assert_int_equal(consumers_of(&c, topic), 0);
    client_close(&c);

    eight = open_parts("8");
    kb_topic_stats st;
    kb_assert_ok(kb_stats(eight, topic, &st));
    assert_int_equal(st.broker_length, 10);
    /* no consumer of the group yet: every stored message is still to deliver */
    assert_true(st.broker_frames > 0);
    assert_int_equal(st.broker_lag, st.broker_frames);
    uint64_t lag = 0;
    for (uint32_t p = 0; p < 8; p++) {
        kb_partition_stats ps;
        kb_assert_ok(kb_partition_stats_get(eight, topic, p, &ps));
        lag += ps.lag;
    }
    assert_int_equal(lag, st.broker_frames);
    _Atomic int handled = 0;
    kb_assert_ok(kb_subscribe(eight, topic, count, &handled));
    wait_count(&handled, 10);
    kb_assert_ok(kb_close(eight, 10000));
    assert_int_equal(atomic_load(&handled), 10);
}

struct dead {
    int n;
    char reasons[4][200];
};

static int collect(const kb_dead_letter *dl, void *opaque)
{
    struct dead *d = opaque;
    if (d->n < 4)
        snprintf(d->reasons[d->n], sizeof d->reasons[0], "%s", dl->reason);
    d->n++;
    return 0;
}

static bool has_reason(const struct dead *d, const char *text)
{
    for (int i = 0; i < d->n && i < 4; i++)
        if (strstr(d->reasons[i], text) != NULL)
            return true;
    return false;
}

/* Another client writes on kb.<topic>.9 of an 8-partition topic and on a
 * partition its key does not hash to: the lone member's wide consumer
 * (filter kb.<topic>.*) dead-letters both with a reason instead of acking
 * them unread; the good event beside them is handled. */
static void foreign_subjects_reach_the_dead_letters(void **state)
{
    (void)state;
    const char *topic = "pt.foreign";
    kb_bus *b = open_parts("8");
    _Atomic int handled = 0;
    kb_assert_ok(kb_subscribe(b, topic, count, &handled));
    client c;
    client_open(&c, server.url);
    const char *key = "agg-1";
    uint32_t home = kb_fnv1a32(key, strlen(key)) % 8;
    char subject[64];
    snprintf(subject, sizeof subject, "kb.%s.9", topic);
    raw_publish(&c, subject, key, "on a partition that does not exist");
    snprintf(subject, sizeof subject, "kb.%s.%u", topic, (home + 1) % 8);
    raw_publish(&c, subject, key, "on another partition");
    snprintf(subject, sizeof subject, "kb.%s.%u", topic, home);
    raw_publish(&c, subject, key, "where it belongs");
    client_close(&c);

    struct dead d = {0};
    for (int i = 0; i < 1000 && (d.n < 2 || atomic_load(&handled) < 1); i++) {
        usleep(10000);
        d.n = 0;
        kb_assert_ok(kb_dead_letters(b, topic, NULL, 10, collect, &d));
    }
    kb_assert_ok(kb_drain(b, 10000));
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(atomic_load(&handled), 1);
    assert_int_equal(d.n, 2);
    assert_true(has_reason(&d, "subject 9 is not a partition of the topic (partitions=8)"));
    assert_true(has_reason(&d, "key belongs to partition"));
    assert_int_equal(st.dlq_length, 2);
}

/* A stream an older keybus made has no count in its Description: the first
 * process to use it states its own, and later ones are held to it. */
static void older_stream_takes_the_first_count(void **state)
{
    (void)state;
    const char *topic = "pt.older";
    char stream[256], subjects[128];
    kb_test_nats_stream(topic, stream, sizeof stream);
    snprintf(subjects, sizeof subjects, "kb.%s.*", topic);
    const char *subj[] = {subjects};
    jsStreamConfig cfg;
    jsStreamConfig_Init(&cfg);
    cfg.Name = stream;
    cfg.Subjects = subj;
    cfg.SubjectsLen = 1;
    cfg.AllowDirect = true;
    client c;
    client_open(&c, server.url);
    jsStreamInfo *si = NULL;
    assert_int_equal(js_AddStream(&si, c.js, &cfg, NULL, NULL), NATS_OK);
    jsStreamInfo_Destroy(si);
    char subject[64];
    const char *keys[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        snprintf(subject, sizeof subject, "kb.%s.%u", topic, kb_fnv1a32(keys[i], 1) % 8);
        raw_publish(&c, subject, keys[i], "old");
    }

    kb_bus *eight = open_parts("8");
    _Atomic int handled = 0;
    kb_assert_ok(kb_subscribe(eight, topic, count, &handled));
    wait_count(&handled, 3);
    kb_assert_ok(kb_close(eight, 10000));
    assert_int_equal(atomic_load(&handled), 3);
    si = NULL;
    assert_int_equal(js_GetStreamInfo(&si, c.js, stream, NULL, NULL), NATS_OK);
    assert_non_null(si->Config->Description);
    assert_string_equal(si->Config->Description, "keybus partitions=8");
    jsStreamInfo_Destroy(si);
    client_close(&c);

    kb_bus *four = open_parts("4");
    assert_int_equal(kb_publish(four, topic, "k", 1, "v", 1), KB_EINVAL);
    names_both_counts();
    kb_assert_ok(kb_close(four, 10000));
}

static int64_t bucket_ttl_ms(client *c, const char *bucket)
{
    kvStore *kv = NULL;
    assert_int_equal(js_KeyValue(&kv, c->js, bucket), NATS_OK);
    kvStatus *st = NULL;
    assert_int_equal(kvStore_Status(&st, kv), NATS_OK);
    int64_t ms = kvStatus_TTL(st) / 1000000;
    kvStatus_Destroy(st);
    kvStore_Destroy(kv);
    return ms;
}

static void make_bucket(client *c, const char *bucket, int64_t ttl_ms)
{
    kvConfig kc;
    kvConfig_Init(&kc);
    kc.Bucket = bucket;
    kc.History = 1;
    kc.TTL = ttl_ms * 1000000;
    kvStore *kv = NULL;
    assert_int_equal(js_CreateKeyValue(&kv, c->js, &kc), NATS_OK);
    kvStore_Destroy(kv);
}

/* A bucket made with a 10 s TTL, a process configured with 3 s: opening and
 * publishing leave it alone; the first subscribe sets 3 s on it. */
static void lease_ttl_applied_to_an_existing_bucket(void **state)
{
    (void)state;
    client c;
    client_open(&c, server.url);
    make_bucket(&c, "ttl_leases", 10000);
    const char *const kv[] = {"nats.lease_bucket", "ttl_leases", "nats.lease_ttl_ms", "3000",
                              NULL};
    kb_bus *b = open_bus_at(server.url, kv);
    kb_assert_ok(kb_publish(b, "pt.ttl", "k", 1, "v", 1));
    kb_assert_ok(kb_flush(b, 10000));
    assert_int_equal(bucket_ttl_ms(&c, "ttl_leases"), 10000);
    _Atomic int handled = 0;
    kb_assert_ok(kb_subscribe(b, "pt.ttl", count, &handled));
    assert_int_equal(bucket_ttl_ms(&c, "ttl_leases"), 3000);
    wait_count(&handled, 1);   /* leases work in the changed bucket */
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(atomic_load(&handled), 1);
    client_close(&c);
}

/* A user the server does not allow to update streams: kb_subscribe fails,
 * naming both TTLs, rather than running with the bucket's. */
static void lease_ttl_refused_fails_naming_both(void **state)
{
    (void)state;
    char url[160];
    snprintf(url, sizeof url, "nats://app:pw@127.0.0.1:%d", guarded.port);
    client c;
    client_open(&c, url);
    make_bucket(&c, "deny_leases", 10000);
    client_close(&c);
    const char *const kv[] = {"nats.lease_bucket", "deny_leases", "nats.lease_ttl_ms", "3000",
                              NULL};
    kb_bus *b = open_bus_at(url, kv);
    _Atomic int handled = 0;
    assert_int_equal(kb_subscribe(b, "pt.deny", count, &handled), KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "10000 ms"));
    assert_non_null(strstr(kb_last_error(), "3000 ms"));
    kb_assert_ok(kb_close(b, 10000));
}

/* The kit's fair share (kb_kit_share), as redis:// and file:// rank: two
 * members hold 4 partitions of 8 each. The topic is one where plain
 * rendezvous ranking (what nats:// used before) gives member-a 6 and
 * member-b 2; every event published is handled by one of them. */
static void two_members_hold_four_each(void **state)
{
    (void)state;
    const char *topic = "share.fair.5";
    const char *const a_kv[] = {"consumer", "member-a", NULL};
    const char *const b_kv[] = {"consumer", "member-b", NULL};
    kb_bus *a = open_bus_at(server.url, a_kv), *b = open_bus_at(server.url, b_kv);
    _Atomic int handled = 0;
    kb_assert_ok(kb_subscribe(a, topic, count, &handled));
    kb_assert_ok(kb_subscribe(b, topic, count, &handled));
    uint32_t oa = 0, ob = 0;
    for (int i = 0; i < 3000 && !(oa == 4 && ob == 4); i++) {
        usleep(10000);
        oa = kb_test_owned(a, topic);
        ob = kb_test_owned(b, topic);
    }
    print_message("share.fair.5: member-a owns %u, member-b %u\n", oa, ob);
    assert_int_equal(oa, 4);
    assert_int_equal(ob, 4);
    char key[16];
    for (int k = 0; k < 64; k++) {
        int n = snprintf(key, sizeof key, "key-%d", k);
        kb_assert_ok(kb_publish(a, topic, key, (size_t)n, "v", 1));
    }
    kb_assert_ok(kb_flush(a, 10000));
    wait_count(&handled, 64);
    assert_int_equal(atomic_load(&handled), 64);
    kb_assert_ok(kb_close(b, 10000));
    kb_assert_ok(kb_close(a, 10000));
}

int main(void)
{
    const char *conf = "authorization { users = [ { user: app, password: pw, permissions: {\n"
                       "  publish: { allow: \">\", deny: \"$JS.API.STREAM.UPDATE.KV_deny_leases\" },\n"
                       "  subscribe: \">\" } } ] }\n";
    if (kb_test_server_start(&server, "nats", NULL) != 0 ||
        kb_test_server_start_conf(&guarded, "nats", conf) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(another_count_is_refused_and_nothing_lost),
        cmocka_unit_test(foreign_subjects_reach_the_dead_letters),
        cmocka_unit_test(older_stream_takes_the_first_count),
        cmocka_unit_test(lease_ttl_applied_to_an_existing_bucket),
        cmocka_unit_test(lease_ttl_refused_fails_naming_both),
        cmocka_unit_test(two_members_hold_four_each),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    kb_test_server_stop(&server);
    kb_test_server_stop(&guarded);
    nats_Close();
    return failed;
}
