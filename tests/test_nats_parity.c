/* nats:// parity with the other transports (issue 9) against a real
 * nats-server -js: headers to and from other NATS clients and in frames,
 * kb_drain across buses, and stats read by a bus that never used the topic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <nats/nats.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/suite.h"

static kb_test_server server;

static kb_bus *open_bus(const char *key, const char *value)
{
    static const char *const short_leases[] = {"nats.lease_ttl_ms", "2000", NULL};
    const char *const extra[] = {key, value, NULL};
    return kb_test_open(server.url, short_leases, extra);
}

/* Wait for a handler's post; false after 30 s (a failure, not a timing). */
static bool wait_post(sem_t *s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30;
    while (sem_timedwait(s, &ts) != 0)
        if (errno != EINTR)
            return false;
    return true;
}

static void subject_of(const char *topic, const char *key, char *buf, size_t len)
{
    snprintf(buf, len, "kb.%s.%u", topic, kb_fnv1a32(key, strlen(key)) % 8);
}

/* What a handler saw, as text: "name=value;..." per call. */
#define CALLS 8
struct seen {
    pthread_mutex_t mu;
    sem_t posted;
    int n;
    char calls[CALLS][256];
};

static int record(const kb_event *ev, void *opaque)
{
    struct seen *s = opaque;
    pthread_mutex_lock(&s->mu);
    if (s->n < CALLS) {
        char *out = s->calls[s->n++];
        size_t o = (size_t)snprintf(out, 256, "%.*s|", (int)ev->payload_len,
                                    (const char *)ev->payload);
        for (size_t i = 0; i < ev->n_headers && o < 256; i++)
            o += (size_t)snprintf(out + o, 256 - o, "%s=%.*s;", ev->headers[i].name,
                                  (int)ev->headers[i].value_len,
                                  (const char *)ev->headers[i].value);
    }
    pthread_mutex_unlock(&s->mu);
    sem_post(&s->posted);
    return KB_HANDLED;
}

static void put_u32(char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (char)(v >> (8 * i));
}

/* One frame entry of docs/headers.md, version 2; returns its length. */
static size_t frame_entry(char *p, const char *key, const char *payload, const char *hname,
                          const char *hvalue)
{
    size_t kl = strlen(key), pl = strlen(payload), o = 0;
    put_u32(p, (uint32_t)kl);
    memcpy(p + 4, key, kl);
    put_u32(p + 4 + kl, (uint32_t)pl);
    memcpy(p + 8 + kl, payload, pl);
    o = 8 + kl + pl;
    p[o++] = hname ? 1 : 0;
    p[o++] = 0;
    if (hname != NULL) {
        p[o++] = (char)strlen(hname);
        memcpy(p + o, hname, strlen(hname));
        o += strlen(hname);
        put_u32(p + o, (uint32_t)strlen(hvalue));
        memcpy(p + o + 4, hvalue, strlen(hvalue));
        o += 4 + strlen(hvalue);
    }
    return o;
}

struct dead_seen {
    int n;
    char reason[256];
};

static int dead_reason(const kb_dead_letter *dl, void *opaque)
{
    struct dead_seen *d = opaque;
    snprintf(d->reason, sizeof d->reason, "%s", dl->reason);
    d->n++;
    return 0;
}

/* Another client's headers reach the handler (Kb-* and Nats-* are keybus's
 * and NATS's); one with too many headers is dead-lettered with the reason; a
 * frame written by hand in the documented version 2 layout is read too. */
