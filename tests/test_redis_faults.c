/* Redis transport under faults; each case ends with nothing lost and no
 * per-key order violation (duplicates are counted and allowed):
 *   - kill -9 of one of two consumer processes mid-stream;
 *   - a consumer SIGSTOPped past its lease TTL, then resumed;
 *   - redis-server killed and restarted mid-stream (AOF, appendfsync always);
 *   - the same mid-publish, without flushes: every accepted publish is stored;
 *   - server down when kb_open runs, up later (kb_open fails; the app retries);
 *   - one pipelined XADD refused "not now" (NOREPLICAS) while a later one of its
 *     stream is stored: the reorder of first copies is counted and logged, the
 *     refused one and the later one are written again, in order;
 *   - the retries after such a refusal go one record at a time until one is
 *     stored: a server that starts storing in the middle of a retry stores
 *     none out of order;
 *   - frames over a proto-max-bulk-len the server hides (CONFIG renamed): the
 *     server drops the connection, the frames are split and stored, only an
 *     event over the limit fails, and kb_flush counts it as one. */
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <keybus/keybus.h>

#include "support/check.h"
#include "support/proxy.h"
#include "support/server.h"
#include "support/tracker.h"

#define TTL_MS 1000
#define TTL_ARG "1000"
#define KEYS 40
#define PER_KEY 150
#define CONSUMER_THREADS 2   /* pool.threads of redis_consumer_proc */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static kb_bus *open_url(const char *url, char *err, size_t errlen)
{
    kb_conf *c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "transport", url, err, errlen));
    kb_assert_ok(kb_conf_set(c, "redis.lease_ttl_ms", TTL_ARG, err, errlen));
    kb_assert_ok(kb_conf_set(c, "redis.reconnect_max_ms", "200", err, errlen));
    kb_assert_ok(kb_conf_set(c, "redis.connect_timeout_ms", "500", err, errlen));
    kb_assert_ok(kb_conf_set(c, "redis.read_timeout_ms", "1000", err, errlen));
    kb_assert_ok(kb_conf_set(c, "consumer", "fault-test", err, errlen));
    kb_bus *b = kb_open(c, err, errlen);
    if (b == NULL)
        kb_conf_destroy(c);
    return b;
}

/* Publish seq first..last for every key; a batch whose publish or flush fails
 * is published again (at least once: duplicates, never gaps). */
static void publish_range(kb_bus *b, const char *topic, uint32_t first, uint32_t last, int pause_ms)
{
    for (uint32_t s = first; s <= last; s++) {
        for (int tries = 0;; tries++) {
            assert_true(tries < 200);
            int rc = KB_OK;
            for (uint32_t k = 0; k < KEYS && rc == KB_OK; k++)
                rc = kb_tracker_publish(b, topic, k, s, 16);
            if (rc == KB_OK)
                rc = kb_flush(b, 2000);
            if (rc == KB_OK)
                break;
            usleep(100000);
        }
        if (pause_ms > 0)
            usleep((useconds_t)pause_ms * 1000);
    }
}

/* ---- log of handled events, shared by the consumer processes ---- */

struct verdict {
    uint64_t distinct, duplicates, violations;
};

static struct verdict check_log(const char *path)
{
    struct verdict v = {0, 0, 0};
    uint32_t last[KEYS] = {0};
    FILE *f = fopen(path, "r");
    unsigned k, s, line = 0;
    char text[200];
    while (f != NULL && fgets(text, sizeof text, f) != NULL &&
           sscanf(text, "%u %u", &k, &s) == 2) {
        line++;
        if (k < KEYS && s == last[k] + 1)
            last[k] = s;
        else if (k < KEYS && s <= last[k])
            v.duplicates++;
        else if (v.violations++ < 3 && getenv("KB_TEST_VERBOSE") != NULL)
            fprintf(stderr, "  line %u: key %u seq %u after %u\n", line, k, s,
                    k < KEYS ? last[k] : 0);
    }
    if (f != NULL)
        fclose(f);
    for (int i = 0; i < KEYS; i++)
        v.distinct += last[i];
    return v;
}

/* Events `who` handled in lines from byte `from` on that another process
 * handled too (anywhere in the log), not counting handlers the pause caught
 * midway: a paused process that handled what it had queued before its lease
 * went would show up here, as the new owner handles those entries as well. */
