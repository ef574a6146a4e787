/* A consumer with a stable name (consumer = fixed-c) killed -9 and restarted
 * again and again, while a producer runs and then while the topic is idle: no
 * event lost, per-key order kept, duplicates bounded per restart (not a replay
 * of the stream), and none dead-lettered: attempts are handler runs, and the
 * handler never fails (a duplicate whose first run completed carries attempt 1).
 * Usage: test_nats_restart PATH_TO_nats_consumer_proc. KB_TEST_RESTART_PATTERN=issue
 * runs issue 19's pattern (2,000 events/s for 30 s, 20 restarts) and prints the
 * figures docs/transports-nats.md quotes; KB_TEST_RESTART_NAMES=unique gives each
 * incarnation its own consumer name (the default host-pid behaviour). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/check.h"
#include "support/server.h"
#include "support/tracker.h"

#define TOPIC "restart.fixed"
#define KEYS 100
static int per_tick = 10;      /* events per 10 ms tick: 1,000 events/s */
static int ticks = 1000;       /* 10 s of production */
static int busy_restarts = 8;  /* at 0.6-1.6 s intervals while producing */
#define IDLE_RESTARTS 3        /* once everything is handled */
#define PARTITIONS 8
/* Handled but not yet acked when killed: ack_interval_ms worth of events per
 * owned partition, plus what the executors were running. Far below one
 * replay of the stream (10,000 events by default). */
#define DUPS_PER_RESTART 250

static const char *helper;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static bool unique_names;

