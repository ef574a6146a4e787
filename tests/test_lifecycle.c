/* The transport SDK's lifecycle hooks and its compatibility promise
 * (include/keybus/transport.h, docs/transports.md), on a toy transport
 * whose publish hands the event straight to its sink: a table of ABI 5
 * (the ops up to close, nothing after) registers and carries events, the
 * ops it lacks read NULL; stop_by gets kb_close's deadline; kb_signal_fd
 * polls readable after a notify; a failed ack or dead letter is logged and
 * counted as documented; kb_sink_dead_letters_lost and
 * kb_bus_publish_failed reach the stats, the delivery callback, kb_flush
 * and kb_close. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/transport.h>

#include "support/check.h"

struct kb_transport {
    kb_bus *bus;
    kb_sink *sink;
};

static struct {
    _Atomic int handled, acks, dead;
    int64_t stop_deadline;     /* what stop_by was given (0: not called) */
    int stops;                 /* plain stop calls */
    int reports, report_rc;    /* delivery callback */
    char logged[4096];         /* warnings, one after another */
    int fail_ack, fail_dead;   /* the hooks fail */
} seen;

static int toy_open(kb_transport **t, kb_bus *b, const kb_conf *c, char *e, size_t n)
{
    (void)c, (void)e, (void)n;
    *t = calloc(1, sizeof **t);
    (*t)->bus = b;
    return KB_OK;
}
static int toy_topic(kb_transport *t, const char *name, kb_transport_topic **o, char *e, size_t n)
{
    (void)name, (void)e, (void)n;
    *o = (kb_transport_topic *)t;   /* one topic per test: the transport is its state */
    return KB_OK;
}
static int toy_publish(kb_transport *t, kb_transport_topic *tt, const kb_msg *m)
{
    (void)tt;
    kb_delivery d = {.key = m->key, .key_len = m->key_len, .payload = m->payload,
                     .payload_len = m->payload_len, .id = "1", .attempt = 1};
    return t->sink != NULL ? kb_sink_deliver(t->sink, &d, -1) : KB_OK;
}
static int toy_subscribe(kb_transport *t, kb_transport_topic *tt, kb_sink *s)
{
    (void)tt;
    t->sink = s;
    return KB_OK;
}
static int toy_ack(kb_transport *t, const kb_delivery *d)
{
    (void)t, (void)d;
    seen.acks++;
    if (seen.fail_ack) {
        kb_errf(NULL, 0, "toy: the broker said no to the ack");
        return KB_ETRANSPORT;
    }
    return KB_OK;
}
static int toy_dead(kb_transport *t, const kb_delivery *d, const char *r)
{
    (void)t, (void)d, (void)r;
    seen.dead++;
    if (seen.fail_dead) {
        kb_errf(NULL, 0, "toy: dead-letter store full");
        return KB_ETRANSPORT;
    }
    return KB_OK;
}
static int toy_flush(kb_transport *t, int ms)
{
    (void)t, (void)ms;
    return KB_OK;
}
static int toy_stats(kb_transport *t, kb_transport_topic *tt, kb_topic_stats *out)
{
    (void)t, (void)tt, (void)out;
    return KB_OK;
}
static void toy_stop(kb_transport *t)
{
    (void)t;
    seen.stops++;
}
static void toy_stop_by(kb_transport *t, int64_t deadline_ns)
{
    (void)t;
    seen.stop_deadline = deadline_ns;
}
static int toy_close(kb_transport *t, int64_t deadline)
{
    (void)deadline;
    free(t);
    return KB_OK;
}

static const kb_transport_ops toy = {
    .abi_version = KB_TRANSPORT_ABI, .scheme = "toy6", .open = toy_open,
    .topic_open = toy_topic, .publish = toy_publish, .subscribe = toy_subscribe,
    .ack = toy_ack, .dead_letter = toy_dead, .flush = toy_flush, .stats = toy_stats,
    .stop = toy_stop, .close = toy_close, .stop_by = toy_stop_by,
};

