/* NATS faults, each ending with 0 lost and 0 per-key order violations
 * (duplicates are counted and allowed): nats-server killed and restarted
 * mid-stream on file storage; server down at start and up later; kill -9 of
 * one of two consumer processes; the consumer's connection alone cut at close;
 * publishes lost with the connection sent again in order, after a reconnect
 * nats.c made before its disconnected callback ran, and all of them at
 * kb_close after a restart; lease answers that come late; a consumer
 * creation's answer lost with the connection.
 * Usage: test_nats_faults PATH_TO_HELPER [TEST] */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nats/nats.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/gate.h"
#include "support/proxy.h"
#include "support/server.h"
#include "support/suite.h"
#include "support/tracker.h"

static const char *helper;

static kb_bus *open_bus(const char *url, const char *k1, const char *v1)
{
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "nats.publish_timeout_ms", "1000", err, sizeof err));
    if (k1 != NULL)
        kb_assert_ok(kb_conf_set(c, k1, v1, err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open: %s", err);
    return b;
}

static void publish_ok(kb_bus *b, const char *topic, uint32_t key, uint32_t seq)
{
    int rc;
    for (int i = 0; (rc = kb_tracker_publish(b, topic, key, seq, 16)) == KB_EFULL && i < 1000; i++)
        usleep(10000);
    kb_assert_ok(rc);
}

static void wait_distinct(kb_tracker *t, uint64_t n, int seconds)
{
    for (int i = 0; i < seconds * 100 && kb_tracker_distinct(t) < n; i++)
        usleep(10000);
}

#define KEYS 20
#define PER_KEY 150

/* kill -9 of the server while publishing and consuming; restart on the same
 * port and store. Publishes in flight are resent (same Nats-Msg-Id). */
static void server_restart_mid_stream(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_bus *b = open_bus(s.url, NULL, NULL);
    kb_tracker t;
    kb_tracker_init(&t, KEYS);
    kb_assert_ok(kb_subscribe(b, "fault.restart", kb_tracker_handler, &t));
    for (uint32_t seq = 1; seq <= PER_KEY; seq++) {
        if (seq == PER_KEY / 2) {
            kb_test_server_signal(&s, SIGKILL);
            usleep(300000);
            assert_int_equal(kb_test_server_restart(&s), 0);
        }
        for (uint32_t k = 0; k < KEYS; k++)
            publish_ok(b, "fault.restart", k, seq);
        usleep(2000);
    }
    kb_assert_ok(kb_flush(b, 30000));
    wait_distinct(&t, KEYS * PER_KEY, 30);
    kb_assert_ok(kb_close(b, 10000));
    print_message("restart: %llu distinct, %llu duplicates\n",
                  (unsigned long long)kb_tracker_distinct(&t), (unsigned long long)t.duplicates);
    assert_int_equal(kb_tracker_distinct(&t), KEYS * PER_KEY);
    assert_int_equal(t.order_violations, 0);
    assert_int_equal(t.concurrent, 0);
    kb_tracker_destroy(&t);
    kb_test_server_stop(&s);
}

static _Atomic int slow_us;

static int tracked_slowly(const kb_event *ev, void *opaque)
{
    usleep((useconds_t)atomic_load(&slow_us));   /* events in flight at each kill */
    return kb_tracker_handler(ev, opaque);
}

/* The group's consumers of a stream as the server shows them: messages
 * delivered and not acked, and not yet delivered. */
static void server_pending(jsCtx *js, const char *stream, int64_t *ack_pending, uint64_t *undelivered)
{
    jsConsumerInfoList *l = NULL;
    *ack_pending = -1;
    *undelivered = UINT64_MAX;
    if (js_Consumers(&l, js, stream, NULL, NULL) != NATS_OK || l->Count == 0) {
        jsConsumerInfoList_Destroy(l);
        return;
    }
    *ack_pending = 0;
    *undelivered = 0;
    for (int i = 0; i < l->Count; i++) {
        *ack_pending += l->List[i]->NumAckPending;
        *undelivered += l->List[i]->NumPending;
    }
    jsConsumerInfoList_Destroy(l);
}

#define DRAIN_KILLS 3
#define DRAIN_PER_KEY 400

/* kb_drain across kill -9 restarts of the server (same store): while it is
 * down or just back, kb_drain answers KB_ETIMEDOUT (retry) or KB_OK, never a
 * client-library error; KB_OK comes only when the server shows nothing of
 * this process's events unacked. 0 lost, order kept, and each restart
 * replays at most what was in flight (docs/transports-nats.md, "Replay"). */
static void drain_across_server_restarts(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_bus *b = open_bus(s.url, NULL, NULL);
    const char *topic = "fault.drain";
    char stream[64];
    snprintf(stream, sizeof stream, "KB_fault_drain_%08x", kb_fnv1a32(topic, strlen(topic)));
    kb_tracker t;
    kb_tracker_init(&t, KEYS);
    atomic_store(&slow_us, 200);
    kb_assert_ok(kb_subscribe(b, topic, tracked_slowly, &t));
    int early[4] = {0};   /* kb_drain while down or just back: OK, ETIMEDOUT, other */
    for (uint32_t seq = 1; seq <= DRAIN_PER_KEY; seq++) {
        if (seq % (DRAIN_PER_KEY / (DRAIN_KILLS + 1)) == 0 && seq < DRAIN_PER_KEY) {
            kb_test_server_signal(&s, SIGKILL);
            int rc = kb_drain(b, 300);
            early[rc == KB_OK ? 0 : rc == KB_ETIMEDOUT ? 1 : 2]++;
            if (rc != KB_OK && rc != KB_ETIMEDOUT)
                print_message("kb_drain while down: %s\n", kb_last_error());
            assert_int_equal(kb_test_server_restart(&s), 0);
            rc = kb_drain(b, 300);
            early[rc == KB_OK ? 0 : rc == KB_ETIMEDOUT ? 1 : 2]++;
            if (rc != KB_OK && rc != KB_ETIMEDOUT)
                print_message("kb_drain just after the restart: %s\n", kb_last_error());
        }
        for (uint32_t k = 0; k < KEYS; k++)
            publish_ok(b, topic, k, seq);
        usleep(1000);
    }
    int rc = KB_ETIMEDOUT;
    for (int i = 0; i < 6 && rc == KB_ETIMEDOUT; i++)   /* retried, as a caller would */
        rc = kb_drain(b, 10000);
    if (rc != KB_OK)
        print_message("kb_drain: %s\n", kb_last_error());
    kb_assert_ok(rc);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, s.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    int64_t ack_pending = 0;
    uint64_t undelivered = 0;
    server_pending(js, stream, &ack_pending, &undelivered);
    uint64_t distinct = kb_tracker_distinct(&t);
    print_message("drain across %d restarts: %llu distinct, %llu duplicates; at kb_drain's OK the "
                  "server shows %lld unacked, %llu undelivered; early kb_drain: %d OK, %d "
                  "timed out, %d other\n", DRAIN_KILLS, (unsigned long long)distinct,
                  (unsigned long long)t.duplicates, (long long)ack_pending,
                  (unsigned long long)undelivered, early[0], early[1], early[2]);
    assert_int_equal(ack_pending, 0);
    assert_int_equal(undelivered, 0);
    assert_int_equal(early[2], 0);
    assert_int_equal(distinct, KEYS * DRAIN_PER_KEY);
    assert_int_equal(t.order_violations, 0);
    assert_int_equal(t.concurrent, 0);
    /* in flight at a kill: at most nats.max_ack_pending (4,096) messages per
     * partition by the settings; far below one replay of the stream */
    assert_true(t.duplicates <= (uint64_t)DRAIN_KILLS * KEYS * DRAIN_PER_KEY / 10);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    kb_assert_ok(kb_close(b, 10000));
    kb_tracker_destroy(&t);
    kb_test_server_stop(&s);
}

struct opener {
    const char *url;
    kb_bus *b;
};

static void *open_later(void *arg)
{
    struct opener *o = arg;
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_conf_set(c, "transport", o->url, err, sizeof err);
    kb_conf_set(c, "nats.connect_wait_ms", "20000", err, sizeof err);
    o->b = kb_open(c, err, sizeof err);
    if (o->b == NULL)
        kb_conf_destroy(c);
    return NULL;
}

/* The server is down when the bus opens: with nats.connect_wait_ms the open
 * waits for it; nothing published afterwards is lost. */
static void server_down_at_start(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_test_server_signal(&s, SIGKILL);   /* keep its port and dir, not its process */
    struct opener o = {s.url, NULL};
    pthread_t th;
    pthread_create(&th, NULL, open_later, &o);
    usleep(800000);
    assert_int_equal(kb_test_server_restart(&s), 0);
    pthread_join(th, NULL);
    assert_non_null(o.b);
    kb_tracker t;
    kb_tracker_init(&t, KEYS);
    kb_assert_ok(kb_subscribe(o.b, "fault.late", kb_tracker_handler, &t));
    for (uint32_t seq = 1; seq <= 50; seq++)
        for (uint32_t k = 0; k < KEYS; k++)
            publish_ok(o.b, "fault.late", k, seq);
    kb_assert_ok(kb_flush(o.b, 20000));
    wait_distinct(&t, KEYS * 50, 20);
    kb_assert_ok(kb_close(o.b, 10000));
    assert_int_equal(kb_tracker_distinct(&t), KEYS * 50);
    assert_int_equal(t.order_violations, 0);
    kb_tracker_destroy(&t);
    kb_test_server_stop(&s);
}

static pid_t spawn_on(const char *url, const char *topic, const char *log, const char *name)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl(helper, helper, url, topic, log, name, "1500", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static pid_t spawn(const char *url, const char *log, const char *name)
{
    return spawn_on(url, "fault.kill", log, name);
}

/* Replay the shared log of `keys` keys: per key, a sequence is new (last + 1),
 * a duplicate (<= last) or a violation (a gap). Returns the distinct count. */
static uint64_t check_log(const char *path, uint32_t keys, uint64_t *dups, uint64_t *violations,
                          uint64_t *by_a)
{
    uint32_t *last = calloc(keys, sizeof *last);
    uint64_t distinct = 0;
    *dups = *violations = *by_a = 0;
    FILE *f = fopen(path, "r");
    unsigned k, seq, attempt;
    char who[32];
    while (f != NULL && fscanf(f, "%u %u %31s %u %*s", &k, &seq, who, &attempt) == 4) {
        *by_a += strcmp(who, "proc-a") == 0;
        if (k >= keys)
            (*violations)++;
        else if (seq == last[k] + 1) {
            last[k] = seq;
            distinct++;
        } else if (seq <= last[k])
            (*dups)++;
        else
            (*violations)++;
    }
    if (f != NULL)
        fclose(f);
    free(last);
    return distinct;
}

/* check_log until n distinct events are in the log, or none came for 10 s
 * (a loaded sanitizer build is slow, not stuck, while the count grows), for
 * at most 120 s. */
static uint64_t wait_log(const char *path, uint32_t keys, uint64_t n, uint64_t *dups,
                         uint64_t *violations, uint64_t *by_a)
{
    uint64_t distinct = 0, seen = 0;
    for (int i = 0, still = 0; i < 12000 && still < 1000 &&
                               (distinct = check_log(path, keys, dups, violations, by_a)) < n;
         i++) {
        still = distinct > seen ? 0 : still + 1;
        seen = distinct;
        usleep(10000);
    }
    return distinct;
}

#define KILL_KEYS 64
#define KILL_EVENTS 20000
/* Duplicates allowed: the 2 % of the events. What the killed process
 * handled in its last progress record's interval comes again
 * (docs/transports-nats.md, "Replay after a takeover"), at the default
 * nats.max_ack_pending. */
#define KILL_DUPS_MAX (KILL_EVENTS / 50)

/* Two consumer processes share the topic (20,000 events of 64 keys); one is
 * killed with SIGKILL mid-stream; the other takes its partitions over when
 * the leases expire and handles again only what the killed one handled after
 * its last progress record. `topic_consumer`: nats.topic_consumer of both
 * (auto: proc-a starts alone on a wide consumer, then hands partitions over). */
static void kill_one_of_two(const char *topic_consumer)
{
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    char log[300];
    snprintf(log, sizeof log, "%s/handled.log", s.dir);
    kb_bus *b = open_bus(s.url, "nats.lease_ttl_ms", "1500");   /* it creates the bucket */
    /* proc-a starts alone, so it owns partitions (a late joiner gets them only
     * by hand-over, which a slow build may not finish in time); proc-b joins
     * once proc-a handles events */
    setenv("KEYBUS_NATS_TOPIC_CONSUMER", topic_consumer, 1);
    pid_t a = spawn(s.url, log, "proc-a"), c = -1;
    uint32_t seq[KILL_KEYS] = {0};
    for (uint32_t i = 0; i < KILL_EVENTS; i++) {
        uint32_t k = i % KILL_KEYS;
        publish_ok(b, "fault.kill", k, ++seq[k]);
        if (i == 640) {
            uint64_t d0, v0, a0 = 0;
            for (int w = 0; w < 3000 && a0 == 0; w++) {
                check_log(log, KILL_KEYS, &d0, &v0, &a0);
                if (a0 == 0)
                    usleep(10000);
            }
            c = spawn(s.url, log, "proc-b");
            usleep(1500000);   /* both own partitions now, normally */
        }
        if (i == KILL_EVENTS / 2) {   /* with events in flight */
            kill(a, SIGKILL);
            waitpid(a, NULL, 0);
        }
        if (k == KILL_KEYS - 1)
            usleep(5000);
    }
    unsetenv("KEYBUS_NATS_TOPIC_CONSUMER");
    kb_assert_ok(kb_flush(b, 20000));
    uint64_t dups = 0, violations = 0, distinct = 0, by_a = 0;
    distinct = wait_log(log, KILL_KEYS, KILL_EVENTS, &dups, &violations, &by_a);
    kill(c, SIGTERM);
    int status = 0;
    waitpid(c, &status, 0);
    kb_assert_ok(kb_close(b, 10000));
    check_log(log, KILL_KEYS, &dups, &violations, &by_a);
    print_message("kill -9 (nats.topic_consumer %s): %llu distinct, %llu duplicates, %llu order "
                  "violations, %llu handled by the killed one\n", topic_consumer,
                  (unsigned long long)distinct, (unsigned long long)dups,
                  (unsigned long long)violations, (unsigned long long)by_a);
    assert_true(by_a > 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(distinct, KILL_EVENTS);
    assert_int_equal(violations, 0);
    assert_true(dups <= KILL_DUPS_MAX);
    kb_test_server_stop(&s);
}

static void kill_one_of_two_consumers(void **state)
{
    (void)state;
    kill_one_of_two("auto");
}

static void kill_one_of_two_consumers_off(void **state)
{
    (void)state;
    kill_one_of_two("off");
}

#define HOLD_KEYS 20
#define HOLD_PER_KEY 100

/* A lone member reads the topic through one wide consumer (AckAll); one
 * event, the stream's first, is held in its handler (retried), so no ack
 * passes it while the events of every other key are handled. The process
 * is killed (-9); the next one starts at the floor but settles without a
 * handler what the killed one's progress record shows handled (Progress per
 * key): it handles the held key's events, not the 1,900 others again. */
static void wide_takeover_skips_acked(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    char log[300];
    snprintf(log, sizeof log, "%s/handled.log", s.dir);
    const char *topic = "fault.hold";
    kb_bus *b = open_bus(s.url, "nats.lease_ttl_ms", "1500");
    setenv("KB_TEST_HOLD_KEY", "0", 1);
    setenv("KEYBUS_RETRY_MAX_ATTEMPTS", "1000000", 1);
    pid_t a = spawn_on(s.url, topic, log, "hold-a");
    unsetenv("KB_TEST_HOLD_KEY");
    for (uint32_t seq = 1; seq <= HOLD_PER_KEY; seq++)
        for (uint32_t k = 0; k < HOLD_KEYS; k++)
            publish_ok(b, topic, k, seq);
    kb_assert_ok(kb_flush(b, 20000));
    uint64_t dups = 0, violations = 0, distinct = 0, by_a = 0;
    uint64_t others = (HOLD_KEYS - 1) * HOLD_PER_KEY;
    distinct = wait_log(log, HOLD_KEYS, others, &dups, &violations, &by_a);
    usleep(200000);   /* their acks on the server */
    /* one AckAll per finished prefix: the held event (key 0, first in the
     * stream) keeps the wide consumer's floor below it, however many of the
     * messages after it are handled */
    char stream[64];
    snprintf(stream, sizeof stream, "KB_fault_hold_%08x", kb_fnv1a32(topic, strlen(topic)));
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsConsumerInfoList *l = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, s.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(js_Consumers(&l, js, stream, NULL, NULL), NATS_OK);
    int wide = 0;
    for (int i = 0; i < l->Count; i++) {
        if (strstr(l->List[i]->Name, "_w_") == NULL)
            continue;
        wide++;
        assert_int_equal(l->List[i]->Config->AckPolicy, js_AckAll);
        assert_int_equal(l->List[i]->AckFloor.Stream, 0);
        assert_true(l->List[i]->Delivered.Stream > 1);
    }
    assert_int_equal(wide, 1);
    jsConsumerInfoList_Destroy(l);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    assert_int_equal(distinct, others);
    /* the held event's runs in `a` count here too (attempts are handler
     * runs): the same limit, or `c` would dead-letter it at once */
    pid_t c = spawn_on(s.url, topic, log, "hold-b");
    unsetenv("KEYBUS_RETRY_MAX_ATTEMPTS");
    distinct = wait_log(log, HOLD_KEYS, HOLD_KEYS * HOLD_PER_KEY, &dups, &violations, &by_a);
    kill(c, SIGTERM);
    int status = 0;
    waitpid(c, &status, 0);
    kb_assert_ok(kb_close(b, 10000));
    check_log(log, HOLD_KEYS, &dups, &violations, &by_a);
    print_message("wide takeover: %llu distinct, %llu duplicates (%llu handled above the held "
                  "event before the kill)\n", (unsigned long long)distinct,
                  (unsigned long long)dups, (unsigned long long)others);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(distinct, HOLD_KEYS * HOLD_PER_KEY);
    assert_int_equal(violations, 0);
    /* in flight at the kill: the held key's messages (frames holding one of
     * its events come whole); never the acked ones above the floor */
    assert_true(dups <= others / 4);
    kb_test_server_stop(&s);
}

static _Atomic uint64_t slow_calls;

static int slow_handler(const kb_event *ev, void *opaque)
{
    usleep(10000);
    atomic_fetch_add(&slow_calls, 1);
    return kb_tracker_handler(ev, opaque);
}

/* still_owned: a process whose lease is taken away stops handling the events
 * already queued in its lanes (they are released unacked) instead of draining
 * them. Another client overwrites the lease; while it holds it, nothing more
 * is handled here; once it expires the partition comes back, from the ack
 * floor, and every event is handled in order. */
static void lost_lease_releases_queued(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_bus *b = open_bus(s.url, "nats.lease_ttl_ms", "1500");
    const char *topic = "fault.fence";
    kb_tracker t;
    kb_tracker_init(&t, 1);
    atomic_store(&slow_calls, 0);
    kb_assert_ok(kb_subscribe(b, topic, slow_handler, &t));
    for (uint32_t seq = 1; seq <= PER_KEY; seq++)
        publish_ok(b, topic, 0, seq);
    kb_assert_ok(kb_flush(b, 10000));
    kb_wait_until(atomic_load(&slow_calls) >= 5, 5000, "five calls of the slow handler");
    assert_true(atomic_load(&slow_calls) >= 5);

    /* The lease key: l.<stream>.<group>.<partition>, stream KB_<topic>_<fnv hex>. */
    char key[256];
    snprintf(key, sizeof key, "l.KB_fault_fence_%08x.keybus.%u",
             kb_fnv1a32(topic, strlen(topic)), kb_fnv1a32("agg-0", 5) % 8);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    kvStore *kv = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, s.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(js_KeyValue(&kv, js, "keybus_leases"), NATS_OK);
    assert_int_equal(kvStore_PutString(NULL, kv, key, "thief"), NATS_OK);
    uint64_t at_theft = atomic_load(&slow_calls);
    usleep(700000);   /* the next renewal (every TTL/3) fails: fenced */
    uint64_t fenced_at = atomic_load(&slow_calls);
    usleep(500000);   /* the thief's lease lives until 1.5 s after the theft */
    uint64_t later = atomic_load(&slow_calls);
    printf("lost lease: %llu handled at the theft, %llu when fenced, %llu 0.5 s later\n",
           (unsigned long long)at_theft, (unsigned long long)fenced_at,
           (unsigned long long)later);
    assert_true(fenced_at < PER_KEY);
    assert_int_equal(later, fenced_at);   /* queued events released, not handled */

    wait_distinct(&t, PER_KEY, 30);   /* the lease comes back after the thief's expires */
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(kb_tracker_distinct(&t), PER_KEY);
    assert_int_equal(t.order_violations, 0);
    assert_int_equal(t.concurrent, 0);
    kb_tracker_destroy(&t);
    kvStore_Destroy(kv);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    kb_test_server_stop(&s);
}

/* Lease keys ("l.<stream>...") of the bucket keybus_leases. */
static size_t lease_keys(const char *url)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    kvStore *kv = NULL;
    kvKeysList keys = {0};
    assert_int_equal(natsConnection_ConnectTo(&nc, url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(js_KeyValue(&kv, js, "keybus_leases"), NATS_OK);
    natsStatus s = kvStore_Keys(&keys, kv, NULL);
    assert_true(s == NATS_OK || s == NATS_NOT_FOUND);   /* not found: no key at all */
    size_t n = 0;
    for (int i = 0; s == NATS_OK && i < keys.Count; i++)
        n += strncmp(keys.Keys[i], "l.", 2) == 0;
    kvKeysList_Destroy(&keys);
    kvStore_Destroy(kv);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return n;
}

/* t (KEYS keys) subscribed to topic on b, and event 1 of every key
 * published and handled. */
static void first_round(kb_bus *b, const char *topic, kb_tracker *t)
{
    kb_tracker_init(t, KEYS);
    kb_assert_ok(kb_subscribe(b, topic, kb_tracker_handler, t));
    for (uint32_t k = 0; k < KEYS; k++)
        publish_ok(b, topic, k, 1);
    kb_assert_ok(kb_flush(b, 10000));
    wait_distinct(t, KEYS, 30);
    assert_int_equal(kb_tracker_distinct(t), KEYS);
}

/* Only the consumer's connection (the bus's second through the proxy, made
 * at its first subscribe) stops answering before kb_close: the close waits
 * for it a share of its deadline, not all of it, and the publishing
 * connection still releases every lease. */
static void consumer_connection_lost_at_close(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_test_proxy *proxy = kb_test_proxy_start(s.port);
    assert_non_null(proxy);
    char url[128];
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", kb_test_proxy_port(proxy));
    /* no PINGs to notice the cut: the connection stays "connected" */
    kb_bus *b = open_bus(url, "nats.ping_interval_ms", "600000");
    const char *topic = "fault.feedcut";
    kb_tracker t;
    first_round(b, topic, &t);
    size_t held = lease_keys(s.url);

    kb_test_proxy_blackhole_from(proxy, 1);
    double t0 = kb_test_now_ms();
    int closed = kb_close(b, 20000);
    double took = kb_test_now_ms() - t0;
    size_t left = lease_keys(s.url);
    printf("consumer connection cut: kb_close(20 s) = %s after %.0f ms, lease keys %zu -> %zu\n",
           kb_strerror(closed), took, held, left);
    assert_true(held > 0);
    assert_int_equal(left, 0);
    assert_true(took < 15000.0);   /* a quarter of the deadline for it, not all of it */
    kb_tracker_destroy(&t);
    kb_test_proxy_stop(proxy);
    kb_test_server_stop(&s);
}

static _Atomic int refills;

static void count_refills(int level, const char *msg, void *opaque)
{
    (void)level;
    (void)opaque;
    if (strstr(msg, "read again from the stream") != NULL)
        atomic_fetch_add(&refills, 1);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of the stream's consumers, sorted, into out. */
static void consumer_names(const char *url, const char *topic, char *out, size_t cap)
{
    char stream[64];
    kb_test_nats_stream(topic, stream, sizeof stream);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsConsumerNamesList *l = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(js_ConsumerNames(&l, js, stream, NULL, NULL), NATS_OK);
    qsort(l->List, (size_t)l->Count, sizeof *l->List, by_name);
    out[0] = '\0';
    for (int i = 0; i < l->Count; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s ", l->List[i]);
    jsConsumerNamesList_Destroy(l);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

/* A bus on s through a new proxy (*proxy), with the settings of `kv`
 * (key, value, ..., NULL) and a log callback. */
static kb_bus *proxied_bus(const kb_test_server *s, kb_test_proxy **proxy, const char *const *kv,
                           kb_log_fn log)
{
    *proxy = kb_test_proxy_start(s->port);
    assert_non_null(*proxy);
    char url[128], err[256];
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", kb_test_proxy_port(*proxy));
    kb_conf *c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
    for (; *kv != NULL; kv += 2)
        kb_assert_ok(kb_conf_set(c, kv[0], kv[1], err, sizeof err));
    kb_conf_set_log(c, log, NULL);
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open: %s", err);
    return b;
}

/* The consumer's connection breaks with deliveries on the wire (the proxy
 * drops what it held for it, as a node killed under the connection would).
 * The server counts them delivered and would send them again only after
 * AckWait; the first delivery after the reconnect shows the gap, and the
 * feeder reads the lost ones again from the stream, in order, and carries on
 * with the same consumers: none is created, nothing is lost, every key in
 * order. */
static void lost_deliveries_read_again(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_test_proxy *proxy = NULL;
    const char *const conf[] = {"nats.topic_consumer", "off", "nats.ack_wait_ms", "600000", NULL};
    kb_bus *b = proxied_bus(&s, &proxy, conf, count_refills);
    const char *topic = "fault.wire";
    kb_tracker t;
    first_round(b, topic, &t);
    char before[2048], after[2048];
    consumer_names(s.url, topic, before, sizeof before);

    kb_test_proxy_blackhole_from(proxy, 1);   /* the consumer's connection */
    for (uint32_t k = 0; k < KEYS; k++)
        publish_ok(b, topic, k, 2);
    kb_assert_ok(kb_flush(b, 10000));
    usleep(500000);   /* delivered into the held connection */
    kb_test_proxy_drop_from(proxy, 1);
    uint32_t last = 2;
    for (int i = 0; i < 1000 && kb_tracker_distinct(&t) < 2 * KEYS; i++) {
        if (i % 50 == 0)
            last++;
        for (uint32_t k = 0; i % 50 == 0 && k < KEYS; k++)
            publish_ok(b, topic, k, last);   /* deliveries that show the gap */
        usleep(10000);
    }
    kb_assert_ok(kb_flush(b, 10000));
    wait_distinct(&t, (uint64_t)KEYS * last, 20);
    consumer_names(s.url, topic, after, sizeof after);
    print_message("lost on the wire: %llu distinct, %d refills, consumers '%s' -> '%s'\n",
                  (unsigned long long)kb_tracker_distinct(&t), atomic_load(&refills), before, after);
    assert_int_equal(kb_tracker_distinct(&t), (uint64_t)KEYS * last);
    assert_int_equal(atomic_load(&t.order_violations), 0);
    assert_true(atomic_load(&refills) > 0);
    assert_string_equal(before, after);
    kb_assert_ok(kb_close(b, 10000));
    kb_tracker_destroy(&t);
    kb_test_proxy_stop(proxy);
    kb_test_server_stop(&s);
}

static _Atomic int unnumbered_reads, gap_reads, restarts;
static kb_gate hold_gate;
static _Atomic int hold_next;   /* the next event handled waits at hold_gate */

static void count_rereads(int level, const char *msg, void *opaque)
{
    (void)level;
    (void)opaque;
    if (strstr(msg, "read again, unnumbered") != NULL)
        atomic_fetch_add(&unnumbered_reads, 1);
    if (strstr(msg, "deliveries lost before a redelivery:") != NULL)
        atomic_fetch_add(&gap_reads, 1);
    if (strstr(msg, "restarting the partition") != NULL)
        atomic_fetch_add(&restarts, 1);
}

static int held_handler(const kb_event *ev, void *opaque)
{
    if (atomic_exchange(&hold_next, 0))
        kb_gate_pass(&hold_gate);
    return kb_tracker_handler(ev, opaque);
}

/* The consumer of `stream` with `pending` messages delivered and unacked,
 * waited for (10 s at most): its name, and its last delivery's stream and
 * delivery sequences. */
static void pending_at(jsCtx *js, const char *stream, int64_t pending, char *name, size_t cap,
                       uint64_t *sseq, uint64_t *dseq)
{
    name[0] = '\0';
    for (int tries = 0; tries < 1000 && name[0] == '\0'; tries++) {
        jsConsumerNamesList *l = NULL;
        assert_int_equal(js_ConsumerNames(&l, js, stream, NULL, NULL), NATS_OK);
        for (int i = 0; i < l->Count && name[0] == '\0'; i++) {
            jsConsumerInfo *ci = NULL;
            if (js_GetConsumerInfo(&ci, js, stream, l->List[i], NULL, NULL) == NATS_OK &&
                ci->NumAckPending == pending) {
                snprintf(name, cap, "%s", l->List[i]);
                *sseq = ci->Delivered.Stream;
                *dseq = ci->Delivered.Consumer;
            }
            jsConsumerInfo_Destroy(ci);
        }
        jsConsumerNamesList_Destroy(l);
        if (name[0] == '\0')
            usleep(10000);
    }
    assert_true(name[0] != '\0');
}

/* Pull requests `consumer` holds open. */
static int64_t waiting(jsCtx *js, const char *stream, const char *consumer)
{
    jsConsumerInfo *ci = NULL;
    assert_int_equal(js_GetConsumerInfo(&ci, js, stream, consumer, NULL, NULL), NATS_OK);
    int64_t n = ci->NumWaiting;
    jsConsumerInfo_Destroy(ci);
    return n;
}

static void nak(natsConnection *nc, const char *stream, const char *consumer, uint64_t sseq,
                uint64_t dseq)
{
    char subject[512];
    snprintf(subject, sizeof subject, "$JS.ACK.%s.%s.1.%llu.%llu.0.0", stream, consumer,
             (unsigned long long)sseq, (unsigned long long)dseq);
    assert_int_equal(natsConnection_PublishString(nc, subject, "-NAK"), NATS_OK);
    assert_int_equal(natsConnection_FlushTimeout(nc, 5000), NATS_OK);
}

#define RENUMBERED 5   /* events of the held key published into the black hole, at most */

enum renumber { NAK_BEFORE_DROP, NAK_AFTER_DROP, NAK_LAST_TOO, WIDE_NAK_AFTER_DROP };

/* The consumer numbers its deliveries otherwise than the stream holds them
 * (nats-server 2.9 sends a NAKed message again under a new number): key 0's
 * event 2 is held in its handler and NAKed from another connection, and the
 * next RENUMBERED deliveries are lost on the wire (the consumer's connection
 * black-holed, then dropped). NAK_BEFORE_DROP: the redelivery is lost too,
 * and the first delivery after the gap shows more lost than the stream holds
 * there: read again, unnumbered. NAK_AFTER_DROP: the redelivery is the first
 * delivery after the gap, which stays open until the next first delivery:
 * read again then. NAK_LAST_TOO: then the last lost delivery is NAKed as well,
 * and its redelivery, past the open gap, has the ones before it read again
 * first. No case loses an event, breaks a key's order or restarts the
 * partition (each restarted it before; the third, taken as the next, lost
 * the ones below it). WIDE_NAK_AFTER_DROP: the second through a wide
 * consumer (a lone member's), which is not read around: it restarts, and
 * loses nothing either. */
static void renumbered_deliveries(enum renumber how)
{
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_test_proxy *proxy = NULL;
    /* long pull requests: the ones open at the black hole take every event
     * published into it */
    bool wide = how == WIDE_NAK_AFTER_DROP;
    const char *const conf[] = {"nats.topic_consumer", wide ? "auto" : "off", "nats.ack_wait_ms",
                                "600000", "nats.fetch_expires_ms", "10000", NULL};
    atomic_store(&unnumbered_reads, 0);
    atomic_store(&gap_reads, 0);
    atomic_store(&restarts, 0);
    atomic_store(&hold_gate.open, 0);
    kb_bus *b = proxied_bus(&s, &proxy, conf, count_rereads);
    const char *topic = "fault.renumber";
    kb_tracker t;
    kb_tracker_init(&t, KEYS);
    kb_assert_ok(kb_subscribe(b, topic, held_handler, &t));
    for (uint32_t k = 0; k < KEYS; k++)
        publish_ok(b, topic, k, 1);
    kb_assert_ok(kb_flush(b, 10000));
    wait_distinct(&t, KEYS, 30);
    assert_int_equal(kb_tracker_distinct(&t), KEYS);
    char before[2048], after[2048];
    consumer_names(s.url, topic, before, sizeof before);

    atomic_store(&hold_next, 1);
    publish_ok(b, topic, 0, 2);
    kb_gate_wait_for_waiter(&hold_gate);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, s.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    char stream[64], consumer[128];
    uint64_t held_sseq = 0, held_dseq = 0, last_sseq = 0, last_dseq = 0;
    kb_test_nats_stream(topic, stream, sizeof stream);
    pending_at(js, stream, 1, consumer, sizeof consumer, &held_sseq, &held_dseq);

    kb_test_proxy_blackhole_from(proxy, 1);   /* the consumer's connection */
    if (how == NAK_BEFORE_DROP)
        nak(nc, stream, consumer, held_sseq, held_dseq);
    /* events of key 0 delivered into the held connection, one at a time
     * while a pull request is open there (none left undelivered) */
    uint32_t lost = 0;
    while (lost < RENUMBERED && waiting(js, stream, consumer) > 0) {
        publish_ok(b, topic, 0, 3 + lost);
        kb_assert_ok(kb_flush(b, 10000));
        pending_at(js, stream, 2 + lost, consumer, sizeof consumer, &last_sseq, &last_dseq);
        lost++;
    }
    assert_true(lost > 0);
    kb_test_proxy_drop_from(proxy, 1);
    usleep(300000);   /* reconnected, pulls sent again */
    if (how != NAK_BEFORE_DROP) {
        nak(nc, stream, consumer, held_sseq, held_dseq);
        usleep(200000);   /* the redelivery came: the gap is open */
    }
    if (how == NAK_LAST_TOO) {
        nak(nc, stream, consumer, last_sseq, last_dseq);
        usleep(200000);   /* its redelivery came, past the open gap */
    }
    publish_ok(b, topic, 0, 3 + lost);   /* the first delivery past the gap */
    kb_assert_ok(kb_flush(b, 10000));
    usleep(300000);
    atomic_store(&hold_gate.open, 1);
    wait_distinct(&t, KEYS + 2 + lost, 30);
    consumer_names(s.url, topic, after, sizeof after);
    print_message("renumbered (case %d): %u lost on the wire, %llu distinct, read again %d "
                  "unnumbered and %d after a redelivery, %d restarts, %llu duplicates\n",
                  (int)how, lost,
                  (unsigned long long)kb_tracker_distinct(&t), atomic_load(&unnumbered_reads),
                  atomic_load(&gap_reads), atomic_load(&restarts),
                  (unsigned long long)t.duplicates);
    assert_int_equal(kb_tracker_distinct(&t), KEYS + 2 + lost);
    assert_int_equal(atomic_load(&t.order_violations), 0);
    if (how == NAK_BEFORE_DROP)
        assert_true(atomic_load(&unnumbered_reads) > 0);
    if (wide) {
        assert_true(atomic_load(&restarts) > 0);
    } else {
        if (how != NAK_BEFORE_DROP)
            assert_true(atomic_load(&gap_reads) > 0);
        assert_int_equal(atomic_load(&restarts), 0);
        assert_string_equal(before, after);
    }
    kb_assert_ok(kb_close(b, 10000));
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    kb_tracker_destroy(&t);
    kb_test_proxy_stop(proxy);
    kb_test_server_stop(&s);
}

static void renumbered_deliveries_read_again(void **state)
{
    (void)state;
    renumbered_deliveries(NAK_BEFORE_DROP);
}

static void redelivery_shows_the_gap(void **state)
{
    (void)state;
    renumbered_deliveries(NAK_AFTER_DROP);
}

static void redelivery_past_an_open_gap(void **state)
{
    (void)state;
    renumbered_deliveries(NAK_LAST_TOO);
}

static void wide_claim_redelivery_shows_the_gap(void **state)
{
    (void)state;
    renumbered_deliveries(WIDE_NAK_AFTER_DROP);
}

static _Atomic int leases_lost;

static void count_lost_leases(int level, const char *msg, void *opaque)
{
    (void)level;
    (void)opaque;
    if (strstr(msg, "lease of") != NULL && strstr(msg, " lost") != NULL)
        atomic_fetch_add(&leases_lost, 1);
}

/* A bucket that answers every lease round later than the round waits for
 * it (nats.lease_ttl_ms 3000: a round waits 500 ms; the proxy holds each
 * direction 300 ms), though well within the TTL: the server renews every
 * lease, and the answers that come late still count. No lease is lost (all
 * were, every 2.5 s), so no partition moves; nothing is lost, every key in
 * order. */
static void late_answers_keep_leases(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_test_proxy *proxy = NULL;
    const char *const conf[] = {"nats.lease_ttl_ms", "3000", NULL};
    kb_bus *b = proxied_bus(&s, &proxy, conf, count_lost_leases);
    const char *topic = "fault.late";
    kb_tracker t;
    first_round(b, topic, &t);
    atomic_store(&leases_lost, 0);

    kb_test_proxy_delay(proxy, 300);
    uint32_t last = 1;
    for (int i = 0; i < 8; i++) {   /* 6 s: two TTLs, events flowing */
        last++;
        for (uint32_t k = 0; k < KEYS; k++)
            publish_ok(b, topic, k, last);
        usleep(750000);
    }
    kb_test_proxy_delay(proxy, 0);
    kb_assert_ok(kb_flush(b, 20000));
    wait_distinct(&t, (uint64_t)KEYS * last, 30);
    print_message("late lease answers: %d leases lost, %llu distinct, %llu duplicates\n",
                  atomic_load(&leases_lost), (unsigned long long)kb_tracker_distinct(&t),
                  (unsigned long long)t.duplicates);
    assert_int_equal(atomic_load(&leases_lost), 0);
    assert_int_equal(kb_tracker_distinct(&t), (uint64_t)KEYS * last);
    assert_int_equal(atomic_load(&t.order_violations), 0);
    kb_assert_ok(kb_close(b, 10000));
    kb_tracker_destroy(&t);
    kb_test_proxy_stop(proxy);
    kb_test_server_stop(&s);
}

/* Every event of `keys` x `per_key` handled by a fresh consumer reading the
 * stream from the start: the tracker says whether a key's events came out
 * of order (stored out of order: one consumer reads a partition in order). */
static void read_back(const char *url, const char *topic, uint32_t keys, uint32_t per_key,
                      kb_tracker *t)
{
    kb_tracker_init(t, keys);
    kb_bus *c = open_bus(url, NULL, NULL);
    kb_assert_ok(kb_subscribe(c, topic, kb_tracker_handler, t));
    uint64_t n = (uint64_t)keys * per_key;
    kb_wait_until(atomic_load(&t->handled) >= n, 60000, "%llu of %llu events handled",
                  (unsigned long long)atomic_load(&t->handled), (unsigned long long)n);
    kb_assert_ok(kb_close(c, 10000));
}

/* nats.c runs every connection callback of the process on one thread: a
 * closed callback of the test's own connection that waits holds back the
 * bus's disconnected and reconnected callbacks until released. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool entered, release;
} hold = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};

static void holding_closed_cb(natsConnection *nc, void *closure)
{
    (void)nc, (void)closure;
    pthread_mutex_lock(&hold.mu);
    hold.entered = true;
    pthread_cond_broadcast(&hold.cv);
    while (!hold.release)
        pthread_cond_wait(&hold.cv, &hold.mu);
    pthread_mutex_unlock(&hold.mu);
}

static natsConnection *hold_callbacks(int port)
{
    char url[64];
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", port);
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    assert_int_equal(natsOptions_Create(&o), NATS_OK);
    assert_int_equal(natsOptions_SetURL(o, url), NATS_OK);
    assert_int_equal(natsOptions_SetClosedCB(o, holding_closed_cb, NULL), NATS_OK);
    assert_int_equal(natsConnection_Connect(&nc, o), NATS_OK);
    natsOptions_Destroy(o);
    natsConnection_Close(nc);
    pthread_mutex_lock(&hold.mu);
    while (!hold.entered)
        pthread_cond_wait(&hold.cv, &hold.mu);
    pthread_mutex_unlock(&hold.mu);
    return nc;
}

static void release_callbacks(natsConnection *nc)
{
    pthread_mutex_lock(&hold.mu);
    hold.release = true;
    pthread_cond_broadcast(&hold.cv);
    pthread_mutex_unlock(&hold.mu);
    natsConnection_Destroy(nc);
}

/* Events the resend tests' publisher had reported stored. */
static _Atomic uint64_t reported_ok;

static void count_ok(const kb_delivery_report *r, void *opaque)
{
    (void)opaque;
    if (r->result == KB_OK)
        atomic_fetch_add(&reported_ok, 1);
}

/* A publisher for the resend tests: plain events (nats.publish_batch = 1,
 * one server: pipelined), no stall verdict and no PINGs in the way (only
 * the break takes back), a quick reconnect; its stored events counted in
 * reported_ok. */
static kb_bus *open_resender(const char *url, const char *const *extra)
{
    static const char *const conf[] = {"nats.publish_batch", "1", "nats.publish_timeout_ms",
                                       "600000", "nats.ping_interval_ms", "600000",
                                       "nats.reconnect_wait_ms", "20", NULL};
    kb_conf *c = kb_test_conf(url, conf, extra);
    kb_conf_set_delivery_cb(c, count_ok, NULL);
    return kb_test_open_conf(c);
}

/* A failed assertion while the callbacks are held would leave nats.c's
 * callback thread waiting for ever. */
static int release_held(void **state)
{
    pthread_mutex_lock(&hold.mu);
    bool held = hold.entered && !hold.release;
    pthread_mutex_unlock(&hold.mu);
    if (held)
        release_callbacks(*state);
    return 0;
}

static _Atomic int claimed_again;

static void count_claimed_again(int level, const char *msg, void *opaque)
{
    (void)level;
    (void)opaque;
    if (strstr(msg, "claimed again") != NULL)
        atomic_fetch_add(&claimed_again, 1);
}

struct cut {
    kb_test_proxy *proxy;
    _Atomic int started;
    int armed;   /* kb_test_proxy_blackhole_after's result */
};

/* The server's answer to the first consumer creation is lost with the
 * client's connections (they are closed with it held); they reconnect. */
static void *cut_after_creation(void *arg)
{
    struct cut *c = arg;
    atomic_store(&c->started, 1);
    c->armed = kb_test_proxy_blackhole_after(c->proxy, ".CREATE.KB_", 30000);
    if (c->armed == 0) {
        usleep(200000);   /* the server made the consumer and answered into the hole */
        kb_test_proxy_drop_from(c->proxy, 0);
    }
    return NULL;
}

/* A consumer's creation whose answer is lost on the way (the client's
 * connection gone, as with its node killed) is asked again, the same
 * request, after ASK_AGAIN_MS — while the connection is being made again
 * (nats.c refuses the ask at once: no reconnect buffer), every 50 ms until
 * it is back — and the server answers from the consumer it made. The claim
 * takes over under its first name: no creation given up ("claimed again",
 * after the whole wait, 3.3 s at the default TTL, before), no second
 * consumer; nothing lost, every key in order. */
static void creation_answer_lost(const char *reconnect_wait_ms)
{
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_test_proxy *proxy = NULL;
    const char *const conf[] = {"nats.reconnect_wait_ms", reconnect_wait_ms, NULL};
    atomic_store(&claimed_again, 0);
    kb_bus *b = proxied_bus(&s, &proxy, conf, count_claimed_again);
    const char *topic = "fault.creation";
    for (uint32_t k = 0; k < KEYS; k++)   /* the stream exists before the cut is armed */
        publish_ok(b, topic, k, 1);
    kb_assert_ok(kb_flush(b, 10000));

    struct cut cut = {.proxy = proxy, .armed = -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, cut_after_creation, &cut), 0);
    while (!atomic_load(&cut.started))
        usleep(1000);
    usleep(20000);   /* armed */
    kb_tracker t;
    kb_tracker_init(&t, KEYS);
    kb_assert_ok(kb_subscribe(b, topic, kb_tracker_handler, &t));
    pthread_join(th, NULL);
    for (uint32_t k = 0; k < KEYS; k++)
        publish_ok(b, topic, k, 2);
    kb_assert_ok(kb_flush(b, 20000));
    wait_distinct(&t, 2 * KEYS, 30);
    char names[2048];
    consumer_names(s.url, topic, names, sizeof names);
    int consumers = 0;
    for (const char *n = names; (n = strchr(n, ' ')) != NULL; n++)
        consumers++;
    print_message("creation answer lost (reconnect wait %s ms): armed %d, %d creations given "
                  "up, %llu distinct, consumers '%s'\n", reconnect_wait_ms, cut.armed,
                  atomic_load(&claimed_again), (unsigned long long)kb_tracker_distinct(&t),
                  names);
    assert_int_equal(cut.armed, 0);
    assert_int_equal(atomic_load(&claimed_again), 0);
    assert_int_equal(kb_tracker_distinct(&t), 2 * KEYS);
    assert_int_equal(atomic_load(&t.order_violations), 0);
    assert_int_equal(consumers, 1);   /* the claim's */
    kb_assert_ok(kb_close(b, 10000));
    kb_tracker_destroy(&t);
    kb_test_proxy_stop(proxy);
    kb_test_server_stop(&s);
}

static void lost_creation_answer_asked_again(void **state)
{
    (void)state;
    creation_answer_lost("1");
}

/* The same, the connection back only after the second ask is due (nats.c
 * waits nats.reconnect_wait_ms before it tries the server again). */
static void lost_creation_answer_slow_reconnect(void **state)
{
    (void)state;
    creation_answer_lost("1500");
}

#define ORDER_KEYS 4
#define LOST 50     /* per key, sent into a black hole */
#define AFTER 50    /* per key, published once the connection broke */

/* The publishes of LOST events of each key are held by the proxy and
 * dropped with the connection; nats.c reconnects at once (through the
 * proxy) while its callback thread is held, so the bus hears of the break
 * only from the connection itself. The later events are published after
 * the reconnect (the acker's tick is a second away: the publishers' own
 * sends meet it); every key must be stored in order. */
static void order_across_a_fast_reconnect(void **state)
{
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_test_proxy *proxy = kb_test_proxy_start(s.port);
    assert_non_null(proxy);
    char url[128];
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", kb_test_proxy_port(proxy));
    const char *topic = "resend.order";
    static const char *const quick[] = {"nats.ack_interval_ms", "1000", "nats.reconnect_wait_ms",
                                        "1", NULL};
    kb_bus *b = open_resender(url, quick);
    for (uint32_t k = 0; k < ORDER_KEYS; k++)   /* the stream exists */
        publish_ok(b, topic, k, 1);
    kb_assert_ok(kb_flush(b, 10000));

    kb_test_proxy_blackhole(proxy, 1);
    for (uint32_t seq = 2; seq <= 1 + LOST; seq++)
        for (uint32_t k = 0; k < ORDER_KEYS; k++)
            publish_ok(b, topic, k, seq);
    usleep(100000);   /* written to the held connection */
    natsConnection *held = hold_callbacks(s.port);
    *state = held;
    uint64_t before = atomic_load(&reported_ok);
    kb_test_proxy_drop_from(proxy, 0);
    usleep(200000);   /* nats.c reconnected through the proxy meanwhile */
    for (uint32_t seq = 2 + LOST; seq <= 1 + LOST + AFTER; seq++) {
        for (uint32_t k = 0; k < ORDER_KEYS; k++)
            publish_ok(b, topic, k, seq);
        usleep(10000);
    }
    /* the case under test: events stored over the new connection before the
     * disconnected callback could run */
    kb_wait_until(atomic_load(&reported_ok) > before, 30000,
                  "no event stored before the disconnected callback");
    uint64_t early = atomic_load(&reported_ok) - before;
    release_callbacks(held);
    kb_assert_ok(kb_flush(b, 30000));
    kb_assert_ok(kb_close(b, 10000));

    kb_tracker t;
    read_back(s.url, topic, ORDER_KEYS, 1 + LOST + AFTER, &t);
    print_message("fast reconnect: %llu stored before the disconnected callback, %llu handled, "
                  "%llu out of order, %llu duplicates\n", (unsigned long long)early,
                  (unsigned long long)atomic_load(&t.handled),
                  (unsigned long long)atomic_load(&t.order_violations),
                  (unsigned long long)atomic_load(&t.duplicates));
    assert_int_equal(atomic_load(&t.order_violations), 0);
    assert_int_equal(kb_tracker_distinct(&t), ORDER_KEYS * (1 + LOST + AFTER));
    kb_tracker_destroy(&t);
    kb_test_proxy_stop(proxy);
    kb_test_server_stop(&s);
}

#define RESTART_KEYS 32
#define RESTART_PER_KEY 100

/* The server stops answering (SIGSTOP) with every publish unacked, is
 * killed and restarted on the same store; kb_close at once (the acker has
 * stopped) must send all of them again within its deadline — a
 * partition's resends go one after the other, each once the one before is
 * acked — and give up none. */
static void close_resends_after_a_restart(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    const char *topic = "resend.restart";
    kb_bus *b = open_resender(s.url, NULL);
    for (uint32_t k = 0; k < RESTART_KEYS; k++)   /* the stream exists */
        publish_ok(b, topic, k, 1);
    kb_assert_ok(kb_flush(b, 10000));

    kb_test_server_signal(&s, SIGSTOP);
    uint64_t before = atomic_load(&reported_ok);
    for (uint32_t seq = 2; seq <= RESTART_PER_KEY; seq++)
        for (uint32_t k = 0; k < RESTART_KEYS; k++)
            publish_ok(b, topic, k, seq);
    usleep(100000);   /* written to the stopped server's socket */
    kb_test_server_signal(&s, SIGKILL);
    assert_int_equal(kb_test_server_restart(&s), 0);
    /* the case under test: publishes left unacked for kb_close to send (the
     * acker may have sent some since the reconnect) */
    uint64_t unacked = RESTART_KEYS * (RESTART_PER_KEY - 1) - (atomic_load(&reported_ok) - before);
    assert_true(unacked > 0);
    int rc = kb_close(b, 20000);
    print_message("kb_close after a restart with %llu of %d publishes unacked: %s %s\n",
                  (unsigned long long)unacked, RESTART_KEYS * (RESTART_PER_KEY - 1),
                  kb_strerror(rc), rc == KB_OK ? "" : kb_last_error());
    kb_assert_ok(rc);

    kb_tracker t;
    read_back(s.url, topic, RESTART_KEYS, RESTART_PER_KEY, &t);
    assert_int_equal(kb_tracker_distinct(&t), RESTART_KEYS * RESTART_PER_KEY);
    assert_int_equal(atomic_load(&t.order_violations), 0);
    kb_tracker_destroy(&t);
    kb_test_server_stop(&s);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    helper = argv[1];
    if (argc > 2)
        cmocka_set_test_filter(argv[2]);   /* one test by name, by hand */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(server_restart_mid_stream),
        cmocka_unit_test(drain_across_server_restarts),
        cmocka_unit_test(server_down_at_start),
        cmocka_unit_test(kill_one_of_two_consumers),
        cmocka_unit_test(kill_one_of_two_consumers_off),
        cmocka_unit_test(wide_takeover_skips_acked),
        cmocka_unit_test(lost_lease_releases_queued),
        cmocka_unit_test(consumer_connection_lost_at_close),
        cmocka_unit_test(lost_deliveries_read_again),
        cmocka_unit_test(renumbered_deliveries_read_again),
        cmocka_unit_test(redelivery_shows_the_gap),
        cmocka_unit_test(redelivery_past_an_open_gap),
        cmocka_unit_test(wide_claim_redelivery_shows_the_gap),
        cmocka_unit_test(late_answers_keep_leases),
        cmocka_unit_test(lost_creation_answer_asked_again),
        cmocka_unit_test(lost_creation_answer_slow_reconnect),
        cmocka_unit_test_teardown(order_across_a_fast_reconnect, release_held),
        cmocka_unit_test(close_resends_after_a_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
