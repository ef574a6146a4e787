/* keybus on a 3-node JetStream cluster (issue 30, NATS half): R3 topic
 * streams and lease bucket (nats.replicas = 3), the URL naming all three
 * seeds. kill -9 of the stream leader mid-stream, then its restart: every
 * event kb_flush acknowledged is handled, kb_drain returns, no per-key order
 * violation, duplicates counted and printed; kill -9 of a node that leads
 * only consumers: every event handled, no reorder, the consumers' messages
 * read from the stream until they have leaders again (the longest pause of
 * one key printed); the lease bucket's leader
 * lost under two consumer processes: ownership of each key moves a bounded
 * number of times (the fence holds). A stream with other replicas is
 * refused, naming both counts.
 * Usage: test_nats_cluster PATH_TO_nats_consumer_proc */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
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

#include "support/bus.h"
#include "support/check.h"
#include "support/nats_cluster.h"
#include "support/suite.h"
#include "support/tracker.h"

#define KEYS 20
#define MAX_SEQ 300

static const char *helper;
static kb_test_nats_cluster cluster;
static const char *const replicas3[] = {"nats.replicas", "3", "nats.publish_timeout_ms", "1000",
                                        NULL};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void publish_ok(kb_bus *b, const char *topic, uint32_t key, uint32_t seq)
{
    int rc;
    for (int i = 0; (rc = kb_tracker_publish(b, topic, key, seq, 16)) == KB_EFULL && i < 3000; i++)
        usleep(10000);
    kb_assert_ok(rc);
}

/* kb_flush until it confirms everything (a leader election can make one time
 * out); the last rc. */
static int flush_all(kb_bus *b)
{
    int rc = KB_ETIMEDOUT;
    for (int i = 0; i < 4 && (rc = kb_flush(b, 15000)) == KB_ETIMEDOUT; i++)
        ;
    if (rc != KB_OK)
        print_message("kb_flush: %d %s\n", rc, kb_last_error());
    return rc;
}