static int handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    seen.handled++;
    return ev->payload_len == 4 && memcmp(ev->payload, "dead", 4) == 0 ? KB_DEAD : KB_HANDLED;
}

static void on_log(int level, const char *msg, void *opaque)
{
    (void)opaque;
    if (level <= KB_LOG_WARNING && strlen(seen.logged) + strlen(msg) + 2 < sizeof seen.logged) {
        strcat(seen.logged, msg);
        strcat(seen.logged, "\n");
    }
}

static void on_report(const kb_delivery_report *r, void *opaque)
{
    (void)opaque;
    seen.reports++;
    seen.report_rc = r->result;
}

static kb_bus *open_toy(const char *scheme)
{
    memset(&seen, 0, sizeof seen);
    kb_conf *c = kb_conf_new();
    char url[32], err[256];
    snprintf(url, sizeof url, "%s://", scheme);
    kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
    kb_conf_set_log(c, on_log, NULL);
    kb_conf_set_delivery_cb(c, on_report, NULL);
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open(%s): %s", url, err);
    return b;
}

/* A table built against ABI 5 ends at close: it registers, its events flow,
 * and the bus's view of it reads the later ops as NULL (ASan would see a
 * read past the table's end). */
static void abi5_table_still_works(void **state)
{
    (void)state;
    size_t abi5 = offsetof(kb_transport_ops, close) + sizeof toy.close;   /* ABI 5 ended there */
    kb_transport_ops full = toy;
    full.abi_version = 5;
    full.scheme = "toy5";
    void *mem = malloc(abi5);   /* exactly an ABI 5 table, nothing after */
    memcpy(mem, &full, abi5);
    const kb_transport_ops *old = mem;
    kb_assert_ok(kb_transport_register(old));
    const kb_transport_ops *view = kb_transport_find("TOY5");
    assert_non_null(view);
    assert_ptr_not_equal(view, old);
    assert_int_equal(view->abi_version, 5);
    assert_ptr_equal(view->publish, toy_publish);
    assert_null(view->stop_by);
    kb_assert_ok(kb_transport_register(old));   /* the same table again: fine */

    kb_bus *b = open_toy("toy5");
    kb_assert_ok(kb_subscribe(b, "t", handler, NULL));
    kb_assert_ok(kb_publish(b, "t", "k", 1, "v", 1));
    kb_wait_until(seen.acks == 1, 10000, "the event acked");
    kb_assert_ok(kb_close(b, 5000));
    assert_int_equal(seen.handled, 1);
    assert_int_equal(seen.stops, 1);            /* stop, as ABI 5 knew it */
    assert_int_equal(seen.stop_deadline, 0);

    kb_transport_ops older = toy;
    older.abi_version = 4;
    older.scheme = "toy4";
    assert_int_equal(kb_transport_register(&older), KB_EINVAL);
    assert_null(kb_transport_find("toy4"));
    older.abi_version = KB_TRANSPORT_ABI + 1;
    assert_int_equal(kb_transport_register(&older), KB_EINVAL);
    /* old's memory stays registered for the process: it is never freed */
}

/* stop_by replaces stop and gets the deadline close gets. */
static void stop_by_gets_the_close_deadline(void **state)
{
    (void)state;
    kb_assert_ok(kb_transport_register(&toy));
    kb_bus *b = open_toy("toy6");
    kb_assert_ok(kb_subscribe(b, "t", handler, NULL));
    int64_t before = kb_now_ns();
    kb_assert_ok(kb_close(b, 7000));
    int64_t after = kb_now_ns();
    assert_int_equal(seen.stops, 0);
    assert_true(seen.stop_deadline >= before + 7000 * 1000000LL);
    assert_true(seen.stop_deadline <= after + 7000 * 1000000LL);
    b = open_toy("toy6");
    kb_assert_ok(kb_close(b, -1));
    assert_int_equal(seen.stop_deadline, INT64_MAX);   /* no deadline */
}

/* A failed ack is logged with the transport's text and never retried; a
 * failed dead letter is logged and counted, as one the transport fails to
 * store later and counts itself. */
