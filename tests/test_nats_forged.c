/* Coordination data another client forged on NATS (docs/security.md): a
 * progress record (<stream>.done.<consumer> in the runs bucket), which a
 * takeover reads to settle events without a handler, is taken only line by
 * line where well formed and within what the server delivered to that
 * consumer: a forged one causes duplicates at worst, never a skip. Dead
 * letters another client published are range-checked when listed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/forged.h"
#include "support/server.h"
#include "support/suite.h"

static kb_test_server server;

static kb_bus *open_as(const char *consumer)
{
    const char *const kv[] = {"consumer", consumer, "nats.lease_ttl_ms", "1000", NULL};
    kb_conf *c = kb_test_conf(server.url, kv, NULL);
    kb_test_log_capture(c);
    return kb_test_open_conf(c);
}

static int count(const kb_event *ev, void *opaque)
{
    (void)ev;
    atomic_fetch_add((_Atomic int *)opaque, 1);
    return KB_HANDLED;
}

static uint64_t fnv64(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *s != '\0'; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h != 0 ? h : 1;
}

/* Write `value` as the progress record of every consumer of the topic's
 * stream; how many. */
static int forge_progress(const char *topic, const char *value)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    kvStore *kv = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(js_KeyValue(&kv, js, "keybus_leases_runs"), NATS_OK);
    char stream[256], key[600];
    kb_test_nats_stream(topic, stream, sizeof stream);
    jsConsumerInfoList *list = NULL;
    assert_int_equal(js_Consumers(&list, js, stream, NULL, NULL), NATS_OK);
    int n = 0;
    for (int i = 0; list != NULL && i < list->Count; i++, n++) {
        snprintf(key, sizeof key, "%s.done.%s", stream, list->List[i]->Name);
        uint64_t rev = 0;
        assert_int_equal(kvStore_PutString(&rev, kv, key, value), NATS_OK);
    }
    jsConsumerInfoList_Destroy(list);
    kvStore_Destroy(kv);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return n;
}

/* Key agg-f handled 5 times by consumer fa, which closes; a record forged
 * under fa's consumers says agg-f is done up to sequence 1,000,000 (and has
 * a malformed line). The 5 events published next are handled by fb: a
 * takeover that took the record would have settled them unhandled. */
static void forged_progress_is_ignored(void **state)
{
    (void)state;
    char topic[64];
    snprintf(topic, sizeof topic, "nfg.progress.%d", (int)getpid());
    _Atomic int first = 0, second = 0;
    kb_bus *a = open_as("fa");
    kb_assert_ok(kb_subscribe(a, topic, count, &first));
    for (int i = 0; i < 5; i++)
        kb_assert_ok(kb_publish(a, topic, "agg-f", 5, "x", 1));
    kb_assert_ok(kb_drain(a, 30000));
    assert_int_equal(atomic_load(&first), 5);
    kb_assert_ok(kb_close(a, 30000));

    char value[256];
    snprintf(value, sizeof value, "%016llx %u 1000000 0\nnot a line\n",
             (unsigned long long)fnv64("agg-f"), kb_fnv1a32("agg-f", 5) % 8);
    assert_true(forge_progress(topic, value) > 0);

    kb_bus *p = open_as("fp");
    for (int i = 0; i < 5; i++)
        kb_assert_ok(kb_publish(p, topic, "agg-f", 5, "y", 1));
    kb_assert_ok(kb_flush(p, 30000));
    kb_bus *b = open_as("fb");
    kb_assert_ok(kb_subscribe(b, topic, count, &second));
    for (int i = 0; i < 2000 && atomic_load(&second) < 5; i++)
        usleep(10000);
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(atomic_load(&second), 5);
    assert_true(kb_test_logged("of progress record"));
    assert_true(kb_test_logged("stream sequence past the last one"));
    kb_assert_ok(kb_close(b, 30000));
    kb_assert_ok(kb_close(p, 30000));
}

/* A dead letter another client published with Kb-Partition 999 (of 8) and
 * an attempt count past 64 bits: listed with its key's partition and 0
 * attempts; its replay goes to the key's partition and says so. */
static void forged_dead_letter_fields_are_range_checked(void **state)
{
    (void)state;
    char topic[64], subject[96];
    snprintf(topic, sizeof topic, "nfg.dlq.%d", (int)getpid());
    snprintf(subject, sizeof subject, "kb.%s.dlq", topic);
    _Atomic int handled = 0;
    kb_bus *b = open_as("fd");
    kb_assert_ok(kb_subscribe(b, topic, count, &handled));   /* makes the stream */
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    natsMsg *m = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(natsMsg_Create(&m, subject, NULL, "x", 1), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Kb-Key", "agg-d"), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Kb-Partition", "999"), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Kb-Attempts", "99999999999999999999999"), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Kb-Orig-Id", "1"), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Kb-Reason", "forged"), NATS_OK);
    jsPubAck *pa = NULL;
    assert_int_equal(js_PublishMsg(&pa, js, m, NULL, NULL), NATS_OK);
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);

    kb_test_forged_dead_letter_replays(b, topic, "agg-d", &handled);
    kb_assert_ok(kb_close(b, 30000));
}

static int setup(void **state)
{
    (void)state;
    return kb_test_server_start(&server, "nats", NULL);
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
        cmocka_unit_test(forged_progress_is_ignored),
        cmocka_unit_test(forged_dead_letter_fields_are_range_checked),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