static pid_t spawn(const char *topic, const char *log, const char *name, const char *ttl)
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv("KEYBUS_NATS_REPLICAS", "3", 1);   /* the helper takes it from there */
        execl(helper, helper, cluster.url, topic, log, name, ttl, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void stop_proc(pid_t pid)
{
    kill(pid, SIGTERM);
    for (int i = 0; i < 1500 && waitpid(pid, NULL, WNOHANG) != pid; i++)
        usleep(10000);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

typedef struct tally {
    uint64_t distinct, dups, violations, switches, lines;
    uint64_t by_b;           /* lines of proc-b, the process that joins second */
    uint64_t unseen;         /* sequences 1..per_key of a key never handled at all */
    uint32_t max_switches;   /* of one key */
} tally;

/* Replay the shared log (nats_consumer_proc's lines): per key a sequence is new
 * (last + 1), a duplicate (<= last) or a violation (a gap); a switch is a new
 * sequence handled by another process than the one before it. */
static void check_log(const char *path, uint32_t per_key, tally *out)
{
    uint32_t last[KEYS] = {0}, sw[KEYS] = {0};
    static bool seen[KEYS][MAX_SEQ + 1];
    memset(seen, 0, sizeof seen);
    char owner[KEYS][32];
    memset(owner, 0, sizeof owner);
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    unsigned k, seq, attempt;
    char who[32], line[200];
    /* a line is "key seq consumer attempt delivery-id": read whole lines */
    while (f != NULL && fgets(line, sizeof line, f) != NULL &&
           sscanf(line, "%u %u %31s %u", &k, &seq, who, &attempt) == 4) {
        out->lines++;
        out->by_b += strcmp(who, "proc-b") == 0;
        if (k < KEYS && seq <= MAX_SEQ)
            seen[k][seq] = true;
        if (k >= KEYS) {
            out->violations++;
        } else if (seq == last[k] + 1) {
            last[k] = seq;
            out->distinct++;
            if (owner[k][0] && strcmp(owner[k], who) != 0)
                sw[k]++;
            snprintf(owner[k], sizeof owner[k], "%s", who);
        } else if (seq <= last[k]) {
            out->dups++;
        } else {
            out->violations++;
        }
    }
    if (f != NULL)
        fclose(f);
    for (int i = 0; i < KEYS; i++) {
        for (uint32_t q = 1; q <= per_key && q <= MAX_SEQ; q++)
            out->unseen += !seen[i][q];
        out->switches += sw[i];
        if (sw[i] > out->max_switches)
            out->max_switches = sw[i];
    }
}

/* Until every sequence of every key was handled at least once, up to 120 s:
 * after a leader's kill the leases come back only once the KV bucket has a
 * leader again, which under ThreadSanitizer and load took over 40 s. */
static void wait_log(const char *log, uint32_t per_key, tally *t)
{
    for (int i = 0; i < 1200; i++) {
        check_log(log, per_key, t);
        if (t->unseen == 0)
            return;
        usleep(100000);
    }
}

/* proc-a and proc-b consuming `topic` into `log`, lease TTL 3 s; the first
 * round of events published. proc-b joins once proc-a handles events, so the
 * stream exists and proc-a owns partitions first. */
static void two_consumers(kb_bus *b, const char *topic, const char *log, pid_t *a, pid_t *c)
{
    *a = spawn(topic, log, "proc-a", "3000");
    for (uint32_t k = 0; k < KEYS; k++)
        publish_ok(b, topic, k, 1);
    kb_assert_ok(flush_all(b));
    tally t = {0};
    for (int i = 0; i < 3000 && t.distinct == 0; i++, usleep(10000))
        check_log(log, 1, &t);
    *c = spawn(topic, log, "proc-b", "3000");
}

/* Publish PER_KEY rounds of KEYS events; at round `kill_at` kill -9 `victim`
 * (-1: the topic's stream leader), restart it at round `restart_at`. The
 * node killed. */
static int produce(kb_bus *b, const char *topic, int per_key, int kill_at, int restart_at,
                   int victim, double *killed_at)
{
    char stream[256];
    kb_test_nats_stream(topic, stream, sizeof stream);
    for (int seq = 1; seq <= per_key; seq++) {
        for (uint32_t k = 0; k < KEYS; k++)
            publish_ok(b, topic, k, (uint32_t)seq);
        if (seq == kill_at) {
            if (victim < 0)
                victim = kb_test_nats_cluster_leader(&cluster, stream);
            assert_in_range(victim, 0, KB_TEST_CLUSTER_NODES - 1);
            kb_test_server_signal(&cluster.node[victim], SIGKILL);
            *killed_at = now_s();
        }
        if (seq == restart_at)
            assert_int_equal(kb_test_nats_cluster_restart(&cluster, victim), 0);
        usleep(5000);
    }
    return victim;
}

/* The stream leader killed mid-stream under two consumer processes, then
 * restarted: nothing kb_flush confirmed is lost; keys out of order counted. */
static void stream_leader_killed(void **state)
{
    (void)state;
    const char *topic = "cluster.leader";
    char log[300];
    snprintf(log, sizeof log, "%s/leader.log", cluster.node[0].dir);
    kb_bus *b = kb_test_open(cluster.url, replicas3, NULL);
    pid_t a, c;
    two_consumers(b, topic, log, &a, &c);
    tally t = {0};
    char stream[256];
    kb_test_nats_stream(topic, stream, sizeof stream);
    double killed_at = 0;
    int leader = produce(b, topic, 200, 60, 160, -1, &killed_at);
    int rc = flush_all(b);
    /* the group's ack floors, read from the consumers' (new) leaders */
    double d0 = now_s();
    int drc = kb_drain(b, 60000);
    print_message("kb_drain after the leader's restart: %d in %.2f s%s%s\n", drc, now_s() - d0,
                  drc != KB_OK ? ": " : "", drc != KB_OK ? kb_last_error() : "");
    wait_log(log, 200, &t);
    int after = kb_test_nats_cluster_leader(&cluster, stream);
    stop_proc(a);
    stop_proc(c);
    kb_assert_ok(kb_close(b, 10000));
    check_log(log, 200, &t);
    print_message("stream leader n%d killed -9 mid-stream, restarted (leader now n%d): %llu "
                  "distinct of %d, %llu duplicates, %llu order violations (%llu never handled), %llu "
                  "owner switches, %llu of %llu handlings by proc-b\n",
                  leader, after, (unsigned long long)t.distinct, KEYS * 200,
                  (unsigned long long)t.dups, (unsigned long long)t.violations,
                  (unsigned long long)t.unseen, (unsigned long long)t.switches,
                  (unsigned long long)t.by_b, (unsigned long long)t.lines);
    kb_assert_ok(rc);
    kb_assert_ok(drc);
    /* t.by_b is printed, not asserted: under ThreadSanitizer proc-b has
     * been seen to get no partition before the events ran out */
    assert_int_equal(t.unseen, 0);
    /* a publish lost with the leader and sent again is stored before any
     * newer one of its partition (nats_batch.c, one unconfirmed) */
    assert_int_equal(t.violations, 0);
}

typedef struct gap_watch {
    kb_tracker tr;
    pthread_mutex_t mu;
    double last, max_gap, max_gap_at;
    double key_last[KEYS], key_gap;   /* the longest pause of one key */
} gap_watch;

static int gap_handler(const kb_event *ev, void *opaque)
{
    gap_watch *g = opaque;
    double now = now_s();
    uint32_t key = 0, seq = 0;
    kb_tracker_decode(ev, &key, &seq);
    pthread_mutex_lock(&g->mu);
    if (g->last > 0 && now - g->last > g->max_gap) {
        g->max_gap = now - g->last;
        g->max_gap_at = g->last;
    }
    g->last = now;
    if (key < KEYS) {
        if (g->key_last[key] > 0 && now - g->key_last[key] > g->key_gap)
            g->key_gap = now - g->key_last[key];
        g->key_last[key] = now;
    }
    pthread_mutex_unlock(&g->mu);
    return kb_tracker_handler(ev, &g->tr);
}

static _Atomic int bridges;

static void count_bridges(int level, const char *msg, void *opaque)
{
    (void)level;
    (void)opaque;
    if (strstr(msg, "is read from the stream until it does") != NULL)
        atomic_fetch_add(&bridges, 1);
    fprintf(stderr, "%.3f keybus: %s\n", now_s(), msg);   /* the timeline, when it fails */
}

/* The node leading consumer `name` of `stream` (-1: unknown), asked on nc. */
static int consumer_leader(jsCtx *js, const char *stream, const char *name)
{
    jsConsumerInfo *ci = NULL;
    int leader = -1;
    if (js_GetConsumerInfo(&ci, js, stream, name, NULL, NULL) == NATS_OK && ci->Cluster != NULL)
        leader = kb_test_nats_cluster_index(ci->Cluster->Leader);
    jsConsumerInfo_Destroy(ci);
    return leader;
}

/* A node that leads one of the stream's consumers but neither the stream nor
 * the lease bucket: consumers led elsewhere are stepped down (their group
 * elects a random other member) until one lands there; -1 if none did. */
static int consumer_only_leader(const char *stream, int stream_leader, int bucket_leader)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    int found = -1;
    if (natsConnection_ConnectTo(&nc, cluster.node[stream_leader].url) != NATS_OK ||
        natsConnection_JetStream(&js, nc, NULL) != NATS_OK)
        found = -2;
    for (int tries = 0; found == -1 && tries < 40; tries++) {
        jsConsumerNamesList *l = NULL;
        if (js_ConsumerNames(&l, js, stream, NULL, NULL) != NATS_OK)
            break;
        const char *other = NULL;
        for (int i = 0; i < l->Count && found < 0; i++) {
            int leader = consumer_leader(js, stream, l->List[i]);
            if (leader >= 0 && leader != stream_leader && leader != bucket_leader)
                found = leader;
            else if (leader >= 0 && other == NULL)
                other = l->List[i];
        }
        if (found < 0 && other != NULL) {
            char api[300];
            natsMsg *r = NULL;
            snprintf(api, sizeof api, "$JS.API.CONSUMER.LEADER.STEPDOWN.%s.%s", stream, other);
            natsConnection_RequestString(&r, nc, api, "", 5000);
            natsMsg_Destroy(r);
            usleep(500000);
        }
        jsConsumerNamesList_Destroy(l);
    }
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return found < 0 ? -1 : found;
}

/* A node that leads some of the topic's consumers, but neither its stream nor
 * the lease bucket, killed -9 while events flow: until their groups elect new
 * leaders (seconds) those consumers deliver nothing, and the feeder reads
 * their messages from the stream meanwhile (the bridge; a log line says so).
 * Every event handled, in order; the longest pause of one key printed. With
 * `per_partition` a consumer per partition (as with several members), else
 * a lone member's one consumer for the topic. */
static void consumer_leader_killed(const char *topic, bool per_partition)
{
    static const char *const partitions[] = {"nats.topic_consumer", "off", NULL};
    kb_conf *conf = kb_test_conf(cluster.url, replicas3, per_partition ? partitions : NULL);
    kb_conf_set_log(conf, count_bridges, NULL);
    kb_bus *b = kb_test_open_conf(conf);
    gap_watch g = {0};
    kb_tracker_init(&g.tr, KEYS);
    pthread_mutex_init(&g.mu, NULL);
    kb_assert_ok(kb_subscribe(b, topic, gap_handler, &g));
    for (uint32_t k = 0; k < KEYS; k++)
        publish_ok(b, topic, k, 1);
    kb_assert_ok(flush_all(b));
    for (int i = 0; i < 3000 && kb_tracker_distinct(&g.tr) < KEYS; i++)
        usleep(10000);   /* every partition claimed: its consumer exists */
    char stream[256];
    kb_test_nats_stream(topic, stream, sizeof stream);
    int leader = kb_test_nats_cluster_leader(&cluster, stream);
    assert_in_range(leader, 0, KB_TEST_CLUSTER_NODES - 1);
    int bucket = kb_test_nats_cluster_leader(&cluster, "KV_keybus_leases");
    int victim = consumer_only_leader(stream, leader, bucket);
    assert_in_range(victim, 0, KB_TEST_CLUSTER_NODES - 1);
    double killed_at = 0;
    pthread_mutex_lock(&g.mu);
    g.last = 0;
    g.max_gap = 0;
    memset(g.key_last, 0, sizeof g.key_last);
    g.key_gap = 0;
    pthread_mutex_unlock(&g.mu);
    atomic_store(&bridges, 0);
    /* 300 rounds at 5 ms: about 2 s of production, the kill at a third */
    for (int seq = 2; seq <= 300; seq++) {
        for (uint32_t k = 0; k < KEYS; k++)
            publish_ok(b, topic, k, (uint32_t)seq);
        if (seq == 100) {
            kb_test_server_signal(&cluster.node[victim], SIGKILL);
            killed_at = now_s();
        }
        usleep(5000);
    }
    int rc = flush_all(b);
    /* a liveness bound, as wait_log's: elections and the claims' return
     * under ThreadSanitizer and load */
    for (int i = 0; i < 12000 && kb_tracker_distinct(&g.tr) < KEYS * 300; i++)
        usleep(10000);
    /* what the bridge read is acked once the consumers deliver it (a
     * liveness bound: their elections, or AckWait's redelivery) */
    double drain_at = now_s();
    int drc = kb_drain(b, 120000);
    double drain_s = now_s() - drain_at;
    kb_assert_ok(kb_close(b, 10000));
    uint64_t handled = kb_tracker_distinct(&g.tr);
    if (handled < KEYS * 300 && now_s() - g.last > g.max_gap) {   /* still stalled */
        g.max_gap = now_s() - g.last;
        g.max_gap_at = g.last;
    }
    print_message("%s: consumer-only leader n%d killed -9 (stream leader n%d, bucket leader "
                  "n%d): longest pause in handling %.3f s (began %+.3f s from the kill), of one key "
                  "%.3f s; %d partitions bridged; %llu of %d handled within 120 s of the flush, "
                  "%llu duplicates; kb_drain %d in %.2f s\n", topic, victim, leader, bucket, g.max_gap,
                  g.max_gap_at - killed_at, g.key_gap, atomic_load(&bridges), (unsigned long long)handled, KEYS * 300,
                  (unsigned long long)g.tr.duplicates, drc, drain_s);
    uint64_t violations = g.tr.order_violations, concurrent = g.tr.concurrent;
    kb_tracker_destroy(&g.tr);
    pthread_mutex_destroy(&g.mu);
    assert_int_equal(kb_test_nats_cluster_restart(&cluster, victim), 0);
    kb_assert_ok(rc);
    assert_int_equal(handled, KEYS * 300);
    assert_int_equal(violations, 0);
    assert_int_equal(concurrent, 0);
    assert_true(atomic_load(&bridges) > 0);   /* its consumers were read around */
    kb_assert_ok(drc);
    /* Liveness, not a timing claim: handling resumes within the 120 s wait.
     * The killed node's consumer leaders are elected again (seconds in
     * nats-server 2.9); when it led the lease bucket the leases run out and
     * come back with new consumers from the ack floor: 0-9 s seen plain,
     * 58 s once under ASan with a CI run beside it. */
    assert_true(g.max_gap < 110.0);
}

static void consumer_leader_killed_wide(void **state)
{
    (void)state;
    consumer_leader_killed("cluster.follower", false);
}

static void consumer_leader_killed_per_partition(void **state)
{
    (void)state;
    consumer_leader_killed("cluster.follower2", true);
}

/* The lease bucket's leader killed under two consumer processes: no key is
 * handled by both in turn beyond a few hand-overs (a fence that failed would
 * alternate owners event by event), nothing lost, no reorder. */
static void lease_leader_killed(void **state)
{
    (void)state;
    const char *topic = "cluster.lease";
    char log[300];
    snprintf(log, sizeof log, "%s/lease.log", cluster.node[0].dir);
    kb_bus *b = kb_test_open(cluster.url, replicas3, NULL);
    pid_t a, c;
    two_consumers(b, topic, log, &a, &c);
    tally t = {0};
    int bucket_leader = kb_test_nats_cluster_leader(&cluster, "KV_keybus_leases");
    char stream[256];
    kb_test_nats_stream(topic, stream, sizeof stream);
    int topic_leader = kb_test_nats_cluster_leader(&cluster, stream);
    double killed_at = 0;
    produce(b, topic, 200, 60, 160, bucket_leader, &killed_at);
    int rc = flush_all(b);
    wait_log(log, 200, &t);
    stop_proc(a);
    stop_proc(c);
    kb_assert_ok(kb_close(b, 10000));
    check_log(log, 200, &t);
    print_message("lease bucket leader n%d killed -9 (topic stream leader n%d), restarted: %llu "
                  "distinct, %llu duplicates, %llu order violations, %llu owner switches over "
                  "%d keys (at most %u for one key), %llu of %llu handlings by proc-b\n",
                  bucket_leader, topic_leader, (unsigned long long)t.distinct,
                  (unsigned long long)t.dups, (unsigned long long)t.violations,
                  (unsigned long long)t.switches, KEYS, t.max_switches,
                  (unsigned long long)t.by_b, (unsigned long long)t.lines);
    kb_assert_ok(rc);
    assert_int_equal(t.unseen, 0);
    if (bucket_leader != topic_leader)   /* else the stream leader's loss, as above */
        assert_int_equal(t.violations, 0);
    /* proc-b's arrival, a lease lost in the election and its return: a few
     * hand-overs per key, not owners alternating */
    assert_true(t.max_switches <= 6);
}

/* A topic whose stream has another replica count is refused, naming both,
 * and the stream is left as it is. */
static void replicas_mismatch_named(void **state)
{
    (void)state;
    const char *topic = "cluster.mismatch";
    kb_bus *b1 = kb_test_open(cluster.url, NULL, NULL);   /* nats.replicas = 1 */
    kb_assert_ok(kb_tracker_publish(b1, topic, 0, 1, 16));
    kb_assert_ok(flush_all(b1));
    kb_assert_ok(kb_close(b1, 10000));
    kb_bus *b3 = kb_test_open(cluster.url, replicas3, NULL);
    assert_int_equal(kb_tracker_publish(b3, topic, 0, 2, 16), KB_EINVAL);
    const char *why = kb_last_error();
    print_message("%s\n", why);
    assert_non_null(strstr(why, "replicas=1"));
    assert_non_null(strstr(why, "nats.replicas=3"));
    kb_assert_ok(kb_close(b3, 10000));
    char stream[256];
    kb_test_nats_stream(topic, stream, sizeof stream);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, cluster.node[0].url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(js_GetStreamInfo(&si, js, stream, NULL, NULL), NATS_OK);
    assert_int_equal(si->Config->Replicas, 1);
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

static int setup(void **state)
{
    (void)state;
    return kb_test_nats_cluster_start(&cluster);
}

static int teardown(void **state)
{
    (void)state;
    kb_test_nats_cluster_stop(&cluster);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    helper = argv[1];
    if (argc > 2)
        cmocka_set_test_filter(argv[2]);   /* one test by name, by hand */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(replicas_mismatch_named),
        cmocka_unit_test(stream_leader_killed),
        cmocka_unit_test(consumer_leader_killed_wide),
        cmocka_unit_test(consumer_leader_killed_per_partition),
        cmocka_unit_test(lease_leader_killed),
    };
    int rc = cmocka_run_group_tests_name("nats_cluster", tests, setup, teardown);
    nats_Close();
    return rc;
}
