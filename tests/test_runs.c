/* Attempts are handler runs (issue 25, item 4), on a real broker:
 *   test_runs redis|nats RUNS_PROC
 * - an event whose handler abort()s the process is dead-lettered after
 *   exactly retry.max_attempts (3) crashes, and every other event is handled;
 * - events a process read but never ran (it was killed -9 while its one
 *   executor blocked on another event) cost no attempt: after 4 such kills
 *   each event is handled with attempt = 1 + the runs it really had, and only
 *   an event that ran 3 times can be a dead letter.
 * - an event of a frame dead-lettered that way is never handled afterwards,
 *   even when its consumer is killed before the frame is acked (on redis://
 *   the test checks on the stream that the event came in a frame);
 * - a runs.dir that cannot be made, or that another user owns, fails kb_open.
 * Each incarnation is a runs_proc child with the same consumer name, so it
 * adopts the crash journal its predecessor left in the test's runs.dir. */
#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/suite.h"
#include "support/tracker.h"

#define MAX_ATTEMPTS 3
#define INCARNATION_WAIT_MS 30000   /* generous: a slow CI box under TSan */

static const char *kind, *proc;
static kb_test_server server;
static char url[256];

/* One line of the children's log. */
typedef struct line {
    char what;
    uint32_t key, seq, attempt;
    char id[64];   /* the broker's: unique per partition only */
} line;

#define LOG_MAX 4096

/* Per test: a topic of keys x per_key events, a log and a runs.dir of its
 * own, a bus that reads the dead letters, the log as last read. */
typedef struct run_env {
    char topic[64];
    char log[300];
    char dir[300];
    kb_bus *monitor;
    line *v;
} run_env;

static void publish(const char *topic, uint32_t keys, uint32_t per_key,
                    const char *const *conf);

/* `conf`: the publisher's settings (NULL: the defaults). */
static void env_init(run_env *e, const char *what, uint32_t keys, uint32_t per_key,
                     const char *const *conf)
{
    static int serial;
    snprintf(e->topic, sizeof e->topic, "runs.%s.%ld.%d", what, (long)getpid(), ++serial);
    char tmpl[] = "/tmp/kb-runs-test-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    snprintf(e->dir, sizeof e->dir, "%s", tmpl);
    snprintf(e->log, sizeof e->log, "%s/handled.log", tmpl);
    publish(e->topic, keys, per_key, conf);
    e->monitor = kb_test_open(url, NULL, NULL);
    e->v = calloc(LOG_MAX, sizeof *e->v);
    assert_non_null(e->v);
}

/* Journals left in runs.dir (the log aside). */
static int journals_left(const run_env *e)
{
    DIR *d = opendir(e->dir);
    int n = 0;
    for (struct dirent *de; d != NULL && (de = readdir(d)) != NULL;)
        n += strstr(de->d_name, ".runs") != NULL;
    if (d != NULL)
        closedir(d);
    return n;
}

static void env_free(const run_env *e)
{
    kb_assert_ok(kb_close(e->monitor, 10000));
    free(e->v);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
    assert_int_equal(system(cmd), 0);
}

static void publish(const char *topic, uint32_t keys, uint32_t per_key,
                    const char *const *conf)
{
    kb_bus *b = kb_test_open(url, conf, NULL);
    for (uint32_t s = 1; s <= per_key; s++) {
        for (uint32_t k = 0; k < keys; k++)
            kb_assert_ok(kb_tracker_publish(b, topic, k, s, 16));
        /* A redis:// publisher that finds the server idle writes an event at
         * once, unframed, while fewer than two writes await their replies
         * (under ASan in CI the poison once went alone): with a linger asked
         * for, the server holds writes a moment and two events of another
         * topic await theirs, so the events after seq 1 fill one frame. */
        if (s == 1 && conf != NULL && strcmp(kind, "redis") == 0) {
            char cmd[128], filler[160];
            snprintf(filler, sizeof filler, "%s.filler", topic);
            kb_assert_ok(kb_publish(b, filler, "f", 1, "x", 1));   /* its metadata written */
            kb_assert_ok(kb_flush(b, 10000));
            snprintf(cmd, sizeof cmd, "redis-cli -p %d CLIENT PAUSE 500 WRITE > /dev/null",
                     server.port);
            assert_int_equal(system(cmd), 0);
            for (int i = 0; i < 2; i++)
                kb_assert_ok(kb_publish(b, filler, "f", 1, "x", 1));
        }
    }
    kb_assert_ok(kb_flush(b, 10000));
    kb_assert_ok(kb_close(b, 10000));
}

