/* Redis frames (redis.publish_batch): events of a partition in one stream
 * entry, against a real redis-server. Per-key order and nothing lost with
 * many producers and two buses sharing a topic through a hand-over; frames
 * and plain entries on one stream; a dead letter inside a frame; malformed
 * frames another client wrote dead-lettered whole; the replay
 * after a consumer killed mid-frame bounded per key; a recovery sweep
 * reading no run records when there are none, and deleting the progress
 * record of a frame deleted while pending; a frame's dead-lettered event
 * not handled after its consumer was killed; the keeper's progress records
 * and the dead-letter script OR-ing into a frame's record; publish_batch = 1
 * writing plain entries; Node decoding keybus-written frames
 * (tests/interop/redis_frames.mjs, docs/formats.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/server.h"
#include "support/tracker.h"

static kb_test_server server;
static const char *const fast[] = {"redis.lease_ttl_ms", "1000", "retry.backoff_ms", "1",
                                   "retry.max_backoff_ms", "2", NULL};

static void unique_topic(char *buf, size_t len, const char *what)
{
    static int n;
    snprintf(buf, len, "frames.%s.%d.%d", what, (int)getpid(), ++n);
}

static redisContext *raw(void)
{
    redisContext *c = redisConnect("127.0.0.1", server.port);
    assert_true(c != NULL && c->err == 0);
    return c;
}

static void wait_distinct(kb_tracker *t, uint64_t n, int seconds)
{
    for (int i = 0; i < seconds * 100 && kb_tracker_distinct(t) < n; i++)
        usleep(10000);
}

/* Entries of all partitions of a topic: frames and plain ones. */
static void count_entries(redisContext *c, const char *topic, long long *frames, long long *plain)
{
    *frames = *plain = 0;
    for (uint32_t p = 0; p < 8; p++) {
        redisReply *r = redisCommand(c, "XRANGE kb:{%s}:p:%u - +", topic, p);
        assert_non_null(r);
        for (size_t i = 0; i < r->elements; i++) {
            const redisReply *f = r->element[i]->element[1];
            bool k = false;
            for (size_t j = 0; j + 1 < f->elements; j += 2)
                k |= strcmp(f->element[j]->str, "k") == 0;
            *frames += !k;
            *plain += k;
        }
        freeReplyObject(r);
    }
}

/* Events of `keys` keys, `per_key` each, published with a long linger so
 * that they travel in frames (but each partition's first goes alone). */
static void publish_lingered(const char *topic, uint32_t keys, uint32_t per_key)
{
    const char *const lg[] = {"redis.publish_linger_us", "1000000", NULL};
    kb_bus *p = kb_test_open(server.url, fast, lg);
    for (uint32_t seq = 1; seq <= per_key; seq++)
        for (uint32_t k = 0; k < keys; k++)
            kb_assert_ok(kb_tracker_publish(p, topic, k, seq, 8));
    kb_assert_ok(kb_close(p, 5000));
}

/* ---- many producers, two buses, a hand-over ---- */

#define PRODUCERS 4
#define KEYS 64
#define PER_KEY 250   /* per producer: each producer has its own keys */

struct producer {
    kb_bus *b;
    const char *topic;
    uint32_t first_key;
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    for (uint32_t seq = 1; seq <= PER_KEY; seq++)
        for (uint32_t k = 0; k < KEYS / PRODUCERS; k++)
            if (kb_tracker_publish(p->b, p->topic, p->first_key + k, seq, 24) != KB_OK)
                fail_msg("publish: %s", kb_last_error());
    return NULL;
}

static void round_trip_under_concurrency_and_hand_over(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "rt");
    kb_tracker t;
    kb_tracker_init(&t, KEYS);
    const char *const a_kv[] = {"consumer", "frames-a", NULL};
    const char *const b_kv[] = {"consumer", "frames-b", NULL};
    kb_bus *a = kb_test_open(server.url, fast, a_kv);
    kb_bus *b = kb_test_open(server.url, fast, b_kv);
    kb_assert_ok(kb_subscribe(a, topic, kb_tracker_handler, &t));
    kb_assert_ok(kb_subscribe(b, topic, kb_tracker_handler, &t));
    pthread_t th[PRODUCERS];
    struct producer pr[PRODUCERS];
    for (int i = 0; i < PRODUCERS; i++) {
        pr[i] = (struct producer){i % 2 ? a : b, topic, (uint32_t)i * (KEYS / PRODUCERS)};
        assert_int_equal(pthread_create(&th[i], NULL, produce, &pr[i]), 0);
    }
    /* a leaves mid-stream: its partitions go to b by hand-over */
    for (int i = 0; i < 500 && kb_tracker_distinct(&t) < KEYS * PER_KEY / 4; i++)
        usleep(10000);
    for (int i = 0; i < PRODUCERS; i++)
        if (i % 2)
            pthread_join(th[i], NULL);
    kb_assert_ok(kb_close(a, 10000));
    for (int i = 0; i < PRODUCERS; i++)
        if (i % 2 == 0)
            pthread_join(th[i], NULL);
    kb_assert_ok(kb_flush(b, 10000));
    wait_distinct(&t, (uint64_t)KEYS * PER_KEY, 15);
    kb_assert_ok(kb_drain(b, 10000));
    kb_assert_ok(kb_close(b, 10000));
    redisContext *c = raw();
    long long frames, plain;
    count_entries(c, topic, &frames, &plain);
    redisFree(c);
    fprintf(stderr, "%d events: %lld frames, %lld plain entries; %llu handled, %llu duplicates\n",
            KEYS * PER_KEY, frames, plain, (unsigned long long)t.handled,
            (unsigned long long)t.duplicates);
    assert_int_equal(kb_tracker_distinct(&t), (uint64_t)KEYS * PER_KEY);
    assert_int_equal(t.order_violations, 0);
    assert_int_equal(t.concurrent, 0);
    assert_true(frames > 0);
    assert_true(frames + plain < KEYS * PER_KEY / 2);   /* most events travelled in frames */
    kb_tracker_destroy(&t);
}