static void foreign_headers_reach_the_handler(void **state)
{
    (void)state;
    const char *topic = "parity.foreign", *key = "ord-1";
    kb_bus *b = open_bus(NULL, NULL);
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    sem_init(&s.posted, 0, 0);
    kb_assert_ok(kb_subscribe(b, topic, record, &s));

    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    char subj[128];
    subject_of(topic, key, subj, sizeof subj);
    jsErrCode jerr = 0;
    natsMsg *m = NULL;
    assert_int_equal(natsMsg_Create(&m, subj, NULL, "one", 3), NATS_OK);
    natsMsgHeader_Set(m, "Kb-Key", key);
    natsMsgHeader_Set(m, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    natsMsgHeader_Set(m, "tenant", "acme");
    natsMsgHeader_Set(m, "Nats-Msg-Id", "foreign-1");
    assert_int_equal(js_PublishMsg(NULL, js, m, NULL, &jerr), NATS_OK);
    natsMsg_Destroy(m);
    /* limits.max_headers is 16 */
    assert_int_equal(natsMsg_Create(&m, subj, NULL, "many", 4), NATS_OK);
    natsMsgHeader_Set(m, "Kb-Key", key);
    for (int i = 0; i < 17; i++) {
        char name[8];
        snprintf(name, sizeof name, "h%02d", i);
        natsMsgHeader_Set(m, name, "v");
    }
    assert_int_equal(js_PublishMsg(NULL, js, m, NULL, &jerr), NATS_OK);
    natsMsg_Destroy(m);
    char body[256];
    size_t len = frame_entry(body, key, "two", "x-a", "1");
    len += frame_entry(body + len, key, "three", NULL, NULL);
    assert_int_equal(natsMsg_Create(&m, subj, NULL, body, (int)len), NATS_OK);
    natsMsgHeader_Set(m, "Kb-Batch", "2");
    natsMsgHeader_Set(m, "Kb-Frame", "2");
    assert_int_equal(js_PublishMsg(NULL, js, m, NULL, &jerr), NATS_OK);
    natsMsg_Destroy(m);

    for (int i = 0; i < 3; i++)
        assert_true(wait_post(&s.posted));
    /* the dead letter was stored before the frame after it was delivered */
    struct dead_seen d = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 10, dead_reason, &d));
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(s.n, 3);
    assert_string_equal(s.calls[0], "one|tenant=acme;traceparent=00-4bf92f3577b34da6a3ce929d0e0e"
                                    "4736-00f067aa0ba902b7-01;");
    assert_string_equal(s.calls[1], "two|x-a=1;");
    assert_string_equal(s.calls[2], "three|");
    assert_int_equal(d.n, 1);
    assert_non_null(strstr(d.reason, "limits.max_headers"));
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    sem_destroy(&s.posted);
}

/* Headers published by keybus as a plain message are NATS headers of the
 * same names for other clients; values NATS cannot carry verbatim (empty,
 * blanks around) travel in Kb-Headers; the handler gets all of them back. */
static void keybus_headers_seen_by_another_client(void **state)
{
    (void)state;
    const char *topic = "parity.out", *key = "ord-2";
    kb_bus *b = open_bus("nats.publish_batch", "1");
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    sem_init(&s.posted, 0, 0);
    kb_assert_ok(kb_subscribe(b, topic, record, &s));
    char err[256];
    kb_topic *t = kb_topic_get(b, topic, err, sizeof err);
    assert_non_null(t);
    const kb_header h[3] = {{"traceparent", "00-aa-bb-01", 11}, {"sp", " padded ", 8},
                            {"empty", "", 0}};
    kb_msg msg = {key, strlen(key), "p", 1, 0, h, 3};
    kb_assert_ok(kb_publish_ex(t, &msg));
    kb_assert_ok(kb_drain(b, 30000));

    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    char stream[160], subj[128];
    kb_test_nats_stream(topic, stream, sizeof stream);
    subject_of(topic, key, subj, sizeof subj);
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    assert_int_equal(js_GetLastMsg(&m, js, stream, subj, NULL, &jerr), NATS_OK);
    const char *v = NULL;
    assert_int_equal(natsMsgHeader_Get(m, "traceparent", &v), NATS_OK);
    assert_string_equal(v, "00-aa-bb-01");
    assert_int_equal(natsMsgHeader_Get(m, "Kb-Headers", &v), NATS_OK);
    assert_string_equal(v, "traceparent,sp=IHBhZGRlZCA=,empty=");
    assert_int_equal(natsMsgHeader_Get(m, "Kb-Key", &v), NATS_OK);
    assert_string_equal(v, key);
    natsMsg_Destroy(m);

    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(s.n, 1);
    assert_string_equal(s.calls[0], "p|traceparent=00-aa-bb-01;sp= padded ;empty=;");
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    sem_destroy(&s.posted);
}

#define MIXED 60

struct mixed {
    _Atomic int handled, wrong, framed;
};

/* Event i carries header "n" = i (padded with blanks every fifth) unless
 * i % 3 == 0: frames mix events with and without headers. */
static size_t mixed_headers(uint32_t i, kb_header *h, char *value)
{
    if (i % 3 == 0)
        return 0;
    int n = snprintf(value, 16, i % 5 == 0 ? " %u " : "%u", i);
    h[0] = (kb_header){"n", value, (size_t)n};
    return 1;
}

