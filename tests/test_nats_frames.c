/* NATS frames (nats.publish_batch) against a real nats-server -js: a burst
 * goes out as few frames and keeps per-key order; a lone event after a quiet
 * spell is a plain message any client can read; frames written by hand by a
 * plain nats.c client are consumed (delivery IDs "<seq>.<i>"); malformed and
 * misrouted frames go to the dead letters; an event over the server's
 * max_payload is refused at kb_publish. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/server.h"
#include "support/tracker.h"

#define PARTITIONS 8

static kb_test_server server;

/* A bus on the file's server; `kv` is NULL or NULL-terminated key/value pairs. */
static kb_bus *open_bus(const char *const *kv)
{
    static const char *const fast_retry[] = {"retry.backoff_ms", "1", "retry.max_backoff_ms", "2",
                                             NULL};
    return kb_test_open(server.url, fast_retry, kv);
}

static uint32_t home_of(const char *key)
{
    return kb_fnv1a32(key, strlen(key)) % PARTITIONS;
}

/* A key other than `base`-N whose home partition differs from `not_home`. */
static void key_elsewhere(char *out, size_t len, const char *base, uint32_t not_home)
{
    for (int i = 0; i < 1000; i++) {
        snprintf(out, len, "%s-%d", base, i);
        if (home_of(out) != not_home)
            return;
    }
    fail_msg("no key of another partition");
}

/* ---- plain nats.c client helpers ---------------------------------------- */

typedef struct client {
    natsConnection *nc;
    jsCtx *js;
} client;

static void client_open(client *c)
{
    assert_int_equal(natsConnection_ConnectTo(&c->nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&c->js, c->nc, NULL), NATS_OK);
}

static void client_close(client *c)
{
    jsCtx_Destroy(c->js);
    natsConnection_Destroy(c->nc);
}

/* A frame body under construction. */
typedef struct frame {
    char buf[4096];
    size_t len;
} frame;

static void put_u32(char *p, uint32_t v)
{
    p[0] = (char)(v & 0xff);
    p[1] = (char)((v >> 8) & 0xff);
    p[2] = (char)((v >> 16) & 0xff);
    p[3] = (char)((v >> 24) & 0xff);
}

static void frame_add(frame *f, const char *key, const char *payload)
{
    size_t kl = strlen(key), pl = strlen(payload);
    assert_true(f->len + 8 + kl + pl <= sizeof f->buf);
    put_u32(f->buf + f->len, (uint32_t)kl);
    memcpy(f->buf + f->len + 4, key, kl);
    put_u32(f->buf + f->len + 4 + kl, (uint32_t)pl);
    memcpy(f->buf + f->len + 8 + kl, payload, pl);
    f->len += 8 + kl + pl;
}

/* Publish synchronously on kb.<topic>.<part> with a Kb-Batch header (when
 * `batch` is not NULL) or a Kb-Key header (when `key` is not NULL); returns
 * the stream sequence. */
static uint64_t publish_raw(client *c, const char *topic, uint32_t part, const char *batch,
                            const char *key, const char *body, size_t len)
{
    char subj[128];
    snprintf(subj, sizeof subj, "kb.%s.%u", topic, part);
    natsMsg *m = NULL;
    assert_int_equal(natsMsg_Create(&m, subj, NULL, body, (int)len), NATS_OK);
    if (batch != NULL)
        assert_int_equal(natsMsgHeader_Set(m, "Kb-Batch", batch), NATS_OK);
    if (key != NULL)
        assert_int_equal(natsMsgHeader_Set(m, "Kb-Key", key), NATS_OK);
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_PublishMsg(&pa, c->js, m, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("js_PublishMsg on %s: %s (jetstream error %d)", subj, natsStatus_GetText(s),
                 (int)jerr);
    uint64_t seq = pa->Sequence;
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
    assert_true(seq > 0);
    return seq;
}

/* ---- what handlers saw ---------------------------------------------------- */

#define REC_MAX 64

static struct recorder {
    pthread_mutex_t mu;
    int n;
    char key[REC_MAX][48];
    char payload[REC_MAX][48];   /* first bytes, NUL-terminated */
    size_t payload_len[REC_MAX];
    char id[REC_MAX][48];
    uint32_t attempt[REC_MAX];
    int big_intact;              /* payloads over 1 KiB whose pattern checked out */
} rec = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void rec_reset(void)
{
    pthread_mutex_lock(&rec.mu);
    rec.n = 0;
    rec.big_intact = 0;
    pthread_mutex_unlock(&rec.mu);
}

static int rec_count(void)
{
    pthread_mutex_lock(&rec.mu);
    int n = rec.n;
    pthread_mutex_unlock(&rec.mu);
    return n;
}

/* Big payloads carry byte i = (unsigned char)(i * 7 + 3). */
static int pattern_ok(const unsigned char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != (unsigned char)(i * 7 + 3))
            return 0;
    return 1;
}

