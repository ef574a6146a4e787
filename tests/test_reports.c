/* What a service learns without parsing logs (issue 28, item 7), on a real
 * broker: `test_reports redis|nats`.
 *   - kb_conf_set_delivery_cb: one report per published event, stored with
 *     its broker ID, key and partition; on redis:// an XADD the server
 *     refuses is reported failed with the server's reason;
 *   - with the broker killed -9 mid-stream, every event kb_publish accepted
 *     is reported exactly once (stored or failed) by the time kb_close
 *     returns (on redis:// also with redis.wait_replicas); on redis:// with
 *     redis.wait_replicas and no replica, every event is reported failed,
 *     naming the replicas;
 *   - kb_conf_set_state_cb: CONNECTED at kb_open, DISCONNECTED when the
 *     server dies, RECONNECTED when it is back;
 *   - group.start = latest: a new group skips what is stored, earliest (the
 *     default) gets it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/suite.h"

#define EVENTS 50

static const char *kind = "redis";
static kb_test_server server;
static char url[160];

static void unique_topic(char *buf, size_t len, const char *name)
{
    static int seq;
    snprintf(buf, len, "reports.%s.%d.%d", name, (int)getpid(), ++seq);
}

/* The test's own settings only: no KEYBUS_* variable of the environment. */
static const char *const no_env[] = {"conf.env", "false", NULL};

/* ---- delivery reports ---- */

struct reports {
    pthread_mutex_t lock;
    unsigned stored, failed, bad;
    unsigned char seen[EVENTS];
    char error[256], first_bad[256];
};

static void on_report(const kb_delivery_report *r, void *opaque)
{
    struct reports *rs = opaque;
    pthread_mutex_lock(&rs->lock);
    int k = -1;
    char key[32];
    snprintf(key, sizeof key, "%.*s", (int)(r->key_len < 31 ? r->key_len : 31),
             (const char *)r->key);
    if (sscanf(key, "key-%d", &k) != 1 || k < 0 || k >= EVENTS ||
        r->partition != kb_partition_of(r->key, r->key_len, 8) ||
        strncmp(r->topic, "reports.", 8) != 0) {
        rs->bad++;
        snprintf(rs->first_bad, sizeof rs->first_bad, "%s %s p%u", r->topic, key, r->partition);
    } else if (r->result == KB_OK && r->id[0] != '\0' && r->error[0] == '\0') {
        rs->stored++;
        rs->seen[k]++;
    } else if (r->result != KB_OK && r->id[0] == '\0' && r->error[0] != '\0') {
        rs->failed++;
        snprintf(rs->error, sizeof rs->error, "%s", r->error);
    } else {
        rs->bad++;
    }
    pthread_mutex_unlock(&rs->lock);
}

static unsigned reported(struct reports *rs)
{
    pthread_mutex_lock(&rs->lock);
    unsigned n = rs->stored + rs->failed + rs->bad;
    pthread_mutex_unlock(&rs->lock);
    return n;
}

static void publish_keys(kb_bus *b, const char *topic, int from, int to)
{
    for (int i = from; i < to; i++) {
        char key[16];
        int kl = snprintf(key, sizeof key, "key-%d", i);
        kb_assert_ok(kb_publish(b, topic, key, (size_t)kl, "v", 1));
    }
}

static void every_event_is_reported_once(void **state)
{
    (void)state;
    static struct reports rs = {.lock = PTHREAD_MUTEX_INITIALIZER};
    char topic[96];
    unique_topic(topic, sizeof topic, "stored");
    kb_conf *c = kb_test_conf(url, no_env, NULL);
    kb_conf_set_delivery_cb(c, on_report, &rs);
    kb_bus *b = kb_test_open_conf(c);
    publish_keys(b, topic, 0, EVENTS);
    kb_assert_ok(kb_flush(b, 30000));
    for (int i = 0; i < 300 && reported(&rs) < EVENTS; i++)   /* the ack thread's */
        usleep(100 * 1000);
    kb_assert_ok(kb_close(b, 30000));
    if (rs.stored != EVENTS || rs.failed != 0 || rs.bad != 0)
        fail_msg("%u stored, %u failed, %u bad (%s)", rs.stored, rs.failed, rs.bad, rs.first_bad);
    for (int i = 0; i < EVENTS; i++)
        assert_int_equal(rs.seen[i], 1);
}

