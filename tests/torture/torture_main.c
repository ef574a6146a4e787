/* keybus-torture: N consumer processes (torture_consumer), a paced producer
 * (a thread here) and a nemesis that follows a schedule drawn from --seed,
 * against real servers started here (a 3-node NATS JetStream cluster, or one
 * redis-server with appendfsync always), every client connected through a
 * proxy per node (tests/support/proxy.c) that can cut it. Then the checker
 * (torture_check.c) over the recorded history. docs/testing.md, "Torture". */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/nats_cluster.h"
#include "support/proxy.h"
#include "support/server.h"
#include "support/tracker.h"
#include "torture.h"

typedef struct opts {
    const char *broker, *dir, *check, *consumer;
    uint64_t seed;
    int have_seed, have_max_pause, json, keep, plan_only;
    int duration_s, warmup_s, drain_s, consumers, max_consumers, rate, lease_ttl_ms;
    int min_gap_ms, max_gap_ms;
    kb_torture_params p;
} opts;

/* The slots of consumer processes. */
typedef struct slot {
    pid_t pid;           /* 0: none */
    int incarnation;
    int wanted;          /* the plan has it up: restart it when it dies on its own */
    int64_t respawn_at;  /* mono ns; 0: none due */
} slot;

static opts o = {
    .consumer = KB_TORTURE_CONSUMER,
    .duration_s = 60, .warmup_s = 3, .drain_s = 60, .consumers = 3, .max_consumers = 0,
    .rate = 500, .lease_ttl_ms = 2000, .min_gap_ms = 2000, .max_gap_ms = 6000,
    .p = {.partitions = 4, .keys = 64, .max_ack_pending = 4096, .publish_batch = 64,
          .ack_interval_ms = 2, .rtt_ms = 100, .max_pause_ms = 150000},
};

static char dir[4096];
static const char *kv[32];          /* the bus configuration of every process */
static char kv_buf[8][4200];
static slot slots[KB_TORTURE_MAX_SLOTS];
static pid_t stopping[256];         /* SIGTERMed, not yet reaped */
static FILE *nemesis_log;

/* ---- the producer ---- */

static FILE *producer_log;
static atomic_int producer_stop;
static int64_t window_start;

static void on_report(const kb_delivery_report *r, void *opaque)
{
    (void)opaque;
    unsigned key = 0;
    char k[32];
    size_t n = r->key_len < sizeof k - 1 ? r->key_len : sizeof k - 1;
    memcpy(k, r->key, n);
    k[n] = '\0';
    if (sscanf(k, "agg-%u", &key) == 1)
        fprintf(producer_log, "D %lld %u %d\n", (long long)kb_torture_mono_ns(), key, r->result);
}

static void *produce(void *arg)
{
    kb_bus *b = arg;
    uint32_t *next = calloc(o.p.keys, sizeof *next);
    if (next == NULL)
        return NULL;
    for (uint32_t k = 0; k < o.p.keys; k++)
        next[k] = 1;
    uint64_t rs = o.p.seed ^ 0x70726f6475636572ULL, sent = 0, accepted = 0;
    uint32_t key = (uint32_t)(kb_torture_rand(&rs) % o.p.keys);
    window_start = kb_torture_mono_ns();
    struct timespec nap = {0, 2000000};
    while (!atomic_load(&producer_stop)) {
        uint64_t due = (uint64_t)((kb_torture_mono_ns() - window_start) / 1000000) *
                       (uint64_t)o.rate / 1000;
        if (due > sent + (uint64_t)o.rate)
            sent = due - (uint64_t)o.rate;   /* after an outage: catch up one second, no more */
        while (sent < due && !atomic_load(&producer_stop)) {
            int rc = kb_tracker_publish(b, KB_TORTURE_TOPIC, key, next[key], 16);
            fprintf(producer_log, "P %lld %u %u %d\n", (long long)kb_torture_mono_ns(), key,
                    next[key], rc);
            if (rc != KB_OK)
                break;   /* the same event again next turn: a key's seqs have no holes */
            next[key]++;
            sent++;
            accepted++;
            key = (uint32_t)(kb_torture_rand(&rs) % o.p.keys);
        }
        nanosleep(&nap, NULL);
    }
    int64_t window_end = kb_torture_mono_ns();
    fprintf(stderr, "torture: producer stopped after %" PRIu64 " events; kb_flush, kb_drain (up to %d s)\n",
            accepted, o.drain_s);
    int flush_rc = kb_flush(b, 30000);
    int drain_rc = kb_drain(b, o.drain_s * 1000);
    fprintf(stderr, "torture: kb_flush %s, kb_drain %s after %.1f s\n", kb_strerror(flush_rc),
            kb_strerror(drain_rc), (double)(kb_torture_mono_ns() - window_end) / 1e9);
    fprintf(producer_log, "W %lld %lld %d %d %lld\n", (long long)window_start,
            (long long)window_end, flush_rc, drain_rc, (long long)kb_torture_mono_ns());
    free(next);
    return NULL;
}