static pid_t spawn(const char *mode, const run_env *e)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);   /* the poison's aborts leave no cores */
        execl(proc, proc, mode, url, e->topic, e->log, e->dir, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static size_t read_log(const run_env *e, line *out, size_t max)
{
    FILE *f = fopen(e->log, "r");
    size_t n = 0;
    if (f == NULL)
        return 0;
    line l;
    while (n < max && fscanf(f, " %c %u %u %63s %u", &l.what, &l.key, &l.seq, l.id, &l.attempt) == 5)
        out[n++] = l;
    fclose(f);
    return n;
}

static size_t count(const line *v, size_t n, char what)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += v[i].what == what;
    return c;
}

/* Distinct (key, seq) handled. */
static size_t distinct_handled(const line *v, size_t n, uint32_t keys, uint32_t per_key)
{
    char *seen = calloc((size_t)keys * per_key, 1);
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i].what == 'H' && v[i].key < keys && v[i].seq >= 1 && v[i].seq <= per_key &&
            !seen[v[i].key * per_key + v[i].seq - 1]) {
            seen[v[i].key * per_key + v[i].seq - 1] = 1;
            d++;
        }
    free(seen);
    return d;
}

typedef struct dead_seen {
    size_t n;
    uint32_t attempts, key, seq;   /* the first's */
    char reason[300];
} dead_seen;

static int collect_dead(const kb_dead_letter *dl, void *opaque)
{
    dead_seen *d = opaque;
    if (d->n++ == 0 && dl->payload_len >= 8) {
        d->attempts = dl->attempts;
        memcpy(&d->key, dl->payload, 4);   /* kb_tracker_publish's payload */
        memcpy(&d->seq, (const char *)dl->payload + 4, 4);
        snprintf(d->reason, sizeof d->reason, "%s", dl->reason);
    }
    return 0;
}

/* Lines v[0..n) of kind `what` about event (key, seq). */
static uint32_t lines_of(const line *v, size_t n, char what, uint32_t key, uint32_t seq)
{
    uint32_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += v[i].what == what && v[i].key == key && v[i].seq == seq;
    return c;
}

static dead_seen dead_letters(kb_bus *monitor, const char *topic)
{
    dead_seen d;
    memset(&d, 0, sizeof d);
    kb_assert_ok(kb_dead_letters(monitor, topic, NULL, 100, collect_dead, &d));
    return d;
}

static void stop(pid_t pid)
{
    int status;
    kill(pid, SIGTERM);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Wait until incarnation pid aborts (true: a crash) or `ready` holds of the
 * log (false: it still runs; the caller ends it). */
static bool crashed_before(run_env *e, pid_t pid, bool (*ready)(run_env *e, size_t n))
{
    for (int waited = 0;; waited += 20) {
        assert_true(waited < INCARNATION_WAIT_MS);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
            return true;
        }
        if (ready(e, read_log(e, e->v, LOG_MAX)))
            return false;
        usleep(20000);
    }
}

#define POISON_KEYS 4
#define POISON_PER_KEY 10

/* All but the poison handled, and the poison dead-lettered. */
static bool poison_settled(run_env *e, size_t n)
{
    return distinct_handled(e->v, n, POISON_KEYS, POISON_PER_KEY) ==
               POISON_KEYS * POISON_PER_KEY - 1 &&
           dead_letters(e->monitor, e->topic).n == 1;
}