static uint64_t shared_by(const char *path, long from, const char *who)
{
    static bool other[KEYS][PER_KEY + 1], mine[KEYS][PER_KEY + 1];
    memset(other, 0, sizeof other);
    memset(mine, 0, sizeof mine);
    FILE *f = fopen(path, "r");
    char text[200], tag[64];
    unsigned k, s;
    char flag;
    for (long pos = 0; f != NULL && fgets(text, sizeof text, f) != NULL; pos = ftell(f)) {
        if (sscanf(text, "%u %u %63s %c", &k, &s, tag, &flag) != 4 || k >= KEYS || s > PER_KEY)
            continue;
        if (strcmp(tag, who) != 0)
            other[k][s] = true;
        else if (pos >= from && flag != 'p')
            mine[k][s] = true;
    }
    if (f != NULL)
        fclose(f);
    uint64_t n = 0;
    for (k = 0; k < KEYS; k++)
        for (s = 0; s <= PER_KEY; s++)
            n += mine[k][s] && other[k][s];
    return n;
}

static long file_size(const char *path)
{
    FILE *f = fopen(path, "r");
    long n = 0;
    if (f != NULL && fseek(f, 0, SEEK_END) == 0)
        n = ftell(f);
    if (f != NULL)
        fclose(f);
    return n;
}

static struct verdict wait_log(const char *path, uint64_t n)
{
    struct verdict v = check_log(path);
    for (int i = 0; i < 3000 && v.distinct < n && v.violations == 0; i++) {
        usleep(10000);
        v = check_log(path);
    }
    return v;
}