/* redis://: a partition's stream key holding a string makes the server
 * refuse its XADDs (WRONGTYPE), for good. */
static void a_refused_event_is_reported_failed(void **state)
{
    (void)state;
    if (strcmp(kind, "redis") != 0)
        skip();   /* a JetStream refusal cannot be provoked from outside this way */
    static struct reports rs = {.lock = PTHREAD_MUTEX_INITIALIZER};
    char topic[96], cmd[512];
    unique_topic(topic, sizeof topic, "refused");
    /* key-0's partition */
    snprintf(cmd, sizeof cmd, "redis-cli -p %d SET 'kb:{%s}:p:%u' x >/dev/null", server.port,
             topic, kb_partition_of("key-0", 5, 8));
    assert_int_equal(system(cmd), 0);
    kb_conf *c = kb_test_conf(url, no_env, NULL);
    kb_conf_set_delivery_cb(c, on_report, &rs);
    kb_bus *b = kb_test_open_conf(c);
    publish_keys(b, topic, 0, 1);
    assert_int_not_equal(kb_flush(b, 30000), KB_OK);   /* refused: kb_flush says so too */
    for (int i = 0; i < 300 && reported(&rs) < 1; i++)
        usleep(100 * 1000);
    kb_close(b, 30000);
    if (rs.failed != 1 || rs.stored != 0 || strstr(rs.error, "WRONGTYPE") == NULL)
        fail_msg("%u stored, %u failed (%s), %u bad", rs.stored, rs.failed, rs.error, rs.bad);
}

/* ---- one report per accepted event, whatever happens ---- */

#define MANY 4000000   /* keys a publisher may try; it stops long before */

struct tally {
    atomic_uint stored, failed, twice, bad;
    unsigned char *seen;   /* MANY */
    pthread_mutex_t lock;
    char error[256];
};

static void on_tally(const kb_delivery_report *r, void *opaque)
{
    struct tally *t = opaque;
    char key[32];
    unsigned k = MANY;
    snprintf(key, sizeof key, "%.*s", (int)(r->key_len < 31 ? r->key_len : 31),
             (const char *)r->key);
    if (sscanf(key, "u%u", &k) != 1 || k >= MANY) {
        atomic_fetch_add(&t->bad, 1);
        return;
    }
    pthread_mutex_lock(&t->lock);
    if (t->seen[k]++ > 0)
        atomic_fetch_add(&t->twice, 1);
    if (r->result != KB_OK && t->error[0] == '\0')
        snprintf(t->error, sizeof t->error, "%s", r->error);
    pthread_mutex_unlock(&t->lock);
    if (r->result == KB_OK && r->id[0] != '\0')
        atomic_fetch_add(&t->stored, 1);
    else if (r->result != KB_OK && r->error[0] != '\0' && r->id[0] == '\0')
        atomic_fetch_add(&t->failed, 1);
    else
        atomic_fetch_add(&t->bad, 1);
}

struct publisher {
    kb_bus *b;
    const char *topic;
    atomic_bool stop;
    unsigned tried;
    unsigned char *accepted;   /* MANY */
    unsigned n_accepted;
};

static void *publish_until_stopped(void *arg)
{
    struct publisher *p = arg;
    while (!atomic_load(&p->stop) && p->tried < MANY) {
        char key[16];
        int kl = snprintf(key, sizeof key, "u%u", p->tried);
        if (kb_publish(p->b, p->topic, key, (size_t)kl, "payload", 7) == KB_OK) {
            p->accepted[p->tried] = 1;
            p->n_accepted++;
        }
        p->tried++;
    }
    return NULL;
}