static int record(const kb_event *ev, void *opaque)
{
    (void)opaque;
    pthread_mutex_lock(&rec.mu);
    if (rec.n < REC_MAX) {
        int i = rec.n;
        size_t kl = ev->key_len < sizeof rec.key[0] - 1 ? ev->key_len : sizeof rec.key[0] - 1;
        memcpy(rec.key[i], ev->key, kl);
        rec.key[i][kl] = '\0';
        size_t pl = ev->payload_len < sizeof rec.payload[0] - 1 ? ev->payload_len
                                                                : sizeof rec.payload[0] - 1;
        memcpy(rec.payload[i], ev->payload, pl);
        rec.payload[i][pl] = '\0';
        rec.payload_len[i] = ev->payload_len;
        snprintf(rec.id[i], sizeof rec.id[0], "%s", ev->id ? ev->id : "(null)");
        rec.attempt[i] = ev->attempt;
        if (ev->payload_len > 1024 && pattern_ok(ev->payload, ev->payload_len))
            rec.big_intact++;
    }
    rec.n++;
    pthread_mutex_unlock(&rec.mu);
    return KB_HANDLED;
}

static void wait_recorded(int n)
{
    for (int i = 0; i < 1000 && rec_count() < n; i++)
        usleep(10000);
}

/* ---- dead letters --------------------------------------------------------- */

#define DL_MAX 16

struct dl_seen {
    int n;
    char original_id[DL_MAX][48];
    char reason[DL_MAX][160];
    char key[DL_MAX][48];
    char payload[DL_MAX][64];
    size_t payload_len[DL_MAX];
    uint32_t partition[DL_MAX];
};

static int collect(const kb_dead_letter *dl, void *opaque)
{
    struct dl_seen *s = opaque;
    if (s->n < DL_MAX) {
        int i = s->n;
        snprintf(s->original_id[i], sizeof s->original_id[0], "%s", dl->original_id);
        snprintf(s->reason[i], sizeof s->reason[0], "%s", dl->reason);
        size_t kl = dl->key_len < sizeof s->key[0] - 1 ? dl->key_len : sizeof s->key[0] - 1;
        memcpy(s->key[i], dl->key, kl);
        s->key[i][kl] = '\0';
        size_t pl = dl->payload_len < sizeof s->payload[0] ? dl->payload_len
                                                           : sizeof s->payload[0];
        memcpy(s->payload[i], dl->payload, pl);
        s->payload_len[i] = dl->payload_len;
        s->partition[i] = dl->partition;
    }
    s->n++;
    return 0;
}

static int dl_find(const struct dl_seen *s, const char *original_id)
{
    for (int i = 0; i < s->n && i < DL_MAX; i++)
        if (strcmp(s->original_id[i], original_id) == 0)
            return i;
    return -1;
}

/* ---- 1 -------------------------------------------------------------------- */

static _Atomic uint64_t framed_ids, plain_ids, bad_ids;

static int track_ids(const kb_event *ev, void *opaque)
{
    /* "<seq>" for a plain message, "<seq>.<i>" (i from 1) inside a frame */
    char *end = NULL;
    unsigned long long seq = ev->id ? strtoull(ev->id, &end, 10) : 0;
    if (seq == 0 || end == ev->id)
        bad_ids++;
    else if (*end == '\0')
        plain_ids++;
    else if (*end == '.' && end[1] >= '1' && end[1] <= '9')
        framed_ids++;
    else
        bad_ids++;
    return kb_tracker_handler(ev, opaque);
}

#define BURST_KEYS 4
#define BURST_PER_KEY 500

/* A burst over 4 keys is packed into frames: far fewer stream messages than
 * events, and every key still sees its events in order, none missing. */
static void frames_keep_order_and_cut_messages(void **state)
{
    (void)state;
    const char *topic = "frames.burst";
    kb_bus *b = open_bus(NULL);
    kb_tracker t;
    kb_tracker_init(&t, BURST_KEYS);
    framed_ids = plain_ids = bad_ids = 0;
    kb_assert_ok(kb_subscribe(b, topic, track_ids, &t));
    for (uint32_t seq = 1; seq <= BURST_PER_KEY; seq++)
        for (uint32_t k = 0; k < BURST_KEYS; k++)
            kb_assert_ok(kb_tracker_publish(b, topic, k, seq, 16));
    kb_assert_ok(kb_flush(b, 10000));
    kb_wait_until(kb_tracker_distinct(&t) >= BURST_KEYS * BURST_PER_KEY, 10000,
                  "every event of the burst handled");
    assert_int_equal(kb_tracker_distinct(&t), BURST_KEYS * BURST_PER_KEY);
    assert_int_equal(t.order_violations, 0);
    assert_int_equal(t.concurrent, 0);
    assert_int_equal(bad_ids, 0);
    assert_true(framed_ids > 0);

    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.partitions, PARTITIONS);
    assert_int_equal(st.published, BURST_KEYS * BURST_PER_KEY);
    assert_int_equal(st.dlq_length, 0);
    uint64_t events = 0;
    for (uint32_t p = 0; p < PARTITIONS; p++) {
        kb_partition_stats ps;
        kb_assert_ok(kb_partition_stats_get(b, topic, p, &ps));
        events += ps.length;
    }
    print_message("2000 events in %llu stream messages (%llu framed, %llu plain deliveries)\n",
                  (unsigned long long)st.broker_frames, (unsigned long long)framed_ids,
                  (unsigned long long)plain_ids);
    /* lengths count events; the messages holding them are broker_frames */
    assert_int_equal(events, BURST_KEYS * BURST_PER_KEY);
    assert_int_equal(st.broker_length, BURST_KEYS * BURST_PER_KEY);
    assert_true(st.broker_frames > 0);
    /* at least two events a message on average: 760 messages seen under
     * ThreadSanitizer at load 12 (a slow publisher's frames are shorter) */
    assert_true(st.broker_frames < BURST_KEYS * BURST_PER_KEY / 2);
    kb_assert_ok(kb_close(b, 10000));
    /* nothing handled twice (no redelivery on a quiet run) */
    assert_int_equal(t.duplicates, 0);
    kb_tracker_destroy(&t);
}

