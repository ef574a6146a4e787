/* Redis transport with many topics on one bus, under a low fd limit: threads
 * and connections do not grow with topics, a consumer that cannot start fails
 * kb_subscribe, every event is handled in per-key order, and kb_close leaves
 * no thread or descriptor behind. Counts, not wall-clock; the time and the
 * memory per idle topic are printed for docs/transports-redis.md. And the
 * topics share one reader: a topic whose lanes are full must not stop it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/server.h"

#define TOPICS 1000
#define EVENTS 10        /* per topic */
#define KEYS 2           /* per topic; events alternate between them */
#define FD_LIMIT 256

static kb_test_server server;

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    if (d != NULL)
        closedir(d);
    return n;
}

static int threads(void) { return entries("/proc/self/task"); }
static int fds(void) { return entries("/proc/self/fd"); }

/* The threads once down to `at_most` (a thread that has returned leaves
 * /proc/self/task a moment later), waiting up to 2 s; at_most < 0: once
 * the count held for 100 ms. */
static int threads_down_to(int at_most)
{
    int n = threads();
    for (int i = 0, same = 0; i < 200 && (at_most < 0 ? same < 10 : n > at_most); i++) {
        usleep(10000);
        int m = threads();
        same = m == n ? same + 1 : 0;
        n = m;
    }
    return n;
}

static long rss_kib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f != NULL && fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = 0;
    if (f != NULL)
        fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One topic's record, written by executors, read by the main thread after. */
struct topic_rec {
    _Atomic uint32_t handled;
    _Atomic uint32_t last[KEYS];   /* last sequence number seen per key */
    _Atomic uint32_t out_of_order;
};

static _Atomic uint64_t handled_total;

static int handler(const kb_event *ev, void *opaque)
{
    struct topic_rec *r = opaque;
    uint32_t key = ((const char *)ev->key)[1] - '0', seq;
    memcpy(&seq, ev->payload, sizeof seq);
    if (key >= KEYS || seq != atomic_load(&r->last[key]) + 1)
        atomic_fetch_add(&r->out_of_order, 1);
    else
        atomic_store(&r->last[key], seq);
    atomic_fetch_add(&r->handled, 1);
    atomic_fetch_add(&handled_total, 1);
    return KB_HANDLED;
}

/* Extra settings: NULL-terminated key, value pairs. */
static kb_bus *open_bus_with(const char *const *kv)
{
    static const char *const base[] = {"pool.threads", "2", "redis.reconnect_max_ms", "100", NULL};
    return kb_test_open(server.url, base, kv);
}

static kb_bus *open_bus(void)
{
    return open_bus_with(NULL);
}

static void wait_handled(uint64_t n)
{
    for (int i = 0; i < 6000 && atomic_load(&handled_total) < n; i++)
        usleep(10000);
}

static void topic_name(char *buf, size_t len, int i)
{
    snprintf(buf, len, "many.%d.%d", (int)getpid(), i);
}

static void publish_all(kb_bus *b, int from, int to)
{
    char topic[64];
    for (uint32_t seq = 1; seq <= EVENTS / KEYS; seq++)
        for (int i = from; i < to; i++)
            for (int k = 0; k < KEYS; k++) {
                char key[3] = {'k', (char)('0' + k), '\0'};
                topic_name(topic, sizeof topic, i);
                kb_assert_ok(kb_publish(b, topic, key, 2, &seq, sizeof seq));
            }
    kb_assert_ok(kb_flush(b, 30000));
}