/* Every accepted key reported exactly once, no other key at all. */
static void check_once_each(const struct tally *t, const struct publisher *p)
{
    unsigned missing = 0, unasked = 0, first_missing = MANY;
    for (unsigned k = 0; k < MANY; k++) {
        if (p->accepted[k] && t->seen[k] == 0 && missing++ == 0)
            first_missing = k;
        if (!p->accepted[k] && t->seen[k] > 0)
            unasked++;
    }
    unsigned stored = atomic_load(&t->stored), failed = atomic_load(&t->failed);
    print_message("%s: %u tried, %u accepted, %u stored + %u failed reported; "
                  "%u missing (first u%u), %u twice, %u never accepted, %u bad (%s)\n", kind,
                  p->tried, p->n_accepted, stored, failed, missing, first_missing,
                  atomic_load(&t->twice), unasked, atomic_load(&t->bad), t->error);
    assert_int_equal(missing, 0);
    assert_int_equal(atomic_load(&t->twice), 0);
    assert_int_equal(unasked, 0);
    assert_int_equal(atomic_load(&t->bad), 0);
    assert_int_equal(stored + failed, p->n_accepted);
}

/* A bus with `kv` whose reports go to t, publishing to a new topic (named
 * into topic[96]) through p. */
static void open_tallied(struct tally *t, struct publisher *p, char *topic, const char *name,
                         const char *const *kv)
{
    t->seen = calloc(MANY, 1);
    p->accepted = calloc(MANY, 1);
    assert_non_null(t->seen);
    assert_non_null(p->accepted);
    unique_topic(topic, 96, name);
    kb_conf *c = kb_test_conf(url, no_env, kv);
    kb_conf_set_delivery_cb(c, on_tally, t);
    p->b = kb_test_open_conf(c);
    p->topic = topic;
}

/* Publish unique keys from a thread, kill the broker -9 mid-stream, close:
 * every accepted event reported exactly once by the time kb_close returned. */
static void killed_mid_stream(const char *name, const char *const *kv, bool some_stored)
{
    static struct tally t;
    memset(&t, 0, sizeof t);
    pthread_mutex_init(&t.lock, NULL);
    struct publisher p = {0};
    char topic[96];
    open_tallied(&t, &p, topic, name, kv);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, publish_until_stopped, &p), 0);
    for (int i = 0; i < 600 && atomic_load(&t.stored) + atomic_load(&t.failed) < 20000; i++)
        usleep(10 * 1000);
    kb_test_server_signal(&server, SIGKILL);   /* mid-stream */
    usleep(500 * 1000);
    atomic_store(&p.stop, true);
    pthread_join(th, NULL);
    int rc = kb_close(p.b, 1000);   /* gives up on what the dead server never took */
    print_message("kb_close: %d (%s)\n", rc, rc != KB_OK ? kb_last_error() : "");
    assert_int_equal(kb_test_server_restart(&server), 0);
    check_once_each(&t, &p);
    assert_true(!some_stored || atomic_load(&t.stored) > 0);
    assert_true(atomic_load(&t.failed) > 0);   /* the server died with events unconfirmed */
    free(t.seen);
    free(p.accepted);
    pthread_mutex_destroy(&t.lock);
}

static void every_accepted_event_is_reported_when_the_broker_dies(void **state)
{
    (void)state;
    /* a short wait for room: the publisher keeps trying through the outage */
    const char *const kv[] = {"pool.enqueue_timeout_ms", "5", NULL};
    killed_mid_stream("killed", kv, true);
}

/* The same with redis.wait_replicas and no replica: events stored before
 * the kill wait for a WAIT (failed, naming the replicas), those confirmed on
 * the lost connection too; each is reported once. */
static void every_accepted_event_is_reported_when_the_broker_dies_waiting(void **state)
{
    (void)state;
    if (strcmp(kind, "redis") != 0)
        skip();   /* a Redis setting */
    const char *const kv[] = {"pool.enqueue_timeout_ms", "5", "redis.wait_replicas", "1",
                              "redis.wait_timeout_ms", "20", NULL};
    killed_mid_stream("killed.wait", kv, false);
}

/* redis.wait_replicas with no replica: stored on the primary, reported
 * failed, the report naming the replicas; kb_flush says so too. */