static int check_mixed(const kb_event *ev, void *opaque)
{
    struct mixed *mx = opaque;
    uint32_t i = 0;
    memcpy(&i, ev->payload, sizeof i);
    kb_header want;
    char value[16];
    size_t n = mixed_headers(i, &want, value);
    bool same = ev->n_headers == n &&
                (n == 0 || (strcmp(ev->headers[0].name, "n") == 0 &&
                            ev->headers[0].value_len == want.value_len &&
                            memcmp(ev->headers[0].value, value, want.value_len) == 0));
    mx->wrong += !same;
    mx->framed += strchr(ev->id, '.') != NULL;
    mx->handled++;
    return KB_HANDLED;
}

static void frames_carry_headers(void **state)
{
    (void)state;
    const char *topic = "parity.frames";
    kb_bus *b = open_bus(NULL, NULL);
    struct mixed mx = {0};
    kb_assert_ok(kb_subscribe(b, topic, check_mixed, &mx));
    char err[256], values[MIXED][16];
    kb_topic *t = kb_topic_get(b, topic, err, sizeof err);
    kb_header h[MIXED];
    kb_msg msgs[MIXED];
    uint32_t payload[MIXED];
    for (uint32_t i = 0; i < MIXED; i++) {
        payload[i] = i;
        size_t n = mixed_headers(i, &h[i], values[i]);
        msgs[i] = (kb_msg){"k", 1, &payload[i], sizeof payload[i], 0, n ? &h[i] : NULL, n};
    }
    size_t taken = 0;
    kb_assert_ok(kb_publish_batch(t, msgs, MIXED, &taken));
    assert_int_equal(taken, MIXED);
    kb_assert_ok(kb_drain(b, 30000));
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(mx.handled, MIXED);
    assert_int_equal(mx.wrong, 0);
    assert_true(mx.framed > 0);
    assert_int_equal(st.broker_length, MIXED);
    assert_true(st.broker_frames < MIXED);
}

struct gate {
    _Atomic int handled, open;
    sem_t entered;
};

/* "block" is retried until the test opens the gate: it stays unsettled
 * while its executor handles other lanes. */
static int gated(const kb_event *ev, void *opaque)
{
    struct gate *g = opaque;
    if (ev->payload_len == 5 && memcmp(ev->payload, "block", 5) == 0 && !g->open) {
        if (ev->attempt == 1)
            sem_post(&g->entered);
        return KB_RETRY;
    }
    g->handled++;
    return KB_HANDLED;
}

/* kb_drain waits for a consumer to exist, in another bus, and for nothing
 * but what this bus published. */
static void drain_waits_for_the_group(void **state)
{
    (void)state;
    const char *topic = "parity.drain";
    kb_bus *pub = open_bus(NULL, NULL), *other = open_bus(NULL, NULL);
    for (int i = 0; i < 20; i++) {
        char key[16];
        int kl = snprintf(key, sizeof key, "a-%d", i % 5);
        kb_assert_ok(kb_publish(pub, topic, key, (size_t)kl, "x", 1));
    }
    /* nobody consumes the topic yet */
    assert_int_equal(kb_drain(pub, 300), KB_ETIMEDOUT);
    assert_non_null(strstr(kb_last_error(), "deadline"));

    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "transport", server.url, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "retry.max_attempts", "1000000", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "retry.backoff_ms", "5", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "retry.max_backoff_ms", "20", err, sizeof err));
    /* a consumer per partition: with one for the whole topic (a lone member's
     * default), another process's drain waits for the topic's ack floor */
    kb_assert_ok(kb_conf_set(c, "nats.topic_consumer", "off", err, sizeof err));
    kb_bus *cons = kb_open(c, err, sizeof err);
    assert_non_null(cons);
    struct gate g = {0};
    sem_init(&g.entered, 0, 0);
    kb_assert_ok(kb_subscribe(cons, topic, gated, &g));
    kb_assert_ok(kb_drain(pub, 30000));
    assert_int_equal(g.handled, 20);

    /* another bus's event held in its handler does not hold pub's drain */
    kb_assert_ok(kb_publish(other, topic, "a-0", 3, "block", 5));
    kb_assert_ok(kb_flush(other, 10000));
    assert_true(wait_post(&g.entered));
    /* a key of another partition: the held one's frontier stops at "block"
     * (and another lane: a lane waits for its retried event) */
    char key[16] = "a-1";
    for (int i = 1; kb_fnv1a32(key, strlen(key)) % 8 == kb_fnv1a32("a-0", 3) % 8; i++)
        snprintf(key, sizeof key, "a-%d", i);
    kb_assert_ok(kb_publish(pub, topic, key, strlen(key), "y", 1));
    kb_assert_ok(kb_drain(pub, 30000));
    assert_int_equal(kb_drain(other, 200), KB_ETIMEDOUT);
    g.open = 1;
    kb_assert_ok(kb_drain(other, 30000));
    assert_int_equal(g.handled, 22);
    kb_assert_ok(kb_close(pub, 10000));
    kb_assert_ok(kb_close(other, 10000));
    kb_assert_ok(kb_close(cons, 10000));
    sem_destroy(&g.entered);
}

