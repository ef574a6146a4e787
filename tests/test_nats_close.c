/* kb_close honours its deadline when the NATS server answers nothing: the
 * server is stopped with SIGSTOP (the connection stays open, nothing comes
 * back) while a bus consumes and produces; kb_close(b, 3000) returns within
 * a wide bound and reports the accepted events it could not send; and
 * kb_close waits for a publish ack's report still running. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/server.h"

#define EVENTS 200

static _Atomic uint64_t handled;

static int count(const kb_event *ev, void *opaque)
{
    (void)ev, (void)opaque;
    atomic_fetch_add(&handled, 1);
    return KB_HANDLED;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void close_with_server_stopped(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_bus *b = kb_test_open(s.url, NULL, NULL);
    kb_assert_ok(kb_subscribe(b, "stopped.t", count, NULL));
    char key[16];
    for (int i = 0; i < EVENTS; i++) {
        int kl = snprintf(key, sizeof key, "k%d", i % 20);
        kb_assert_ok(kb_publish(b, "stopped.t", key, (size_t)kl, "v", 1));
    }
    kb_assert_ok(kb_flush(b, 30000));
    /* the consumer holds leases and claims: it has handled everything */
    kb_wait_until(atomic_load(&handled) >= EVENTS, 30000, "the consumer handled %d events", EVENTS);
    assert_int_equal(atomic_load(&handled), EVENTS);

    kb_test_server_signal(&s, SIGSTOP);
    for (int i = 0; i < 50; i++) {   /* accepted, never acknowledged */
        int kl = snprintf(key, sizeof key, "late%d", i);
        kb_assert_ok(kb_publish(b, "stopped.t", key, (size_t)kl, "v", 1));
    }
    double t0 = now_s();
    int rc = kb_close(b, 3000);
    double took = now_s() - t0;
    char why[512];
    snprintf(why, sizeof why, "%s", kb_last_error());
    kb_test_server_signal(&s, SIGCONT);
    kb_test_server_stop(&s);

    print_message("kb_close(b, 3000) with the server stopped: %.2f s, rc %d: %s\n", took, rc, why);
    assert_true(took < 15.0);
    assert_int_not_equal(rc, KB_OK);
    assert_non_null(strstr(why, "never sent"));
}

/* Reports seen by slow_report; the first one blocks its thread (nats.c's
 * publish-ack thread) for a second. */
static struct {
    _Atomic int reports, failed, inside;
} slow;

static void slow_report(const kb_delivery_report *r, void *opaque)
{
    (void)opaque;
    if (r->result != KB_OK)
        atomic_fetch_add(&slow.failed, 1);
    if (atomic_fetch_add(&slow.reports, 1) == 0) {
        atomic_store(&slow.inside, 1);
        usleep(1000 * 1000);
        atomic_store(&slow.inside, 0);
    }
}

/* kb_close while a publish ack's report is still running on nats.c's ack
 * thread, which natsConnection_Close does not join: close waits for it
 * instead of giving the item up under it (a second, failed report, then a
 * use after free when the ack's done goes on). */
static void close_during_a_publish_ack(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    kb_conf *c = kb_test_conf(s.url, NULL, NULL);
    kb_conf_set_delivery_cb(c, slow_report, NULL);
    kb_bus *b = kb_test_open_conf(c);
    kb_assert_ok(kb_publish(b, "slow.t", "k", 1, "v", 1));
    kb_wait_until(atomic_load(&slow.inside), 30000, "the report callback runs");
    int rc = kb_close(b, 200);
    print_message("kb_close(b, 200) during a report: rc %d: %s\n", rc, kb_last_error());
    assert_int_equal(atomic_load(&slow.inside), 0);   /* close waited for it */
    usleep(200 * 1000);
    kb_test_server_stop(&s);
    assert_int_equal(atomic_load(&slow.reports), 1);
    assert_int_equal(atomic_load(&slow.failed), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(close_with_server_stopped),
        cmocka_unit_test(close_during_a_publish_ack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