static void many_topics_one_reader(void **state)
{
    (void)state;
    /* warm up: libraries' own globals (liburcu's threads...) exist from here */
    kb_bus *b = open_bus();
    kb_assert_ok(kb_close(b, 5000));
    int threads0 = threads_down_to(-1), fds0 = fds();   /* CI once counted a thread ending */

    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    struct rlimit low = {FD_LIMIT, rl.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);

    struct topic_rec *rec = calloc(TOPICS, sizeof *rec);
    assert_non_null(rec);
    b = open_bus();
    char topic[64];

    /* no descriptor left for the consumer's connection: kb_subscribe says so */
    int spare[FD_LIMIT], nspare = 0;
    while (nspare < FD_LIMIT && (spare[nspare] = dup(0)) >= 0)
        nspare++;
    topic_name(topic, sizeof topic, 0);
    int rc = kb_subscribe(b, topic, handler, &rec[0]);
    char why[512];
    snprintf(why, sizeof why, "%s", kb_last_error());
    while (nspare > 0)
        close(spare[--nspare]);
    assert_int_equal(rc, KB_ETRANSPORT);
    if (strstr(why, "consumer cannot start") == NULL)
        fail_msg("kb_subscribe errstr \"%s\" does not say the consumer cannot start", why);

    /* one topic: the bus's reader thread and connection exist from here */
    kb_assert_ok(kb_subscribe(b, topic, handler, &rec[0]));
    publish_all(b, 0, 1);
    wait_handled(EVENTS);
    assert_int_equal(atomic_load(&handled_total), EVENTS);
    int threads1 = threads(), fds1 = fds();

    long rss_before = rss_kib();
    double t_sub = now_s();
    for (int i = 1; i < TOPICS; i++) {
        topic_name(topic, sizeof topic, i);
        kb_assert_ok(kb_subscribe(b, topic, handler, &rec[i]));
    }
    long rss_idle = rss_kib();
    double t0 = now_s();
    t_sub = t0 - t_sub;
    publish_all(b, 1, TOPICS);
    wait_handled((uint64_t)TOPICS * EVENTS);
    double took = now_s() - t0;
    int threads_n = threads(), fds_n = fds();
    double t_close = now_s();
    rc = kb_close(b, 10000);
    t_close = now_s() - t_close;
    int threads_closed = threads_down_to(threads0), fds_closed = fds();
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
    fprintf(stderr, "redis, %d topics x %d events: subscribed in %.2f s, handled in %.2f s, closed in %.2f s; "
            "threads %d -> %d (bus: %d), fds %d -> %d (bus: %d); RSS of %d idle topics %ld KiB "
            "(%.1f KiB each)\n", TOPICS, EVENTS, t_sub, took, t_close, threads1, threads_n, threads1 - threads0, fds1, fds_n,
            fds1 - fds0, TOPICS - 1, rss_idle - rss_before,
            (double)(rss_idle - rss_before) / (TOPICS - 1));

    kb_assert_ok(rc);
    assert_int_equal(atomic_load(&handled_total), (uint64_t)TOPICS * EVENTS);
    for (int i = 0; i < TOPICS; i++) {
        assert_int_equal(atomic_load(&rec[i].handled), EVENTS);
        assert_int_equal(atomic_load(&rec[i].out_of_order), 0);
    }
    assert_int_equal(threads_n, threads1);   /* not one more thread per topic */
    assert_int_equal(fds_n, fds1);           /* nor a connection */
    assert_int_equal(threads_closed, threads0);
    assert_int_equal(fds_closed, fds0);
    free(rec);
}

/* ---- a topic with full lanes does not stop the reader ---- */

#define PATIENCE 1000   /* retries (10-20 ms each) the slow topic waits for the fast one */

static struct topic_rec fast;
static _Atomic uint32_t slow_gave_up;   /* the slow topic stopped waiting: fast never came */
static _Atomic uint32_t wrong_attempt;  /* seq >= 2 ran before: swept ones were only read */

static int slow_handler(const kb_event *ev, void *opaque)
{
    uint32_t seq;
    memcpy(&seq, ev->payload, sizeof seq);
    /* its lane stays delayed, and full behind it, until the fast topic is done */
    if (seq == 1 && atomic_load(&fast.handled) < 5) {
        if (ev->attempt < PATIENCE)
            return KB_RETRY;
        atomic_store(&slow_gave_up, 1);
    }
    if (seq >= 2 && ev->attempt != 1)
        atomic_fetch_add(&wrong_attempt, 1);
    return handler(ev, opaque);
}

/* 20 events of one key wait for a full lane of topic `slow` (read by this
 * bus, or left pending by a dead consumer and swept); then the `fast`
 * topic's 5 events must get through meanwhile. */