/* ---- frames and plain entries on one stream ---- */

/* A frame's body entry (docs/formats.md) for key/payload, no headers. */
static size_t put_event(char *out, const char *key, const void *payload, uint32_t plen)
{
    uint32_t klen = (uint32_t)strlen(key);
    unsigned char *o = (unsigned char *)out;
    for (int i = 0; i < 4; i++)
        o[i] = (unsigned char)(klen >> (8 * i));
    memcpy(out + 4, key, klen);
    for (int i = 0; i < 4; i++)
        o[4 + klen + i] = (unsigned char)(plen >> (8 * i));
    memcpy(out + 8 + klen, payload, plen);
    out[8 + klen + plen] = 0;
    out[9 + klen + plen] = 0;
    return 10 + klen + plen;
}

static void mixed_frames_and_plain_entries(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "mixed");
    kb_tracker t;
    kb_tracker_init(&t, 4);
    kb_bus *b = kb_test_open(server.url, fast, NULL);
    kb_assert_ok(kb_subscribe(b, topic, kb_tracker_handler, &t));
    redisContext *c = raw();
    /* per key: seq 1..10 by keybus (frames), 11 plain by hand, 12..13 a frame
     * written by hand, 14..20 by keybus again */
    for (uint32_t seq = 1; seq <= 10; seq++)
        for (uint32_t k = 0; k < 4; k++)
            kb_assert_ok(kb_tracker_publish(b, topic, k, seq, 8));
    kb_assert_ok(kb_flush(b, 5000));
    for (uint32_t k = 0; k < 4; k++) {
        char key[16], stream[128], body[128];
        snprintf(key, sizeof key, "agg-%u", k);
        snprintf(stream, sizeof stream, "kb:{%s}:p:%u", topic, kb_fnv1a32(key, strlen(key)) % 8);
        uint32_t pl[2] = {k, 11};
        freeReplyObject(redisCommand(c, "XADD %s * k %s d %b", stream, key, pl, sizeof pl));
        size_t len = 0;
        for (uint32_t seq = 12; seq <= 13; seq++) {
            uint32_t p2[2] = {k, seq};
            len += put_event(body + len, key, p2, sizeof p2);
        }
        redisReply *r = redisCommand(c, "XADD %s * f 1 n 2 b %b", stream, body, len);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        freeReplyObject(r);
    }
    for (uint32_t seq = 14; seq <= 20; seq++)
        for (uint32_t k = 0; k < 4; k++)
            kb_assert_ok(kb_tracker_publish(b, topic, k, seq, 8));
    kb_assert_ok(kb_flush(b, 5000));
    wait_distinct(&t, 80, 10);
    /* kb_peek sees nothing left; kb_drain waits for the acks */
    kb_assert_ok(kb_drain(b, 10000));
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    kb_assert_ok(kb_close(b, 5000));
    long long frames, plain;
    count_entries(c, topic, &frames, &plain);
    redisFree(c);
    assert_int_equal(kb_tracker_distinct(&t), 80);
    assert_int_equal(t.order_violations, 0);
    assert_int_equal(t.duplicates, 0);
    assert_int_equal(st.broker_pending, 0);
    assert_true(frames >= 4 && plain >= 4);
    kb_tracker_destroy(&t);
}

/* ---- a dead letter inside a frame ---- */

static _Atomic bool poisoned;

static int poison_handler(const kb_event *ev, void *opaque)
{
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (key == 1 && seq == 3 && atomic_load(&poisoned))
        return KB_DEAD;
    return kb_tracker_handler(ev, opaque);
}

struct dl {
    int n;
    char id[64], orig[64];
    uint32_t key, seq;
};

static int list_dl(const kb_dead_letter *d, void *opaque)
{
    struct dl *l = opaque;
    l->n++;
    snprintf(l->id, sizeof l->id, "%s", d->id);
    snprintf(l->orig, sizeof l->orig, "%s", d->original_id);
    memcpy(&l->key, d->payload, 4);
    memcpy(&l->seq, (const char *)d->payload + 4, 4);
    return 0;
}

