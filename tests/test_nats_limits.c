/* Server limits: an event kb_publish accepts is sent (or kb_close says how
 * many were not); one that cannot fit the server's max_payload or its 64 KiB
 * header limit is refused at once with KB_ETOOBIG, at exactly the sizes
 * docs/transports-nats.md ("Limits") gives; one that no longer fits a server
 * back with a smaller limit is reported by kb_flush and the delivery callback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/server.h"

#define SMALL_MAX 2000   /* max_payload of the small server */

static kb_test_server small, big;

static kb_bus *open_bus(const kb_test_server *s, const char *const *kv)
{
    return kb_test_open(s->url, NULL, kv);
}

/* What the handler saw: payload sizes of the 5-byte key, in order. */
static struct seen {
    pthread_mutex_t mu;
    size_t len[256];
    int n, text, dead;
} seen = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int record(const kb_event *ev, void *opaque)
{
    (void)opaque;
    pthread_mutex_lock(&seen.mu);
    if (ev->key_len == 5 && seen.text < 256)
        seen.len[seen.text++] = ev->payload_len;
    seen.n++;
    pthread_mutex_unlock(&seen.mu);
    return KB_HANDLED;
}

static int dead(const kb_event *ev, void *opaque)
{
    (void)ev, (void)opaque;
    pthread_mutex_lock(&seen.mu);
    seen.dead++;
    pthread_mutex_unlock(&seen.mu);
    return KB_DEAD;
}

static int seen_count(void)
{
    pthread_mutex_lock(&seen.mu);
    int n = seen.n + seen.dead;
    pthread_mutex_unlock(&seen.mu);
    return n;
}

static void seen_reset(void)
{
    pthread_mutex_lock(&seen.mu);
    seen.n = seen.text = seen.dead = 0;
    pthread_mutex_unlock(&seen.mu);
}

/* The largest payload with `key` is accepted and handled, one byte more is
 * refused with KB_ETOOBIG naming the server's limit and the header room. */
static void edge(kb_bus *b, const char *topic, const char *key, size_t klen, size_t room,
                 char *buf, int *expect)
{
    size_t largest = SMALL_MAX - room;
    assert_int_equal(kb_publish(b, topic, key, klen, buf, largest + 1), KB_ETOOBIG);
    char text[128];
    snprintf(text, sizeof text, "max_payload of %d bytes", SMALL_MAX);
    assert_non_null(strstr(kb_last_error(), text));
    snprintf(text, sizeof text, "%zu bytes go to headers and framing", room);
    assert_non_null(strstr(kb_last_error(), text));
    assert_int_equal(kb_publish(b, topic, key, klen, buf, 3000), KB_ETOOBIG);
    kb_assert_ok(kb_publish(b, topic, key, klen, buf, largest));
    expect[0]++;
}

/* The same with headers, which count in the room: traceparent (55 bytes) is
 * "traceparent: <value>" CRLF = 70 bytes plus its name in "Kb-Headers:
 * traceparent,empty=" CRLF (32 bytes); an empty value travels only there. In
 * a frame the entry grows by 2 + (5 + 11 + 55) + (5 + 5) bytes and the frame
 * by "Kb-Frame: 2" CRLF (13): with a 6-byte key (not recorded by `record`),
 * room = max(64 + 16 + 102, 88 + 6 + 13 + 83). */