static void poison_dead_after_max_attempts_crashes(void **state)
{
    (void)state;
    run_env e;
    env_init(&e, "poison", POISON_KEYS, POISON_PER_KEY, NULL);
    kb_bus *monitor = e.monitor;
    line *v = e.v;
    int crashes = 0;
    bool done = false;
    for (int inc = 0; inc < MAX_ATTEMPTS + 3 && !done; inc++) {
        pid_t pid = spawn("poison", &e);
        if (crashed_before(&e, pid, poison_settled)) {
            crashes++;
        } else {
            stop(pid);
            done = true;
        }
    }
    size_t n = read_log(&e, v, LOG_MAX);
    dead_seen d = dead_letters(monitor, e.topic);
    assert_true(done);
    assert_int_equal(crashes, MAX_ATTEMPTS);
    assert_int_equal(count(v, n, 'C'), MAX_ATTEMPTS);
    for (size_t i = 0, c = 0; i < n; i++)   /* each crash was the next run */
        if (v[i].what == 'C')
            assert_int_equal(v[i].attempt, ++c);
    assert_int_equal(d.n, 1);
    assert_int_equal(d.key, 0);
    assert_int_equal(d.seq, 3);
    assert_int_equal(d.attempts, MAX_ATTEMPTS);
    assert_non_null(strstr(d.reason, "retry.max_attempts"));
    assert_int_equal(distinct_handled(v, n, POISON_KEYS, POISON_PER_KEY),
                     POISON_KEYS * POISON_PER_KEY - 1);
    assert_int_equal(journals_left(&e), 0);   /* adopted, and the last one closed cleanly */
    env_free(&e);
}

#define PREFETCH_KEYS 8
#define PREFETCH_PER_KEY 25

static void prefetched_events_cost_no_attempt(void **state)
{
    (void)state;
    run_env e;
    env_init(&e, "prefetch", PREFETCH_KEYS, PREFETCH_PER_KEY, NULL);
    const size_t total = PREFETCH_KEYS * PREFETCH_PER_KEY;
    kb_bus *monitor = e.monitor;
    line *v = e.v;
    /* max_attempts + 1 incarnations, each killed while its one executor runs
     * (blocks on) one event and the rest of what it read waits */
    for (int inc = 0; inc < MAX_ATTEMPTS + 1; inc++) {
        size_t before = count(v, read_log(&e, v, LOG_MAX), 'R');
        pid_t pid = spawn("block", &e);
        for (int waited = 0; count(v, read_log(&e, v, LOG_MAX), 'R') == before; waited += 20) {
            assert_true(waited < INCARNATION_WAIT_MS);
            int status;
            assert_int_equal(waitpid(pid, &status, WNOHANG), 0);   /* still alive */
            usleep(20000);
        }
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, NULL, 0), pid);
    }
    pid_t pid = spawn("handle", &e);
    dead_seen d;
    for (int waited = 0;; waited += 20) {
        assert_true(waited < INCARNATION_WAIT_MS);
        size_t n = read_log(&e, v, LOG_MAX);
        d = dead_letters(monitor, e.topic);
        if (distinct_handled(v, n, PREFETCH_KEYS, PREFETCH_PER_KEY) + d.n == total)
            break;
        usleep(20000);
    }
    stop(pid);
    size_t n = read_log(&e, v, LOG_MAX);
    /* Every handled event ran once here, after as many runs as it was seen
     * blocking in: events only read by the killed ones start at attempt 1. */
    size_t handled = 0, first_runs = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i].what != 'H')
            continue;
        uint32_t ran_before = lines_of(v, i, 'R', v[i].key, v[i].seq);
        assert_int_equal(v[i].attempt, ran_before + 1);
        first_runs += ran_before == 0;
        handled++;
    }
    assert_int_equal(handled, total - d.n);   /* nothing handled twice */
    assert_true(first_runs >= total - MAX_ATTEMPTS - 1);
    /* a dead letter only for an event that ran max_attempts times */
    assert_true(d.n <= 1);
    if (d.n == 1) {
        assert_int_equal(lines_of(v, n, 'R', d.key, d.seq), MAX_ATTEMPTS);
        assert_int_equal(d.attempts, MAX_ATTEMPTS);
    }
    assert_int_equal(journals_left(&e), 0);
    env_free(&e);
}

#define FRAMED_PER_KEY 8

/* Dead letters of key 0 per seq (payload of kb_tracker_publish), and where
 * the poison's event came from. */
typedef struct framed_dead {
    uint32_t per_seq[FRAMED_PER_KEY + 1];
    uint32_t partition;
    char orig_id[64];
} framed_dead;

