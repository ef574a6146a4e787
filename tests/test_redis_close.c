/* kb_close on a Redis server that answers nothing (stopped with SIGSTOP: the
 * connections stay open, no reply comes): every step shares the caller's
 * deadline, and events kb_publish accepted but never sent make it an error.
 * Also: the transport's threads carry their names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/server.h"
#include "support/tracker.h"

#define KEYS 20
#define PER_KEY 20

static kb_test_server srv;
static bool stopped;   /* srv is SIGSTOPped: teardown sends SIGCONT first */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int teardown(void **state)
{
    (void)state;
    if (stopped)
        kb_test_server_signal(&srv, SIGCONT);
    stopped = false;
    kb_test_server_stop(&srv);
    return 0;
}

/* Threads of this process whose name is `name`. */
static int threads_named(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        if (fgets(comm, sizeof comm, f) != NULL)
            comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        n += strcmp(comm, name) == 0;
    }
    closedir(d);
    return n;
}

static const char *const settings[] = {
    "redis.lease_ttl_ms", "2000",
    "retry.backoff_ms", "1",
    "retry.max_backoff_ms", "4",
    NULL,
};

static void close_on_silent_server(void **state)
{
    (void)state;
    assert_int_equal(kb_test_server_start(&srv, "redis", NULL), 0);
    char topic[64];
    snprintf(topic, sizeof topic, "close.silent.%d", (int)getpid());
    kb_tracker tr;
    kb_tracker_init(&tr, KEYS);
    kb_bus *consumer = kb_test_open(srv.url, settings, NULL);
    kb_bus *producer = kb_test_open(srv.url, settings, NULL);
    kb_assert_ok(kb_subscribe(consumer, topic, kb_tracker_handler, &tr));
    for (uint32_t s = 1; s <= PER_KEY; s++)
        for (uint32_t k = 0; k < KEYS; k++)
            kb_assert_ok(kb_tracker_publish(producer, topic, k, s, 16));
    kb_assert_ok(kb_flush(producer, 10000));
    kb_wait_until(kb_tracker_distinct(&tr) >= (uint64_t)KEYS * PER_KEY, 30000,
                  "the consumer handled every event");
    assert_int_equal(kb_tracker_distinct(&tr), (uint64_t)KEYS * PER_KEY);
    /* one keeper per bus, one reader for the bus that subscribed */
    assert_int_equal(threads_named("kb-redis-keeper"), 2);
    assert_int_equal(threads_named("kb-redis-reader"), 1);

    kb_test_server_signal(&srv, SIGSTOP);
    stopped = true;
    /* accepted (buffered for the keeper), never answered */
    for (uint32_t k = 0; k < KEYS; k++)
        kb_assert_ok(kb_tracker_publish(producer, topic, k, PER_KEY + 1, 16));

    int64_t t0 = now_ms();
    int rc_consumer = kb_close(consumer, 3000);
    int64_t consumer_ms = now_ms() - t0;
    t0 = now_ms();
    int rc_producer = kb_close(producer, 3000);
    int64_t producer_ms = now_ms() - t0;
    char why[512];
    snprintf(why, sizeof why, "%s", kb_last_error());
    fprintf(stderr, "  kb_close(3000) on a stopped server: consumer %lld ms (rc %d), producer "
            "%lld ms (rc %d: %s)\n", (long long)consumer_ms, rc_consumer,
            (long long)producer_ms, rc_producer, why);
    kb_tracker_destroy(&tr);
    assert_true(consumer_ms < 15000);
    assert_true(producer_ms < 15000);
    assert_int_not_equal(rc_producer, KB_OK);
    assert_non_null(strstr(why, "never sent"));
    assert_int_equal(threads_named("kb-redis-keeper"), 0);
    assert_int_equal(threads_named("kb-redis-reader"), 0);
}

/* A deadline already past still gives close one short try: on a live server
 * the producer's buffered events are sent. */
static void close_with_no_time_left(void **state)
{
    (void)state;
    assert_int_equal(kb_test_server_start(&srv, "redis", NULL), 0);
    char topic[64];
    snprintf(topic, sizeof topic, "close.now.%d", (int)getpid());
    kb_bus *producer = kb_test_open(srv.url, settings, NULL);
    for (uint32_t k = 0; k < KEYS; k++)
        kb_assert_ok(kb_publish(producer, topic, "k", 1, "v", 1));
    int64_t t0 = now_ms();
    kb_assert_ok(kb_close(producer, 0));
    assert_true(now_ms() - t0 < 5000);
    kb_bus *monitor = kb_test_open(srv.url, settings, NULL);
    kb_topic_stats st;
    kb_assert_ok(kb_stats(monitor, topic, &st));
    assert_int_equal(st.broker_length, KEYS);
    kb_assert_ok(kb_close(monitor, 5000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(close_on_silent_server, teardown),
        cmocka_unit_test_teardown(close_with_no_time_left, teardown),
    };
    return cmocka_run_group_tests_name("redis_close", tests, NULL, NULL);
}
