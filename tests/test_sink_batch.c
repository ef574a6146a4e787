/* kb_sink_deliver_batch (include/keybus/transport.h): a transport's feeder
 * hands deliveries over in batches. A toy in-process transport whose feeder is
 * the test thread: every delivery taken is handled once, in per-key order;
 * what is not taken is a prefix's complement the transport may deliver again;
 * bad deliveries and bad arguments are refused with the prefix before them
 * taken. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/transport.h>

#include "support/check.h"

#define KEYS 5
#define EVENTS 1000

static kb_sink *the_sink;
static atomic_int acks;

static int toy_open(kb_transport **t, kb_bus *b, const kb_conf *c, char *e, size_t n)
{
    (void)b, (void)c, (void)e, (void)n;
    *t = (kb_transport *)&the_sink;   /* any non-NULL state: the toy keeps none */
    return KB_OK;
}
static int toy_topic(kb_transport *t, const char *n, kb_transport_topic **o, char *e, size_t l)
{
    (void)t, (void)n, (void)e, (void)l;
    *o = (kb_transport_topic *)&the_sink;
    return KB_OK;
}
static int toy_publish(kb_transport *t, kb_transport_topic *tt, const kb_msg *m)
{
    (void)t, (void)tt, (void)m;
    return KB_ETRANSPORT;
}
static int toy_subscribe(kb_transport *t, kb_transport_topic *tt, kb_sink *s)
{
    (void)t, (void)tt;
    the_sink = s;
    return KB_OK;
}
static int toy_ack(kb_transport *t, const kb_delivery *d)
{
    (void)t, (void)d;
    atomic_fetch_add(&acks, 1);
    return KB_OK;
}
static int toy_dead(kb_transport *t, const kb_delivery *d, const char *r)
{
    (void)t, (void)d, (void)r;
    return KB_OK;
}
static int toy_flush(kb_transport *t, int timeout_ms)
{
    (void)t, (void)timeout_ms;
    return KB_OK;
}
static void toy_stop(kb_transport *t)
{
    (void)t;
}
static int toy_close(kb_transport *t, int64_t deadline)
{
    (void)t, (void)deadline;
    return KB_OK;
}

static const kb_transport_ops toy = {
    .abi_version = KB_TRANSPORT_ABI, .scheme = "toybatch", .flags = KB_TRANSPORT_F_SINGLE_FEEDER,
    .open = toy_open, .topic_open = toy_topic, .publish = toy_publish,
    .subscribe = toy_subscribe, .ack = toy_ack, .dead_letter = toy_dead, .flush = toy_flush,
    .stop = toy_stop, .close = toy_close,
};

/* What the handler saw: per key, the next sequence number it expects. */
typedef struct seen {
    atomic_int next[KEYS];
    atomic_int handled, misordered;
    atomic_int hold;   /* non-zero: handlers wait (lanes fill up) */
    atomic_int slow;   /* non-zero: each handler run takes 1 ms */
} seen;

static int handler(const kb_event *ev, void *opaque)
{
    seen *s = opaque;
    while (atomic_load(&s->hold))
        usleep(200);
    if (atomic_load(&s->slow))
        usleep(1000);
    char text[16] = {0};
    memcpy(text, ev->payload, ev->payload_len < sizeof text ? ev->payload_len : sizeof text - 1);
    int key = ((const char *)ev->key)[1] - '0', seq = atoi(text);
    if (atomic_load(&s->next[key]) != seq)
        atomic_fetch_add(&s->misordered, 1);
    atomic_store(&s->next[key], seq + 1);
    atomic_fetch_add(&s->handled, 1);
    return KB_HANDLED;
}

typedef struct event {
    char key[3], payload[16], id[24];
} event;

static event events[EVENTS];
static kb_delivery deliveries[EVENTS];