static void dead_letter_inside_a_frame(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "dead");
    kb_tracker t;
    kb_tracker_init(&t, 4);
    /* publish first, then consume: key 1's eight events in one frame for
     * sure (written by hand: an idle sender may send keybus's own sooner) */
    kb_bus *p = kb_test_open(server.url, fast, NULL);
    for (uint32_t seq = 1; seq <= 8; seq++)
        for (uint32_t k = 0; k < 4; k++)
            if (k != 1)
                kb_assert_ok(kb_tracker_publish(p, topic, k, seq, 8));
    kb_assert_ok(kb_close(p, 5000));
    char body[256];
    size_t len = 0;
    for (uint32_t seq = 1; seq <= 8; seq++) {
        uint32_t pl[2] = {1, seq};
        len += put_event(body + len, "agg-1", pl, sizeof pl);
    }
    redisContext *w = raw();
    redisReply *x = redisCommand(w, "XADD kb:{%s}:p:%u * f 1 n 8 b %b", topic,
                                 kb_fnv1a32("agg-1", 5) % 8, body, len);
    assert_int_equal(x->type, REDIS_REPLY_STRING);
    freeReplyObject(x);
    redisFree(w);
    kb_bus *b = kb_test_open(server.url, fast, NULL);
    atomic_store(&poisoned, true);
    kb_assert_ok(kb_subscribe(b, topic, poison_handler, &t));
    for (int i = 0; i < 1000 && t.handled < 31; i++)
        usleep(10000);
    kb_assert_ok(kb_drain(b, 10000));
    struct dl l = {0};
    for (int i = 0; i < 500 && l.n == 0; i++) {
        l.n = 0;
        kb_assert_ok(kb_dead_letters(b, topic, NULL, 10, list_dl, &l));
        if (l.n == 0)
            usleep(10000);
    }
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, topic, &st));
    for (int i = 0; i < 500 && st.broker_pending != 0; i++) {   /* the ack follows the dead letter */
        usleep(10000);
        kb_assert_ok(kb_stats(b, topic, &st));
    }
    redisContext *c = raw();
    redisReply *r = redisCommand(c, "XRANGE kb:{%s}:dlq - +", topic);
    assert_int_equal(r->elements, 1);
    const redisReply *f = r->element[0]->element[1];
    assert_string_equal(f->element[0]->str, "k");   /* alone, as a plain entry */
    assert_string_equal(f->element[1]->str, "agg-1");
    assert_string_equal(f->element[2]->str, "d");
    freeReplyObject(r);
    redisFree(c);
    /* replayed: handled now, in a plain entry */
    atomic_store(&poisoned, false);
    kb_assert_ok(kb_dead_letter_replay(b, topic, l.id));
    for (int i = 0; i < 500 && t.handled < 32; i++)
        usleep(10000);
    kb_assert_ok(kb_close(b, 5000));
    assert_int_equal(l.n, 1);
    assert_int_equal(l.key, 1);
    assert_int_equal(l.seq, 3);
    assert_non_null(strchr(l.orig, '.'));   /* "<entry ID>.<index>" */
    assert_int_equal(st.broker_pending, 0);   /* the frame was acked */
    assert_int_equal(t.handled, 32);
    kb_tracker_destroy(&t);
}

/* ---- malformed frames another client wrote ---- */

static atomic_int handled_ok;

static int count_handler(const kb_event *ev, void *opaque)
{
    (void)ev;
    (void)opaque;
    atomic_fetch_add(&handled_ok, 1);
    return KB_OK;
}

struct reasons {
    int n, malformed;
};

static int list_reasons(const kb_dead_letter *d, void *opaque)
{
    struct reasons *r = opaque;
    r->n++;
    r->malformed += strncmp(d->reason, "malformed frame", 15) == 0;
    return 0;
}

/* Each goes to the DLQ whole, acked, and what follows it is handled. */
static void malformed_frames_are_dead_lettered(void **state)
{
    (void)state;
    char topic[96], body[64];
    unique_topic(topic, sizeof topic, "bad");
    size_t one = put_event(body, "ok", "x", 1);   /* a good event, then one more byte */
    body[one] = 'z';
    const struct {
        const char *f, *n;
        size_t len;
    } bad[] = {
        {"2", "1", one},       /* unknown version */
        {"1", "0", one},       /* bad counts */
        {"1", "4097", one},
        {"1", "x", one},
        {"1", " 1", one},
        {"1", "+1", one},
        {"1", "1", one - 1},   /* truncated body */
        {"1", "1", one + 1},   /* trailing bytes */
        {"1", "2", one},       /* n disagrees with the body */
    };
    size_t nbad = sizeof bad / sizeof bad[0];
    redisContext *c = raw();
    uint32_t part = kb_fnv1a32("ok", 2) % 8;
    for (size_t i = 0; i < nbad; i++) {
        redisReply *x = redisCommand(c, "XADD kb:{%s}:p:%u * f %s n %s b %b", topic, part,
                                     bad[i].f, bad[i].n, body, bad[i].len);
        assert_int_equal(x->type, REDIS_REPLY_STRING);
        freeReplyObject(x);
    }
    redisReply *x = redisCommand(c, "XADD kb:{%s}:p:%u * f 1 n 1 b %b", topic, part, body, one);
    freeReplyObject(x);
    x = redisCommand(c, "XADD kb:{%s}:p:%u * k ok d y", topic, part);
    freeReplyObject(x);
    redisFree(c);
    atomic_store(&handled_ok, 0);
    kb_bus *b = kb_test_open(server.url, fast, NULL);
    kb_assert_ok(kb_subscribe(b, topic, count_handler, NULL));
    struct reasons r = {0};
    kb_topic_stats st = {0};
    for (int i = 0; i < 1000 && (r.n < (int)nbad || atomic_load(&handled_ok) < 2 ||
                                 st.broker_pending != 0); i++) {
        usleep(10000);
        r = (struct reasons){0};
        kb_assert_ok(kb_dead_letters(b, topic, NULL, 100, list_reasons, &r));
        kb_assert_ok(kb_stats(b, topic, &st));
    }
    kb_assert_ok(kb_close(b, 5000));
    assert_int_equal(r.n, (int)nbad);
    assert_int_equal(r.malformed, (int)nbad);
    /* the good frame and entry after them (again after a lease lost under load) */
    assert_true(atomic_load(&handled_ok) >= 2);
    assert_int_equal(st.broker_pending, 0);          /* every entry acked */
}

