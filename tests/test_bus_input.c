/* Bad input to the bus gets its error code and a message naming the problem,
 * and loses nothing that was accepted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>

#include "support/check.h"

static _Atomic int handled;

static int count(const kb_event *ev, void *opaque)
{
    (void)ev, (void)opaque;
    handled++;
    return KB_HANDLED;
}

static kb_bus *open_small_limits(void)
{
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "limits.max_key_bytes", "16", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "limits.max_payload_bytes", "64", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    return b;
}

static void expect(int rc, int want, const char *word)
{
    if (rc != want)
        fail_msg("rc %d (%s), want %d; last error: %s", rc, kb_strerror(rc), want, kb_last_error());
    if (strstr(kb_last_error(), word) == NULL)
        fail_msg("last error \"%s\" lacks \"%s\"", kb_last_error(), word);
}

static void bad_publish_arguments(void **state)
{
    (void)state;
    kb_bus *b = open_small_limits();
    handled = 0;
    kb_assert_ok(kb_subscribe(b, "orders.events", count, NULL));
    char big[128];
    memset(big, 'x', sizeof big);

    expect(kb_publish(NULL, "orders.events", "k", 1, "p", 1), KB_EINVAL, "bus");
    expect(kb_publish(b, NULL, "k", 1, "p", 1), KB_EINVAL, "topic is NULL");
    expect(kb_publish(b, "", "k", 1, "p", 1), KB_EINVAL, "topic length 0");
    expect(kb_publish(b, "orders events", "k", 1, "p", 1), KB_EINVAL, "' '");
    expect(kb_publish(b, "orders.*", "k", 1, "p", 1), KB_EINVAL, "'*'");
    expect(kb_publish(b, "orders.>", "k", 1, "p", 1), KB_EINVAL, "'>'");
    expect(kb_publish(b, ".orders", "k", 1, "p", 1), KB_EINVAL, "empty dot-separated part");
    expect(kb_publish(b, "orders..events", "k", 1, "p", 1), KB_EINVAL, "empty dot-separated");
    char long_topic[300];
    memset(long_topic, 'a', sizeof long_topic - 1);
    long_topic[sizeof long_topic - 1] = '\0';
    expect(kb_publish(b, long_topic, "k", 1, "p", 1), KB_EINVAL, "topic length 299");
    expect(kb_publish(b, "orders.events", NULL, 1, "p", 1), KB_EINVAL, "key is NULL");
    expect(kb_publish(b, "orders.events", "k", 0, "p", 1), KB_EINVAL, "key is empty");
    expect(kb_publish(b, "orders.events", big, 17, "p", 1), KB_ETOOBIG, "limits.max_key_bytes");
    expect(kb_publish(b, "orders.events", "k", 1, NULL, 5), KB_EINVAL, "payload is NULL");
    expect(kb_publish(b, "orders.events", "k", 1, big, 65), KB_ETOOBIG,
           "limits.max_payload_bytes");
    expect(kb_publish(b, "no.subscriber", "k", 1, "p", 1), KB_ENOTFOUND, "no.subscriber");

    /* Limits are inclusive, and what was accepted is all handled. */
    kb_assert_ok(kb_publish(b, "orders.events", big, 16, big, 64));
    kb_assert_ok(kb_publish(b, "orders.events", "k", 1, NULL, 0));
    kb_assert_ok(kb_flush(b, 5000));
    assert_int_equal(handled, 2);
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, "orders.events", &st));
    assert_int_equal(st.published, 2);
    assert_int_equal(st.handled, 2);
    kb_assert_ok(kb_close(b, 1000));
}