/* ---- 2 -------------------------------------------------------------------- */

static natsMsg *next_msg(natsSubscription *sub, int64_t timeout_ms)
{
    natsMsg *m = NULL;
    natsStatus s = natsSubscription_NextMsg(&m, sub, timeout_ms);
    return s == NATS_OK ? m : NULL;
}

static const char *header(natsMsg *m, const char *name)
{
    const char *v = NULL;
    return natsMsgHeader_Get(m, name, &v) == NATS_OK ? v : NULL;
}

static void assert_plain(natsMsg *m, const char *subj, const char *key_hdr, const char *key,
                         const char *payload)
{
    assert_non_null(m);
    assert_string_equal(natsMsg_GetSubject(m), subj);
    assert_null(header(m, "Kb-Batch"));
    const char *k = header(m, key_hdr);
    assert_non_null(k);
    assert_string_equal(k, key);
    assert_non_null(header(m, "Nats-Msg-Id"));
    assert_int_equal(natsMsg_GetDataLength(m), (int)strlen(payload));
    assert_memory_equal(natsMsg_GetData(m), payload, strlen(payload));
}

/* The first event after a quiet spell (longer than the linger) goes out at
 * once as a plain message: Kb-Key (or Kb-Bin-Key) header, body = payload.
 * Events close behind it wait in a frame. The linger is 200 ms here, so "at
 * once" is told apart from "after the linger" without tight timing. */
static void sparse_event_is_plain(void **state)
{
    (void)state;
    const char *topic = "frames.sparse";
    const char *const kv[] = {"nats.publish_linger_us", "200000", NULL};
    kb_bus *b = open_bus(kv);
    client c;
    client_open(&c);
    natsSubscription *sub = NULL;
    assert_int_equal(natsConnection_SubscribeSync(&sub, c.nc, "kb.frames.sparse.*"), NATS_OK);
    assert_int_equal(natsConnection_Flush(c.nc), NATS_OK);   /* the server knows the interest */

    const char *key = "sparse-key";
    char subj[64];
    snprintf(subj, sizeof subj, "kb.%s.%u", topic, home_of(key));

    /* A: first event ever on the partition, plain at once; B and C follow
     * within the linger and leave together as a frame of 2 on kb_flush. */
    kb_assert_ok(kb_publish(b, topic, key, strlen(key), "A", 1));
    kb_assert_ok(kb_publish(b, topic, key, strlen(key), "B-b", 3));
    kb_assert_ok(kb_publish(b, topic, key, strlen(key), "C-cc", 4));
    kb_assert_ok(kb_flush(b, 10000));
    natsMsg *m = next_msg(sub, 10000);
    assert_plain(m, subj, "Kb-Key", key, "A");
    natsMsg_Destroy(m);
    m = next_msg(sub, 10000);
    assert_non_null(m);
    assert_string_equal(natsMsg_GetSubject(m), subj);
    assert_null(header(m, "Kb-Key"));
    const char *count = header(m, "Kb-Batch");
    assert_non_null(count);
    assert_string_equal(count, "2");
    assert_non_null(header(m, "Nats-Msg-Id"));
    frame want = {.len = 0};
    frame_add(&want, key, "B-b");
    frame_add(&want, key, "C-cc");
    assert_int_equal(natsMsg_GetDataLength(m), (int)want.len);
    assert_memory_equal(natsMsg_GetData(m), want.buf, want.len);
    natsMsg_Destroy(m);

    /* D after 300 ms of quiet: on the wire well before the 200 ms linger
     * would have sent it, a plain message; kb_flush then sends nothing more. */
    usleep(300000);
    kb_assert_ok(kb_publish(b, topic, key, strlen(key), "payload-D", 9));
    m = next_msg(sub, 150);
    assert_plain(m, subj, "Kb-Key", key, "payload-D");
    natsMsg_Destroy(m);
    kb_assert_ok(kb_flush(b, 10000));
    m = next_msg(sub, 100);
    assert_null(m);

    /* A key that is not printable text travels base64-encoded in Kb-Bin-Key. */
    usleep(300000);
    const char bin[] = {0x01, 0x02};
    snprintf(subj, sizeof subj, "kb.%s.%u", topic, kb_fnv1a32(bin, 2) % PARTITIONS);
    kb_assert_ok(kb_publish(b, topic, bin, 2, "E", 1));
    m = next_msg(sub, 150);
    assert_plain(m, subj, "Kb-Bin-Key", "AQI=", "E");
    assert_null(header(m, "Kb-Key"));
    natsMsg_Destroy(m);

    kb_assert_ok(kb_close(b, 10000));
    natsSubscription_Destroy(sub);
    client_close(&c);
}