/* ---- a consumer killed mid-frame: the replay is bounded per key ---- */

#define CRASH_KEYS 8
#define CRASH_PER_KEY 200

/* Shared with the child: handler runs per key there. */
static _Atomic uint32_t *child_runs;
static _Atomic uint32_t heir_runs[CRASH_KEYS], heir_last[CRASH_KEYS], heir_disorder;

static int slow_handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    if (key < CRASH_KEYS)
        atomic_fetch_add(&child_runs[key], 1);
    return KB_HANDLED;
}

/* The heir: from wherever it starts, each key's events once, in order. */
static int heir_handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (key >= CRASH_KEYS)
        return KB_HANDLED;
    uint32_t last = atomic_load(&heir_last[key]);
    if (last != 0 && seq != last + 1)
        atomic_fetch_add(&heir_disorder, 1);
    atomic_store(&heir_last[key], seq);
    atomic_fetch_add(&heir_runs[key], 1);
    return KB_HANDLED;
}

/* Key k's last event was handled: by the heir, or, when the child's
 * executors got through the whole key before the kill (one executor stays
 * on a lane for up to 64 events), by the child, and then the heir has none
 * of it. */
static bool key_finished(int k)
{
    uint32_t last = atomic_load(&heir_last[k]);
    return last == CRASH_PER_KEY || (last == 0 && atomic_load(&child_runs[k]) >= CRASH_PER_KEY);
}

static void crash_replay_is_bounded_per_key(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "crash");
    child_runs = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(child_runs != MAP_FAILED);
    publish_lingered(topic, CRASH_KEYS, CRASH_PER_KEY);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const char *const kv[] = {"consumer", "frames-doomed", "pool.threads", "2", NULL};
        kb_bus *b = kb_test_open(server.url, fast, kv);
        if (kb_subscribe(b, topic, slow_handler, NULL) != KB_OK)
            _exit(2);
        pause();
        _exit(0);
    }
    uint32_t before = 0;
    for (int i = 0; i < 1000 && before < CRASH_KEYS * CRASH_PER_KEY / 4; i++) {
        usleep(10000);
        before = 0;
        for (int k = 0; k < CRASH_KEYS; k++)
            before += atomic_load(&child_runs[k]);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    const char *const kv[] = {"consumer", "frames-heir", NULL};
    kb_bus *b = kb_test_open(server.url, fast, kv);
    kb_assert_ok(kb_subscribe(b, topic, heir_handler, NULL));
    for (int i = 0; i < 1500; i++) {
        bool done = true;
        for (int k = 0; k < CRASH_KEYS; k++)
            done &= key_finished(k);
        if (done)
            break;
        usleep(10000);
    }
    kb_assert_ok(kb_drain(b, 10000));
    kb_assert_ok(kb_close(b, 10000));
    uint32_t worst = 0, again = 0;
    for (int k = 0; k < CRASH_KEYS; k++) {
        assert_true(key_finished(k));   /* nothing lost */
        assert_true(atomic_load(&child_runs[k]) + atomic_load(&heir_runs[k]) >= CRASH_PER_KEY);
        uint32_t twice = atomic_load(&child_runs[k]) + atomic_load(&heir_runs[k]) - CRASH_PER_KEY;
        worst = twice > worst ? twice : worst;
        again += twice;
    }
    fprintf(stderr, "killed after %u handler runs: %u events handled again, at most %u of one key "
            "(%d keys)\n", before, again, worst, CRASH_KEYS);
    assert_int_equal(atomic_load(&heir_disorder), 0);
    /* the bound (docs/transports-redis.md): per key, the events the dead
     * consumer settled since its frames' last progress record (10 ms, + a
     * keeper pass); 2 executors at 2 ms an event make a handful */
    assert_true(worst <= 16);
    munmap((void *)child_runs, 4096);
}

/* ---- the recovery sweep reads no run records when there are none ---- */

#define SWEEP_KEYS 8
#define SWEEP_PER_KEY 100

/* HGET calls the server counted, commands of scripts included. */
static long long hget_calls(redisContext *c)
{
    redisReply *r = redisCommand(c, "INFO commandstats");
    assert_true(r != NULL && r->type == REDIS_REPLY_STRING);
    const char *s = strstr(r->str, "cmdstat_hget:calls=");
    long long n = s != NULL ? atoll(s + strlen("cmdstat_hget:calls=")) : 0;
    freeReplyObject(r);
    return n;
}

/* A consumer of the default group reads every entry of the topic and dies:
 * all of them are pending, none acked. */