static void settle_errors_are_logged_and_counted(void **state)
{
    (void)state;
    kb_assert_ok(kb_transport_register(&toy));
    kb_bus *b = open_toy("toy6");
    seen.fail_ack = seen.fail_dead = 1;
    kb_assert_ok(kb_subscribe(b, "t", handler, NULL));
    kb_assert_ok(kb_publish(b, "t", "k", 1, "v", 1));
    kb_assert_ok(kb_publish(b, "t", "k", 1, "dead", 4));
    kb_wait_until(seen.dead == 1, 10000, "the dead letter tried");
    kb_topic_stats st;
    kb_wait_until(kb_stats(b, "t", &st) == KB_OK && st.dead_letters_lost == 1, 10000,
                  "the failed dead letter counted");
    kb_assert_ok(kb_close(b, 5000));
    assert_int_equal(seen.acks, 1);   /* not retried */
    assert_int_equal(seen.handled, 2);
    assert_non_null(strstr(seen.logged, "the broker said no to the ack"));
    assert_non_null(strstr(seen.logged, "dead-letter store full"));
}

static kb_sink *toy_sink(kb_bus *b)
{
    return kb_bus_sink(b, "t");
}

static void dead_letters_lost_later_are_counted(void **state)
{
    (void)state;
    kb_assert_ok(kb_transport_register(&toy));
    kb_bus *b = open_toy("toy6");
    kb_assert_ok(kb_subscribe(b, "t", handler, NULL));
    kb_sink_dead_letters_lost(toy_sink(b), 3, "the writer's disk is full");
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, "t", &st));
    assert_int_equal(st.dead_letters_lost, 3);
    assert_non_null(strstr(seen.logged, "3 dead letters not stored: the writer's disk is full"));
    kb_assert_ok(kb_close(b, 5000));
}

/* A publish that fails after it was accepted: one report, and the next
 * kb_flush (then kb_close, if no flush came) says so once. */
static void publish_failed_reaches_flush_and_close(void **state)
{
    (void)state;
    kb_assert_ok(kb_transport_register(&toy));
    kb_bus *b = open_toy("toy6");
    kb_delivery_report r = {.topic = "t", .key = "k", .key_len = 1, .result = KB_ETRANSPORT,
                            .id = "", .error = "stream full"};
    kb_bus_publish_failed(b, &r);
    kb_bus_publish_failed(b, &r);
    assert_int_equal(seen.reports, 2);
    assert_int_equal(seen.report_rc, KB_ETRANSPORT);
    assert_int_equal(kb_flush(b, 1000), KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "2 published events failed"));
    assert_non_null(strstr(kb_last_error(), "t: stream full"));
    kb_assert_ok(kb_flush(b, 1000));   /* said once */
    kb_bus_publish_failed(b, &r);
    assert_int_equal(kb_close(b, 5000), KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "kb_close: 1 published events failed"));
}

/* kb_signal_fd: one eventfd per signal, readable after a notify, reset by
 * reading it. */
static void signal_fd_polls(void **state)
{
    (void)state;
    kb_signal *s = kb_signal_new();
    assert_non_null(s);
    int fd = kb_signal_fd(s);
    assert_true(fd >= 0);
    assert_int_equal(kb_signal_fd(s), fd);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 0), 0);
    kb_signal_notify(s);
    kb_signal_notify(s);
    assert_int_equal(poll(&p, 1, 1000), 1);
    uint64_t count = 0;
    assert_int_equal(read(fd, &count, sizeof count), (ssize_t)sizeof count);
    assert_int_equal(count, 2);
    assert_int_equal(poll(&p, 1, 0), 0);
    kb_signal_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(abi5_table_still_works),
        cmocka_unit_test(stop_by_gets_the_close_deadline),
        cmocka_unit_test(settle_errors_are_logged_and_counted),
        cmocka_unit_test(dead_letters_lost_later_are_counted),
        cmocka_unit_test(publish_failed_reaches_flush_and_close),
        cmocka_unit_test(signal_fd_polls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