static void a_replica_shortfall_is_reported_failed(void **state)
{
    (void)state;
    if (strcmp(kind, "redis") != 0)
        skip();   /* a Redis setting */
    static struct tally t = {.lock = PTHREAD_MUTEX_INITIALIZER};
    struct publisher p = {0};
    char topic[96];
    const char *const kv[] = {"redis.wait_replicas", "1", "redis.wait_timeout_ms", "50", NULL};
    open_tallied(&t, &p, topic, "replicas", kv);
    for (p.tried = 0; p.tried < 200; p.tried++) {
        char key[16];
        int kl = snprintf(key, sizeof key, "u%u", p.tried);
        kb_assert_ok(kb_publish(p.b, topic, key, (size_t)kl, "v", 1));
        p.accepted[p.tried] = 1;
        p.n_accepted++;
    }
    int rc = kb_flush(p.b, 30000);
    assert_int_equal(rc, KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "replicas"));
    /* the WAIT's answer settled them */
    for (int i = 0; i < 300 && atomic_load(&t.failed) < 200; i++)
        usleep(10 * 1000);
    assert_int_equal(atomic_load(&t.failed), 200);
    kb_close(p.b, 10000);
    assert_int_equal(atomic_load(&t.stored), 0);
    assert_non_null(strstr(t.error, "of 1 replicas"));
    check_once_each(&t, &p);
    free(t.seen);
    free(p.accepted);
}

/* ---- connection state ---- */

struct states {
    pthread_mutex_t lock;
    int seq[16];
    size_t n;
    char scheme[16];
};

static void on_state(const char *scheme, kb_state st, const char *reason, void *opaque)
{
    struct states *s = opaque;
    (void)reason;
    pthread_mutex_lock(&s->lock);
    if (s->n < 16)
        s->seq[s->n++] = (int)st;
    snprintf(s->scheme, sizeof s->scheme, "%s", scheme);
    pthread_mutex_unlock(&s->lock);
}

static bool saw(struct states *s, kb_state st)
{
    pthread_mutex_lock(&s->lock);
    bool found = false;
    for (size_t i = 0; i < s->n; i++)
        found = found || s->seq[i] == (int)st;
    pthread_mutex_unlock(&s->lock);
    return found;
}

static void outage_is_reported(void **state)
{
    (void)state;
    static struct states s = {.lock = PTHREAD_MUTEX_INITIALIZER};
    char topic[96];
    unique_topic(topic, sizeof topic, "state");
    kb_conf *c = kb_test_conf(url, no_env, NULL);
    kb_conf_set_state_cb(c, on_state, &s);
    kb_bus *b = kb_test_open_conf(c);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.seq[0], KB_STATE_CONNECTED);
    assert_string_equal(s.scheme, kind);
    publish_keys(b, topic, 0, 5);
    kb_assert_ok(kb_flush(b, 30000));
    kb_test_server_signal(&server, SIGKILL);
    /* Redis notices on its publishing connection: publish into the outage */
    for (int i = 0; i < 300 && !saw(&s, KB_STATE_DISCONNECTED); i++) {
        if (strcmp(kind, "redis") == 0)
            publish_keys(b, topic, 5, 6);
        usleep(100 * 1000);
    }
    assert_true(saw(&s, KB_STATE_DISCONNECTED));
    assert_int_equal(kb_test_server_restart(&server), 0);
    for (int i = 0; i < 600 && !saw(&s, KB_STATE_RECONNECTED); i++) {
        if (strcmp(kind, "redis") == 0 && i % 10 == 0)
            publish_keys(b, topic, 6, 7);   /* something to send brings it back */
        usleep(100 * 1000);
    }
    assert_true(saw(&s, KB_STATE_RECONNECTED));
    kb_close(b, 10000);
    /* in order: CONNECTED, then DISCONNECTED before RECONNECTED */
    size_t down = 0, up = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (s.seq[i] == KB_STATE_DISCONNECTED && down == 0)
            down = i;
        if (s.seq[i] == KB_STATE_RECONNECTED && up == 0)
            up = i;
    }
    assert_true(down > 0 && up > down);
}