static void read_by_ghost(redisContext *c, const char *topic)
{
    for (uint32_t part = 0; part < 8; part++) {
        freeReplyObject(redisCommand(c, "XGROUP CREATE kb:{%s}:p:%u keybus 0 MKSTREAM", topic,
                                     part));
        redisReply *r = redisCommand(c, "XREADGROUP GROUP keybus ghost COUNT 100000 STREAMS "
                                     "kb:{%s}:p:%u >", topic, part);
        assert_true(r != NULL && r->type != REDIS_REPLY_ERROR);
        freeReplyObject(r);
    }
}

static _Atomic uint64_t later_attempts;

/* kb_tracker_handler, counting the events handled on an attempt past the first */
static int first_attempt_handler(const kb_event *ev, void *opaque)
{
    if (ev->attempt != 1)
        atomic_fetch_add(&later_attempts, 1);
    return kb_tracker_handler(ev, opaque);
}

static void sweep_reads_no_runs_without_records(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "sweep");
    publish_lingered(topic, SWEEP_KEYS, SWEEP_PER_KEY);
    /* a consumer read every entry and died before a handler ran: all of
     * them pending, no run record anywhere */
    redisContext *c = raw();
    read_by_ghost(c, topic);
    long long frames, plain;
    count_entries(c, topic, &frames, &plain);
    long long before = hget_calls(c);
    kb_tracker t;
    kb_tracker_init(&t, SWEEP_KEYS);
    /* the default lease: a lease lapsing under load would redeliver events
     * and add HGETs the bound below does not allow for */
    const char *const kv[] = {"consumer", "sweep-heir", NULL};
    kb_bus *b = kb_test_open(server.url, NULL, kv);
    atomic_store(&later_attempts, 0);
    kb_assert_ok(kb_subscribe(b, topic, first_attempt_handler, &t));
    wait_distinct(&t, SWEEP_KEYS * SWEEP_PER_KEY, 15);
    kb_assert_ok(kb_drain(b, 10000));
    kb_assert_ok(kb_close(b, 10000));
    long long hgets = hget_calls(c) - before;
    redisFree(c);
    fprintf(stderr, "%d events in %lld frames and %lld plain entries swept: %lld HGETs\n",
            SWEEP_KEYS * SWEEP_PER_KEY, frames, plain, hgets);
    assert_int_equal(kb_tracker_distinct(&t), SWEEP_KEYS * SWEEP_PER_KEY);
    assert_int_equal(t.order_violations, 0);
    /* no handler had run before the heir: each event's first run */
    assert_int_equal(atomic_load(&later_attempts), 0);
    assert_true(frames > 0);
    /* each redelivered event's run is recorded (one HGET, redis_runs.c) and
     * the sweep reads each frame's progress record; reading every event's
     * absent run record too would double the count */
    assert_true(hgets < SWEEP_KEYS * SWEEP_PER_KEY * 3 / 2);
    kb_tracker_destroy(&t);
}

/* ---- a frame deleted while pending leaves no progress record ---- */

static void deleted_frame_leaves_no_progress(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "gone");
    publish_lingered(topic, 1, 10);
    redisContext *c = raw();
    read_by_ghost(c, topic);
    /* the dead consumer settled the frame's first event (its progress
     * record), then the frame was deleted (XDEL, or a trim) while pending */
    uint32_t part = 0;
    char id[64] = "";
    for (; part < 8 && id[0] == '\0'; part++) {
        redisReply *r = redisCommand(c, "XRANGE kb:{%s}:p:%u - +", topic, part);
        assert_non_null(r);
        for (size_t i = 0; i < r->elements; i++) {   /* the first event went alone: plain */
            const redisReply *f = r->element[i]->element[1];
            if (strcmp(f->element[0]->str, "f") == 0)
                snprintf(id, sizeof id, "%s", r->element[i]->element[0]->str);
        }
        freeReplyObject(r);
    }
    assert_true(id[0] != '\0');
    part--;
    redisReply *r = redisCommand(c, "HSET kb:{%s}:done:keybus:%u %s \x01", topic, part, id);
    assert_true(r != NULL && r->type == REDIS_REPLY_INTEGER);
    freeReplyObject(r);
    r = redisCommand(c, "XDEL kb:{%s}:p:%u %s", topic, part, id);
    assert_true(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
    kb_tracker t;
    kb_tracker_init(&t, 1);
    const char *const kv[] = {"consumer", "gone-heir", NULL};
    kb_bus *b = kb_test_open(server.url, fast, kv);
    kb_assert_ok(kb_subscribe(b, topic, kb_tracker_handler, &t));
    kb_topic_stats st = {0};
    for (int i = 0; i < 1500 && st.broker_trimmed == 0; i++) {
        usleep(10000);
        kb_assert_ok(kb_stats(b, topic, &st));
    }
    assert_int_equal(st.broker_trimmed, 1);   /* the sweep found it deleted */
    kb_assert_ok(kb_close(b, 10000));
    r = redisCommand(c, "HEXISTS kb:{%s}:done:keybus:%u %s", topic, part, id);
    assert_true(r != NULL && r->type == REDIS_REPLY_INTEGER);
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    redisFree(c);
    assert_true(t.handled <= 1);   /* the frame's events went with it */
    kb_tracker_destroy(&t);
}

/* ---- a frame's dead letter outlives its consumer's crash ---- */

#define DL_B 9      /* key 2's events, at indexes 0..8: settled by a dead consumer */
#define DL_A 7      /* key 1's events, at indexes 9..15 */