static void edge_headers(kb_bus *b, const char *topic, char *buf, int *expect)
{
    char err[256], text[128];
    kb_topic *t = kb_topic_get(b, topic, err, sizeof err);
    assert_non_null(t);
    const kb_header h[2] = {
        {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", 55},
        {"empty", "", 0}};
    size_t room = 190, largest = SMALL_MAX - room;
    kb_msg m = {"key-22", 6, buf, largest + 1, 0, h, 2};
    assert_int_equal(kb_publish_ex(t, &m), KB_ETOOBIG);
    snprintf(text, sizeof text, "and 2 headers, %zu bytes go to headers and framing", room);
    assert_non_null(strstr(kb_last_error(), text));
    m.payload_len = largest;
    kb_assert_ok(kb_publish_ex(t, &m));
    expect[0]++;
}

/* max_payload 2000 (frames on, then off): payloads up to max_payload - room
 * pass, where room = max(64 + key header line, 88 + key length); a burst of
 * mid-sized events is framed below the limit; every accepted event is
 * handled, in order, and kb_flush and kb_close succeed. */
static void small_max_payload(const char *topic, const char *batch)
{
    seen_reset();
    const char *const kv[] = {"nats.publish_batch", batch, NULL};
    kb_bus *b = open_bus(&small, kv);
    kb_assert_ok(kb_subscribe(b, topic, record, NULL));
    char *buf = calloc(1, 4096);
    assert_non_null(buf);
    int n = 0;
    const char *text_key = "key-1";   /* printable: "Kb-Key: key-1\r\n" */
    edge(b, topic, text_key, 5, 88 + 5, buf, &n);
    for (int i = 0; i < 40; i++, n++)
        kb_assert_ok(kb_publish(b, topic, text_key, 5, buf, 300));
    /* 40 bytes, not printable: "Kb-Bin-Key: <56 base64>\r\n" = 70 bytes */
    char bin_key[40];
    memset(bin_key, 1, sizeof bin_key);
    edge(b, topic, bin_key, sizeof bin_key, 64 + 70, buf, &n);
    edge_headers(b, topic, buf, &n);
    kb_assert_ok(kb_drain(b, 10000));
    assert_int_equal(seen_count(), n);
    assert_int_equal(seen.text, 41);
    assert_int_equal(seen.len[0], SMALL_MAX - 93);
    for (int i = 1; i <= 40; i++)
        assert_int_equal(seen.len[i], 300);
    free(buf);
    kb_assert_ok(kb_close(b, 10000));
}

static void small_max_payload_frames(void **state)
{
    (void)state;
    small_max_payload("limits.frames", "64");
}

static void small_max_payload_plain(void **state)
{
    (void)state;
    small_max_payload("limits.plain", "1");
}

/* The longest key is the one whose Kb-Bin-Key header still leaves room for a
 * dead letter's headers under 64 KiB: 48,324 bytes. It is consumed and
 * dead-lettered (stored, not lost); one byte more is refused at publish. */
#define LONGEST_KEY 48324
static void longest_key(void **state)
{
    (void)state;
    seen_reset();
    const char *topic = "limits.key";
    const char *const kv[] = {"limits.max_key_bytes", "65535", NULL};
    kb_bus *b = open_bus(&big, kv);
    kb_assert_ok(kb_subscribe(b, topic, dead, NULL));
    char *key = malloc(LONGEST_KEY + 1);
    assert_non_null(key);
    memset(key, 2, LONGEST_KEY + 1);
    assert_int_equal(kb_publish(b, topic, key, LONGEST_KEY + 1, "p", 1), KB_ETOOBIG);
    assert_non_null(strstr(kb_last_error(), "64 KiB header"));
    kb_assert_ok(kb_publish(b, topic, key, LONGEST_KEY, "p", 1));
    kb_assert_ok(kb_publish(b, topic, key, LONGEST_KEY, "q", 1));
    kb_assert_ok(kb_flush(b, 10000));
    kb_topic_stats st = {0};
    for (int i = 0; i < 1000 && st.dlq_length < 2; i++) {
        kb_assert_ok(kb_stats(b, topic, &st));
        usleep(10000);
    }
    assert_int_equal(st.dlq_length, 2);
    assert_int_equal(st.dead_letters_lost, 0);
    assert_int_equal(seen.dead, 2);
    free(key);
    kb_assert_ok(kb_close(b, 10000));
}

typedef struct refs {
    int n, payload, key, omitted;
    char first[32];
} refs;

static int count_ref(const kb_dead_letter *dl, void *opaque)
{
    refs *r = opaque;
    if (r->n++ == 0)
        snprintf(r->first, sizeof r->first, "%s", dl->id);
    r->payload += strstr(dl->reason, "limits.max_payload_bytes") != NULL;
    r->key += strstr(dl->reason, "limits.max_key_bytes") != NULL;
    r->omitted += dl->payload_len == 0 && dl->key_len == 0;
    return 0;
}

/* Events another process published within its limits but over this
 * consumer's limits.max_payload_bytes / max_key_bytes: dead-lettered as
 * references (no body, no key; the reason names the limit and the size),
 * never handed to a handler; the events after them are. Plain and framed. */
static void over_the_consumers_limits(const char *topic, const char *batch)
{
    seen_reset();
    const char *const pk[] = {"nats.publish_batch", batch, "limits.max_key_bytes", "4096", NULL};
    const char *const ck[] = {"limits.max_payload_bytes", "1024", "limits.max_key_bytes", "1024",
                              NULL};
    kb_bus *p = open_bus(&big, pk), *c = open_bus(&big, ck);
    kb_assert_ok(kb_subscribe(c, topic, record, NULL));
    char *buf = calloc(1, 4096);
    assert_non_null(buf);
    kb_assert_ok(kb_publish(p, topic, "key-1", 5, buf, 4096));
    char key[2000];
    memset(key, 'k', sizeof key);
    kb_assert_ok(kb_publish(p, topic, key, sizeof key, "p", 1));
    for (int i = 0; i < 10; i++)
        kb_assert_ok(kb_publish(p, topic, "key-1", 5, buf, 100));
    kb_assert_ok(kb_flush(p, 10000));
    refs r = {0};
    for (int i = 0; i < 1000 && (seen_count() < 10 || r.n < 2); i++) {
        r = (refs){0};
        kb_assert_ok(kb_dead_letters(c, topic, NULL, 10, count_ref, &r));
        usleep(10000);
    }
    assert_int_equal(seen_count(), 10);
    assert_int_equal(seen.text, 10);
    for (int i = 0; i < 10; i++)
        assert_int_equal(seen.len[i], 100);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.payload, 1);
    assert_int_equal(r.key, 1);
    assert_int_equal(r.omitted, 2);
    /* a reference holds nothing to replay: refused, saying so */
    assert_int_equal(kb_dead_letter_replay(c, topic, r.first), KB_EINVAL);
    assert_non_null(strstr(kb_last_error(), "reference"));
    free(buf);
    kb_assert_ok(kb_close(p, 10000));
    kb_assert_ok(kb_close(c, 10000));
}