/* Headers are checked against the limits and the rules every broker can carry. */
static void bad_headers(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "limits.max_headers", "2", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "limits.max_header_bytes", "20", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    handled = 0;
    kb_assert_ok(kb_subscribe(b, "t", count, NULL));
    kb_topic *t = kb_topic_get(b, "t", err, sizeof err);
    kb_header h[3] = {{"a", "1", 1}, {"b", "2", 1}, {"c", "3", 1}};
    kb_msg m = {"k", 1, "p", 1, 0, h, 3};
    expect(kb_publish_ex(t, &m), KB_ETOOBIG, "limits.max_headers");
    m.n_headers = 1;
    m.headers = NULL;
    expect(kb_publish_ex(t, &m), KB_EINVAL, "headers is NULL");
    m.headers = h;
    h[0].name = "bad name";
    expect(kb_publish_ex(t, &m), KB_EINVAL, "0x20");
    h[0].name = "Kb-Key";
    expect(kb_publish_ex(t, &m), KB_EINVAL, "reserved");
    h[0].name = "nats-msg-id";
    expect(kb_publish_ex(t, &m), KB_EINVAL, "reserved");
    h[0].name = "";
    expect(kb_publish_ex(t, &m), KB_EINVAL, "empty");
    h[0] = (kb_header){"a", "x\ny", 3};
    expect(kb_publish_ex(t, &m), KB_EINVAL, "LF");
    h[0] = (kb_header){"a", "01234567890123456789", 20};
    expect(kb_publish_ex(t, &m), KB_ETOOBIG, "limits.max_header_bytes");
    h[0] = (kb_header){"a", "0123456789012345678", 19};   /* 1 + 19 bytes: at the limit */
    kb_assert_ok(kb_publish_ex(t, &m));
    expect(kb_publish_ex(NULL, &m), KB_EINVAL, "topic");
    expect(kb_publish_ex(t, NULL), KB_EINVAL, "msgs");
    kb_assert_ok(kb_flush(b, 5000));
    assert_int_equal(handled, 1);
    kb_assert_ok(kb_close(b, 1000));
}

static void bad_subscribe_and_stats_arguments(void **state)
{
    (void)state;
    kb_bus *b = open_small_limits();
    expect(kb_subscribe(b, "t", NULL, NULL), KB_EINVAL, "handler is NULL");
    expect(kb_subscribe(b, "bad topic", count, NULL), KB_EINVAL, "' '");
    kb_assert_ok(kb_subscribe(b, "t", count, NULL));
    expect(kb_subscribe(b, "t", count, NULL), KB_EINVAL, "already has a handler");
    kb_topic_stats st;
    expect(kb_stats(b, "unknown", &st), KB_ENOTFOUND, "unknown");
    expect(kb_stats(b, "t", NULL), KB_EINVAL, "out is NULL");
    kb_partition_stats ps;
    expect(kb_partition_stats_get(b, "t", 0, &ps), KB_ENOTFOUND, "mem://");
    expect(kb_dead_letter_replay(b, "t", "12"), KB_ENOTFOUND, "no dead letter 12");
    expect(kb_dead_letter_replay(b, "t", "twelve"), KB_EINVAL, "not a decimal");
    kb_assert_ok(kb_close(b, 1000));
    assert_int_equal(kb_close(NULL, 0), KB_EINVAL);
    assert_int_equal(kb_flush(NULL, 0), KB_EINVAL);
}

static void bad_transport_urls(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256] = "";
    /* checked when set, by the transport's check_url */
    assert_int_equal(kb_conf_set(c, "transport", "mem://somewhere", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "mem:// takes no host"));
    /* and never echoes the URL, which may carry a password */
    assert_int_equal(kb_conf_set(c, "transport", "mem://u:hunter2@x", err, sizeof err),
                     KB_EINVAL);
    assert_null(strstr(err, "hunter2"));
    assert_null(strstr(kb_last_error(), "hunter2"));
    assert_int_equal(kb_conf_set(c, "transport", "redis:/:hunter2@10.0.0.5:6379", err,
                                 sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "not a URL"));
    assert_null(strstr(err, "hunter2"));
    assert_null(strstr(kb_last_error(), "hunter2"));
    assert_null(kb_open(NULL, err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);   /* refused values left it on mem:// */
    assert_non_null(b);
    kb_assert_ok(kb_close(b, 1000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_publish_arguments),
        cmocka_unit_test(bad_subscribe_and_stats_arguments),
        cmocka_unit_test(bad_headers),
        cmocka_unit_test(bad_transport_urls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