static int count_dead_seqs(const kb_dead_letter *dl, void *opaque)
{
    framed_dead *d = opaque;
    uint32_t key, seq;
    if (dl->payload_len >= 8) {
        memcpy(&key, dl->payload, 4);
        memcpy(&seq, (const char *)dl->payload + 4, 4);
        d->per_seq[key == 0 && seq <= FRAMED_PER_KEY ? seq : 0]++;
        if (key == 0 && seq == 3) {
            d->partition = dl->partition;
            snprintf(d->orig_id, sizeof d->orig_id, "%s", dl->original_id);
        }
    }
    return 0;
}

/* The events of redis:// frame "<entry ID>.<index>" as its stream entry
 * says (field `n`, docs/formats.md); 0 when the entry is not a frame. Read
 * with redis-cli, one field or value a line, up to the body (binary). */
static uint32_t redis_frame_events(const char *topic, uint32_t partition, const char *event_id)
{
    char id[64], cmd[512], l[256];
    snprintf(id, sizeof id, "%s", event_id);
    char *dot = strrchr(id, '.');
    if (dot == NULL)
        return 0;
    *dot = '\0';
    snprintf(cmd, sizeof cmd, "redis-cli -p %d XRANGE 'kb:{%s}:p:%u' %s %s", server.port, topic,
             partition, id, id);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    bool frame = false;
    uint32_t n = 0;
    if (fgets(l, sizeof l, p) != NULL && strncmp(l, id, strlen(id)) == 0)   /* the entry ID */
        for (char v[256]; fgets(l, sizeof l, p) != NULL && fgets(v, sizeof v, p) != NULL;) {
            if (strcmp(l, "b\n") == 0 || strcmp(l, "d\n") == 0)
                break;   /* a body or a payload: bytes, not lines */
            frame |= strcmp(l, "f\n") == 0;
            if (strcmp(l, "n\n") == 0)
                n = (uint32_t)strtoul(v, NULL, 10);
        }
    while (fgets(l, sizeof l, p) != NULL) {
    }
    assert_int_equal(pclose(p), 0);
    return frame ? n : 0;
}

/* The framed poison dead-lettered, and the event after it run (the
 * incarnation blocks in it). */
static bool poison_dead_next_runs(run_env *e, size_t n)
{
    return lines_of(e->v, n, 'R', 0, 4) > 0 && dead_letters(e->monitor, e->topic).n > 0;
}

/* The poison (key 0 seq 3) travels in a frame with the events after it: the
 * publisher lingers, so all but a partition's first event go framed (on
 * nats:// always; on redis:// a frame is sent once two entries wait for
 * replies, so the first few may go plain: test_redis_frames has the
 * deterministic case). After max_attempts crashes the next incarnation
 * dead-letters it without a run and is killed in key 0's next event: the
 * frame stays unacked. The last incarnation must not run the dead-lettered
 * event, and handles the events after it in order. Seq 1 and 2, before the
 * poison and handled by every incarnation, may come again with max_attempts
 * runs recorded and be dead-lettered then (seq 2's frame was never acked; seq
 * 1's ack may not have been stored before the kill either, as in a CI run
 * under ASan; and a process that dies within 10 ms of a settle leaves no
 * progress record). No event after the poison is dead-lettered. */
