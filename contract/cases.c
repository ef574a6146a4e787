/* The transport contract: the cases every transport must pass, run by
 * keybus-contract (contract/main.c) against the target it was given — a
 * built-in URL, or a plugin and its URL. What a case expects of an optional
 * hook it reads from the transport's table (kc->ops), never from its name.
 * Threads other than the runner's only record what they saw: the checks
 * (check.h) may only fail on the runner's thread. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "check.h"
#include "support/tracker.h"

/* The suite's bus with `extra` (key, value pairs, NULL-terminated) set last. */
static kb_bus *open_bus_with(const char *const *extra)
{
    kb_conf *c = kb_conf_new();
    char err[256];
    if (kc->plugin != NULL &&
        kb_conf_set(c, "transport.plugins", kc->plugin, err, sizeof err) != KB_OK)
        kc_fail("%s", err);
    kc_ok(kb_conf_set(c, "transport", kc->url, err, sizeof err));
    kc_ok(kb_conf_set(c, "pool.queue_capacity", "64", err, sizeof err));
    kc_ok(kb_conf_set(c, "retry.backoff_ms", "1", err, sizeof err));
    kc_ok(kb_conf_set(c, "retry.max_backoff_ms", "4", err, sizeof err));
    for (size_t i = 0; i < kc->n_settings; i += 2)
        if (kb_conf_set(c, kc->settings[i], kc->settings[i + 1], err, sizeof err) != KB_OK)
            kc_fail("-X %s: %s", kc->settings[i], err);
    for (size_t i = 0; extra != NULL && extra[i] != NULL; i += 2)
        if (kb_conf_set(c, extra[i], extra[i + 1], err, sizeof err) != KB_OK)
            kc_fail("%s", err);
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        kc_fail("kb_open(%s): %s", kc->url, err);
    return b;
}

static kb_bus *open_bus(const char *extra_key, const char *extra_value)
{
    const char *extra[] = {extra_key, extra_value, NULL};
    return open_bus_with(extra);
}

static void unique_topic(char *buf, size_t len, const char *name)
{
    static int seq;
    snprintf(buf, len, "contract.%s.%d.%d", name, (int)getpid(), ++seq);
}

/* Poll `done` until it holds or 30 s pass (a generous deadline: the
 * asserts after it say what was missing). */