/* Event i: key "k<i % KEYS>", its sequence number within the key. */
static void make_events(void)
{
    for (int i = 0; i < EVENTS; i++) {
        event *e = &events[i];
        snprintf(e->key, sizeof e->key, "k%d", i % KEYS);
        snprintf(e->payload, sizeof e->payload, "%d", i / KEYS);
        snprintf(e->id, sizeof e->id, "%d-0", i);
        deliveries[i] = (kb_delivery){.topic = "t", .key = e->key, .key_len = 2,
                                      .payload = e->payload, .payload_len = strlen(e->payload),
                                      .attempt = 1, .id = e->id};
    }
}

static kb_bus *open_toy(const char *capacity)
{
    static int registered;
    if (!registered++)
        kb_assert_ok(kb_transport_register(&toy));
    char err[256];
    kb_conf *c = kb_conf_new();
    assert_non_null(c);
    kb_assert_ok(kb_conf_set(c, "transport", "toybatch://", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "pool.queue_capacity", capacity, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "pool.threads", "2", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    kb_conf_destroy(c);
    assert_non_null(b);
    return b;
}

static void wait_handled(seen *s, int n)
{
    kb_wait_until(atomic_load(&s->handled) >= n, 30000, "%d events handled", n);
    assert_int_equal(atomic_load(&s->handled), n);
}

/* More than one chunk per call, many calls: all handled once, in order. */
static void batches_keep_order_and_lose_nothing(void **state)
{
    (void)state;
    make_events();
    seen s = {0};
    atomic_store(&acks, 0);
    kb_bus *b = open_toy("1000");
    kb_assert_ok(kb_subscribe(b, "t", handler, &s));
    size_t accepted = 99;
    kb_assert_ok(kb_sink_deliver_batch(the_sink, deliveries, 0, 0, &accepted));
    assert_int_equal(accepted, 0);
    for (size_t at = 0; at < EVENTS;) {
        size_t n = EVENTS - at < 150 ? EVENTS - at : 150;   /* 64 + 64 + 22 */
        kb_assert_ok(kb_sink_deliver_batch(the_sink, deliveries + at, n, -1, &accepted));
        assert_int_equal(accepted, n);
        at += n;
    }
    wait_handled(&s, EVENTS);
    assert_int_equal(atomic_load(&s.misordered), 0);
    for (int k = 0; k < KEYS; k++)
        assert_int_equal(atomic_load(&s.next[k]), EVENTS / KEYS);
    kb_assert_ok(kb_close(b, 5000));
    assert_int_equal(atomic_load(&acks), EVENTS);
}

/* Full lanes and timeout 0: a prefix is taken, the rest stays the caller's
 * and goes in later without loss or reordering. */
static void full_lanes_take_a_prefix(void **state)
{
    (void)state;
    make_events();
    seen s = {0};
    atomic_store(&acks, 0);
    kb_bus *b = open_toy("8");
    kb_assert_ok(kb_subscribe(b, "t", handler, &s));
    atomic_store(&s.hold, 1);
    size_t at = 0, accepted = 0;
    int rc = kb_sink_deliver_batch(the_sink, deliveries, 200, 0, &accepted);
    assert_int_equal(rc, KB_EFULL);
    assert_true(accepted > 0 && accepted < 200);
    at = accepted;
    atomic_store(&s.hold, 0);
    while (at < EVENTS) {
        rc = kb_sink_deliver_batch(the_sink, deliveries + at, EVENTS - at, 0, &accepted);
        assert_true(rc == KB_OK || rc == KB_EFULL);
        at += accepted;
        if (rc == KB_EFULL)
            usleep(100);
    }
    wait_handled(&s, EVENTS);
    assert_int_equal(atomic_load(&s.misordered), 0);
    kb_assert_ok(kb_close(b, 5000));
    assert_int_equal(atomic_load(&acks), EVENTS);
}

/* timeout_ms is one deadline for the whole call. Here the full lane gets
 * room every 16 handler runs of 1 ms (the executor's lookahead), so waiting up
 * to timeout_ms each time it is found full would take all 1000 events of one
 * key: ~1000 ms against 50. */
static void timeout_is_for_the_whole_call(void **state)
{
    (void)state;
    static char payloads[EVENTS][8];
    static kb_delivery one_key[EVENTS];
    for (int i = 0; i < EVENTS; i++) {
        snprintf(payloads[i], sizeof payloads[i], "%d", i);
        one_key[i] = (kb_delivery){.topic = "t", .key = "k0", .key_len = 2,
                                   .payload = payloads[i], .payload_len = strlen(payloads[i]),
                                   .attempt = 1, .id = "0-1"};
    }
    seen s = {0};
    atomic_store(&acks, 0);
    kb_bus *b = open_toy("8");
    kb_assert_ok(kb_subscribe(b, "t", handler, &s));
    atomic_store(&s.slow, 1);
    size_t accepted = 0;
    int rc = kb_sink_deliver_batch(the_sink, one_key, EVENTS, 50, &accepted);
    assert_int_equal(rc, KB_EFULL);
    assert_true(accepted >= 8 && accepted < EVENTS);   /* the lane's room at least */
    assert_non_null(strstr(kb_last_error(), "full for 50 ms"));
    atomic_store(&s.slow, 0);
    kb_assert_ok(kb_sink_deliver_batch(the_sink, one_key + accepted, EVENTS - accepted, -1,
                                       &accepted));
    wait_handled(&s, EVENTS);
    assert_int_equal(atomic_load(&s.misordered), 0);
    assert_int_equal(atomic_load(&s.next[0]), EVENTS);
    kb_assert_ok(kb_close(b, 5000));
    assert_int_equal(atomic_load(&acks), EVENTS);
}

/* A bad delivery stops the batch there: what came before it is taken. */
static void bad_input_is_refused_after_the_prefix(void **state)
{
    (void)state;
    make_events();
    seen s = {0};
    kb_bus *b = open_toy("1000");
    kb_assert_ok(kb_subscribe(b, "t", handler, &s));
    size_t accepted = 99;
    assert_int_equal(kb_sink_deliver_batch(NULL, deliveries, 1, 0, &accepted), KB_EINVAL);
    assert_int_equal(accepted, 0);
    assert_non_null(strstr(kb_last_error(), "sink is NULL"));
    assert_int_equal(kb_sink_deliver_batch(the_sink, NULL, 1, 0, &accepted), KB_EINVAL);
    assert_int_equal(accepted, 0);

    kb_delivery bad[200];
    memcpy(bad, deliveries, sizeof bad);
    bad[70].key = NULL;
    assert_int_equal(kb_sink_deliver_batch(the_sink, bad, 100, 0, &accepted), KB_EINVAL);
    assert_int_equal(accepted, 70);
    assert_non_null(strstr(kb_last_error(), "delivery 70: key is NULL or empty"));
    bad[70] = deliveries[70];
    bad[134].payload = NULL;   /* the first of the call's second chunk */
    assert_int_equal(kb_sink_deliver_batch(the_sink, bad + 70, 100, 0, &accepted), KB_EINVAL);
    assert_int_equal(accepted, 64);
    assert_non_null(strstr(kb_last_error(), "delivery 64: payload is NULL with a length"));
    bad[134] = deliveries[134];
    char long_id[300];
    memset(long_id, '7', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    bad[139].id = long_id;
    assert_int_equal(kb_sink_deliver_batch(the_sink, bad + 134, 30, 0, &accepted), KB_EINVAL);
    assert_int_equal(accepted, 5);
    assert_non_null(strstr(kb_last_error(), "delivery 5: delivery ID of 299 bytes is longer than"));
    wait_handled(&s, 139);
    assert_int_equal(atomic_load(&s.misordered), 0);
    kb_assert_ok(kb_close(b, 5000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(batches_keep_order_and_lose_nothing),
        cmocka_unit_test(full_lanes_take_a_prefix),
        cmocka_unit_test(timeout_is_for_the_whole_call),
        cmocka_unit_test(bad_input_is_refused_after_the_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