static void slow_and_fast(const char *slow_topic, const char *fast_topic, bool swept)
{
    const char *kv[] = {"pool.queue_capacity", "1", "pool.workers", "1", "retry.backoff_ms", "10",
                        "retry.max_backoff_ms", "20", "retry.max_attempts", "100000", NULL};
    memset(&fast, 0, sizeof fast);
    atomic_store(&slow_gave_up, 0);
    atomic_store(&wrong_attempt, 0);
    atomic_store(&handled_total, 0);
    char stream[96];
    snprintf(stream, sizeof stream, "kb:{%s}:p:%u", slow_topic, kb_fnv1a32("k0", 2) % 8);
    redisContext *c = redisConnect("127.0.0.1", server.port);
    assert_true(c != NULL && c->err == 0);
    if (swept) {   /* "ghost" read them all and died */
        freeReplyObject(redisCommand(c, "XGROUP CREATE %s keybus 0 MKSTREAM", stream));
        for (uint32_t seq = 1; seq <= 20; seq++)
            freeReplyObject(redisCommand(c, "XADD %s * k k0 d %b", stream, &seq, sizeof seq));
        freeReplyObject(redisCommand(c, "XREADGROUP GROUP keybus ghost STREAMS %s >", stream));
    }
    kb_bus *b = open_bus_with(kv);
    struct topic_rec slow = {0};
    kb_assert_ok(kb_subscribe(b, slow_topic, slow_handler, &slow));
    kb_assert_ok(kb_subscribe(b, fast_topic, handler, &fast));
    for (uint32_t seq = 1; !swept && seq <= 20; seq++)
        kb_assert_ok(kb_publish(b, slow_topic, "k0", 2, &seq, sizeof seq));
    kb_assert_ok(kb_flush(b, 10000));
    /* the reader holds all 20 (read, or claimed from the ghost): some have no room */
    long long ours = 0;
    for (int i = 0; i < 3000 && ours < 20; i++) {
        redisReply *r = redisCommand(c, "XPENDING %s keybus", stream);
        ours = 0;
        for (size_t j = 0; r->elements == 4 && r->element[3]->type == REDIS_REPLY_ARRAY &&
                           j < r->element[3]->elements; j++)
            if (strcmp(r->element[3]->element[j]->element[0]->str, "ghost") != 0)
                ours += strtoll(r->element[3]->element[j]->element[1]->str, NULL, 10);
        freeReplyObject(r);
        usleep(1000);
    }
    assert_int_equal(ours, 20);
    for (uint32_t seq = 1; seq <= 5; seq++)
        kb_assert_ok(kb_publish(b, fast_topic, "k1", 2, &seq, sizeof seq));
    kb_assert_ok(kb_flush(b, 10000));
    wait_handled(25);
    kb_assert_ok(kb_close(b, 10000));
    redisFree(c);
    assert_int_equal(atomic_load(&fast.handled), 5);
    assert_int_equal(atomic_load(&slow_gave_up), 0);   /* fast got through meanwhile */
    assert_int_equal(atomic_load(&slow.handled), 20);
    assert_int_equal(atomic_load(&slow.out_of_order), 0);
    assert_int_equal(atomic_load(&fast.out_of_order), 0);
    assert_int_equal(atomic_load(&wrong_attempt), 0);
}

static void full_topic_does_not_stop_others(void **state)
{
    (void)state;
    slow_and_fast("hol.slow", "hol.fast", false);
}

/* The same while the slow topic's entries come from a recovery sweep. */
static void sweep_on_full_lane_does_not_stop_others(void **state)
{
    (void)state;
    slow_and_fast("hol.swept", "hol.fast2", true);
}

/* Closing while entries wait for lane space: they stay pending on the
 * server for the next consumer, nothing leaks (ASan), close keeps its deadline. */
static int never_done(const kb_event *ev, void *opaque)
{
    (void)ev, (void)opaque;
    return KB_RETRY;
}

static void close_while_entries_wait(void **state)
{
    (void)state;
    const char *kv[] = {"pool.queue_capacity", "1", "pool.workers", "1", "retry.backoff_ms", "10",
                        "retry.max_backoff_ms", "20", "retry.max_attempts", "100000", NULL};
    kb_bus *b = open_bus_with(kv);
    kb_assert_ok(kb_subscribe(b, "hol.stuck", never_done, NULL));
    for (uint32_t seq = 1; seq <= 20; seq++)
        kb_assert_ok(kb_publish(b, "hol.stuck", "k0", 2, &seq, sizeof seq));
    kb_assert_ok(kb_flush(b, 10000));
    kb_topic_stats st = {0};
    for (int i = 0; i < 3000 && st.broker_pending < 20; i++) {
        kb_assert_ok(kb_stats(b, "hol.stuck", &st));
        usleep(1000);
    }
    assert_int_equal(st.broker_pending, 20);
    /* The lane never drains: the deadline cuts the close short, unless the
     * stopped consumer released the stuck event before it (slow builds);
     * either way nothing is acked. */
    int rc = kb_close(b, 300);
    assert_true(rc == KB_ETIMEDOUT || rc == KB_OK);
    b = open_bus();   /* a monitor: nothing was acked or lost */
    kb_assert_ok(kb_stats(b, "hol.stuck", &st));
    kb_assert_ok(kb_close(b, 5000));
    assert_int_equal(st.broker_length, 20);
    assert_int_equal(st.broker_pending, 20);
}

int main(void)
{
    if (kb_test_server_start(&server, "redis", NULL) != 0) {
        fprintf(stderr, "cannot start redis-server\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_topics_one_reader),
        cmocka_unit_test(full_topic_does_not_stop_others),
        cmocka_unit_test(sweep_on_full_lane_does_not_stop_others),
        cmocka_unit_test(close_while_entries_wait),
    };
    int failed = cmocka_run_group_tests_name("redis_topics", tests, NULL, NULL);
    kb_test_server_stop(&server);
    return failed;
}
