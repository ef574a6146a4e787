/* The broker black-holed (issue 11): a proxy between keybus and the real
 * server stops forwarding without closing anything. kb_publish returns in
 * bounded time (success, KB_EFULL or an error — never blocks for ever),
 * kb_flush times out with KB_ETIMEDOUT, and when forwarding resumes every
 * accepted event is handled, in per-key order. `test_blackhole redis|nats`.
 * The publishing thread records; the main thread asserts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/gate.h"
#include "support/proxy.h"
#include "support/server.h"
#include "support/tracker.h"

#define KEYS 10
#define BEFORE 20              /* events per key before the black hole */
#define DURING_MS 3000         /* publishing into the black hole */
#define FLUSH_MS 2000

static const char *kind;

static void blackholed_broker_bounds_every_call_and_loses_nothing(void **state)
{
    (void)state;
    kb_test_server srv = {0};
    assert_int_equal(kb_test_server_start(&srv, kind, NULL), 0);
    kb_test_proxy *proxy = kb_test_proxy_start(srv.port);
    assert_non_null(proxy);
    char url[128];
    snprintf(url, sizeof url, "%s://127.0.0.1:%d", kind, kb_test_proxy_port(proxy));
    static const char *const settings[] = {
        "partitions", "4", "pool.enqueue_timeout_ms", "200",
        "redis.read_timeout_ms", "1500", "redis.connect_timeout_ms", "1000",
        "redis.lease_ttl_ms", "3000", NULL};
    static const char *const nats_settings[] = {
        "partitions", "4", "pool.enqueue_timeout_ms", "200",
        "nats.publish_timeout_ms", "1500", "nats.lease_ttl_ms", "3000", NULL};
    kb_bus *b = kb_test_open(url, strcmp(kind, "redis") == 0 ? settings : nats_settings, NULL);
    kb_tracker tr;
    kb_tracker_init(&tr, KEYS);
    kb_assert_ok(kb_subscribe(b, "bh", kb_tracker_handler, &tr));

    uint32_t next[KEYS];
    uint64_t accepted = 0;
    for (uint32_t k = 0; k < KEYS; k++)
        next[k] = 1;
    for (int i = 0; i < BEFORE; i++)
        for (uint32_t k = 0; k < KEYS; k++) {
            kb_assert_ok(kb_tracker_publish(b, "bh", k, next[k], 64));
            next[k]++;
            accepted++;
        }
    kb_assert_ok(kb_flush(b, 20000));

    /* The network stops answering; the connections stay open. */
    kb_test_proxy_blackhole(proxy, 1);
    double start = kb_test_now_ms(), slowest = 0;
    uint64_t ok = 0, full = 0, failed = 0;
    int last_error = KB_OK;
    for (uint32_t i = 0; kb_test_now_ms() - start < DURING_MS; i++) {
        uint32_t k = i % KEYS;
        double t0 = kb_test_now_ms();
        int rc = kb_tracker_publish(b, "bh", k, next[k], 64);
        double took = kb_test_now_ms() - t0;
        if (took > slowest)
            slowest = took;
        if (rc == KB_OK) {
            next[k]++;   /* a refused event is sent again with the same number */
            accepted++;
            ok++;
        } else if (rc == KB_EFULL) {
            full++;
        } else {
            failed++;
            last_error = rc;
        }
    }
    double t0 = kb_test_now_ms();
    int flushed = kb_flush(b, FLUSH_MS);
    double flush_took = kb_test_now_ms() - t0;
    fprintf(stderr, "%s black-holed %d ms: publish ok %llu, KB_EFULL %llu, other %llu (%s), "
            "slowest %.0f ms; kb_flush(%d) = %s after %.0f ms\n", kind, DURING_MS,
            (unsigned long long)ok, (unsigned long long)full, (unsigned long long)failed,
            kb_strerror(last_error), slowest, FLUSH_MS, kb_strerror(flushed), flush_took);

    /* Forwarding resumes: the flow goes on, nothing accepted is lost. */
    kb_test_proxy_blackhole(proxy, 0);
    t0 = kb_test_now_ms();
    int drained = kb_drain(b, 60000);
    double recover_ms = kb_test_now_ms() - t0;
    fprintf(stderr, "%s resumed: drained in %.0f ms, handled %llu distinct of %llu accepted, "
            "%llu duplicates, %llu order violations\n", kind, recover_ms,
            (unsigned long long)kb_tracker_distinct(&tr), (unsigned long long)accepted,
            (unsigned long long)atomic_load(&tr.duplicates),
            (unsigned long long)atomic_load(&tr.order_violations));
    int closed = kb_close(b, 10000);

    assert_true(slowest < 10000.0);                  /* no call blocked for ever */
    if (strcmp(kind, "redis") == 0)   /* publishers never wait for the network (read timeout 1.5 s) */
        assert_true(slowest < 200 + 1200.0);
    assert_int_equal(flushed, KB_ETIMEDOUT);
    assert_true(flush_took < FLUSH_MS + 10000.0);
    kb_assert_ok(drained);
    kb_assert_ok(closed);
    assert_int_equal(kb_tracker_distinct(&tr), accepted);   /* nothing accepted lost */
    assert_int_equal(atomic_load(&tr.order_violations), 0);
    kb_tracker_destroy(&tr);
    kb_test_proxy_stop(proxy);
    kb_test_server_stop(&srv);
}

int main(int argc, char **argv)
{
    kind = argc > 1 ? argv[1] : "redis";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(blackholed_broker_bounds_every_call_and_loses_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