static pid_t spawn_consumer(const char *url, const char *topic, const char *name, const char *log)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(KB_CONSUMER_PROC, KB_CONSUMER_PROC, url, topic, name, log, TTL_ARG, "300",
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Owners of the 8 partitions: how many each of a and b hold. */
static void owners(kb_bus *b, const char *topic, int *a, int *bb)
{
    *a = *bb = 0;
    for (uint32_t i = 0; i < 8; i++) {
        kb_partition_stats ps;
        if (kb_partition_stats_get(b, topic, i, &ps) != KB_OK)
            continue;
        *a += strcmp(ps.owner, "cons-a") == 0;
        *bb += strcmp(ps.owner, "cons-b") == 0;
    }
}

/* Two consumer processes sharing the topic, both owning partitions. */
struct pair {
    kb_test_server server;
    kb_bus *producer;
    char topic[64], log[300];
    pid_t a, b;
};

static void pair_start(struct pair *p, const char *name)
{
    assert_int_equal(kb_test_server_start(&p->server, "redis", NULL), 0);
    snprintf(p->topic, sizeof p->topic, "fault.%s.%d", name, (int)getpid());
    snprintf(p->log, sizeof p->log, "%s/handled.log", p->server.dir);
    char err[256];
    p->producer = open_url(p->server.url, err, sizeof err);
    if (p->producer == NULL)
        fail_msg("kb_open: %s", err);
    p->a = spawn_consumer(p->server.url, p->topic, "cons-a", p->log);
    p->b = spawn_consumer(p->server.url, p->topic, "cons-b", p->log);
    int na = 0, nb = 0;
    for (int i = 0; i < 1000 && (na == 0 || nb == 0 || na + nb < 8); i++) {
        usleep(10000);
        owners(p->producer, p->topic, &na, &nb);
    }
    if (na == 0 || nb == 0 || na + nb != 8)
        fail_msg("partitions not shared: cons-a %d, cons-b %d", na, nb);
}

static struct pair cur;        /* the running case's processes, for teardown */
static kb_test_server srv;

/* A failed assertion must not leave servers or consumers running (they would
 * also hold ctest's output pipes open until its timeout). */
static int teardown(void **state)
{
    (void)state;
    pid_t *pids[] = {&cur.a, &cur.b};
    for (int i = 0; i < 2; i++)
        if (*pids[i] > 0) {
            kill(*pids[i], SIGKILL);
            waitpid(*pids[i], NULL, 0);
            *pids[i] = 0;
        }
    if (cur.producer != NULL)
        kb_close(cur.producer, 1000);
    cur.producer = NULL;
    kb_test_server_stop(&cur.server);
    kb_test_server_stop(&srv);
    return 0;
}

static void pair_stop(struct pair *p, struct verdict *v)
{
    *v = wait_log(p->log, (uint64_t)KEYS * PER_KEY);
    kb_topic_stats st;
    kb_assert_ok(kb_stats(p->producer, p->topic, &st));
    fprintf(stderr, "  dead letters %llu, pending %llu\n", (unsigned long long)st.dlq_length,
            (unsigned long long)st.broker_pending);
    for (int i = 0; i < 2; i++) {
        pid_t pid = i == 0 ? p->a : p->b;
        if (pid > 0) {
            kill(pid, SIGTERM);
            int status;
            waitpid(pid, &status, 0);
        }
    }
    p->a = p->b = 0;
    kb_assert_ok(kb_close(p->producer, 5000));
    p->producer = NULL;
    kb_test_server_stop(&p->server);
    fprintf(stderr, "  distinct %llu, duplicates %llu, order violations %llu\n",
            (unsigned long long)v->distinct, (unsigned long long)v->duplicates,
            (unsigned long long)v->violations);
}

static void kill9_consumer_failover(void **state)
{
    (void)state;
    pair_start(&cur, "kill9");
    publish_range(cur.producer, cur.topic, 1, PER_KEY / 2, 2);
    /* mid-stream: consumers are busy (300 us per event) */
    kill(cur.a, SIGKILL);
    waitpid(cur.a, NULL, 0);
    cur.a = 0;
    int64_t killed = now_ms();
    int na = 8, nb = 0;
    while (nb < 8 && now_ms() - killed < TTL_MS + 3000) {
        usleep(20000);
        owners(cur.producer, cur.topic, &na, &nb);
    }
    int64_t took = now_ms() - killed;
    fprintf(stderr, "  cons-b owned all partitions %lld ms after kill -9 (TTL %d ms)\n",
            (long long)took, TTL_MS);
    assert_int_equal(nb, 8);
    assert_true(took <= TTL_MS + 1000);
    publish_range(cur.producer, cur.topic, PER_KEY / 2 + 1, PER_KEY, 0);
    struct verdict v;
    pair_stop(&cur, &v);
    assert_int_equal(v.violations, 0);
    assert_int_equal(v.distinct, (uint64_t)KEYS * PER_KEY);
}

static void sigstop_past_lease(void **state)
{
    (void)state;
    pair_start(&cur, "sigstop");
    publish_range(cur.producer, cur.topic, 1, PER_KEY / 3, 2);
    kill(cur.a, SIGSTOP);
    int64_t stopped = now_ms();
    publish_range(cur.producer, cur.topic, PER_KEY / 3 + 1, 2 * PER_KEY / 3, 0);
    int na = 8, nb = 0;
    while (nb < 8 && now_ms() - stopped < TTL_MS + 3000) {
        usleep(20000);
        owners(cur.producer, cur.topic, &na, &nb);
    }
    assert_int_equal(nb, 8);   /* cons-b took over from the paused process */
    usleep(TTL_MS * 1000);
    long resumed_at = file_size(cur.log);
    kill(cur.a, SIGCONT);        /* it finds its leases gone: no acks, no deliveries */
    publish_range(cur.producer, cur.topic, 2 * PER_KEY / 3 + 1, PER_KEY, 2);
    /* and it gets its share back through a clean hand-over */
    for (int i = 0; i < 1000 && (na == 0 || na + nb != 8); i++) {
        usleep(10000);
        owners(cur.producer, cur.topic, &na, &nb);
    }
    assert_true(na > 0 && na + nb == 8);
    /* Events already in its lanes when the lease went are released unhandled
     * (still_owned): after the resume it handles nothing cons-b handled, except
     * handlers the stop caught between the lease check and their first clock
     * read (flagged '-', not 'p'): at most one per executor of cons-a. */
    wait_log(cur.log, (uint64_t)KEYS * PER_KEY);
    uint64_t redone = shared_by(cur.log, resumed_at, "cons-a");
    struct verdict v;
    pair_stop(&cur, &v);
    fprintf(stderr, "  events cons-a handled after the resume that cons-b handled too: %llu\n",
            (unsigned long long)redone);
    assert_true(redone <= CONSUMER_THREADS);
    assert_int_equal(v.violations, 0);
    assert_int_equal(v.distinct, (uint64_t)KEYS * PER_KEY);
}

/* ---- server faults, one process ---- */

static int slow_tracker(const kb_event *ev, void *opaque)
{
    usleep(50);
    return kb_tracker_handler(ev, opaque);
}

static void wait_tracker(kb_tracker *t, uint64_t n)
{
    for (int i = 0; i < 3000 && kb_tracker_distinct(t) < n; i++)
        usleep(10000);
}

/* A server that survives kill -9 (AOF, appendfsync always) and a bus
 * subscribed to fault.<what>.<pid> with the tracker. */
static kb_bus *durable_server_bus(const char *what, char *topic, size_t len, kb_handler_fn handler,
                                  kb_tracker *t)
{
    const char *extra[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};
    assert_int_equal(kb_test_server_start(&srv, "redis", extra), 0);
    char err[256];
    snprintf(topic, len, "fault.%s.%d", what, (int)getpid());
    kb_bus *b = open_url(srv.url, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open: %s", err);
    kb_tracker_init(t, KEYS);
    kb_assert_ok(kb_subscribe(b, topic, handler, t));
    return b;
}

static void server_killed_and_restarted(void **state)
{
    (void)state;
    char topic[64];
    kb_tracker t;
    kb_bus *b = durable_server_bus("restart", topic, sizeof topic, slow_tracker, &t);
    publish_range(b, topic, 1, PER_KEY / 2, 1);
    kb_test_server_signal(&srv, SIGKILL);
    usleep(300000);
    assert_int_equal(kb_test_server_restart(&srv), 0);
    publish_range(b, topic, PER_KEY / 2 + 1, PER_KEY, 1);
    wait_tracker(&t, (uint64_t)KEYS * PER_KEY);
    kb_assert_ok(kb_close(b, 5000));
    fprintf(stderr, "  distinct %llu, duplicates %llu, order violations %llu\n",
            (unsigned long long)kb_tracker_distinct(&t), (unsigned long long)t.duplicates,
            (unsigned long long)t.order_violations);
    assert_int_equal(kb_tracker_distinct(&t), (uint64_t)KEYS * PER_KEY);
    assert_int_equal(t.order_violations, 0);
    assert_int_equal(t.concurrent, 0);
    kb_tracker_destroy(&t);
    kb_test_server_stop(&srv);
}

/* Publish seq first..last for every key, no flush: what kb_publish accepts
 * must reach the handler (a KB_EFULL is published again, same number). */
static uint64_t publish_unflushed(kb_bus *b, const char *topic, uint32_t first, uint32_t last)
{
    uint64_t full = 0;
    for (uint32_t s = first; s <= last; s++)
        for (uint32_t k = 0; k < KEYS; k++) {
            int rc;
            while ((rc = kb_tracker_publish(b, topic, k, s, 16)) == KB_EFULL)
                full++;
            kb_assert_ok(rc);
        }
    return full;
}

/* kill -9 with publishes written and unconfirmed: the sender writes them
 * again once the server is back (at least once), so nothing accepted is lost
 * and kb_drain succeeds. */
static void server_killed_mid_publish(void **state)
{
    (void)state;
    char topic[64];
    kb_tracker t;
    kb_bus *b = durable_server_bus("midpub", topic, sizeof topic, kb_tracker_handler, &t);
    uint64_t full = publish_unflushed(b, topic, 1, PER_KEY / 2);
    kb_test_server_signal(&srv, SIGKILL);
    full += publish_unflushed(b, topic, PER_KEY / 2 + 1, PER_KEY * 3 / 4);   /* while down */
    int flushed = kb_flush(b, 300);   /* nothing to confirm them: held, not dropped */
    char flush_error[1024];           /* the deadline, then what the transport still holds */
    snprintf(flush_error, sizeof flush_error, "%s", kb_last_error());
    assert_int_equal(kb_test_server_restart(&srv), 0);
    int64_t up = now_ms();
    full += publish_unflushed(b, topic, PER_KEY * 3 / 4 + 1, PER_KEY);
    int drained = kb_drain(b, 60000);
    int64_t took = now_ms() - up;
    int closed = kb_close(b, 5000);
    fprintf(stderr, "  kb_flush while down: %s; drained %lld ms after the restart: %s; closed: "
            "%s%s%s; distinct %llu of %llu, duplicates %llu, order violations %llu, "
            "KB_EFULL %llu\n",
            kb_strerror(flushed), (long long)took, kb_strerror(drained), kb_strerror(closed),
            closed != KB_OK ? ": " : "", closed != KB_OK ? kb_last_error() : "",
            (unsigned long long)kb_tracker_distinct(&t), (unsigned long long)KEYS * PER_KEY,
            (unsigned long long)t.duplicates, (unsigned long long)t.order_violations,
            (unsigned long long)full);
    assert_int_equal(flushed, KB_ETIMEDOUT);
    print_message("  kb_flush while down said: %s\n", flush_error);
    assert_non_null(strstr(flush_error, "kb_flush: 300 ms deadline passed: "));
    assert_non_null(strstr(flush_error, "not yet confirmed by"));
    kb_assert_ok(drained);
    kb_assert_ok(closed);
    assert_int_equal(kb_tracker_distinct(&t), (uint64_t)KEYS * PER_KEY);
    assert_int_equal(t.order_violations, 0);
    assert_int_equal(t.concurrent, 0);
    kb_tracker_destroy(&t);
    kb_test_server_stop(&srv);
}

static void server_down_at_start(void **state)
{
    (void)state;
    assert_int_equal(kb_test_server_start(&srv, "redis", NULL), 0);
    kb_test_server_signal(&srv, SIGKILL);   /* keeps its port and dir */
    char err[256], where[32], topic[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", srv.port);
    snprintf(topic, sizeof topic, "fault.down.%d", (int)getpid());
    kb_bus *b = open_url(srv.url, err, sizeof err);
    assert_null(b);
    assert_non_null(strstr(err, where));
    assert_int_equal(kb_test_server_restart(&srv), 0);
    /* the documented way: kb_open fails fast, the application retries */
    for (int i = 0; i < 50 && b == NULL; i++) {
        b = open_url(srv.url, err, sizeof err);
        if (b == NULL)
            usleep(100000);
    }
    assert_non_null(b);
    kb_tracker t;
    kb_tracker_init(&t, KEYS);
    kb_assert_ok(kb_subscribe(b, topic, kb_tracker_handler, &t));
    publish_range(b, topic, 1, 10, 0);
    wait_tracker(&t, (uint64_t)KEYS * 10);
    kb_assert_ok(kb_close(b, 5000));
    assert_int_equal(kb_tracker_distinct(&t), (uint64_t)KEYS * 10);
    assert_int_equal(t.order_violations, 0);
    kb_tracker_destroy(&t);
    kb_test_server_stop(&srv);
}

struct opener {
    const char *url;
    kb_bus *b;
    char err[256];
};

static void *open_waiting(void *arg)
{
    struct opener *o = arg;
    kb_conf *c = kb_conf_new();
    kb_conf_set(c, "transport", o->url, o->err, sizeof o->err);
    kb_conf_set(c, "redis.connect_timeout_ms", "500", o->err, sizeof o->err);
    kb_conf_set(c, "redis.reconnect_max_ms", "200", o->err, sizeof o->err);
    kb_conf_set(c, "redis.connect_wait_ms", "20000", o->err, sizeof o->err);
    o->b = kb_open(c, o->err, sizeof o->err);
    if (o->b == NULL)
        kb_conf_destroy(c);
    return NULL;
}

/* The server is down when the bus opens: with redis.connect_wait_ms the open
 * waits for it, as nats.connect_wait_ms does; nothing published is lost. */
static void server_down_open_waits(void **state)
{
    (void)state;
    assert_int_equal(kb_test_server_start(&srv, "redis", NULL), 0);
    kb_test_server_signal(&srv, SIGKILL);
    char topic[64];
    snprintf(topic, sizeof topic, "fault.wait.%d", (int)getpid());
    struct opener o = {srv.url, NULL, ""};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, open_waiting, &o), 0);
    usleep(800000);
    assert_int_equal(kb_test_server_restart(&srv), 0);
    pthread_join(th, NULL);
    if (o.b == NULL)
        fail_msg("kb_open: %s", o.err);
    kb_tracker t;
    kb_tracker_init(&t, KEYS);
    kb_assert_ok(kb_subscribe(o.b, topic, kb_tracker_handler, &t));
    publish_range(o.b, topic, 1, 10, 0);
    wait_tracker(&t, (uint64_t)KEYS * 10);
    kb_assert_ok(kb_close(o.b, 5000));
    assert_int_equal(kb_tracker_distinct(&t), (uint64_t)KEYS * 10);
    assert_int_equal(t.order_violations, 0);
    kb_tracker_destroy(&t);
    kb_test_server_stop(&srv);
}

/* ---- a transient refusal among pipelined XADDs ---- */

/* The sender's warnings this file looks for, counted per case (reset by it). */
static atomic_uint said_ahead, said_split;

static void count_said(int level, const char *msg, void *opaque)
{
    (void)opaque;
    if (level > KB_LOG_WARNING)
        return;
    fprintf(stderr, "keybus: %s\n", msg);
    if (strstr(msg, "1 events stored on kb:{refused}:p:0 ahead of an earlier event") != NULL &&
        strstr(msg, "NOREPLICAS") != NULL)
        atomic_fetch_add(&said_ahead, 1);
    else if (strstr(msg, "ahead of an earlier event") != NULL)
        atomic_fetch_add(&said_ahead, 100);   /* any other count: wrong */
    if (strstr(msg, "frames over 1048576 bytes are sent again as entries within it") != NULL)
        atomic_fetch_add(&said_split, 1);
}

static void said_reset(kb_conf *c)
{
    atomic_store(&said_ahead, 0);
    atomic_store(&said_split, 0);
    kb_conf_set_log(c, count_said, NULL);
}

struct later {
    kb_bus *b;
    const char *payload;
};

static void *publish_later(void *arg)
{
    const struct later *l = arg;
    usleep(500000);   /* the proxy is armed by then (the main thread arms it at once) */
    kb_assert_ok(kb_publish(l->b, "refused", "k", 1, l->payload, strlen(l->payload)));
    return NULL;
}

static long long errorstat(redisContext *rc, const char *name)
{
    redisReply *r = redisCommand(rc, "INFO errorstats");
    assert_non_null(r);
    const char *at = r->str != NULL ? strstr(r->str, name) : NULL;
    long long n = at != NULL ? strtoll(at + strlen(name) + strlen(":count="), NULL, 10) : 0;
    freeReplyObject(r);
    return n;
}

/* The payloads of the stream, oldest first, into out (up to max). */
static size_t payloads(redisContext *rc, const char *stream, char out[][16], size_t max)
{
    redisReply *r = redisCommand(rc, "XRANGE %s - +", stream);
    assert_true(r != NULL && r->type == REDIS_REPLY_ARRAY);
    size_t n = 0;
    for (size_t i = 0; i < r->elements && n < max; i++) {
        const redisReply *f = r->element[i]->element[1];
        for (size_t j = 0; j + 1 < f->elements; j += 2)
            if (strcmp(f->element[j]->str, "d") == 0)
                snprintf(out[n++], 16, "%s", f->element[j + 1]->str);
    }
    freeReplyObject(r);
    return n;
}

static size_t first_of(char got[][16], size_t n, const char *payload)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(got[i], payload) == 0)
            return i;
    return n;
}