static void over_the_consumers_limits_plain(void **state)
{
    (void)state;
    over_the_consumers_limits("limits.over.plain", "1");
}

static void over_the_consumers_limits_frames(void **state)
{
    (void)state;
    over_the_consumers_limits("limits.over.frames", "64");
}

/* Warnings that the PING behind kb_close's last acks got no answer. */
static atomic_int ping_warnings;

static void on_log(int level, const char *msg, void *opaque)
{
    (void)opaque;
    if (level == KB_LOG_WARNING && strstr(msg, "last acks may be lost") != NULL)
        atomic_fetch_add(&ping_warnings, 1);
}

/* The server goes away with accepted events not yet sent: kb_close says how
 * many, with an error, instead of KB_OK, and logs that the PING behind its
 * last acks went unanswered. */
static void close_reports_unsent(void **state)
{
    (void)state;
    const char *const kv[] = {"nats.publish_timeout_ms", "1000", NULL};
    kb_conf *c = kb_test_conf(small.url, NULL, kv);
    kb_conf_set_log(c, on_log, NULL);
    kb_bus *b = kb_test_open_conf(c);
    kb_assert_ok(kb_publish(b, "limits.gone", "k", 1, "v", 1));
    kb_assert_ok(kb_flush(b, 10000));
    kb_test_server_signal(&small, SIGKILL);
    for (int i = 0; i < 5; i++)
        kb_assert_ok(kb_publish(b, "limits.gone", "k", 1, "v", 1));
    assert_int_equal(kb_close(b, 2000), KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "5 published events never sent"));
    assert_int_equal(atomic_load(&ping_warnings), 1);
    assert_int_equal(kb_test_server_restart(&small), 0);
}

/* Failed delivery reports of the 3,000-byte event, and every other report. */
static struct refusals {
    pthread_mutex_t mu;
    int failed, other;
    char error[256];
} refusals = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void on_report(const kb_delivery_report *r, void *opaque)
{
    (void)opaque;
    pthread_mutex_lock(&refusals.mu);
    if (r->result != KB_OK && r->key_len == 3 && memcmp(r->key, "big", 3) == 0) {
        refusals.failed++;
        snprintf(refusals.error, sizeof refusals.error, "%s", r->error);
    } else if (r->result != KB_OK) {
        refusals.other++;
    }
    pthread_mutex_unlock(&refusals.mu);
}

static int refusals_failed(void)
{
    pthread_mutex_lock(&refusals.mu);
    int n = refusals.failed;
    pthread_mutex_unlock(&refusals.mu);
    return n;
}

/* The server comes back with a smaller max_payload than the event kb_publish
 * accepted while it was away: nats.c refuses to send it, kb_flush reports it,
 * and so does the delivery callback, once. */
static void shrunk_max_payload_is_reported(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start_conf(&s, "nats", "max_payload: 1048576\n"), 0);
    kb_conf *c = kb_test_conf(s.url, NULL, NULL);
    kb_conf_set_delivery_cb(c, on_report, NULL);
    kb_bus *b = kb_test_open_conf(c);
    static char payload[3000];
    memset(payload, 'x', sizeof payload);
    kb_assert_ok(kb_publish(b, "limits.shrunk", "k", 1, "v", 1));
    kb_assert_ok(kb_flush(b, 10000));
    kb_test_server_signal(&s, SIGKILL);
    kb_assert_ok(kb_publish(b, "limits.shrunk", "big", 3, payload, sizeof payload));
    char path[300];
    snprintf(path, sizeof path, "%s/server.conf", s.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "max_payload: %d\n", SMALL_MAX);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(kb_test_server_restart(&s), 0);
    assert_int_equal(kb_flush(b, 20000), KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "max_payload"));
    for (int i = 0; i < 100 && refusals_failed() < 1; i++)
        usleep(100 * 1000);   /* the report comes from the acker, maybe just after */
    kb_assert_ok(kb_close(b, 10000));
    kb_test_server_stop(&s);
    assert_int_equal(refusals.failed, 1);
    assert_int_equal(refusals.other, 0);
    assert_non_null(strstr(refusals.error, "max_payload"));
}

int main(void)
{
    char conf[64];
    snprintf(conf, sizeof conf, "max_payload: %d\n", SMALL_MAX);
    if (kb_test_server_start_conf(&small, "nats", conf) != 0 ||
        kb_test_server_start(&big, "nats", NULL) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_max_payload_frames),
        cmocka_unit_test(small_max_payload_plain),
        cmocka_unit_test(longest_key),
        cmocka_unit_test(over_the_consumers_limits_plain),
        cmocka_unit_test(over_the_consumers_limits_frames),
        cmocka_unit_test(close_reports_unsent),
        cmocka_unit_test(shrunk_max_payload_is_reported),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    kb_test_server_stop(&small);
    kb_test_server_stop(&big);
    return failed;
}
