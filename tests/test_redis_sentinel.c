/* redis-sentinel:// and redis.wait_replicas against real servers: a primary,
 * one replica and three Sentinels on loopback (support/sentinel.h):
 *   - the URL checked at kb_conf_set; no Sentinel answering fails kb_open;
 *   - WAIT: kb_flush names the shortfall when fewer replicas confirm;
 *   - SENTINEL FAILOVER: the old primary lives on as a replica; every
 *     connection leaves it (+switch-master, -READONLY);
 *   - the primary killed -9 mid-stream with redis.wait_replicas = 1: the
 *     Sentinels promote the replica, keybus follows it, every event a kb_flush
 *     acknowledged is handled, in per-key order; leases and pending entries
 *     carry on on the new primary (kb_drain settles). Duplicates and the
 *     pauses are printed, not asserted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <keybus/keybus.h>

#include "support/check.h"
#include "support/sentinel.h"
#include "support/tracker.h"

#define KEYS 20
#define ROUNDS_MAX 4000
#define TOPIC "sentinel-orders"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static kb_conf *conf_for(const char *url, const char *wait_replicas)
{
    char err[512];
    kb_conf *c = kb_conf_new();
    const char *kv[][2] = {
        {"transport", url},
        {"redis.lease_ttl_ms", "2000"},
        {"redis.reconnect_max_ms", "200"},
        {"redis.connect_timeout_ms", "500"},
        {"redis.read_timeout_ms", "2000"},
        {"redis.wait_replicas", wait_replicas},
        {"redis.wait_timeout_ms", "500"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        if (kb_conf_set(c, kv[i][0], kv[i][1], err, sizeof err) != KB_OK)
            fail_msg("%s: %s", kv[i][0], err);
    return c;
}

static kb_bus *open_bus(const char *url, const char *wait_replicas)
{
    char err[512];
    kb_conf *c = conf_for(url, wait_replicas);
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open %s: %s", url, err);
    return b;
}

/* ---- the URL ---- */

static void url_checked_when_set(void **state)
{
    (void)state;
    const struct {
        const char *url, *says;
    } bad[] = {
        {"redis-sentinel://h1:26379,h2:26380", "master name"},
        {"redis-sentinel://h1:26379,h2:26380/", "master name"},
        {"redis-sentinel://h1/m/0", "master name"},
        {"redis-sentinel:///m", "no Sentinel host"},
        {"redis-sentinel://h1:26379,,h2/m", "empty entry"},
        {"redis-sentinel://h1:26379,h2:0/m", "port"},
        {"redis-sentinel://h1,h2/m?x=1", "query"},
        {"redis://h1:6379,h2:6379", "redis-sentinel://"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[512] = "";
        kb_conf *c = kb_conf_new();
        assert_int_equal(kb_conf_set(c, "transport", bad[i].url, err, sizeof err), KB_EINVAL);
        if (strstr(err, bad[i].says) == NULL)
            fail_msg("%s: \"%s\" does not say \"%s\"", bad[i].url, err, bad[i].says);
        kb_conf_destroy(c);
    }
    char err[512];
    kb_conf *c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "transport", "redis-sentinel://u:SECRET@a:1,[::1]:2,b/m-1.x",
                             err, sizeof err));
    /* a WAIT longer than the read timeout would look like a silent server */
    kb_assert_ok(kb_conf_set(c, "redis.wait_replicas", "1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.wait_timeout_ms", "5000", err, sizeof err));
    assert_null(kb_open(c, err, sizeof err));
    assert_non_null(strstr(err, "redis.wait_timeout_ms (5000) must be below redis.read_timeout_ms"));
    kb_conf_destroy(c);
}

static void no_sentinel_answers(void **state)
{
    (void)state;
    int p1 = kb_test_free_port(), p2 = kb_test_free_port();
    char url[128], err[512];
    snprintf(url, sizeof url, "redis-sentinel://:SECRET@127.0.0.1:%d,127.0.0.1:%d/kbmaster", p1, p2);
    kb_conf *c = conf_for(url, "0");
    assert_null(kb_open(c, err, sizeof err));
    assert_non_null(strstr(err, "no Sentinel named the primary of \"kbmaster\""));
    char where[32];
    snprintf(where, sizeof where, "127.0.0.1:%d", p2);
    assert_non_null(strstr(err, where));   /* each Sentinel tried is named */
    assert_null(strstr(err, "SECRET"));
    kb_conf_destroy(c);
}

/* ---- WAIT ---- */