/* A redis-server, a proxy before it, and a bus through the proxy with one
 * partition and plain entries; an event of `topic` stored, so the
 * connections are up. *rc: a client of the server itself. */
static kb_bus *proxied_bus(const char *topic, const char *reconnect_max_ms, kb_test_proxy **proxy,
                           redisContext **rc)
{
    assert_int_equal(kb_test_server_start(&srv, "redis", NULL), 0);
    *proxy = kb_test_proxy_start(srv.port);
    assert_non_null(*proxy);
    char url[64], err[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", kb_test_proxy_port(*proxy));
    kb_conf *c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "partitions", "1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.publish_batch", "1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.reconnect_min_ms", "1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.reconnect_max_ms", reconnect_max_ms, err, sizeof err));
    said_reset(c);
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open: %s", err);
    *rc = redisConnect("127.0.0.1", srv.port);
    assert_true(*rc != NULL && (*rc)->err == 0);
    kb_assert_ok(kb_publish(b, topic, "k", 1, "before", 6));
    kb_assert_ok(kb_flush(b, 10000));   /* connected, the topic's metadata checked */
    return b;
}

/* "early" reaches the server while it refuses writes (min-replicas-to-write
 * without a replica: NOREPLICAS) and its answer is held on the way back;
 * writes are allowed again, "late" (same key) is written behind it and
 * stored. Redis runs each pipelined command on its own, so late's first
 * copy precedes early: the sender reads the replies still due, counts and
 * logs that, and writes both again in order on a new connection. */