static void framed_dead_letter_never_handled(void **state)
{
    (void)state;
    run_env e;
    const char *const linger[] = {strcmp(kind, "nats") == 0 ? "nats.publish_linger_us"
                                                             : "redis.publish_linger_us",
                                  "1000000", NULL};
    env_init(&e, "framed", 1, FRAMED_PER_KEY, linger);
    line *v = e.v;
    int crashes = 0;
    for (int inc = 0; inc < MAX_ATTEMPTS + 3; inc++) {   /* crashes, then the dead letter */
        pid_t pid = spawn("framed", &e);
        if (crashed_before(&e, pid, poison_dead_next_runs)) {
            crashes++;
            continue;
        }
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, NULL, 0), pid);
        break;
    }
    size_t before = read_log(&e, v, LOG_MAX);
    pid_t pid = spawn("handle", &e);
    for (int waited = 0; lines_of(v, read_log(&e, v, LOG_MAX), 'H', 0, FRAMED_PER_KEY) == 0;
         waited += 20) {
        assert_true(waited < INCARNATION_WAIT_MS);
        usleep(20000);
    }
    usleep(200000);   /* a late run of the dead-lettered event would show by now */
    stop(pid);
    size_t n = read_log(&e, v, LOG_MAX);
    framed_dead fd;
    memset(&fd, 0, sizeof fd);
    kb_assert_ok(kb_dead_letters(e.monitor, e.topic, NULL, 100, count_dead_seqs, &fd));
    const uint32_t *dead = fd.per_seq;
    uint32_t next = 0;
    bool in_order = true;
    for (size_t i = before; i < n; i++)   /* the last incarnation's runs */
        if (v[i].what == 'H' && v[i].seq > 3) {
            in_order &= next == 0 || v[i].seq == next;
            next = v[i].seq + 1;
        }
    bool redis = strcmp(kind, "redis") == 0;
    uint32_t framed_with = redis ? redis_frame_events(e.topic, fd.partition, fd.orig_id) : 0;
    fprintf(stderr, "%s: %d crashes; dead letters of seq 1: %u, seq 2: %u, seq 3: %u (%s, a "
            "frame of %u), others: %u; seq 2 handled %u times, seq 3 %u\n", kind, crashes,
            dead[1], dead[2], dead[3], fd.orig_id, framed_with,
            dead[0] + dead[4] + dead[5] + dead[6] + dead[7] + dead[8], lines_of(v, n, 'H', 0, 2),
            lines_of(v, n, 'H', 0, 3));
    assert_int_equal(crashes, MAX_ATTEMPTS);
    assert_int_equal(count(v, n, 'C'), MAX_ATTEMPTS);
    /* redis:// stores the event's dead letter and its frame's progress bit
     * in one script; nats:// may store it again when the frame comes back */
    assert_true(dead[3] >= 1);
    if (redis) {
        assert_int_equal(dead[3], 1);
        /* what this test is about: the poison came in a frame of more than itself */
        assert_true(framed_with > 1);
    }
    for (uint32_t s = 0; s <= FRAMED_PER_KEY; s++)
        assert_true((s >= 1 && s <= 3) || dead[s] == 0);
    assert_int_equal(lines_of(v, n, 'H', 0, 3), 0);   /* never handled after its dead letter */
    assert_int_equal(distinct_handled(v, n, 1, FRAMED_PER_KEY), FRAMED_PER_KEY - 1);
    assert_true(in_order);
    env_free(&e);
}

/* kb_open refuses a runs.dir it cannot make, or one another user owns (a
 * directory made in /tmp by someone else could feed it journals). */
static void unusable_runs_dir_refused(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/kb-runs-test-XXXXXX", err[256];
    assert_non_null(mkdtemp(tmpl));
    const char *dirs[] = {"/dev/null/runs", tmpl};
    bool other_user = geteuid() == 0 && chown(tmpl, 65534, 65534) == 0;
    for (size_t i = 0; i < (other_user ? 2u : 1u); i++) {
        kb_conf *c = kb_conf_new();
        kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
        kb_assert_ok(kb_conf_set(c, "runs.dir", dirs[i], err, sizeof err));
        kb_assert_ok(kb_conf_set(c, "conf.env", "false", err, sizeof err));
        err[0] = '\0';
        assert_null(kb_open(c, err, sizeof err));
        assert_non_null(strstr(err, "runs.dir"));
        assert_non_null(strstr(err, dirs[i]));
        kb_conf_destroy(c);
    }
    assert_int_equal(rmdir(tmpl), 0);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s redis|nats RUNS_PROC\n", argv[0]);
        return 2;
    }
    kind = argv[1];
    proc = argv[2];
    if (kb_test_broker_for(kind, &server, url, sizeof url) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(poison_dead_after_max_attempts_crashes),
        cmocka_unit_test(prefetched_events_cost_no_attempt),
        cmocka_unit_test(framed_dead_letter_never_handled),
        cmocka_unit_test(unusable_runs_dir_refused),
    };
    return kb_test_run_group("runs", kind, tests, sizeof tests / sizeof tests[0], &server);
}