/* ---- 3 -------------------------------------------------------------------- */

/* A frame written by a plain nats.c client is consumed: its 3 events reach
 * the handler in order, with IDs "<seq>.1" .. "<seq>.3". */
static void plain_client_frame_consumed_in_order(void **state)
{
    (void)state;
    const char *topic = "frames.hand";
    rec_reset();
    kb_bus *b = open_bus(NULL);
    kb_assert_ok(kb_subscribe(b, topic, record, NULL));   /* creates the stream */
    client c;
    client_open(&c);
    const char *key = "hand-key";
    frame f = {.len = 0};
    frame_add(&f, key, "first");
    frame_add(&f, key, "second");
    frame_add(&f, key, "third");
    uint64_t seq = publish_raw(&c, topic, home_of(key), "3", NULL, f.buf, f.len);
    wait_recorded(3);
    usleep(50000);   /* a fourth (duplicate) delivery would show up here */
    assert_int_equal(rec_count(), 3);
    const char *want[] = {"first", "second", "third"};
    for (int i = 0; i < 3; i++) {
        char id[48];
        snprintf(id, sizeof id, "%llu.%d", (unsigned long long)seq, i + 1);
        assert_string_equal(rec.payload[i], want[i]);
        assert_int_equal(rec.payload_len[i], strlen(want[i]));
        assert_string_equal(rec.key[i], key);
        assert_string_equal(rec.id[i], id);
        assert_int_equal(rec.attempt[i], 1);
    }
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.dlq_length, 0);
    assert_int_equal(st.handled, 3);
    kb_assert_ok(kb_close(b, 10000));
    client_close(&c);
}

/* ---- 4 -------------------------------------------------------------------- */

/* Frames that cannot be read go to the dead letters whole ("malformed
 * Kb-Batch"); in a readable frame, an event whose key belongs to another
 * partition goes alone ("key belongs to partition"), its neighbours are
 * handled, and the partition keeps going. */