static void transient_refusal_reorder_counted(void **state)
{
    (void)state;
    kb_test_proxy *proxy;
    redisContext *rc;
    kb_bus *b = proxied_bus("refused", "200", &proxy, &rc);

    freeReplyObject(redisCommand(rc, "CONFIG SET min-replicas-to-write 1"));
    struct later early = {b, "early"};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, publish_later, &early), 0);
    assert_int_equal(kb_test_proxy_blackhole_after(proxy, "early", 10000), 0);
    pthread_join(th, NULL);
    kb_wait_until(errorstat(rc, "errorstat_NOREPLICAS") >= 1, 10000, "early refused");
    freeReplyObject(redisCommand(rc, "CONFIG SET min-replicas-to-write 0"));
    /* one XADD awaits its answer: the publisher writes this one at once */
    kb_assert_ok(kb_publish(b, "refused", "k", 1, "late", 4));
    kb_test_proxy_blackhole(proxy, 0);
    kb_assert_ok(kb_flush(b, 10000));

    char got[8][16];
    size_t n = payloads(rc, "kb:{refused}:p:0", got, 8);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "  entry %zu: %s\n", i, got[i]);
    size_t e = first_of(got, n, "early"), l = first_of(got, n, "late");
    assert_true(e < n && l < n);
    assert_true(l < e);   /* the reorder of first copies, as Redis stored them */
    assert_string_equal(got[n - 1], "late");   /* written again after early */
    kb_wait_until(atomic_load(&said_ahead) > 0, 10000, "the reorder logged");
    assert_int_equal(atomic_load(&said_ahead), 1);
    kb_assert_ok(kb_close(b, 5000));
    redisFree(rc);
    kb_test_proxy_stop(proxy);
    kb_test_server_stop(&srv);
}