/* ---- consumer processes ---- */

static void note(const char *what, int target, int departures)
{
    fprintf(nemesis_log, "N %lld %s %d %d\n", (long long)kb_torture_mono_ns(), what, target,
            departures);
    fflush(nemesis_log);
}

static int live_count(void)
{
    int n = 0;
    for (int s = 0; s < KB_TORTURE_MAX_SLOTS; s++)
        n += slots[s].pid > 0;
    return n;
}

static void spawn(int s)
{
    char name[32], log[4200], err[4200];
    snprintf(name, sizeof name, "c%d-%d", s, ++slots[s].incarnation);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    snprintf(err, sizeof err, "%s/%s.err", dir, name);
    const char *argv[40] = {o.consumer, log, name};
    int n = 3;
    for (int i = 0; kv[i] != NULL && n < 38; i++)
        argv[n++] = kv[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* never outlive the harness */
        int fd = open(err, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    slots[s].pid = pid > 0 ? pid : 0;
    slots[s].wanted = 1;
    slots[s].respawn_at = 0;
}

static void stop_slot(int s, int sig)
{
    if (slots[s].pid <= 0)
        return;
    kill(slots[s].pid, sig);
    if (sig == SIGKILL) {
        waitpid(slots[s].pid, NULL, 0);
    } else {
        for (size_t i = 0; i < sizeof stopping / sizeof *stopping; i++)
            if (stopping[i] == 0) {
                stopping[i] = slots[s].pid;
                break;
            }
    }
    slots[s].pid = 0;
}

/* A consumer that ended otherwise than asked: an `X` line, which fails the check. */
static void crashed(pid_t pid, int status, const char *when)
{
    fprintf(nemesis_log, "X %lld %d %s %s %d\n", (long long)kb_torture_mono_ns(), (int)pid, when,
            WIFEXITED(status) ? "exit" : "signal",
            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

/* Reap what exited: a SIGTERMed process (exit 0, 1 when kb_close did not
 * return KB_OK: its deadline passed while the broker was away, 2 when it was
 * still waiting in kb_open and that failed), or one that
 * ended on its own, started again a second later as the plan has it up: exit
 * 2 (kb_open failed while the broker was down) is expected, anything else is
 * a crash. */
static void reap(void)
{
    int status;
    for (size_t i = 0; i < sizeof stopping / sizeof *stopping; i++)
        if (stopping[i] > 0 && waitpid(stopping[i], &status, WNOHANG) == stopping[i]) {
            if (WIFEXITED(status) && WEXITSTATUS(status) == 1)
                fprintf(nemesis_log, "# pid %d: kb_close did not return KB_OK\n", (int)stopping[i]);
            else if (WIFEXITED(status) && WEXITSTATUS(status) == 2)
                fprintf(nemesis_log, "# pid %d: SIGTERM before it had a bus\n", (int)stopping[i]);
            else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                crashed(stopping[i], status, "after-sigterm");
            stopping[i] = 0;
        }
    for (int s = 0; s < KB_TORTURE_MAX_SLOTS; s++)
        if (slots[s].pid > 0 && waitpid(slots[s].pid, &status, WNOHANG) == slots[s].pid) {
            if (WIFEXITED(status) && WEXITSTATUS(status) == 2)
                fprintf(nemesis_log, "# c%d-%d: no bus (exit 2): started again in 1 s\n", s,
                        slots[s].incarnation);
            else
                crashed(slots[s].pid, status, "unasked");
            slots[s].pid = 0;
            slots[s].respawn_at = kb_torture_mono_ns() + 1000000000;
        } else if (slots[s].pid == 0 && slots[s].wanted && slots[s].respawn_at != 0 &&
                   kb_torture_mono_ns() >= slots[s].respawn_at) {
            spawn(s);
        }
}

/* ---- the brokers ---- */

static kb_test_nats_cluster cluster;
static kb_test_server redis;
static kb_test_proxy *proxy[KB_TEST_CLUSTER_NODES];
static int nodes;

static int broker_start(char *url, size_t len)
{
    if (strcmp(o.p.broker, "nats") == 0) {
        if (kb_test_nats_cluster_start(&cluster) != 0)
            return -1;
        nodes = KB_TEST_CLUSTER_NODES;
        size_t at = (size_t)snprintf(url, len, "nats://");
        for (int i = 0; i < nodes; i++) {
            if ((proxy[i] = kb_test_proxy_start(cluster.node[i].port)) == NULL)
                return -1;
            at += (size_t)snprintf(url + at, len - at, "%s127.0.0.1:%d", i ? "," : "",
                                   kb_test_proxy_port(proxy[i]));
        }
        return 0;
    }
    /* every acknowledged write on disk before its reply: a kill -9 loses none */
    static const char *const aof[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};
    if (kb_test_server_start(&redis, "redis", aof) != 0)
        return -1;
    nodes = 1;
    if ((proxy[0] = kb_test_proxy_start(redis.port)) == NULL)
        return -1;
    snprintf(url, len, "redis://127.0.0.1:%d", kb_test_proxy_port(proxy[0]));
    return 0;
}

static kb_test_server *node(int i)
{
    return strcmp(o.p.broker, "nats") == 0 ? &cluster.node[i] : &redis;
}

static void node_start(int i)
{
    /* not waiting for it to be healthy: the schedule goes on meanwhile */
    if (kb_test_server_restart(node(i)) != 0)
        fprintf(nemesis_log, "# node %d did not come back\n", i);
}

static void broker_stop(void)
{
    for (int i = 0; i < nodes; i++)
        if (proxy[i] != NULL)
            kb_test_proxy_stop(proxy[i]);
    if (strcmp(o.p.broker, "nats") == 0)
        kb_test_nats_cluster_stop(&cluster);
    else
        kb_test_server_stop(&redis);
}

/* ---- the nemesis ---- */

static void run_step(const kb_torture_step *st)
{
    const char *what = kb_torture_op_name(st->op);
    int t = st->target;
    switch (st->op) {
    case KB_T_KILL9:
    case KB_T_TERM:
    case KB_T_LEAVE:
        note(what, t, slots[t].pid > 0);
        slots[t].wanted = st->op != KB_T_LEAVE;
        slots[t].respawn_at = 0;
        stop_slot(t, st->op == KB_T_KILL9 ? SIGKILL : SIGTERM);
        break;
    case KB_T_JOIN:
    case KB_T_START:
        note(what, t, live_count());   /* the others hand partitions over */
        if (slots[t].pid == 0)
            spawn(t);
        break;
    case KB_T_NODE_KILL:
    case KB_T_NODE_DOWN:
        note(what, t, live_count());   /* leases may be lost everywhere */
        kb_test_server_signal(node(t), SIGKILL);
        break;
    case KB_T_NODE_START:
        note(what, t, 0);
        node_start(t);
        break;
    case KB_T_CUT:
    case KB_T_HEAL:
        note(what, t, st->op == KB_T_CUT ? live_count() : 0);
        for (int i = 0; i < nodes; i++)
            if (t < 0 || t == i)
                kb_test_proxy_blackhole(proxy[i], st->op == KB_T_CUT);
        break;
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: keybus-torture --broker nats|redis [--seed S] [--duration SECONDS]\n"
            "         [--consumers N] [--max-consumers N] [--partitions N] [--keys N] [--rate EV/S]\n"
            "         [--lease-ttl-ms MS] [--min-gap-ms MS] [--max-gap-ms MS] [--warmup S]\n"
            "         [--drain S] [--max-pause-ms MS] [--max-ack-pending N] [--rtt-ms MS]\n"
            "         [--dir DIR] [--keep] [--json] [--consumer PATH] [--plan]\n"
            "       keybus-torture --check DIR [--json] [--max-pause-ms MS]\n");
}

static int parse(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n = v != NULL ? strtoll(v, NULL, 10) : 0;
        int used = 1;
        if (strcmp(a, "--json") == 0) {
            o.json = 1;
            used = 0;
        } else if (strcmp(a, "--keep") == 0) {
            o.keep = 1;
            used = 0;
        } else if (strcmp(a, "--plan") == 0) {
            o.plan_only = 1;
            used = 0;
        } else if (v == NULL) {
            usage();
            return -1;
        } else if (strcmp(a, "--broker") == 0) {
            o.broker = v;
        } else if (strcmp(a, "--seed") == 0) {
            o.p.seed = strtoull(v, NULL, 10);
            o.have_seed = 1;
        } else if (strcmp(a, "--dir") == 0) {
            o.dir = v;
        } else if (strcmp(a, "--check") == 0) {
            o.check = v;
        } else if (strcmp(a, "--consumer") == 0) {
            o.consumer = v;
        } else if (strcmp(a, "--duration") == 0) {
            o.duration_s = (int)n;
        } else if (strcmp(a, "--consumers") == 0) {
            o.consumers = (int)n;
        } else if (strcmp(a, "--max-consumers") == 0) {
            o.max_consumers = (int)n;
        } else if (strcmp(a, "--partitions") == 0) {
            o.p.partitions = (uint32_t)n;
        } else if (strcmp(a, "--keys") == 0) {
            o.p.keys = (uint32_t)n;
        } else if (strcmp(a, "--rate") == 0) {
            o.rate = (int)n;
        } else if (strcmp(a, "--lease-ttl-ms") == 0) {
            o.lease_ttl_ms = (int)n;
        } else if (strcmp(a, "--min-gap-ms") == 0) {
            o.min_gap_ms = (int)n;
        } else if (strcmp(a, "--max-gap-ms") == 0) {
            o.max_gap_ms = (int)n;
        } else if (strcmp(a, "--warmup") == 0) {
            o.warmup_s = (int)n;
        } else if (strcmp(a, "--drain") == 0) {
            o.drain_s = (int)n;
        } else if (strcmp(a, "--max-pause-ms") == 0) {
            o.p.max_pause_ms = n;
            o.have_max_pause = 1;
        } else if (strcmp(a, "--max-ack-pending") == 0) {
            o.p.max_ack_pending = (uint32_t)n;
        } else if (strcmp(a, "--rtt-ms") == 0) {
            o.p.rtt_ms = (uint32_t)n;
        } else {
            usage();
            return -1;
        }
        i += used;
    }
    if (o.max_consumers == 0)
        o.max_consumers = o.consumers + 2;
    if (o.check == NULL &&
        (o.broker == NULL || (strcmp(o.broker, "nats") != 0 && strcmp(o.broker, "redis") != 0) ||
         o.duration_s < 1 || o.consumers < 1 || o.max_consumers > KB_TORTURE_MAX_SLOTS ||
         o.max_consumers < o.consumers || o.p.partitions < 1 || o.p.keys < 1 || o.rate < 1 ||
         o.min_gap_ms < 100 || o.max_gap_ms < o.min_gap_ms)) {
        usage();
        return -1;
    }
    return 0;
}

/* The configuration every process of the run opens its bus with. */
static void make_kv(const char *url)
{
    int n = 0, b = 0;
#define KV(k, ...)                                                                  \
    do {                                                                            \
        kv[n++] = k;                                                                \
        snprintf(kv_buf[b], sizeof kv_buf[b], __VA_ARGS__);                         \
        kv[n++] = kv_buf[b++];                                                      \
    } while (0)
    KV("transport", "%s", url);
    KV("partitions", "%u", o.p.partitions);
    KV("runs.dir", "%s/runs", dir);
    KV("retry.max_attempts", "%d", 1000000);   /* kills count as runs: no dead letters */
    if (strcmp(o.p.broker, "nats") == 0) {
        KV("nats.lease_ttl_ms", "%d", o.lease_ttl_ms);
        KV("nats.max_ack_pending", "%u", o.p.max_ack_pending);
        kv[n++] = "nats.replicas";
        kv[n++] = "3";
        kv[n++] = "nats.connect_wait_ms";   /* a consumer started during a cut waits */
        kv[n++] = "20000";
    } else {
        KV("redis.lease_ttl_ms", "%d", o.lease_ttl_ms);
    }
#undef KV
    kv[n] = NULL;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (parse(argc, argv) != 0)
        return 2;
    if (o.check != NULL) {
        if (!o.have_max_pause)
            o.p.max_pause_ms = 0;   /* the run's own bound, from run.conf */
        if (kb_torture_params_read(o.check, &o.p) != 0) {
            fprintf(stderr, "torture: %s/run.conf unreadable\n", o.check);
            return 2;
        }
        return kb_torture_check(o.check, &o.p, o.json, stdout, NULL);
    }
    snprintf(o.p.broker, sizeof o.p.broker, "%s", o.broker);
    if (!o.have_seed)
        o.p.seed = (uint64_t)kb_torture_wall_ns() ^ ((uint64_t)getpid() << 32);
    kb_torture_plan plan;
    if (kb_torture_plan_make(&plan, o.p.seed, strcmp(o.broker, "nats") == 0 ? 3 : 1,
                             o.consumers, o.max_consumers, (int64_t)o.duration_s * 1000,
                             o.min_gap_ms, o.max_gap_ms) != 0) {
        fprintf(stderr, "torture: no schedule\n");
        return 2;
    }
    fprintf(stderr, "torture: %s, seed %" PRIu64 ", %d s, %d consumers (up to %d), %u partitions, "
                    "%u keys, %d events/s, lease TTL %d ms\n",
            o.broker, o.p.seed, o.duration_s, o.consumers, o.max_consumers, o.p.partitions,
            o.p.keys, o.rate, o.lease_ttl_ms);
    fprintf(stderr, "torture: schedule (s from the start of the nemesis):");
    for (size_t i = 0; i < plan.n; i++)
        fprintf(stderr, " %.1f:%s:%d", (double)plan.steps[i].at_ms / 1000,
                kb_torture_op_name(plan.steps[i].op), plan.steps[i].target);
    fprintf(stderr, "\n");
    if (o.plan_only) {
        kb_torture_plan_free(&plan);
        return 0;
    }
    if (o.dir != NULL) {
        snprintf(dir, sizeof dir, "%s", o.dir);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            perror(dir);
            return 2;
        }
    } else {
        snprintf(dir, sizeof dir, "/tmp/keybus-torture-XXXXXX");
        if (mkdtemp(dir) == NULL) {
            perror(dir);
            return 2;
        }
    }
    fprintf(stderr, "torture: history in %s\n", dir);

    char path[4200], url[512];
    snprintf(path, sizeof path, "%s/nemesis.log", dir);
    nemesis_log = fopen(path, "w");
    snprintf(path, sizeof path, "%s/producer.log", dir);
    producer_log = fopen(path, "w");
    if (nemesis_log == NULL || producer_log == NULL || kb_torture_params_write(dir, &o.p) != 0) {
        fprintf(stderr, "torture: cannot write in %s\n", dir);
        return 2;
    }
    if (broker_start(url, sizeof url) != 0) {
        fprintf(stderr, "torture: the broker did not start\n");
        broker_stop();
        return 2;
    }
    make_kv(url);

    /* the producer's bus first: it makes the stream or groups the consumers share */
    kb_conf *c = kb_conf_new();
    char err[256];
    for (int i = 0; kv[i] != NULL; i += 2)
        if (kb_conf_set(c, kv[i], kv[i + 1], err, sizeof err) != KB_OK) {
            fprintf(stderr, "torture: %s\n", err);
            return 2;
        }
    kb_conf_set_delivery_cb(c, on_report, NULL);
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL) {
        fprintf(stderr, "torture: kb_open: %s\n", err);
        kb_conf_destroy(c);
        broker_stop();
        return 2;
    }
    for (int s = 0; s < o.consumers; s++)
        spawn(s);
    sleep_ms(o.warmup_s * 1000);
    pthread_t producer;
    if (pthread_create(&producer, NULL, produce, b) != 0) {
        fprintf(stderr, "torture: no producer thread\n");
        return 2;
    }

    int64_t t0 = kb_torture_mono_ns();
    size_t next = 0;
    for (;;) {
        int64_t now_ms = (kb_torture_mono_ns() - t0) / 1000000;
        while (next < plan.n && plan.steps[next].at_ms <= now_ms)
            run_step(&plan.steps[next++]);
        reap();
        if (next == plan.n && now_ms >= (int64_t)o.duration_s * 1000)
            break;
        sleep_ms(20);
    }
    atomic_store(&producer_stop, 1);
    /* consumers that die on their own are started again until the drain ends */
    while (pthread_tryjoin_np(producer, NULL) == EBUSY) {
        reap();
        sleep_ms(20);
    }
    int close_rc = kb_close(b, 10000);
    if (close_rc != KB_OK)
        fprintf(stderr, "torture: producer kb_close: %s\n", kb_strerror(close_rc));
    for (int s = 0; s < KB_TORTURE_MAX_SLOTS; s++) {
        slots[s].wanted = 0;
        stop_slot(s, SIGTERM);
    }
    for (int waited = 0; waited < 15000; waited += 20) {
        int left = 0;
        reap();
        for (size_t i = 0; i < sizeof stopping / sizeof *stopping; i++)
            left += stopping[i] > 0;
        if (left == 0)
            break;
        sleep_ms(20);
    }
    for (size_t i = 0; i < sizeof stopping / sizeof *stopping; i++)
        if (stopping[i] > 0) {
            fprintf(nemesis_log, "# pid %d did not end within 15 s of SIGTERM: killed\n",
                    (int)stopping[i]);
            kill(stopping[i], SIGKILL);
            waitpid(stopping[i], NULL, 0);
        }
    broker_stop();
    fclose(producer_log);
    fclose(nemesis_log);
    kb_torture_plan_free(&plan);

    int rc = kb_torture_check(dir, &o.p, o.json, stdout, NULL);
    if (rc == 0 && !o.keep && o.dir == NULL)
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    else
        fprintf(stderr, "torture: history kept in %s (keybus-torture --check %s)\n", dir, dir);
    return rc;
}