/* ---- group.start ---- */

static int count_handler(const kb_event *ev, void *opaque)
{
    (void)ev;
    atomic_fetch_add((atomic_int *)opaque, 1);
    return KB_HANDLED;
}

/* Subscribe `group` with `start`, wait until it owns every partition, publish
 * 3 more, drain; how many events its handler saw. */
static int consume_as(const char *topic, const char *group, const char *start)
{
    static atomic_int n;
    atomic_store(&n, 0);
    const char *const kv[] = {"group", group, "group.start", start, NULL};
    kb_bus *b = kb_test_open_conf(kb_test_conf(url, no_env, kv));
    kb_assert_ok(kb_subscribe(b, topic, count_handler, &n));
    kb_topic_stats st = {0};
    for (int i = 0; i < 300 && (kb_stats(b, topic, &st) != KB_OK || st.partitions_owned < 8); i++)
        usleep(100 * 1000);
    assert_int_equal(st.partitions_owned, 8);
    publish_keys(b, topic, 100, 103);
    kb_assert_ok(kb_drain(b, 30000));
    kb_assert_ok(kb_close(b, 30000));
    return atomic_load(&n);
}

/* A new topic with 5 events stored, before any group. */
static void stored_topic(char *topic, size_t cap, const char *prefix)
{
    unique_topic(topic, cap, prefix);
    kb_bus *b = kb_test_open_conf(kb_test_conf(url, no_env, NULL));
    publish_keys(b, topic, 0, 5);
    kb_assert_ok(kb_flush(b, 30000));
    kb_assert_ok(kb_close(b, 30000));
}

static void group_start_latest_skips_what_is_stored(void **state)
{
    (void)state;
    char topic[96];
    stored_topic(topic, sizeof topic, "start");
    assert_int_equal(consume_as(topic, "late", "latest"), 3);
    assert_int_equal(consume_as(topic, "early", "earliest"), 11);   /* 5 + late's 3, and 3 */
    /* a group that exists keeps its place: latest changes nothing for it (early's
     * 3 and its own 3) */
    assert_int_equal(consume_as(topic, "late", "latest"), 6);
}

/* A latest group whose first owner handled nothing keeps its place: the next
 * owner does not get what was stored before the group began (a JetStream
 * DeliverNew consumer that acked nothing reports an ack floor of 0). */
static void group_start_latest_kept_by_an_owner_that_handled_nothing(void **state)
{
    (void)state;
    char topic[96];
    stored_topic(topic, sizeof topic, "idle");
    static atomic_int n;
    const char *const kv[] = {"group", "idle", "group.start", "latest", NULL};
    kb_bus *first = kb_test_open_conf(kb_test_conf(url, no_env, kv));
    kb_assert_ok(kb_subscribe(first, topic, count_handler, &n));
    kb_topic_stats st = {0};
    for (int i = 0; i < 300 && (kb_stats(first, topic, &st) != KB_OK || st.partitions_owned < 8);
         i++)
        usleep(100 * 1000);
    assert_int_equal(st.partitions_owned, 8);
    kb_assert_ok(kb_close(first, 30000));
    assert_int_equal(atomic_load(&n), 0);
    assert_int_equal(consume_as(topic, "idle", "latest"), 3);
}

int main(int argc, char **argv)
{
    kind = argc > 1 ? argv[1] : "redis";
    if (kb_test_broker_for(kind, &server, url, sizeof url) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_event_is_reported_once),
        cmocka_unit_test(a_refused_event_is_reported_failed),
        cmocka_unit_test(group_start_latest_skips_what_is_stored),
        cmocka_unit_test(group_start_latest_kept_by_an_owner_that_handled_nothing),
        cmocka_unit_test(outage_is_reported),
        cmocka_unit_test(a_replica_shortfall_is_reported_failed),
        cmocka_unit_test(every_accepted_event_is_reported_when_the_broker_dies),
        cmocka_unit_test(every_accepted_event_is_reported_when_the_broker_dies_waiting),
    };
    return kb_test_run_group("reports", kind, tests, sizeof tests / sizeof *tests, &server);
}