/* Shared with the child: [0] runs of key 1's event 1, [1] key 1's event it
 * blocks in, [2] runs of key 2's events. */
static _Atomic uint32_t *doomed;
static _Atomic uint32_t heir_a[DL_A + 1], heir_b, heir_a_last, heir_a_disorder;

static int doomed_handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (key != 1) {
        atomic_fetch_add(&doomed[2], 1);
        return KB_HANDLED;
    }
    if (seq == 1) {
        atomic_fetch_add(&doomed[0], 1);
        return KB_RETRY;   /* retry.max_attempts runs, then its dead letter */
    }
    atomic_store(&doomed[1], seq);
    for (;;)
        pause();   /* until kill -9: no other event of the frame settles */
}

static int dl_heir_handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (key != 1 || seq < 1 || seq > DL_A) {
        atomic_fetch_add(&heir_b, 1);
        return KB_HANDLED;
    }
    uint32_t last = atomic_load(&heir_a_last);
    if (last != 0 && seq != last + 1)
        atomic_fetch_add(&heir_a_disorder, 1);
    atomic_store(&heir_a_last, seq);
    atomic_fetch_add(&heir_a[seq], 1);
    return KB_HANDLED;
}

/* An event of a frame that was dead-lettered is settled for good, as a
 * plain entry's dead letter (acked in the same script) is: when its
 * consumer dies before the frame is acked and before any progress record of
 * it was written, the next owner must not hand it to a handler again. The
 * dead letter is the frame's first settle in that consumer (no 10 ms window
 * can record it), at index 9, after 9 events a progress record says a
 * consumer before it settled. */
static void frame_dead_letter_outlives_a_crash(void **state)
{
    (void)state;
    char topic[96], kb_b[32] = "", body[1024];
    unique_topic(topic, sizeof topic, "dlcrash");
    uint32_t part = kb_fnv1a32("agg-1", 5) % 8;
    for (int i = 0; kb_b[0] == '\0'; i++) {   /* key 2: the same partition */
        char k[32];
        snprintf(k, sizeof k, "agg-b%d", i);
        if (kb_fnv1a32(k, strlen(k)) % 8 == part)
            memcpy(kb_b, k, sizeof k);
    }
    size_t len = 0;
    for (uint32_t seq = 1; seq <= DL_B; seq++) {
        uint32_t pl[2] = {2, seq};
        len += put_event(body + len, kb_b, pl, sizeof pl);
    }
    for (uint32_t seq = 1; seq <= DL_A; seq++) {
        uint32_t pl[2] = {1, seq};
        len += put_event(body + len, "agg-1", pl, sizeof pl);
    }
    redisContext *c = raw();
    redisReply *x = redisCommand(c, "XADD kb:{%s}:p:%u * f 1 n %u b %b", topic, part,
                                 DL_B + DL_A, body, len);
    assert_int_equal(x->type, REDIS_REPLY_STRING);
    char id[64];
    snprintf(id, sizeof id, "%s", x->str);
    freeReplyObject(x);
    read_by_ghost(c, topic);
    x = redisCommand(c, "HSET kb:{%s}:done:keybus:%u %s %b", topic, part, id, "\xff\x01", (size_t)2);
    assert_true(x != NULL && x->type == REDIS_REPLY_INTEGER);
    freeReplyObject(x);
    doomed = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(doomed != MAP_FAILED);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* never outlives a test that failed */
        const char *const kv[] = {"consumer", "dl-doomed", "pool.threads", "1",
                                  "retry.max_attempts", "2", NULL};
        kb_bus *b = kb_test_open(server.url, fast, kv);
        if (kb_subscribe(b, topic, doomed_handler, NULL) != KB_OK)
            _exit(2);
        pause();
        _exit(0);
    }
    kb_bus *mon = kb_test_open(server.url, fast, NULL);
    struct dl l = {0};
    int listed = KB_OK;
    for (int i = 0; i < 1500 && (l.n == 0 || atomic_load(&doomed[1]) == 0); i++) {
        usleep(10000);
        l.n = 0;   /* a listing that failed on a loaded machine is asked again */
        listed = kb_dead_letters(mon, topic, NULL, 10, list_dl, &l);
    }
    kill(pid, SIGKILL);   /* before any assertion: a failure leaves no child behind */
    waitpid(pid, NULL, 0);
    kb_assert_ok(listed);
    assert_int_equal(l.n, 1);
    assert_int_equal(atomic_load(&doomed[1]), 2);   /* blocked in key 1's second event */
    const char *const kv[] = {"consumer", "dl-heir", NULL};
    kb_bus *b = kb_test_open(server.url, fast, kv);
    kb_assert_ok(kb_subscribe(b, topic, dl_heir_handler, NULL));
    for (int i = 0; i < 1500 && atomic_load(&heir_a_last) < DL_A; i++)
        usleep(10000);
    kb_assert_ok(kb_drain(b, 10000));
    kb_assert_ok(kb_close(b, 10000));
    l.n = 0;
    kb_assert_ok(kb_dead_letters(mon, topic, NULL, 10, list_dl, &l));
    kb_assert_ok(kb_close(mon, 10000));
    x = redisCommand(c, "XPENDING kb:{%s}:p:%u keybus", topic, part);
    assert_true(x != NULL && x->type == REDIS_REPLY_ARRAY && x->elements > 0);
    long long pending = x->element[0]->integer;
    freeReplyObject(x);
    x = redisCommand(c, "HEXISTS kb:{%s}:done:keybus:%u %s", topic, part, id);
    assert_true(x != NULL && x->type == REDIS_REPLY_INTEGER);
    long long record = x->integer;
    freeReplyObject(x);
    redisFree(c);
    fprintf(stderr, "dead letters %d; the dead letter's event handled by the heir %u times; "
            "key 1 handled up to %u, %u out of order; key 2 run %u + %u times\n", l.n,
            atomic_load(&heir_a[1]), atomic_load(&heir_a_last), atomic_load(&heir_a_disorder),
            atomic_load(&doomed[2]), atomic_load(&heir_b));
    assert_int_equal(atomic_load(&doomed[0]), 2);   /* retry.max_attempts runs */
    assert_int_equal(l.n, 1);                       /* one dead letter: key 1's first */
    assert_int_equal(l.key, 1);
    assert_int_equal(l.seq, 1);
    assert_int_equal(atomic_load(&heir_a[1]), 0);   /* never handled after its dead letter */
    for (uint32_t seq = 2; seq <= DL_A; seq++)      /* the rest once each, in order */
        assert_int_equal(atomic_load(&heir_a[seq]), 1);
    assert_int_equal(atomic_load(&heir_a_disorder), 0);
    /* the dead consumer's record kept: key 2's events settled before it */
    assert_int_equal(atomic_load(&doomed[2]) + atomic_load(&heir_b), 0);
    assert_int_equal(pending, 0);   /* the frame acked */
    assert_int_equal(record, 0);    /* and its progress record with it */
    munmap((void *)doomed, 4096);
}