static void wait_for(int (*done)(const void *arg), const void *arg)
{
    struct timespec now, pause = {0, 1000000};
    clock_gettime(CLOCK_MONOTONIC, &now);
    time_t deadline = now.tv_sec + 30;
    while (!done(arg) && now.tv_sec < deadline) {
        nanosleep(&pause, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
    }
}

struct seen_goal {
    const kb_tracker *t;
    uint64_t n;
};

static int tracker_saw(const void *arg)
{
    const struct seen_goal *g = arg;
    return kb_tracker_distinct(g->t) >= g->n;
}

/* Wait until the tracker has seen `n` distinct events. */
static void wait_seen(const kb_tracker *t, uint64_t n)
{
    struct seen_goal g = {t, n};
    wait_for(tracker_saw, &g);
}

/* Producer threads record their first failure; the main thread asserts. */
struct producer {
    kb_bus *b;
    const char *topic;
    uint32_t first_key, keys, per_key;
    int rc;
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    for (uint32_t s = 1; s <= p->per_key && p->rc == KB_OK; s++)
        for (uint32_t k = p->first_key; k < p->first_key + p->keys && p->rc == KB_OK; k++)
            p->rc = kb_tracker_publish(p->b, p->topic, k, s, 16);
    return NULL;
}

#define BATCH_MAX 23

/* The same events as produce(), through kb_publish_batch in batches of
 * 1..BATCH_MAX, resending the rest after KB_EFULL. */
static void *produce_batches(void *arg)
{
    struct producer *p = arg;
    kb_topic *t = kb_topic_get(p->b, p->topic, NULL, 0);
    char keys[BATCH_MAX][32];
    uint32_t payloads[BATCH_MAX][4];
    kb_msg msgs[BATCH_MAX];
    size_t n = 0, want = 1;
    if (t == NULL)
        p->rc = KB_EINVAL;
    for (uint32_t s = 1; s <= p->per_key && p->rc == KB_OK; s++) {
        for (uint32_t k = p->first_key; k < p->first_key + p->keys && p->rc == KB_OK; k++) {
            int klen = snprintf(keys[n], sizeof keys[n], "agg-%u", k);
            payloads[n][0] = k;   /* the tracker's format: key index, sequence */
            payloads[n][1] = s;
            msgs[n] = (kb_msg){keys[n], (size_t)klen, payloads[n], sizeof payloads[n], 0};
            bool last = s == p->per_key && k + 1 == p->first_key + p->keys;
            if (++n < want && !last)
                continue;
            size_t off = 0;
            while (off < n && p->rc == KB_OK) {
                size_t taken = 0;
                int rc = kb_publish_batch(t, msgs + off, n - off, &taken);
                off += taken;
                if (rc != KB_OK && rc != KB_EFULL)
                    p->rc = rc;
            }
            n = 0;
            want = want % BATCH_MAX + 1;
        }
    }
    return NULL;
}

/* Many producers, many keys: every event handled once, in order per key. */
static void order_and_no_loss(void)
{
    kb_bus *b = open_bus(NULL, NULL);
    char topic[96];
    unique_topic(topic, sizeof topic, "order");
    kb_tracker t;
    kb_tracker_init(&t, 200);
    kc_ok(kb_subscribe(b, topic, kb_tracker_handler, &t));

    pthread_t th[4];
    struct producer p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = (struct producer){b, topic, (uint32_t)i * 50, 50, 50, KB_OK};
        pthread_create(&th[i], NULL, produce, &p[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        kc_ok(p[i].rc);
    kc_ok(kb_flush(b, 30000));
    wait_seen(&t, 200 * 50);
    kc_ok(kb_close(b, 30000));

    kc_eq(kb_tracker_distinct(&t), 200 * 50);
    kc_eq(t.order_violations, 0);
    kc_eq(t.duplicates, 0);
    kc_eq(t.concurrent, 0);
    kb_tracker_destroy(&t);
}

struct retry_state {
    kb_tracker t;
    _Atomic uint32_t retries_asked;
    _Atomic uint32_t second_attempts;
};

/* Every third event fails on its first attempt: it is handled again before any
 * later event of its key, and its attempt number says 2. */
static int retry_handler(const kb_event *ev, void *opaque)
{
    struct retry_state *rs = opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (seq % 3 == 0 && ev->attempt == 1) {
        rs->retries_asked++;
        return KB_RETRY;
    }
    if (seq % 3 == 0 && ev->attempt == 2)
        rs->second_attempts++;
    return kb_tracker_handler(ev, &rs->t);
}

static void ordered_retry(void)
{
    kb_bus *b = open_bus(NULL, NULL);
    char topic[96];
    unique_topic(topic, sizeof topic, "retry");
    struct retry_state rs = {0};
    kb_tracker_init(&rs.t, 20);
    kc_ok(kb_subscribe(b, topic, retry_handler, &rs));
    struct producer p = {b, topic, 0, 20, 30};
    produce(&p);
    kc_ok(kb_flush(b, 30000));
    wait_seen(&rs.t, 20 * 30);
    kc_ok(kb_close(b, 30000));

    kc_eq(kb_tracker_distinct(&rs.t), 20 * 30);
    kc_eq(rs.t.order_violations, 0);
    kc_eq(rs.t.duplicates, 0);
    kc_eq(rs.retries_asked, 20 * 10);
    kc_eq(rs.second_attempts, 20 * 10);
    kb_tracker_destroy(&rs.t);
}

struct dead_state {
    _Atomic uint32_t handled;
    _Atomic int flaky_ok;        /* set before the replay: the flaky event now passes */
};

static int poison_handler(const kb_event *ev, void *opaque)
{
    struct dead_state *ds = opaque;
    if (ev->payload_len == 6 && memcmp(ev->payload, "poison", 6) == 0) {
        kb_event_set_reason(ev, "poison pill %d", 7);
        return KB_DEAD;
    }
    if (ev->payload_len == 5 && memcmp(ev->payload, "flaky", 5) == 0 && !ds->flaky_ok) {
        kb_event_set_reason(ev, "flaky: attempt %u", ev->attempt);
        return KB_RETRY;   /* until retry.max_attempts */
    }
    ds->handled++;
    return KB_HANDLED;
}

#define MAX_SEEN 8

/* Dead letters as kb_dead_letters hands them over, copied for the asserts. */
struct seen_dead {
    int n;
    struct {
        char id[64], key[16], payload[16], reason[64];
        uint32_t attempts;
        int64_t time_ms;
    } e[MAX_SEEN];
};

static int collect_dead_letter(const kb_dead_letter *dl, void *opaque)
{
    struct seen_dead *sd = opaque;
    if (sd->n == MAX_SEEN)
        return 1;
    snprintf(sd->e[sd->n].id, sizeof sd->e[0].id, "%s", dl->id);
    snprintf(sd->e[sd->n].key, sizeof sd->e[0].key, "%.*s", (int)dl->key_len,
             (const char *)dl->key);
    snprintf(sd->e[sd->n].payload, sizeof sd->e[0].payload, "%.*s", (int)dl->payload_len,
             (const char *)dl->payload);
    snprintf(sd->e[sd->n].reason, sizeof sd->e[0].reason, "%s", dl->reason ? dl->reason : "");
    sd->e[sd->n].attempts = dl->attempts;
    sd->e[sd->n].time_ms = dl->time_ms;
    sd->n++;
    return 0;
}

static int dead_letter_id(const kb_dead_letter *dl, void *opaque)
{
    snprintf(opaque, 64, "%s", dl->id);
    return 1;
}

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Listing and replaying dead letters takes the optional hooks that keep a
 * store; a transport without them has no such case to pass. */
static void needs_dead_letter_store(void)
{
    if (kc->ops->dead_letters == NULL || kc->ops->dead_letter_replay == NULL)
        kc_skip("%s:// has no dead_letters or dead_letter_replay hook: no dead-letter store "
                "to list and replay", kc->ops->scheme);
}

/* KB_DEAD dead-letters at once; KB_RETRY until retry.max_attempts, then dead.
 * Every transport keeps them with the handler's reason, the attempts and the
 * time, lists them oldest first and replays one back to its topic. */
static void dead_letters(void)
{
    needs_dead_letter_store();
    kb_bus *b = open_bus("retry.max_attempts", "3");
    char topic[96];
    unique_topic(topic, sizeof topic, "dead");
    struct dead_state ds = {0};
    kc_ok(kb_subscribe(b, topic, poison_handler, &ds));
    int64_t before = unix_ms();
    kc_ok(kb_publish(b, topic, "k1", 2, "poison", 6));
    kc_ok(kb_publish(b, topic, "k2", 2, "flaky", 5));
    kc_ok(kb_publish(b, topic, "k1", 2, "fine", 4));
    kc_ok(kb_drain(b, 30000));
    int64_t after = unix_ms();
    kb_topic_stats st = {0};
    kc_ok(kb_stats(b, topic, &st));
    kc_eq(st.dead_lettered, 2);
    kc_eq(st.dead_letters_lost, 0);
    kc_eq(ds.handled, 1);

    struct seen_dead sd = {0};
    kc_ok(kb_dead_letters(b, topic, NULL, 100, collect_dead_letter, &sd));
    kc_eq(sd.n, 2);
    int poison = strcmp(sd.e[0].key, "k1") == 0 ? 0 : 1, flaky = 1 - poison;
    kc_str_eq(sd.e[poison].key, "k1");
    kc_str_eq(sd.e[poison].payload, "poison");
    kc_str_eq(sd.e[poison].reason, "poison pill 7");
    kc_eq(sd.e[poison].attempts, 1);
    kc_str_eq(sd.e[flaky].key, "k2");
    kc_str_eq(sd.e[flaky].reason, "flaky: attempt 3");
    kc_eq(sd.e[flaky].attempts, 3);
    for (int i = 0; i < 2; i++) {   /* wall-clock stamps, a second of slack each way */
        kc_true(sd.e[i].time_ms >= before - 1000);
        kc_true(sd.e[i].time_ms <= after + 1000);
    }
    /* walking after the first one gives the second */
    struct seen_dead rest = {0};
    kc_ok(kb_dead_letters(b, topic, sd.e[0].id, 100, collect_dead_letter, &rest));
    kc_eq(rest.n, 1);
    kc_str_eq(rest.e[0].id, sd.e[1].id);
    /* an ID of no form the transport writes is refused, not read as another */
    struct seen_dead none = {0};
    kc_eq(kb_dead_letters(b, topic, "x1", 100, collect_dead_letter, &none), KB_EINVAL);
    kc_eq(kb_dead_letters(b, topic, "-1", 100, collect_dead_letter, &none), KB_EINVAL);
    kc_eq(none.n, 0);

    /* replayed, the flaky event now passes and leaves the store */
    ds.flaky_ok = 1;
    kc_ok(kb_dead_letter_replay(b, topic, sd.e[flaky].id));
    kc_ok(kb_drain(b, 30000));
    kc_eq(ds.handled, 2);
    struct seen_dead left = {0};
    kc_ok(kb_dead_letters(b, topic, NULL, 100, collect_dead_letter, &left));
    kc_eq(left.n, 1);
    kc_str_eq(left.e[0].key, "k1");
    kc_eq(kb_dead_letter_replay(b, topic, sd.e[flaky].id), KB_ENOTFOUND);

    /* removed without a replay (the optional dead_letter_delete hook: without
     * it both calls say KB_ENOTFOUND) */
    uint64_t removed = 99;
    int rc = kb_dead_letters_purge(b, topic, &removed);
    if (kc->ops->dead_letter_delete == NULL) {
        kc_eq(rc, KB_ENOTFOUND);
        kc_eq(removed, 0);
    } else {
        kc_ok(rc);
        kc_eq(removed, 1);
        struct seen_dead gone = {0};
        kc_ok(kb_dead_letters(b, topic, NULL, 100, collect_dead_letter, &gone));
        kc_eq(gone.n, 0);
        kc_ok(kb_dead_letters_purge(b, topic, &removed));
        kc_eq(removed, 0);
    }
    kc_eq(kb_dead_letter_delete(b, topic, left.e[0].id), KB_ENOTFOUND);
    kc_ok(kb_close(b, 30000));
}

struct bytes_state {
    _Atomic int seen_nul_key, seen_empty;
};

static int bytes_handler(const kb_event *ev, void *opaque)
{
    struct bytes_state *bs = opaque;
    if (ev->key_len == 3 && memcmp(ev->key, "a\0b", 3) == 0 && ev->payload_len == 2)
        bs->seen_nul_key++;
    if (ev->key_len == 1 && ev->payload_len == 0)
        bs->seen_empty++;
    return KB_HANDLED;
}

static int saw_both(const void *arg)
{
    const struct bytes_state *bs = arg;
    return bs->seen_nul_key >= 1 && bs->seen_empty >= 1;
}

static void binary_keys_and_empty_payloads(void)
{
    kb_bus *b = open_bus(NULL, NULL);
    char topic[96];
    unique_topic(topic, sizeof topic, "bytes");
    struct bytes_state bs = {0};
    kc_ok(kb_subscribe(b, topic, bytes_handler, &bs));
    kc_ok(kb_publish(b, topic, "a\0b", 3, "\0\1", 2));
    kc_ok(kb_publish(b, topic, "z", 1, NULL, 0));
    kc_ok(kb_flush(b, 30000));
    wait_for(saw_both, &bs);
    kc_ok(kb_close(b, 30000));
    kc_eq(bs.seen_nul_key, 1);
    kc_eq(bs.seen_empty, 1);
}

/* Headers travel with their event: to the handler in order, through a retry,
 * into the dead letter and back out with the replay. */
struct header_state {
    _Atomic int calls;
    int bad;                     /* handler saw headers other than sent */
    _Atomic int replayed_ok;
};

static const kb_header sent[3] = {
    {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", 55},
    {"ce-type", "com.example.order.created", 25},
    {"empty", "", 0},
};

static int headers_handler(const kb_event *ev, void *opaque)
{
    struct header_state *hs = opaque;
    int call = ++hs->calls;
    int same = ev->n_headers == 3;
    for (size_t i = 0; same && i < 3; i++)
        same = strcmp(ev->headers[i].name, sent[i].name) == 0 &&
               ev->headers[i].value_len == sent[i].value_len &&
               memcmp(ev->headers[i].value, sent[i].value, sent[i].value_len) == 0;
    if (!same)
        hs->bad++;
    if (call == 1)
        return KB_RETRY;         /* attempt 2 must carry them too */
    if (call == 2)
        return KB_DEAD;
    hs->replayed_ok++;
    return KB_HANDLED;
}

static int dead_letter_headers(const kb_dead_letter *dl, void *opaque)
{
    int *same = opaque;
    *same = dl->n_headers == 3 && strcmp(dl->headers[0].name, "traceparent") == 0 &&
            dl->headers[0].value_len == 55 && dl->headers[2].value_len == 0;
    return 1;
}

static void headers_travel_with_events(void)
{
    kb_bus *b = open_bus(NULL, NULL);
    char topic[96], err[256];
    unique_topic(topic, sizeof topic, "headers");
    if (!(kc->ops->flags & (KB_TRANSPORT_F_HEADERS | KB_TRANSPORT_F_LOCAL))) {
        kb_msg refused = {"order-7", 7, "created", 7, 0, sent, 3};
        kb_topic *h = kb_topic_get(b, topic, err, sizeof err);
        kc_not_null(h);
        kc_eq(kb_publish_ex(h, &refused), KB_EINVAL);   /* never dropped silently */
        kc_ok(kb_close(b, 30000));
        kc_skip("%s:// does not carry headers (no KB_TRANSPORT_F_HEADERS): they are refused",
                kc->ops->scheme);
    }
    if (kc->ops->dead_letters == NULL || kc->ops->dead_letter_replay == NULL) {
        kc_ok(kb_close(b, 30000));
        needs_dead_letter_store();
    }
    struct header_state hs = {0};
    kc_ok(kb_subscribe(b, topic, headers_handler, &hs));
    kb_topic *t = kb_topic_get(b, topic, err, sizeof err);
    kc_not_null(t);
    kb_msg m = {"order-7", 7, "created", 7, 0, sent, 3};
    kc_ok(kb_publish_ex(t, &m));
    kc_ok(kb_drain(b, 30000));
    kc_eq(hs.calls, 2);
    int same = 0;
    char id[64] = "";
    kc_ok(kb_dead_letters(b, topic, NULL, 1, dead_letter_headers, &same));
    kc_eq(same, 1);
    kc_ok(kb_dead_letters(b, topic, NULL, 1, dead_letter_id, id));
    kc_ok(kb_dead_letter_replay(b, topic, id));
    kc_ok(kb_drain(b, 30000));
    kc_eq(hs.replayed_ok, 1);
    kc_eq(hs.bad, 0);
    kc_ok(kb_close(b, 30000));
}

/* Topic handles and batches: one handle per name, taken before anyone
 * subscribes; four threads publish through it in batches of 1..23 (small
 * lanes: some batches stop at a full lane and the rest is resent); every
 * event is handled once, in order per key. */
static void batches_through_a_topic_handle(void)
{
    kb_bus *b = open_bus(NULL, NULL);
    char topic[96], err[256];
    unique_topic(topic, sizeof topic, "batch");
    kb_topic *h = kb_topic_get(b, topic, err, sizeof err);
    kc_not_null(h);
    kc_eq(kb_topic_get(b, topic, err, sizeof err), h);
    if (kc->ops->flags & KB_TRANSPORT_F_LOCAL) {   /* in-process: nothing kept without a handler */
        kc_eq(kb_publish_to(h, "k", 1, "x", 1), KB_ENOTFOUND);
        kc_not_null(strstr(kb_last_error(), topic));
    }
    kb_tracker t;
    kb_tracker_init(&t, 200);
    kc_ok(kb_subscribe(b, topic, kb_tracker_handler, &t));
    kc_eq(kb_topic_get(b, topic, err, sizeof err), h);

    pthread_t th[4];
    struct producer p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = (struct producer){b, topic, (uint32_t)i * 50, 50, 40, KB_OK};
        pthread_create(&th[i], NULL, produce_batches, &p[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        kc_ok(p[i].rc);
    kc_ok(kb_flush(b, 30000));
    wait_seen(&t, 200 * 40);
    kb_topic_stats st;
    kc_ok(kb_stats(b, topic, &st));
    kc_eq(st.published, 200 * 40);

    /* a bad event stops the batch there: the ones before it are taken */
    uint32_t next[4] = {0, 41};   /* key 0's event 41 */
    kb_msg bad[3] = {{"agg-0", 5, next, sizeof next, 0}, {NULL, 0, "x", 1, 0},
                     {"agg-0", 5, "y", 1, 0}};
    size_t taken = 99;
    kc_eq(kb_publish_batch(h, bad, 3, &taken), KB_EINVAL);
    kc_eq(taken, 1);
    kc_not_null(strstr(kb_last_error(), "key is NULL"));
    kc_ok(kb_flush(b, 30000));
    wait_seen(&t, 200 * 40 + 1);
    kc_ok(kb_close(b, 30000));

    kc_eq(kb_tracker_distinct(&t), 200 * 40 + 1);
    kc_eq(t.order_violations, 0);
    kc_eq(t.duplicates, 0);
    kc_eq(t.concurrent, 0);
    kb_tracker_destroy(&t);
}

/* After kb_close starts, publishing is refused; stats survive until then. */
static void stats_and_close(void)
{
    kb_bus *b = open_bus(NULL, NULL);
    char topic[96];
    unique_topic(topic, sizeof topic, "stats");
    kb_tracker t;
    kb_tracker_init(&t, 10);
    kc_ok(kb_subscribe(b, topic, kb_tracker_handler, &t));
    struct producer p = {b, topic, 0, 10, 10, KB_OK};
    produce(&p);
    kc_ok(p.rc);
    kc_ok(kb_flush(b, 30000));
    wait_seen(&t, 100);
    kb_topic_stats st;
    kc_ok(kb_stats(b, topic, &st));
    kc_eq(st.published, 100);
    kc_eq(st.handled, 100);
    kc_eq(st.lanes, 1024);
    kc_true(st.lanes_allocated >= 1 && st.lanes_allocated <= 10);
    kc_ok(kb_close(b, 30000));
    kc_eq(kb_tracker_distinct(&t), 100);
    kb_tracker_destroy(&t);
}

/* ---- retry.scope: one aggregate's retry holds only itself ---- */

#define LEVEL_KEYS 100      /* agg-0 retries; agg-1.. share its lane (pool.workers = 1) */
#define LEVEL_PER_KEY 10
#define LEVEL_RETRIES 5     /* agg-0's first event fails 5 times, 50..100 ms apart */
#define LEVEL_OTHERS ((LEVEL_KEYS - 1) * LEVEL_PER_KEY)

struct level_state {
    kb_tracker t;
    _Atomic uint32_t a_runs;          /* runs of agg-0's first event */
    _Atomic int a_done;               /* it passed */
    _Atomic uint32_t others_waiting;  /* other events handled while it waited */
    int64_t rest_published_ns;        /* when the other events were published */
    int64_t waits_ns[LEVEL_OTHERS];   /* each other event: handled - published */
    _Atomic uint32_t n_waits;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int level_handler(const kb_event *ev, void *opaque)
{
    struct level_state *ls = opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (key == 0 && seq == 1) {
        if (++ls->a_runs <= LEVEL_RETRIES)
            return KB_RETRY;
        ls->a_done = 1;
    } else if (key != 0) {
        if (ls->a_runs > 0 && !ls->a_done)
            ls->others_waiting++;
        uint32_t i = ls->n_waits++;
        if (i < LEVEL_OTHERS)
            ls->waits_ns[i] = mono_ns() - ls->rest_published_ns;
    }
    return kb_tracker_handler(ev, &ls->t);
}

static int first_run_seen(const void *arg)
{
    return ((const struct level_state *)arg)->a_runs >= 1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* agg-0's first event is published and fails once; then the 990 events of
 * 99 other aggregates and agg-0's later ones, all in agg-0's lane. Returns
 * how many of the others were handled while agg-0 waited for its retries. */
static uint32_t one_aggregate_retries(const char *scope)
{
    /* room for every event in the one lane: with scope lane, it holds them all */
    const char *extra[] = {"pool.workers", "1", "pool.queue_capacity", "1024", "retry.scope",
                           scope, "retry.backoff_ms", "100", "retry.max_backoff_ms", "100",
                           "retry.max_attempts", "10", NULL};
    kb_bus *b = open_bus_with(extra);
    char topic[96];
    unique_topic(topic, sizeof topic, scope);
    static struct level_state ls;
    memset(&ls, 0, sizeof ls);
    kb_tracker_init(&ls.t, LEVEL_KEYS);
    kc_ok(kb_subscribe(b, topic, level_handler, &ls));
    kc_ok(kb_tracker_publish(b, topic, 0, 1, 16));
    wait_for(first_run_seen, &ls);
    kc_eq(ls.a_runs >= 1, 1);
    ls.rest_published_ns = mono_ns();
    for (uint32_t s = 1; s <= LEVEL_PER_KEY; s++)
        for (uint32_t k = 0; k < LEVEL_KEYS; k++)
            if (k != 0 || s != 1)
                kc_ok(kb_tracker_publish(b, topic, k, s, 16));
    kc_ok(kb_flush(b, 30000));
    wait_seen(&ls.t, LEVEL_KEYS * LEVEL_PER_KEY);
    kb_topic_stats st;
    /* the last handler has returned to the tracker, its executor may not yet
     * have counted the aggregate's set-aside events back */
    kc_wait_until(kb_stats(b, topic, &st) == KB_OK && st.set_aside == 0, 10000,
                  "the set-aside events counted back");
    kc_eq(st.set_aside, 0);
    kc_eq(st.aggregates_waiting, 0);
    kc_eq(st.retried, LEVEL_RETRIES);
    kc_ok(kb_close(b, 30000));

    /* per-key order for agg-0 too: its later events ran after its retries */
    kc_eq(kb_tracker_distinct(&ls.t), LEVEL_KEYS * LEVEL_PER_KEY);
    kc_eq(ls.t.order_violations, 0);
    kc_eq(ls.t.duplicates, 0);
    kc_eq(ls.a_runs, LEVEL_RETRIES + 1);
    kc_eq(ls.n_waits, LEVEL_OTHERS);
    qsort(ls.waits_ns, LEVEL_OTHERS, sizeof ls.waits_ns[0], cmp_i64);
    kc_note("retry.scope=%s: %u of %d other events handled while agg-0 waited; their "
                  "p99 wait %.1f ms (5 retries 50..100 ms apart)\n", scope, ls.others_waiting,
                  LEVEL_OTHERS, ls.waits_ns[LEVEL_OTHERS * 99 / 100] / 1e6);
    kb_tracker_destroy(&ls.t);
    return ls.others_waiting;
}

/* retry.scope = key: the other aggregates of the lane go on while one waits
 * (at least half of their events handled meanwhile: its retries take 250 ms
 * or more, the others a few ms). */
static void key_level_retry(void)
{
    kc_true(one_aggregate_retries("key") >= LEVEL_OTHERS / 2);
}

/* retry.scope = lane: the lane waits with the aggregate, as before. */
static void lane_level_retry(void)
{
    kc_eq(one_aggregate_retries("lane"), 0);
}

/* A consumer process killed (kill -9) while agg-0's later events are set
 * aside behind its retry loses none of them and keeps their order: the next
 * consumer gets agg-0's events 1..10 in order, and every event at least
 * once. The consumer: `keybus-contract --child TOPIC LOG MODE OPTIONS... URL`
 * (the runner's own options: kc_child_main), MODE `hold` (agg-0's first
 * event always fails) or `pass`; it logs "MODE key seq" per handled event
 * and "S set_aside waiting" when they change. How soon the second consumer
 * takes over from the killed one is the transport's failure detection: the
 * runner's -K settings (a short lease) are set in both consumers. */
#define KILL_KEYS 21
#define KILL_PER_KEY 10

static const char *child_mode;
static int child_log = -1;

static void log_line(const char *fmt, ...)
{
    char line[96];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (write(child_log, line, (size_t)n) != n)
        abort();   /* the parent would miss it */
}

static int child_handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (key == 0 && seq == 1 && strcmp(child_mode, "hold") == 0)
        return KB_RETRY;
    log_line("%c %u %u\n", child_mode[0], key, seq);
    return KB_HANDLED;
}

static volatile sig_atomic_t child_stop;

static void on_term(int sig)
{
    (void)sig;
    child_stop = 1;
}

int kc_child_main(const char *topic, const char *log, const char *mode)
{
    child_mode = mode;
    child_log = open(log, O_WRONLY | O_APPEND);
    signal(SIGTERM, on_term);
    const char *kv[] = {"transport", kc->url, "pool.workers", "1", "pool.queue_capacity",
                        "64", "retry.backoff_ms", "20", "retry.max_backoff_ms", "50",
                        "retry.max_attempts", "1000000", "consumer", "contract-kill", NULL};
    kb_conf *c = kb_conf_new();
    char err[256];
    const char *bad = NULL;
    if (kc->plugin != NULL &&
        kb_conf_set(c, "transport.plugins", kc->plugin, err, sizeof err) != KB_OK)
        bad = "transport.plugins";
    for (size_t i = 0; bad == NULL && kv[i] != NULL; i += 2)
        if (kb_conf_set(c, kv[i], kv[i + 1], err, sizeof err) != KB_OK)
            bad = kv[i];
    for (size_t i = 0; bad == NULL && i < kc->n_settings; i += 2)
        if (kb_conf_set(c, kc->settings[i], kc->settings[i + 1], err, sizeof err) != KB_OK)
            bad = kc->settings[i];
    for (size_t i = 0; bad == NULL && i < kc->n_crash_settings; i += 2)
        if (kb_conf_set(c, kc->crash_settings[i], kc->crash_settings[i + 1], err,
                        sizeof err) != KB_OK)
            bad = kc->crash_settings[i];
    if (bad != NULL) {
        fprintf(stderr, "child: %s: %s\n", bad, err);
        return 2;
    }
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL || child_log < 0 || kb_subscribe(b, topic, child_handler, NULL) != KB_OK) {
        fprintf(stderr, "child: %s\n", b == NULL ? err : kb_last_error());
        return 2;
    }
    uint64_t said = UINT64_MAX;
    while (!child_stop) {
        kb_topic_stats st = {0};
        if (kb_stats(b, topic, &st) == KB_OK && st.set_aside != said) {
            said = st.set_aside;
            log_line("S %llu %llu\n", (unsigned long long)st.set_aside,
                     (unsigned long long)st.aggregates_waiting);
        }
        struct timespec pause = {0, 10000000};
        nanosleep(&pause, NULL);
    }
    return kb_close(b, 10000) == KB_OK ? 0 : 1;
}

extern char **environ;

static pid_t spawn_child(const char *topic, const char *log, const char *mode)
{
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    kc_true(len > 0);
    self[len] = '\0';
    char *argv[256] = {self, "--child", (char *)topic, (char *)log, (char *)mode};
    size_t n = 5;
    for (size_t i = 0; kc->child_argv[i] != NULL && n < 255; i++)
        argv[n++] = kc->child_argv[i];
    kc_true(kc->child_argv[n - 5] == NULL);   /* all of them fitted */
    pid_t pid;
    kc_eq(posix_spawn(&pid, self, NULL, NULL, argv, environ), 0);
    return pid;
}

/* What the consumers logged. */
struct kill_log {
    const char *path;
    bool held_seen;                         /* "S 9 1": agg-0's 9 later events set aside */
    uint32_t hold[KILL_KEYS][KILL_PER_KEY + 1], pass[KILL_KEYS][KILL_PER_KEY + 1];
    uint32_t order_violations;              /* within one consumer, per key */
    uint32_t a_order[KILL_PER_KEY * 2], a_n; /* agg-0's sequences as `pass` handled them */
};

static void read_kill_log(struct kill_log *kl)
{
    const char *path = kl->path;
    memset(kl, 0, sizeof *kl);
    kl->path = path;
    FILE *f = fopen(path, "r");
    kc_not_null(f);
    uint32_t last[2][KILL_KEYS] = {{0}};
    char mode;
    unsigned long long x, y;
    while (fscanf(f, " %c %llu %llu", &mode, &x, &y) == 3) {
        if (mode == 'S') {
            kl->held_seen |= x == KILL_PER_KEY - 1 && y == 1;
            continue;
        }
        if (x >= KILL_KEYS || y < 1 || y > KILL_PER_KEY)
            continue;
        bool pass = mode == 'p';
        (pass ? kl->pass : kl->hold)[x][y]++;
        if (y <= last[pass][x])
            kl->order_violations++;
        last[pass][x] = (uint32_t)y;
        if (pass && x == 0 && kl->a_n < KILL_PER_KEY * 2)
            kl->a_order[kl->a_n++] = (uint32_t)y;
    }
    fclose(f);
}

static int others_handled(const void *arg)
{
    struct kill_log *kl = (struct kill_log *)arg;
    read_kill_log(kl);
    if (!kl->held_seen)
        return 0;
    for (uint32_t k = 1; k < KILL_KEYS; k++)
        for (uint32_t s = 1; s <= KILL_PER_KEY; s++)
            if (kl->hold[k][s] == 0)
                return 0;
    return 1;
}

static int all_handled(const void *arg)
{
    struct kill_log *kl = (struct kill_log *)arg;
    read_kill_log(kl);
    for (uint32_t k = 0; k < KILL_KEYS; k++)
        for (uint32_t s = 1; s <= KILL_PER_KEY; s++)
            if (kl->hold[k][s] + kl->pass[k][s] == 0)
                return 0;
    return 1;
}

static void kill_while_set_aside(void)
{
    if (kc->ops->flags & KB_TRANSPORT_F_LOCAL)
        kc_skip("%s:// keeps no event across processes: nothing to recover",
                kc->ops->scheme);
    char topic[96], log[] = "/tmp/kb-contract-kill-XXXXXX";
    unique_topic(topic, sizeof topic, "kill");
    int fd = mkstemp(log);
    kc_true(fd >= 0);
    close(fd);
    kb_bus *b = open_bus(NULL, NULL);
    for (uint32_t s = 1; s <= KILL_PER_KEY; s++)
        for (uint32_t k = 0; k < KILL_KEYS; k++)
            kc_ok(kb_tracker_publish(b, topic, k, s, 16));
    kc_ok(kb_flush(b, 30000));

    static struct kill_log kl;
    kl.path = log;
    pid_t holder = spawn_child(topic, log, "hold");
    wait_for(others_handled, &kl);
    kc_true(kl.held_seen);
    kc_eq(others_handled(&kl), 1);
    kc_eq(kill(holder, SIGKILL), 0);
    kc_eq(waitpid(holder, NULL, 0), holder);

    pid_t passer = spawn_child(topic, log, "pass");
    wait_for(all_handled, &kl);
    kill(passer, SIGTERM);
    int status = 0;
    kc_eq(waitpid(passer, &status, 0), passer);
    kc_ok(kb_close(b, 30000));
    int complete = all_handled(&kl);
    unlink(log);

    kc_eq(complete, 1);
    uint32_t again = 0;
    for (uint32_t k = 1; k < KILL_KEYS; k++)
        for (uint32_t s = 1; s <= KILL_PER_KEY; s++)
            again += kl.hold[k][s] > 0 && kl.pass[k][s] > 0;
    kc_note("killed with %d events set aside; the next consumer handled them in order, "
                  "and %u of the %d others again (at least once)\n", KILL_PER_KEY - 1, again,
                  (KILL_KEYS - 1) * KILL_PER_KEY);
    kc_eq(kl.order_violations, 0);
    kc_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* agg-0: never handled by the killed consumer, then 1..10 once each, in order */
    for (uint32_t s = 1; s <= KILL_PER_KEY; s++)
        kc_eq(kl.hold[0][s], 0);
    kc_eq(kl.a_n, KILL_PER_KEY);
    for (uint32_t i = 0; i < KILL_PER_KEY; i++)
        kc_eq(kl.a_order[i], i + 1);
}

const kc_case kc_cases[] = {
    {"order_and_no_loss", order_and_no_loss},
    {"ordered_retry", ordered_retry},
    {"dead_letters", dead_letters},
    {"binary_keys_and_empty_payloads", binary_keys_and_empty_payloads},
    {"stats_and_close", stats_and_close},
    {"batches_through_a_topic_handle", batches_through_a_topic_handle},
    {"headers_travel_with_events", headers_travel_with_events},
    {"key_level_retry", key_level_retry},
    {"lane_level_retry", lane_level_retry},
    {"kill_while_set_aside", kill_while_set_aside},
};
const size_t kc_n_cases = sizeof kc_cases / sizeof kc_cases[0];