static void wait_shortfall_named(void **state)
{
    kb_test_sentinels *s = *state;
    kb_bus *one = open_bus(s->url, "1"), *two = open_bus(s->url, "2");
    for (uint32_t seq = 1; seq <= 50; seq++) {
        kb_assert_ok(kb_tracker_publish(one, TOPIC "-wait", seq % KEYS, seq, 16));
        kb_assert_ok(kb_tracker_publish(two, TOPIC "-wait", seq % KEYS, seq, 16));
    }
    if (kb_flush(one, 5000) != KB_OK)   /* the replica confirms */
        fail_msg("kb_flush: %s", kb_last_error());
    assert_int_equal(kb_flush(two, 5000), KB_ETRANSPORT);
    const char *why = kb_last_error();
    /* the count is not asserted: a batch whose replies arrive between two
     * partial writes is left out of its WAIT (an undercount, noted as open) */
    if (strstr(why, "1 of 2 replicas confirmed within 500 ms") == NULL ||
        strstr(why, " publishes stored on ") == NULL)
        fail_msg("kb_flush: %s", why);
    /* reported once: a WAIT answered after that report (a slow replica, a
     * loaded or TSan-slowed machine) is its own shortfall, reported by a
     * later flush only; with nothing new published they run out */
    int again = KB_ETRANSPORT;
    for (int i = 0; i < 20 && again == KB_ETRANSPORT; i++)
        again = kb_flush(two, 5000);
    kb_assert_ok(again);
    kb_assert_ok(kb_close(one, 5000));
    kb_assert_ok(kb_close(two, 5000));
}

/* Publishes far apart, as at everyday rates: each still gets its WAIT, so
 * kb_flush and kb_close report none unconfirmed (a publisher that wrote its
 * own XADD once left it without one). */
static void sparse_publishes_waited(void **state)
{
    kb_test_sentinels *s = *state;
    kb_bus *b = open_bus(s->url, "1");
    for (uint32_t seq = 1; seq <= 3; seq++) {
        kb_assert_ok(kb_tracker_publish(b, TOPIC "-sparse", seq % KEYS, seq, 16));
        usleep(400000);
    }
    if (kb_flush(b, 5000) != KB_OK)
        fail_msg("kb_flush: %s", kb_last_error());
    if (kb_close(b, 5000) != KB_OK)
        fail_msg("kb_close: %s", kb_last_error());
}

/* ---- a failover the Sentinels are asked for: the old primary lives on as a replica ---- */

#define SWITCH_EVENTS_MAX 1400   /* 100 before the switch, at most 60 rounds of KEYS after */

/* Which events (a sequence number each) were handled; duplicates counted. */
typedef struct switch_log {
    _Atomic uint8_t seen[SWITCH_EVENTS_MAX + 1];
    _Atomic uint64_t handled;
} switch_log;

static int mark_handled(const kb_event *ev, void *opaque)
{
    switch_log *l = opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (seq <= SWITCH_EVENTS_MAX)
        atomic_store(&l->seen[seq], 1);
    atomic_fetch_add(&l->handled, 1);
    return KB_HANDLED;
}