static void malformed_frames_dead_letter(void **state)
{
    (void)state;
    const char *topic = "frames.bad";
    rec_reset();
    kb_bus *b = open_bus(NULL);
    kb_assert_ok(kb_subscribe(b, topic, record, NULL));
    client c;
    client_open(&c);
    const char *key = "bad-key";
    uint32_t home = home_of(key);
    char other[48];
    key_elsewhere(other, sizeof other, "stray", home);

    enum { N_MALFORMED = 6 };
    uint64_t malformed[N_MALFORMED];
    frame one = {.len = 0}, two = {.len = 0};
    frame_add(&one, key, "bad-1");
    frame_add(&two, key, "bad-a");
    frame_add(&two, key, "bad-b");
    /* Kb-Batch below 2 */
    malformed[0] = publish_raw(&c, topic, home, "1", NULL, one.buf, one.len);
    /* Kb-Batch not a number */
    malformed[1] = publish_raw(&c, topic, home, "abc", NULL, two.buf, two.len);
    /* count 3, 2 events in the body */
    malformed[2] = publish_raw(&c, topic, home, "3", NULL, two.buf, two.len);
    /* count 2, the second payload length runs past the end */
    frame trunc = two;
    trunc.len -= 2;
    malformed[3] = publish_raw(&c, topic, home, "2", NULL, trunc.buf, trunc.len);
    /* count 2, bytes left over after the 2 events */
    frame extra = two;
    memcpy(extra.buf + extra.len, "xyz", 3);
    extra.len += 3;
    malformed[4] = publish_raw(&c, topic, home, "2", NULL, extra.buf, extra.len);
    /* count 2, an event with an empty key */
    frame nokey = one;
    put_u32(nokey.buf + nokey.len, 0);
    put_u32(nokey.buf + nokey.len + 4, 5);
    memcpy(nokey.buf + nokey.len + 8, "bad-e", 5);
    nokey.len += 13;
    malformed[5] = publish_raw(&c, topic, home, "2", NULL, nokey.buf, nokey.len);

    /* a valid frame whose event 2 belongs to another partition */
    frame mixed = {.len = 0};
    frame_add(&mixed, key, "good-1");
    frame_add(&mixed, other, "misrouted");
    frame_add(&mixed, key, "good-3");
    uint64_t mixed_seq = publish_raw(&c, topic, home, "3", NULL, mixed.buf, mixed.len);
    /* and a plain message after all of it */
    uint64_t after_seq = publish_raw(&c, topic, home, NULL, key, "after", 5);

    kb_topic_stats st = {0};
    for (int i = 0; i < 1000; i++) {
        kb_assert_ok(kb_stats(b, topic, &st));
        if (st.dlq_length >= N_MALFORMED + 1 && rec_count() >= 3)
            break;
        usleep(10000);
    }
    usleep(50000);
    assert_int_equal(st.dlq_length, N_MALFORMED + 1);

    /* handled: the readable events only, in partition order */
    assert_int_equal(rec_count(), 3);
    char id[48];
    assert_string_equal(rec.payload[0], "good-1");
    snprintf(id, sizeof id, "%llu.1", (unsigned long long)mixed_seq);
    assert_string_equal(rec.id[0], id);
    assert_string_equal(rec.payload[1], "good-3");
    snprintf(id, sizeof id, "%llu.3", (unsigned long long)mixed_seq);
    assert_string_equal(rec.id[1], id);
    assert_string_equal(rec.payload[2], "after");
    snprintf(id, sizeof id, "%llu", (unsigned long long)after_seq);
    assert_string_equal(rec.id[2], id);
    for (int i = 0; i < 3; i++)
        assert_string_equal(rec.key[i], key);

    struct dl_seen seen = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 100, collect, &seen));
    assert_int_equal(seen.n, N_MALFORMED + 1);
    for (int j = 0; j < N_MALFORMED; j++) {
        snprintf(id, sizeof id, "%llu", (unsigned long long)malformed[j]);
        int i = dl_find(&seen, id);
        if (i < 0)
            fail_msg("malformed frame %d (seq %s) not in the dead letters", j, id);
        if (strstr(seen.reason[i], "malformed Kb-Batch") == NULL)
            fail_msg("malformed frame %d: reason \"%s\"", j, seen.reason[i]);
        assert_int_equal(seen.partition[i], home);
        assert_int_equal(seen.key[i][0], '\0');   /* no key: the whole message */
    }
    /* the whole body is kept (here the "abc" frame's) */
    snprintf(id, sizeof id, "%llu", (unsigned long long)malformed[1]);
    int abc = dl_find(&seen, id);
    assert_true(abc >= 0);
    assert_int_equal(seen.payload_len[abc], two.len);
    assert_memory_equal(seen.payload[abc], two.buf, two.len);

    snprintf(id, sizeof id, "%llu.2", (unsigned long long)mixed_seq);
    int mis = dl_find(&seen, id);
    if (mis < 0)
        fail_msg("misrouted event %s not in the dead letters", id);
    if (strstr(seen.reason[mis], "belongs to partition") == NULL)
        fail_msg("misrouted event: reason \"%s\"", seen.reason[mis]);
    assert_string_equal(seen.key[mis], other);
    assert_int_equal(seen.payload_len[mis], 9);
    assert_memory_equal(seen.payload[mis], "misrouted", 9);
    assert_int_equal(seen.partition[mis], home);

    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.handled, 3);
    kb_assert_ok(kb_close(b, 10000));
    client_close(&c);
}

/* ---- 5 -------------------------------------------------------------------- */

/* An event that cannot fit the server's max_payload (1 MiB by default) is
 * refused by kb_publish with KB_ETOOBIG naming max_payload, also when it is
 * within limits.max_payload_bytes; a large event that fits (bigger than a
 * frame's byte budget) and small ones around it are handled, in order. */
static void oversized_event_rejected(void **state)
{
    (void)state;
    const char *topic = "frames.big";
    rec_reset();
    /* limits.max_payload_bytes (1 MiB by default) would refuse first with
     * KB_ETOOBIG: raise it so the transport's check is the one tested. */
    const char *const kv[] = {"limits.max_payload_bytes", "8388608", NULL};
    kb_bus *b = open_bus(kv);
    kb_assert_ok(kb_subscribe(b, topic, record, NULL));
    const char *key = "big-key";
    size_t huge = 2u << 20, big = 512u << 10;
    unsigned char *p = malloc(huge);
    assert_non_null(p);
    for (size_t i = 0; i < huge; i++)
        p[i] = (unsigned char)(i * 7 + 3);

    assert_int_equal(kb_publish(b, topic, key, strlen(key), p, huge), KB_ETOOBIG);
    assert_non_null(strstr(kb_last_error(), "max_payload"));
    /* just under the server's limit, but no room left for the headers */
    assert_int_equal(kb_publish(b, topic, key, strlen(key), p, (1u << 20) - 64), KB_ETOOBIG);
    assert_non_null(strstr(kb_last_error(), "max_payload"));

    kb_assert_ok(kb_publish(b, topic, key, strlen(key), "small-1", 7));
    kb_assert_ok(kb_publish(b, topic, key, strlen(key), p, big));
    kb_assert_ok(kb_publish(b, topic, key, strlen(key), "small-2", 7));
    kb_assert_ok(kb_flush(b, 10000));
    free(p);
    wait_recorded(3);
    usleep(50000);
    assert_int_equal(rec_count(), 3);
    assert_string_equal(rec.payload[0], "small-1");
    assert_int_equal(rec.payload_len[1], big);
    assert_int_equal(rec.big_intact, 1);
    assert_string_equal(rec.payload[2], "small-2");

    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(st.published, 3);
    assert_int_equal(st.dlq_length, 0);
    kb_assert_ok(kb_close(b, 10000));
}