static pid_t spawn(const char *url, const char *log)
{
    static int incarnation;
    char name[32];
    snprintf(name, sizeof name, unique_names ? "c-%d" : "fixed-c", ++incarnation);
    pid_t pid = fork();
    if (pid == 0) {
        execl(helper, helper, url, TOPIC, log, name, "10000", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void kill9(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

typedef struct tally {
    uint64_t distinct, dups, violations, dups_first_attempt;
} tally;

/* Replay the shared log "key seq consumer attempt id": per key a sequence is new
 * (last + 1), a duplicate (<= last) or a violation (a gap). */
static void check_log(const char *path, tally *out)
{
    uint32_t last[KEYS] = {0};
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    unsigned k, seq, attempt;
    char who[32];
    while (f != NULL && fscanf(f, "%u %u %31s %u %*s", &k, &seq, who, &attempt) == 4) {
        if (k >= KEYS) {
            out->violations++;
        } else if (seq == last[k] + 1) {
            last[k] = seq;
            out->distinct++;
        } else if (seq <= last[k]) {
            out->dups++;
            out->dups_first_attempt += attempt < 2;
        } else {
            out->violations++;
        }
    }
    if (f != NULL)
        fclose(f);
}

static void wait_handled(const char *log, uint64_t n, tally *t)
{
    for (int i = 0; i < 6000; i++) {
        check_log(log, t);
        if (t->distinct >= n)
            return;
        usleep(10000);
    }
}

/* Consumers of the stream, as one string of names. */
static void consumer_names(jsCtx *js, const char *stream, char *buf, size_t len, int *count)
{
    jsConsumerInfoList *l = NULL;
    buf[0] = '\0';
    *count = 0;
    if (js_Consumers(&l, js, stream, NULL, NULL) != NATS_OK)
        return;
    for (int i = 0; i < l->Count; i++) {
        size_t o = strlen(buf);
        snprintf(buf + o, len - o, "|%s|", l->List[i]->Name);
        (*count)++;
    }
    jsConsumerInfoList_Destroy(l);
}

/* Do the consumers (count n, names as consumer_names gives them) cover every
 * partition: one per partition, or one wide consumer (<group>_w_<rev>) for
 * the topic, which a lone process takes (docs/transports-nats.md)? */
static bool cover_all(const char *names, int n)
{
    return n == PARTITIONS || (n == 1 && strstr(names, "_w_") != NULL);
}

/* Until every event on the stream was delivered and acked. */
static void wait_acked(jsCtx *js, const char *stream)
{
    for (int i = 0; i < 6000; i++) {
        char names[4096];
        int n = 0;
        consumer_names(js, stream, names, sizeof names, &n);
        jsConsumerInfoList *l = NULL;
        bool done = cover_all(names, n) && js_Consumers(&l, js, stream, NULL, NULL) == NATS_OK;
        for (int j = 0; done && j < l->Count; j++)
            done = l->List[j]->NumPending == 0 && l->List[j]->NumAckPending == 0;
        jsConsumerInfoList_Destroy(l);
        if (done)
            return;
        usleep(10000);
    }
    fail_msg("%s not fully acked", stream);
}

/* Until every partition has a consumer created after `before` was taken. */
static void wait_new_claims(jsCtx *js, const char *stream, const char *before)
{
    char now[4096];
    for (int i = 0; i < 3000; i++) {
        int n = 0;
        consumer_names(js, stream, now, sizeof now, &n);
        bool fresh = cover_all(now, n);
        for (char *p = now; fresh && (p = strchr(p, '|')) != NULL;) {
            char *end = strchr(p + 1, '|');
            char name[160];
            snprintf(name, sizeof name, "%.*s", (int)(end - p + 1), p);
            fresh = strstr(before, name) == NULL;
            p = end + 1;
        }
        if (fresh)
            return;
        usleep(10000);
    }
    fail_msg("no new consumers on %s", stream);
}

static void stable_name_restarts(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    char log[300], err[256], stream[64];
    snprintf(log, sizeof log, "%s/handled.log", s.dir);
    snprintf(stream, sizeof stream, "KB_restart_fixed_%08x", kb_fnv1a32(TOPIC, strlen(TOPIC)));
    kb_conf *c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "transport", s.url, err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, s.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);

    srand(19);
    pid_t consumer = spawn(s.url, log);
    int next_kill = 60 + rand() % 101, restarts = 0;
    uint32_t seq = 0;
    for (int tick = 0; tick < ticks; tick++) {
        for (int i = 0; i < per_tick; i++) {
            uint32_t k = (uint32_t)(tick * per_tick + i) % KEYS;
            if (k == 0)
                seq++;
            int rc;
            for (int tries = 0; (rc = kb_tracker_publish(b, TOPIC, k, seq, 16)) == KB_EFULL &&
                                tries < 1000; tries++)
                usleep(1000);
            kb_assert_ok(rc);
        }
        if (tick == next_kill && restarts < busy_restarts) {
            kill9(consumer);
            consumer = spawn(s.url, log);
            restarts++;
            next_kill = tick + 60 + rand() % 101;
        }
        usleep(10000);
    }
    kb_assert_ok(kb_flush(b, 30000));
    uint64_t total = (uint64_t)ticks * per_tick;
    tally t;
    double produced = now_s();
    wait_handled(log, total, &t);
    double drained = now_s() - produced;
    /* Idle: each incarnation claims every partition, handles nothing new,
     * acks nothing, and is killed. */
    for (int i = 0; i < IDLE_RESTARTS; i++) {
        wait_handled(log, total, &t);
        wait_acked(js, stream);
        char before[4096];
        int n = 0;
        consumer_names(js, stream, before, sizeof before, &n);
        kill9(consumer);
        consumer = spawn(s.url, log);
        wait_new_claims(js, stream, before);
        restarts++;
    }
    wait_handled(log, total, &t);
    wait_acked(js, stream);
    kill(consumer, SIGTERM);
    int status = 0;
    waitpid(consumer, &status, 0);
    check_log(log, &t);
    print_message("%d restarts: %llu distinct, %llu duplicates (%llu with attempt 1), "
                  "%llu violations; backlog at the end of production drained in %.2f s\n",
                  restarts, (unsigned long long)t.distinct, (unsigned long long)t.dups,
                  (unsigned long long)t.dups_first_attempt, (unsigned long long)t.violations,
                  drained);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(restarts, busy_restarts + IDLE_RESTARTS);
    assert_int_equal(t.distinct, total);
    assert_int_equal(t.violations, 0);
    assert_true(t.dups <= (uint64_t)restarts * DUPS_PER_RESTART);
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, TOPIC, &st));
    assert_int_equal(st.dlq_length, 0);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    kb_assert_ok(kb_close(b, 10000));
    kb_test_server_stop(&s);
}

int main(int argc, char **argv)
{
    /* A lone member reads the topic through one wide consumer; a restart
     * starts at the topic's floor but skips what the server shows acked
     * above it (docs/transports-nats.md, "Replay"), so the same bound holds
     * as with a consumer per partition (KB_TEST_RESTART_CONSUMER=off). */
    const char *mode = getenv("KB_TEST_RESTART_CONSUMER");
    setenv("KEYBUS_NATS_TOPIC_CONSUMER", mode != NULL ? mode : "auto", 1);
    if (argc < 2)
        return 2;
    helper = argv[1];
    const char *pattern = getenv("KB_TEST_RESTART_PATTERN");
    if (pattern != NULL && strcmp(pattern, "issue") == 0) {
        per_tick = 20;
        ticks = 3000;
        busy_restarts = 20;
    }
    const char *names = getenv("KB_TEST_RESTART_NAMES");
    unique_names = names != NULL && strcmp(names, "unique") == 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stable_name_restarts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