#define CAREFUL_EVENTS 200
#define CAREFUL_BYTES 600

/* The seq of each entry's payload ("e%03d..."), oldest first. */
static size_t seqs(redisContext *rc, const char *stream, int *out, size_t max)
{
    char(*got)[16] = malloc(max * sizeof *got);
    assert_non_null(got);
    size_t n = 0, all = payloads(rc, stream, got, max);
    for (size_t i = 0; i < all; i++)
        if (got[i][0] == 'e')
            out[n++] = atoi(got[i] + 1);
    free(got);
    return n;
}

/* Writes refused (NOREPLICAS) for a while: the sender retries. Once the
 * server stores again, it must not store a later event of the stream before
 * an earlier one: a retry that pipelined the whole backlog could be cut by
 * the switch (here the proxy holds what follows "e150" while writes are
 * allowed again: all before it refused, all after it stored). After a
 * refusal the sender writes one record at a time until one is stored, so
 * "e150" never goes out while the server refuses, and the first copies
 * stay in publish order. */
static void retries_after_refusal_keep_order(void **state)
{
    (void)state;
    kb_test_proxy *proxy;
    redisContext *rc;
    kb_bus *b = proxied_bus("careful", "50", &proxy, &rc);

    freeReplyObject(redisCommand(rc, "CONFIG SET min-replicas-to-write 1"));
    char pay[CAREFUL_BYTES];
    memset(pay, 'x', sizeof pay);
    snprintf(pay, 5, "e%03d", 0);
    kb_assert_ok(kb_publish(b, "careful", "k", 1, pay, sizeof pay));
    kb_wait_until(errorstat(rc, "errorstat_NOREPLICAS") >= 2, 10000, "retried after a refusal");
    for (int i = 1; i < CAREFUL_EVENTS; i++) {
        snprintf(pay, 5, "e%03d", i);
        pay[4] = 'x';
        kb_assert_ok(kb_publish(b, "careful", "k", 1, pay, sizeof pay));
    }
    /* a retry that writes e150 while refused is cut there (none should) */
    int cut = kb_test_proxy_blackhole_after(proxy, "e150", 3000);
    if (cut == 0)
        usleep(300000);   /* what went before e150 reaches the server, refused */
    freeReplyObject(redisCommand(rc, "CONFIG SET min-replicas-to-write 0"));
    kb_test_proxy_blackhole(proxy, 0);
    kb_assert_ok(kb_flush(b, 20000));

    static int got[4 * CAREFUL_EVENTS];
    size_t n = seqs(rc, "kb:{careful}:p:0", got, 4 * CAREFUL_EVENTS);
    int next = 0;   /* the first copies, in order */
    size_t reordered = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] == next)
            next++;
        else if (got[i] > next)
            reordered++;   /* a first copy ahead of an earlier event */
    fprintf(stderr, "  retry cut at e150: %s; %zu entries, first copies out of order: %zu\n",
            cut == 0 ? "yes" : "no", n, reordered);
    assert_int_equal(next, CAREFUL_EVENTS);
    assert_int_equal(reordered, 0);
    assert_int_equal(atomic_load(&said_ahead), 0);
    kb_assert_ok(kb_close(b, 5000));
    redisFree(rc);
    kb_test_proxy_stop(proxy);
    kb_test_server_stop(&srv);
}