/* Another client's unreadable message close to max_payload: the dead letter
 * cannot hold its body and our headers, so it is stored without the body
 * (Kb-Body-Omitted) instead of being refused and redelivered for ever; the
 * partition goes on, and such a dead letter is not replayable. */
static void huge_foreign_message_does_not_block(void **state)
{
    (void)state;
    const char *topic = "frames.hugebad";
    rec_reset();
    kb_bus *b = open_bus(NULL);
    kb_assert_ok(kb_subscribe(b, topic, record, NULL));
    client c;
    client_open(&c);
    const char *key = "huge-key";
    uint32_t home = home_of(key);
    size_t len = (size_t)natsConnection_GetMaxPayload(c.nc) - 60;
    char *body = calloc(1, len);
    assert_non_null(body);
    uint64_t bad_seq = publish_raw(&c, topic, home, "abc", NULL, body, len);
    free(body);
    publish_raw(&c, topic, home, NULL, key, "after", 5);
    wait_recorded(1);
    assert_int_equal(rec_count(), 1);
    assert_string_equal(rec.payload[0], "after");
    kb_topic_stats st = {0};
    for (int i = 0; i < 500 && st.dlq_length < 1; i++) {
        kb_assert_ok(kb_stats(b, topic, &st));
        usleep(10000);
    }
    assert_int_equal(st.dlq_length, 1);
    struct dl_seen seen = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 10, collect, &seen));
    assert_int_equal(seen.n, 1);
    char id[32];
    snprintf(id, sizeof id, "%llu", (unsigned long long)bad_seq);
    assert_string_equal(seen.original_id[0], id);
    assert_int_equal(seen.payload_len[0], 0);
    assert_non_null(strstr(seen.reason[0], "malformed Kb-Batch"));
    client_close(&c);
    kb_assert_ok(kb_close(b, 10000));
}

static _Atomic int poison_calls;

/* Keys over 1 KiB are poison: dead-lettered at once. */
static int poison_or_record(const kb_event *ev, void *opaque)
{
    if (ev->key_len > 1024) {
        atomic_fetch_add(&poison_calls, 1);
        return KB_DEAD;
    }
    return record(ev, opaque);
}

/* A key of `home` partition: base-N. */
static void key_in(char *out, size_t len, const char *base, uint32_t home)
{
    for (int i = 0; i < 1000; i++) {
        snprintf(out, len, "%s-%d", base, i);
        if (home_of(out) == home)
            return;
    }
    fail_msg("no key of partition %u", home);
}

/* A frame mixing good events and a poison one whose dead letter cannot be
 * stored (a 60,000-byte binary key: as a Kb-Bin-Key header it is over the
 * server's 64 KiB header limit). The poison reaches its handler once, the good
 * events once each, the lost dead letter is counted, and the partition goes on
 * (it used to come back for ever, attempt 1 each time). */
#define POISON_KEY 60000
static void poison_frame_does_not_loop(void **state)
{
    (void)state;
    const char *topic = "frames.poison";
    rec_reset();
    atomic_store(&poison_calls, 0);
    const char *const kv[] = {"limits.max_key_bytes", "65535", "retry.max_attempts", "3", NULL};
    kb_bus *b = open_bus(kv);
    kb_assert_ok(kb_subscribe(b, topic, poison_or_record, NULL));
    char *poison = malloc(POISON_KEY);
    assert_non_null(poison);
    for (size_t i = 0; i < POISON_KEY; i++)
        poison[i] = (char)(1 + i % 200);   /* not printable: base64 in a header */
    uint32_t home = kb_fnv1a32(poison, POISON_KEY) % PARTITIONS;
    char good_a[32], good_b[32];
    key_in(good_a, sizeof good_a, "good-a", home);
    key_in(good_b, sizeof good_b, "good-b", home);
    size_t cap = 3 * 8 + POISON_KEY + 64, len = 0;
    char *body = malloc(cap);
    assert_non_null(body);
    const char *keys[] = {good_a, poison, good_b}, *payloads[] = {"one", "poison", "two"};
    for (int i = 0; i < 3; i++) {
        size_t kl = i == 1 ? POISON_KEY : strlen(keys[i]), pl = strlen(payloads[i]);
        put_u32(body + len, (uint32_t)kl);
        memcpy(body + len + 4, keys[i], kl);
        put_u32(body + len + 4 + kl, (uint32_t)pl);
        memcpy(body + len + 8 + kl, payloads[i], pl);
        len += 8 + kl + pl;
    }
    client c;
    client_open(&c);
    publish_raw(&c, topic, home, "3", NULL, body, len);
    publish_raw(&c, topic, home, NULL, good_a, "after", 5);
    free(body);
    free(poison);
    wait_recorded(3);
    kb_partition_stats ps = {0};
    for (int i = 0; i < 1000; i++) {   /* until the partition is acked */
        kb_assert_ok(kb_partition_stats_get(b, topic, home, &ps));
        if (ps.pending == 0 && ps.lag == 0)
            break;
        usleep(10000);
    }
    assert_int_equal(ps.pending, 0);
    assert_int_equal(ps.lag, 0);
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    assert_int_equal(atomic_load(&poison_calls), 1);
    assert_int_equal(rec_count(), 3);
    char order[3][48];   /* good-a's events in order, then good-b's */
    int o = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 3; i++)
            if (strcmp(rec.key[i], pass == 0 ? good_a : good_b) == 0)
                memcpy(order[o++], rec.payload[i], sizeof order[0]);   /* NUL-terminated */
    assert_int_equal(o, 3);
    assert_string_equal(order[0], "one");
    assert_string_equal(order[1], "after");
    assert_string_equal(order[2], "two");
    assert_int_equal(st.dead_letters_lost, 1);
    assert_int_equal(st.dlq_length, 0);
    client_close(&c);
    kb_assert_ok(kb_close(b, 10000));
}