static void switch_followed(void **state)
{
    kb_test_sentinels *s = *state;
    int old = kb_test_sentinels_primary(s, 0);
    assert_true(old == 0 || old == 1);
    switch_log *log = calloc(1, sizeof *log);
    bool *acked = calloc(SWITCH_EVENTS_MAX + 1, sizeof *acked);
    assert_non_null(log);
    assert_non_null(acked);
    kb_bus *consumer = open_bus(s->url, "0");
    kb_assert_ok(kb_subscribe(consumer, TOPIC "-switch", mark_handled, log));
    kb_bus *pub = open_bus(s->url, "1");
    uint32_t seq = 0;
    for (; seq < 100; seq++)
        kb_assert_ok(kb_tracker_publish(pub, TOPIC "-switch", seq % KEYS, seq + 1, 16));
    kb_assert_ok(kb_flush(pub, 5000));
    for (uint32_t i = 1; i <= seq; i++)
        acked[i] = true;

    redisContext *c = redisConnect("127.0.0.1", s->sentinel[2].port);
    assert_non_null(c);
    redisReply *r = redisCommand(c, "SENTINEL FAILOVER %s", KB_TEST_MASTER);
    assert_non_null(r);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("SENTINEL FAILOVER: %s", r->str);
    freeReplyObject(r);
    redisFree(c);
    int64_t start = now_ms();
    while (kb_test_sentinels_primary(s, 0) != 1 - old && now_ms() - start < 30000)
        usleep(50000);
    assert_int_equal(kb_test_sentinels_primary(s, 0), 1 - old);
    int64_t switched = now_ms();

    /* connections that stayed up to the demoted node move too: publishes are
     * stored and replicated again, and consumed (publishes written to the old
     * primary between the switch and its demotion are lost: never acknowledged) */
    int rc = KB_ETIMEDOUT;
    int64_t stored = 0;   /* on the new primary, its replica maybe not back yet */
    for (int tries = 0; tries < 60 && rc != KB_OK; tries++) {
        uint32_t from = seq + 1;
        for (uint32_t k = 0; k < KEYS; k++, seq++)
            kb_assert_ok(kb_tracker_publish(pub, TOPIC "-switch", k, seq + 1, 16));
        rc = kb_flush(pub, 1000);
        for (uint32_t i = from; rc == KB_OK && i <= seq; i++)
            acked[i] = true;
        if (stored == 0 && (rc == KB_OK || strstr(kb_last_error(), "replicas confirmed") != NULL))
            stored = now_ms();
    }
    kb_assert_ok(rc);
    int64_t acked_ms = now_ms();
    kb_assert_ok(kb_drain(pub, 30000));
    uint32_t distinct = 0;
    for (uint32_t i = 1; i <= seq; i++) {
        distinct += atomic_load(&log->seen[i]);
        if (acked[i] && !atomic_load(&log->seen[i]))
            fail_msg("event %u: acknowledged by kb_flush, never handled", i);
    }
    printf("# switch: the Sentinels named the new primary %lld ms after SENTINEL FAILOVER; then "
           "the first flush stored %lld ms later, the first acknowledged (replica back) %lld ms "
           "later; %llu handled (%u distinct) of %u published\n",
           (long long)(switched - start), (long long)(stored - switched), (long long)(acked_ms - switched),
           (unsigned long long)atomic_load(&log->handled), distinct, seq);
    kb_assert_ok(kb_close(pub, 5000));
    kb_assert_ok(kb_close(consumer, 5000));
    free(log);
    free(acked);
}

/* ---- the failover ---- */

/* Handled events per key, first sightings in order (per-key order) and again
 * (duplicates: redelivered after the failover). */
typedef struct history {
    pthread_mutex_t lock;
    uint32_t top[KEYS];               /* highest sequence seen per key */
    uint8_t seen[KEYS][ROUNDS_MAX + 1];
    uint64_t handled, duplicates, violations;
    int64_t first_after_kill_ms;      /* when the first event published after the kill ran */
    uint32_t kill_round;
} history;

static int record(const kb_event *ev, void *opaque)
{
    history *h = opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    pthread_mutex_lock(&h->lock);
    if (key >= KEYS || seq == 0 || seq > ROUNDS_MAX) {
        h->violations++;
    } else if (h->seen[key][seq]++ > 0) {
        h->duplicates++;
    } else {
        if (seq < h->top[key])
            h->violations++;   /* a new event of the key after a later one */
        else
            h->top[key] = seq;
        if (h->kill_round != 0 && seq > h->kill_round && h->first_after_kill_ms == 0)
            h->first_after_kill_ms = now_ms();
    }
    h->handled++;
    pthread_mutex_unlock(&h->lock);
    return KB_HANDLED;
}

/* Rounds 1..n of every key acknowledged by kb_flush, all handled? */
static bool acked_handled(history *h, const bool *acked, uint32_t rounds)
{
    pthread_mutex_lock(&h->lock);
    bool all = true;
    for (uint32_t r = 1; r <= rounds && all; r++)
        for (uint32_t k = 0; k < KEYS && all && acked[r]; k++)
            all = h->seen[k][r] > 0;
    pthread_mutex_unlock(&h->lock);
    return all;
}