/* ---- frames over a hidden proto-max-bulk-len ---- */

#define SPLIT_EVENTS 18
#define SPLIT_BYTES (200 * 1024)

struct split_seen {
    _Atomic unsigned handled, out_of_order;   /* distinct events; first copies out of order */
    _Atomic unsigned stored, failed, too_big;
    unsigned last;                            /* the newest first copy (one lane: one thread) */
    bool seen[2 * SPLIT_EVENTS + 1];
};

/* At least once: an entry whose reply was lost with the connection comes
 * twice; the first copies must come in publish order. */
static int split_handler(const kb_event *ev, void *opaque)
{
    struct split_seen *s = opaque;
    unsigned seq = (unsigned)strtoul(ev->payload, NULL, 10);
    if (seq > 2 * SPLIT_EVENTS || s->seen[seq])
        return KB_HANDLED;
    s->seen[seq] = true;
    if (seq < s->last)
        atomic_fetch_add(&s->out_of_order, 1);
    s->last = seq;
    atomic_fetch_add(&s->handled, 1);
    return KB_HANDLED;
}

static void split_report(const kb_delivery_report *r, void *opaque)
{
    struct split_seen *s = opaque;
    atomic_fetch_add(r->result == KB_OK ? &s->stored : &s->failed, 1);
    if (r->result == KB_ETOOBIG)
        atomic_fetch_add(&s->too_big, 1);
}

static void publish_seq(kb_bus *b, char *buf, unsigned seq, size_t len)
{
    snprintf(buf, 16, "%08u", seq);
    kb_assert_ok(kb_publish(b, "split", "k", 1, buf, len));
}