/* ---- a frame's progress record is only ever OR-ed into ---- */

#define OR_EVENTS 12   /* key 1's, in one frame: a bitmap of two bytes */

/* Handler of key 1: seq s is event s - 1 of the frame. The test lets it past
 * seq 4, 5 and 6 (or_go) once the record shows what it waits for. */
static _Atomic uint32_t or_go, or_last;

static int or_handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (key != 1)
        return KB_HANDLED;
    if (seq == 2) {
        /* every client waits, the keeper in its next tick's heartbeat: seq 2's
         * progress (events 0 and 1, settled 10 ms apart and more) and seq 3's
         * dead letter are queued meanwhile and go in one pass */
        redisContext *c = redisConnect("127.0.0.1", server.port);
        if (c == NULL || c->err != 0)
            abort();
        freeReplyObject(redisCommand(c, "CLIENT PAUSE 1600"));
        redisFree(c);
        struct timespec ts = {1, 400000000};   /* past a tick (a quarter of the TTL) */
        nanosleep(&ts, NULL);
    }
    for (int i = 0; seq >= 4 && seq <= 6 && atomic_load(&or_go) < seq && i < 3000; i++)
        usleep(10000);
    if (seq == 4)
        usleep(20000);   /* 10 ms and more after seq 3's dead letter opened the window */
    atomic_store(&or_last, seq);
    return seq == 3 || seq == 5 ? KB_DEAD : KB_HANDLED;
}

/* Frame `id`'s progress record into `out` (2 bytes, zero when absent) once
 * `ready` holds of it and the dead-letter stream holds `dead` entries. */
static void wait_record(redisContext *c, const char *topic, uint32_t part, const char *id,
                        unsigned char ready, long long dead, unsigned char out[2])
{
    for (int i = 0; i < 1500; i++) {
        redisReply *r = redisCommand(c, "HGET kb:{%s}:done:keybus:%u %s", topic, part, id);
        assert_non_null(r);
        memset(out, 0, 2);
        if (r->type == REDIS_REPLY_STRING)
            memcpy(out, r->str, r->len < 2 ? r->len : 2);
        freeReplyObject(r);
        r = redisCommand(c, "XLEN kb:{%s}:dlq", topic);
        assert_true(r != NULL && r->type == REDIS_REPLY_INTEGER);
        bool stored = r->integer >= dead;
        freeReplyObject(r);
        if (stored && (out[0] & ready) == ready)
            return;
        usleep(10000);
    }
}

/* The keeper's progress writes and an event's dead letter (which sets its
 * bit in the same script) merge into the record: each keeps the bits the
 * other set. A dead letter stored in the pass before a progress record
 * lacking its bit (queued a moment before it: the keeper holds a frame's
 * progress behind its dead letters) keeps its bit; a dead letter stored
 * after a record keeps the record's bits. */