/* A group the broker cannot take in a consumer name or a KV key is refused by
 * kb_open, naming the allowed set (it used to open, then consume nothing); an
 * allowed one with every kind of character consumes. */
static void group_names(void **state)
{
    (void)state;
    const char *bad[] = {"a{b", "a:b", "a@b", "a#b", "a/b", "a.b"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kb_conf *c = kb_conf_new();
        char err[256] = "";
        kb_assert_ok(kb_conf_set(c, "transport", server.url, err, sizeof err));
        kb_assert_ok(kb_conf_set(c, "group", bad[i], err, sizeof err));
        kb_bus *b = kb_open(c, err, sizeof err);
        assert_null(b);
        assert_non_null(strstr(err, bad[i]));
        assert_non_null(strstr(err, "letters, digits, '-', '_' and '='"));
        kb_conf_destroy(c);
    }
    rec_reset();
    const char *const kv[] = {"group", "Team-7_a=b", NULL};
    kb_bus *b = open_bus(kv);
    kb_assert_ok(kb_subscribe(b, "frames.group", record, NULL));
    kb_assert_ok(kb_publish(b, "frames.group", "k", 1, "v", 1));
    wait_recorded(1);
    assert_int_equal(rec_count(), 1);
    kb_assert_ok(kb_close(b, 10000));
}

#define RUN_FRAME 2000

static _Atomic uint32_t retried_ok, retried_out_of_order, retried_next;
static _Atomic int lines_at_last = -1;

/* Records in the runs bucket: run records, or the progress records
 * ("<stream>.done.<consumer>") whose key contains `stream`; how many, and
 * the lines of the longest. */