/* Events of 200 KiB gather into frames of up to 4 MiB (limits.max_payload_bytes)
 * while the server is stopped; it takes arguments of 1 MiB at most and hides
 * that (CONFIG renamed away), so it drops the connection at the first frame.
 * The frames are sent again as entries within 1 MiB, in order: every event is
 * stored and handled in order but one of 1.5 MiB among them, refused alone
 * (KB_ETOOBIG), which kb_flush counts as 1 publish. */
static void frames_over_hidden_limit_split(void **state)
{
    (void)state;
    const char *hidden[] = {"--proto-max-bulk-len", "1mb", "--rename-command", "CONFIG", "", NULL};
    assert_int_equal(kb_test_server_start(&srv, "redis", hidden), 0);
    static struct split_seen seen;
    memset(&seen, 0, sizeof seen);
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "transport", srv.url, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "partitions", "1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.publish_batch", "64", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.publish_linger_us", "1000000", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "limits.max_payload_bytes", "4194304", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.publish_buffer_bytes", "33554432", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.reconnect_min_ms", "1", err, sizeof err));
    kb_conf_set_delivery_cb(c, split_report, &seen);
    said_reset(c);
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open: %s", err);
    kb_assert_ok(kb_subscribe(b, "split", split_handler, &seen));
    char *buf = calloc(1, 3 * 512 * 1024);
    assert_non_null(buf);
    publish_seq(b, buf, 0, 16);
    kb_assert_ok(kb_flush(b, 10000));   /* connected, the topic's metadata checked */

    kb_test_server_signal(&srv, SIGSTOP);   /* no replies: the frames fill */
    unsigned seq = 1;
    for (; seq <= SPLIT_EVENTS / 2; seq++)
        publish_seq(b, buf, seq, SPLIT_BYTES);
    publish_seq(b, buf, 999999, 3 * 512 * 1024);   /* 1.5 MiB: over the server's limit */
    for (; seq <= SPLIT_EVENTS; seq++)
        publish_seq(b, buf, seq, SPLIT_BYTES);
    kb_test_server_signal(&srv, SIGCONT);
    int flushed = kb_flush(b, 30000);
    fprintf(stderr, "  kb_flush: %s: %s\n", kb_strerror(flushed), kb_last_error());
    assert_int_equal(flushed, KB_ETRANSPORT);
    assert_non_null(strstr(kb_last_error(), "1 publishes to"));   /* events, not entries */
    assert_non_null(strstr(kb_last_error(), "proto-max-bulk-len"));
    kb_wait_until(atomic_load(&seen.handled) == SPLIT_EVENTS + 1, 20000,
                  "every event but the big one handled");
    assert_int_equal(atomic_load(&said_split), 1);
    /* frames stay within the limit from now: gathered again, all stored */
    kb_test_server_signal(&srv, SIGSTOP);
    unsigned last = seq + SPLIT_EVENTS;
    for (; seq < last; seq++)
        publish_seq(b, buf, seq, SPLIT_BYTES);
    kb_test_server_signal(&srv, SIGCONT);
    kb_assert_ok(kb_flush(b, 30000));
    kb_wait_until(atomic_load(&seen.handled) == 2 * SPLIT_EVENTS + 1, 20000, "all handled");
    kb_assert_ok(kb_close(b, 10000));
    fprintf(stderr, "  reports: %u stored, %u failed (%u KB_ETOOBIG); handled %u distinct, first "
            "copies out of order %u\n",
            atomic_load(&seen.stored), atomic_load(&seen.failed), atomic_load(&seen.too_big),
            atomic_load(&seen.handled), atomic_load(&seen.out_of_order));
    assert_int_equal(atomic_load(&seen.out_of_order), 0);
    assert_int_equal(atomic_load(&seen.stored), 2 * SPLIT_EVENTS + 1);
    assert_int_equal(atomic_load(&seen.failed), 1);
    assert_int_equal(atomic_load(&seen.too_big), 1);
    free(buf);
    kb_test_server_stop(&srv);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(kill9_consumer_failover, teardown),
        cmocka_unit_test_teardown(sigstop_past_lease, teardown),
        cmocka_unit_test_teardown(server_killed_and_restarted, teardown),
        cmocka_unit_test_teardown(server_killed_mid_publish, teardown),
        cmocka_unit_test_teardown(server_down_at_start, teardown),
        cmocka_unit_test_teardown(server_down_open_waits, teardown),
        cmocka_unit_test_teardown(transient_refusal_reorder_counted, teardown),
        cmocka_unit_test_teardown(retries_after_refusal_keep_order, teardown),
        cmocka_unit_test_teardown(frames_over_hidden_limit_split, teardown),
    };
    return cmocka_run_group_tests_name("redis_faults", tests, NULL, NULL);
}