static void primary_killed_mid_stream(void **state)
{
    kb_test_sentinels *s = *state;
    history *h = calloc(1, sizeof *h);
    bool *acked = calloc(ROUNDS_MAX + 1, sizeof *acked);
    assert_non_null(h);
    assert_non_null(acked);
    pthread_mutex_init(&h->lock, NULL);
    int old = kb_test_sentinels_primary(s, 0);
    assert_true(old == 0 || old == 1);

    kb_bus *consumer = open_bus(s->url, "0");
    kb_assert_ok(kb_subscribe(consumer, TOPIC, record, h));
    kb_bus *pub = open_bus(s->url, "1");

    uint32_t round = 0, acked_after = 0;
    int64_t kill_ms = 0, first_ack_after_kill_ms = 0;
    uint64_t not_acked = 0;
    for (;;) {
        round++;
        assert_true(round <= ROUNDS_MAX);
        for (uint32_t k = 0; k < KEYS; k++)
            kb_assert_ok(kb_tracker_publish(pub, TOPIC, k, round, 16));
        int rc = kb_flush(pub, 1000);
        if (rc == KB_OK) {
            acked[round] = true;
            if (kill_ms != 0 && first_ack_after_kill_ms == 0)
                first_ack_after_kill_ms = now_ms();
            acked_after += kill_ms != 0;
        } else {
            assert_true(rc == KB_ETIMEDOUT || rc == KB_ETRANSPORT);
            not_acked++;
        }
        if (round == 30) {
            /* mid-stream: the consumer is working through what came before */
            pthread_mutex_lock(&h->lock);
            h->kill_round = round;
            pthread_mutex_unlock(&h->lock);
            kill_ms = now_ms();
            kb_test_server_signal(&s->node[old], SIGKILL);
        }
        if (kill_ms != 0 && kb_test_sentinels_primary(s, 1) == 1 - old &&
            s->node[old].pid == 0) {
            /* promoted: the old node comes back empty, and the Sentinels make
             * it the new primary's replica, so WAIT can be satisfied again */
            assert_int_equal(kb_test_server_restart(&s->node[old]), 0);
        }
        if (acked_after >= 20)
            break;
        if (kill_ms != 0 && now_ms() - kill_ms > 45000)
            fail_msg("no kb_flush acknowledged 20 rounds within 45 s of the kill (round %u)", round);
        usleep(20000);
    }
    int64_t deadline = now_ms() + 30000;
    while (!acked_handled(h, acked, round) && now_ms() < deadline)
        usleep(50000);
    assert_true(acked_handled(h, acked, round));
    /* the leases and the pending entries carried on on the new primary:
     * everything the publisher stored is handled and acked there */
    kb_assert_ok(kb_drain(pub, 30000));
    kb_topic_stats st;
    kb_assert_ok(kb_stats(consumer, TOPIC, &st));
    assert_int_equal(st.partitions_owned, st.partitions);
    assert_int_equal(st.broker_pending, 0);

    pthread_mutex_lock(&h->lock);
    uint64_t distinct = 0;
    for (uint32_t k = 0; k < KEYS; k++)
        for (uint32_t r = 1; r <= round; r++)
            distinct += h->seen[k][r] > 0;
    printf("# failover: %u rounds x %d keys, %llu flushes not acknowledged; handled %llu "
           "(%llu distinct of %u published), %llu duplicates, %llu per-key order violations\n",
           round, KEYS, (unsigned long long)not_acked, (unsigned long long)h->handled,
           (unsigned long long)distinct, round * KEYS, (unsigned long long)h->duplicates,
           (unsigned long long)h->violations);
    printf("# pause: kill -9 -> first event published after it handled %lld ms, "
           "-> first kb_flush acknowledged (replica back) %lld ms\n",
           (long long)(h->first_after_kill_ms - kill_ms), (long long)(first_ack_after_kill_ms - kill_ms));
    assert_int_equal(h->violations, 0);
    pthread_mutex_unlock(&h->lock);

    kb_assert_ok(kb_close(pub, 5000));
    kb_assert_ok(kb_close(consumer, 5000));
    pthread_mutex_destroy(&h->lock);
    free(h);
    free(acked);
}

static int set_up(void **state)
{
    kb_test_sentinels *s = calloc(1, sizeof *s);
    if (s == NULL || kb_test_sentinels_start(s, 1000, 4000) != 0) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static int tear_down(void **state)
{
    kb_test_sentinels_stop(*state);
    free(*state);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);   /* hiredis writes to a killed server: an error, not a signal */
    const struct CMUnitTest alone[] = {
        cmocka_unit_test(url_checked_when_set),
        cmocka_unit_test(no_sentinel_answers),
    };
    const struct CMUnitTest with_servers[] = {
        cmocka_unit_test(wait_shortfall_named),
        cmocka_unit_test(sparse_publishes_waited),
        cmocka_unit_test(switch_followed),
        cmocka_unit_test(primary_killed_mid_stream),
    };
    int failed = cmocka_run_group_tests_name("redis_sentinel_url", alone, NULL, NULL);
    return failed + cmocka_run_group_tests_name("redis_sentinel", with_servers, set_up, tear_down);
}