struct once_dead {
    _Atomic int calls;
};

static int first_dead(const kb_event *ev, void *opaque)
{
    struct once_dead *o = opaque;
    bool dead = ev->payload_len == 4 && memcmp(ev->payload, "dead", 4) == 0 && o->calls == 0;
    if (ev->payload_len == 4 && memcmp(ev->payload, "dead", 4) == 0)
        o->calls++;
    return dead ? KB_DEAD : KB_HANDLED;
}

static int first_id(const kb_dead_letter *dl, void *opaque)
{
    snprintf(opaque, 32, "%s", dl->id);
    return 1;
}

/* A bus that never published or subscribed the topic reads its broker
 * figures, in events; a replayed dead letter counts as published where it
 * was replayed, and leaves the store. */
static void monitor_reads_stats(void **state)
{
    (void)state;
    const char *topic = "parity.monitor";
    kb_bus *b = open_bus(NULL, NULL), *mon = open_bus(NULL, NULL);
    struct once_dead o = {0};
    kb_assert_ok(kb_subscribe(b, topic, first_dead, &o));
    char err[256];
    kb_topic *t = kb_topic_get(b, topic, err, sizeof err);
    kb_msg msgs[50];
    for (int i = 0; i < 50; i++)
        msgs[i] = (kb_msg){"agg", 3, i == 10 ? "dead" : "live", 4, 0, NULL, 0};
    kb_assert_ok(kb_publish_batch(t, msgs, 50, NULL));
    kb_assert_ok(kb_drain(b, 30000));

    kb_topic_stats st;
    kb_assert_ok(kb_stats(mon, topic, &st));
    assert_int_equal(st.published, 0);
    assert_int_equal(st.received, 0);
    assert_int_equal(st.partitions, 8);
    assert_int_equal(st.broker_length, 50);
    assert_true(st.broker_frames >= 1 && st.broker_frames < 50);
    assert_int_equal(st.dlq_length, 1);
    assert_int_equal(st.broker_lag, 0);
    assert_int_equal(st.broker_pending, 0);
    uint32_t home = kb_fnv1a32("agg", 3) % 8;
    for (uint32_t p = 0; p < 8; p++) {
        kb_partition_stats ps;
        kb_assert_ok(kb_partition_stats_get(mon, topic, p, &ps));
        assert_int_equal(ps.length, p == home ? 50 : 0);
        if (p == home) {
            assert_int_equal(ps.pending, 0);
            assert_true(ps.owner[0] != '\0');
        }
    }
    assert_int_equal(kb_stats(mon, "parity.never", &st), KB_ENOTFOUND);
    kb_partition_stats ps;
    assert_int_equal(kb_partition_stats_get(mon, "parity.never", 0, &ps), KB_ENOTFOUND);

    char id[32] = "";
    kb_assert_ok(kb_dead_letters(mon, topic, NULL, 1, first_id, id));
    kb_assert_ok(kb_dead_letter_replay(b, topic, id));
    assert_int_equal(kb_dead_letter_replay(b, topic, id), KB_ENOTFOUND);
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(o.calls, 2);
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.published, 51);
    assert_int_equal(st.dlq_length, 0);
    assert_int_equal(st.broker_length, 51);
    kb_assert_ok(kb_stats(mon, topic, &st));
    assert_int_equal(st.published, 0);
    assert_int_equal(st.broker_length, 51);
    kb_assert_ok(kb_close(mon, 10000));
    kb_assert_ok(kb_close(b, 10000));
}

int main(void)
{
    if (kb_test_server_start(&server, "nats", NULL) != 0) {
        fprintf(stderr, "cannot start nats-server\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(foreign_headers_reach_the_handler),
        cmocka_unit_test(keybus_headers_seen_by_another_client),
        cmocka_unit_test(frames_carry_headers),
        cmocka_unit_test(drain_waits_for_the_group),
        cmocka_unit_test(monitor_reads_stats),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    kb_test_server_stop(&server);
    nats_Close();
    return failed;
}