static int records_of(bool progress, const char *stream, int *most)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    kvStore *runs = NULL;
    kvKeysList keys = {0};
    int records = 0;
    *most = 0;
    assert_int_equal(natsConnection_ConnectTo(&nc, server.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(js_KeyValue(&runs, js, "keybus_leases_runs"), NATS_OK);
    natsStatus s = kvStore_Keys(&keys, runs, NULL);
    assert_true(s == NATS_OK || s == NATS_NOT_FOUND);
    for (int i = 0; i < keys.Count; i++) {
        kvEntry *e = NULL;
        bool is_progress = strstr(keys.Keys[i], ".done.") != NULL;
        if (is_progress != progress || (stream != NULL && strstr(keys.Keys[i], stream) == NULL) ||
            kvStore_Get(&e, runs, keys.Keys[i]) != NATS_OK)
            continue;
        int lines = 0;
        for (const char *c = kvEntry_ValueString(e); *c; c++)
            lines += *c == '\n';
        *most = lines > *most ? lines : *most;
        records++;
        kvEntry_Destroy(e);
    }
    kvKeysList_Destroy(&keys);
    kvStore_Destroy(runs);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return records;
}

/* Every event fails its first run and is handled on its second; the last
 * one looks at the run records first (every second run is recorded before
 * it starts). */
static int fail_first(const kb_event *ev, void *opaque)
{
    (void)opaque;
    if (ev->attempt == 1)
        return KB_RETRY;
    char text[16] = "";
    memcpy(text, ev->payload, ev->payload_len < sizeof text - 1 ? ev->payload_len : 0);
    uint32_t seq = (uint32_t)strtoul(text, NULL, 10);
    if (seq != atomic_load(&retried_next))
        atomic_fetch_add(&retried_out_of_order, 1);
    atomic_store(&retried_next, seq + 1);
    if (seq == RUN_FRAME - 1) {
        int most = 0;
        records_of(false, NULL, &most);
        atomic_store(&lines_at_last, most);
    }
    atomic_fetch_add(&retried_ok, 1);
    return KB_HANDLED;
}

/* A frame of 1,999 events of one key that all run twice: the message's run
 * record holds a line for every event (it used to stop at 8,192 bytes, about
 * 400 events' worth, logging the rest as not recorded), and once the events
 * are acked their records are deleted (they used to stay for a week). */
static void retried_frame_keeps_every_run(void **state)
{
    (void)state;
    const char *topic = "frames.runs";
    const char *const kv[] = {"nats.publish_batch", "4096", "nats.publish_linger_us", "1000000",
                              NULL};
    kb_bus *b = open_bus(kv);
    atomic_store(&retried_next, 0);
    kb_assert_ok(kb_subscribe(b, topic, fail_first, NULL));
    for (uint32_t i = 0; i < RUN_FRAME; i++) {   /* the first goes alone, plain */
        char payload[16];
        int n = snprintf(payload, sizeof payload, "%u", i);
        kb_assert_ok(kb_publish(b, topic, "k", 1, payload, (size_t)n));
    }
    kb_assert_ok(kb_flush(b, 10000));
    kb_wait_until(atomic_load(&retried_ok) >= RUN_FRAME, 30000,
                  "every event of the frame handled after its retry");
    assert_int_equal(atomic_load(&retried_ok), RUN_FRAME);
    assert_int_equal(atomic_load(&retried_out_of_order), 0);
    assert_int_equal(atomic_load(&lines_at_last), RUN_FRAME - 1);
    kb_assert_ok(kb_drain(b, 10000));   /* acked on the server */
    int most = 0, left = records_of(false, NULL, &most);
    for (int i = 0; i < 500 && left > 0; i++) {
        usleep(10000);
        left = records_of(false, NULL, &most);
    }
    assert_int_equal(left, 0);
    kb_assert_ok(kb_close(b, 10000));
}

/* A declined event stays unacked while its key goes on: the next owner must
 * run it although the departing process's progress record has the key past
 * it (a record used to vouch for it, and the next owner settled it unrun). */
static _Atomic int declined_runs[2][10];

static int decline_five_once(const kb_event *ev, void *opaque)
{
    int bus = (int)(intptr_t)opaque;
    char text[8] = "";
    memcpy(text, ev->payload, ev->payload_len < sizeof text - 1 ? ev->payload_len : 0);
    int n = atoi(text);
    if (n < 0 || n > 9)
        return KB_HANDLED;
    atomic_fetch_add(&declined_runs[bus][n], 1);
    return bus == 0 && n == 5 ? KB_DECLINE : KB_HANDLED;
}

static void declined_event_runs_after_handover(void **state)
{
    (void)state;
    const char *topic = "frames.decline";
    const char *const kv[] = {"nats.publish_batch", "4096", "nats.publish_linger_us", "1000000",
                              NULL};
    kb_bus *first = open_bus(kv);
    kb_assert_ok(kb_subscribe(first, topic, decline_five_once, (void *)(intptr_t)0));
    for (int i = 0; i < 10; i++) {
        char payload[4];
        int n = snprintf(payload, sizeof payload, "%d", i);
        kb_assert_ok(kb_publish(first, topic, "k", 1, payload, (size_t)n));
    }
    kb_assert_ok(kb_flush(first, 10000));
    kb_wait_until(atomic_load(&declined_runs[0][9]) != 0, 20000,
                  "the first bus ran every event, 5 declined");
    for (int i = 0; i < 10; i++)
        assert_int_equal(atomic_load(&declined_runs[0][i]), 1);
    /* the departing claim's progress record holds key k: the next owner reads it */
    int lines = 0;
    for (int i = 0; i < 1000 && lines == 0; i++) {
        usleep(10000);
        records_of(true, "KB_frames_decline_", &lines);
    }
    assert_true(lines > 0);
    kb_assert_ok(kb_close(first, 10000));

    kb_bus *next = open_bus(kv);
    kb_assert_ok(kb_subscribe(next, topic, decline_five_once, (void *)(intptr_t)1));
    kb_wait_until(atomic_load(&declined_runs[1][5]) != 0, 20000,
                  "the next bus runs event 5 (declined once)");
    assert_int_equal(atomic_load(&declined_runs[1][5]), 1);
    kb_assert_ok(kb_drain(next, 10000));
    kb_assert_ok(kb_close(next, 10000));
}

int main(void)
{
    if (kb_test_server_start(&server, "nats", NULL) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(frames_keep_order_and_cut_messages),
        cmocka_unit_test(sparse_event_is_plain),
        cmocka_unit_test(plain_client_frame_consumed_in_order),
        cmocka_unit_test(malformed_frames_dead_letter),
        cmocka_unit_test(oversized_event_rejected),
        cmocka_unit_test(huge_foreign_message_does_not_block),
        cmocka_unit_test(poison_frame_does_not_loop),
        cmocka_unit_test(group_names),
        cmocka_unit_test(retried_frame_keeps_every_run),
        cmocka_unit_test(declined_event_runs_after_handover),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    kb_test_server_stop(&server);
    nats_Close();
    return failed;
}