static void progress_record_merges_bits(void **state)
{
    (void)state;
    char topic[96], id[64], body[512];
    unique_topic(topic, sizeof topic, "or");
    uint32_t part = kb_fnv1a32("agg-1", 5) % 8;
    size_t len = 0;
    for (uint32_t seq = 1; seq <= OR_EVENTS; seq++) {
        uint32_t pl[2] = {1, seq};
        len += put_event(body + len, "agg-1", pl, sizeof pl);
    }
    redisContext *c = raw();
    redisReply *x = redisCommand(c, "XADD kb:{%s}:p:%u * f 1 n %u b %b", topic, part, OR_EVENTS,
                                 body, len);
    assert_int_equal(x->type, REDIS_REPLY_STRING);
    snprintf(id, sizeof id, "%s", x->str);
    freeReplyObject(x);
    atomic_store(&or_go, 0);
    atomic_store(&or_last, 0);
    /* one executor: the frame's events in order; a TTL long enough for the
     * pause (the lease stays ours: deadline 4 s after a renewal, ticks 1.25 s) */
    const char *const kv[] = {"consumer", "or-merge", "pool.threads", "1",
                              "redis.lease_ttl_ms", "5000", NULL};
    kb_bus *b = kb_test_open(server.url, fast, kv);
    kb_assert_ok(kb_subscribe(b, topic, or_handler, NULL));
    unsigned char first[2], second[2], third[2];
    /* events 0, 1 from the keeper's record, 2 from its dead letter */
    wait_record(c, topic, part, id, 0x01, 1, first);
    atomic_store(&or_go, 4);
    /* event 3 handled 10 ms and more after event 2: a record of 0..3 */
    wait_record(c, topic, part, id, 0x08, 1, second);
    atomic_store(&or_go, 5);
    /* event 4's dead letter, its window just opened: no record follows it */
    wait_record(c, topic, part, id, 0x10, 2, third);
    atomic_store(&or_go, 6);
    for (int i = 0; i < 1500 && atomic_load(&or_last) < OR_EVENTS; i++)
        usleep(10000);
    kb_assert_ok(kb_drain(b, 10000));
    kb_assert_ok(kb_close(b, 10000));
    x = redisCommand(c, "HEXISTS kb:{%s}:done:keybus:%u %s", topic, part, id);
    assert_true(x != NULL && x->type == REDIS_REPLY_INTEGER);
    long long record = x->integer;
    freeReplyObject(x);
    redisFree(c);
    fprintf(stderr, "progress record: %02x %02x, then %02x %02x, then %02x %02x\n", first[0],
            first[1], second[0], second[1], third[0], third[1]);
    assert_int_equal(first[0], 0x07);   /* the dead letter's bit 2 kept by the later record */
    assert_int_equal(second[0], 0x0f);
    assert_int_equal(third[0], 0x1f);   /* the record's bits kept by the later dead letter */
    assert_int_equal(first[1] | second[1] | third[1], 0);
    assert_int_equal(atomic_load(&or_last), OR_EVENTS);
    assert_int_equal(record, 0);   /* acked, the record deleted with it */
}

/* ---- redis.publish_batch = 1: plain entries ---- */

static void publish_batch_one_writes_plain_entries(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "plain");
    const char *const kv[] = {"redis.publish_batch", "1", NULL};
    kb_bus *b = kb_test_open(server.url, fast, kv);
    for (uint32_t seq = 1; seq <= 50; seq++)
        for (uint32_t k = 0; k < 8; k++)
            kb_assert_ok(kb_tracker_publish(b, topic, k, seq, 8));
    kb_assert_ok(kb_close(b, 5000));
    redisContext *c = raw();
    long long frames, plain;
    count_entries(c, topic, &frames, &plain);
    redisFree(c);
    assert_int_equal(frames, 0);
    assert_int_equal(plain, 400);
}

/* ---- another language reads the frames ---- */

static void node_decodes_frames(void **state)
{
    (void)state;
    if (system("node --version > /dev/null 2>&1") != 0)
        fail_msg("node not found (scripts/deps.sh installs nodejs)");
    char topic[96];
    unique_topic(topic, sizeof topic, "node");
    const kb_header h[] = {{"trace", "t-1", 3}};
    const char *const kv[] = {"redis.publish_linger_us", "1000000", NULL};
    kb_bus *b = kb_test_open(server.url, fast, kv);
    char err[256];
    kb_topic *tp = kb_topic_get(b, topic, err, sizeof err);
    assert_non_null(tp);
    for (uint32_t seq = 1; seq <= 100; seq++)
        for (uint32_t k = 0; k < 10; k++) {
            char key[16];
            int klen = snprintf(key, sizeof key, "agg-%u", k);
            uint32_t pl[2] = {k, seq};
            kb_msg m = {key, (size_t)klen, pl, sizeof pl, 0, h, seq % 10 == 0 ? 1 : 0};
            kb_assert_ok(kb_publish_ex(tp, &m));
        }
    kb_assert_ok(kb_close(b, 5000));
    char cmd[512];
    snprintf(cmd, sizeof cmd, "node %s/tests/interop/redis_frames.mjs %d '%s' 8 10 100",
             KB_SOURCE_DIR, server.port, topic);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    if (kb_test_server_start(&server, "redis", NULL) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip_under_concurrency_and_hand_over),
        cmocka_unit_test(mixed_frames_and_plain_entries),
        cmocka_unit_test(dead_letter_inside_a_frame),
        cmocka_unit_test(malformed_frames_are_dead_lettered),
        cmocka_unit_test(crash_replay_is_bounded_per_key),
        cmocka_unit_test(sweep_reads_no_runs_without_records),
        cmocka_unit_test(deleted_frame_leaves_no_progress),
        cmocka_unit_test(frame_dead_letter_outlives_a_crash),
        cmocka_unit_test(progress_record_merges_bits),
        cmocka_unit_test(publish_batch_one_writes_plain_entries),
        cmocka_unit_test(node_decodes_frames),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    kb_test_server_stop(&server);
    return failed;
}
