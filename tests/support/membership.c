#include "check.h"
#include "membership.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

double kb_test_mship_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int kb_test_mship_init(kb_test_mship *m, const char *prog, const char *url, const char *topic)
{
    memset(m, 0, sizeof *m);
    m->prog = prog;
    m->c1 = m->c2 = -1;
    setenv("KEYBUS_PARTITIONS", "16", 1);   /* KB_TEST_MSHIP_PARTITIONS */
    setenv("KEYBUS_GROUP", "mship", 1);
    snprintf(m->url, sizeof m->url, "%s", url);
    snprintf(m->topic, sizeof m->topic, "%s", topic);
    snprintf(m->dir, sizeof m->dir, "/tmp/keybus-mship-XXXXXX");
    return mkdtemp(m->dir) != NULL ? 0 : -1;
}

void kb_test_mship_cleanup(kb_test_mship *m)
{
    for (int i = 0; i < m->nspawned; i++)
        if (waitpid(m->spawned[i], NULL, WNOHANG) == 0) {   /* still ours and running */
            kill(m->spawned[i], SIGKILL);
            waitpid(m->spawned[i], NULL, 0);
        }
    m->nspawned = 0;
    if (m->dir[0] == '\0')
        return;
    DIR *d = opendir(m->dir);
    struct dirent *e;
    char path[400];
    while (d != NULL && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", m->dir, e->d_name);
            unlink(path);
        }
    if (d != NULL)
        closedir(d);
    rmdir(m->dir);
    m->dir[0] = '\0';
}

/* fork and exec the program with `argv`, its stderr appended to dir/NAME.err */
static pid_t spawn(kb_test_mship *m, const char *name, char *const *argv)
{
    char err[400];
    snprintf(err, sizeof err, "%s/%s.err", m->dir, name);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(err, O_WRONLY | O_APPEND | O_CREAT, 0644);
        if (fd >= 0)
            dup2(fd, 2);
        execv(m->prog, argv);
        _exit(127);
    }
    if (pid > 0 && m->nspawned < (int)(sizeof m->spawned / sizeof m->spawned[0]))
        m->spawned[m->nspawned++] = pid;
    return pid;
}

static bool err_says(const kb_test_mship *m, const char *name, const char *what)
{
    char path[400], line[512];
    snprintf(path, sizeof path, "%s/%s.err", m->dir, name);
    FILE *f = fopen(path, "r");
    bool found = false;
    while (f != NULL && !found && fgets(line, sizeof line, f) != NULL)
        found = strstr(line, what) != NULL;
    if (f != NULL)
        fclose(f);
    return found;
}

/* The processes' warnings and errors (log levels 3 and 4, sanitizer
 * reports), up to 40 lines. */
static void print_warnings(const kb_test_mship *m)
{
    DIR *d = opendir(m->dir);
    struct dirent *e;
    char path[400], line[512];
    int shown = 0;
    while (d != NULL && shown < 40 && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".err") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", m->dir, e->d_name);
        FILE *f = fopen(path, "r");
        while (f != NULL && shown < 40 && fgets(line, sizeof line, f) != NULL)
            if (strstr(line, " L3 ") != NULL || strstr(line, " L4 ") != NULL ||
                strstr(line, "runtime error") != NULL || strstr(line, "Sanitizer") != NULL) {
                fprintf(stderr, "  %s", line);
                shown++;
            }
        if (f != NULL)
            fclose(f);
    }
    if (d != NULL)
        closedir(d);
}

static void print_err(const kb_test_mship *m, const char *name)
{
    char path[400], line[512];
    snprintf(path, sizeof path, "%s/%s.err", m->dir, name);
    FILE *f = fopen(path, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        fprintf(stderr, "  %s: %s", name, line);
    if (f != NULL)
        fclose(f);
}

pid_t kb_test_mship_consumer(kb_test_mship *m, const char *name)
{
    char log[400];
    snprintf(log, sizeof log, "%s/%s.log", m->dir, name);
    char *const argv[] = {(char *)m->prog, "consume", (char *)m->url, (char *)m->topic,
                          (char *)name, log, NULL};
    pid_t pid = spawn(m, name, argv);
    for (int i = 0; pid > 0 && i < 600; i++) {
        if (err_says(m, name, " subscribed"))
            return pid;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            break;
        usleep(100000);
    }
    print_err(m, name);
    if (pid > 0)
        kb_test_mship_wait(pid, 0);
    return -1;
}

pid_t kb_test_mship_producer(kb_test_mship *m, int rate, int keys, int seconds)
{
    char r[16], k[16], s[16], summary[400];
    snprintf(r, sizeof r, "%d", rate);
    snprintf(k, sizeof k, "%d", keys);
    snprintf(s, sizeof s, "%d", seconds);
    snprintf(summary, sizeof summary, "%s/summary", m->dir);
    char *const argv[] = {(char *)m->prog, "produce", (char *)m->url, (char *)m->topic, r, k, s,
                          summary, NULL};
    return spawn(m, "producer", argv);
}

int kb_test_mship_wait(pid_t pid, int timeout_s)
{
    int status = 0;
    for (int i = 0; i < timeout_s * 10; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

int kb_test_mship_stop(pid_t pid)
{
    kill(pid, SIGTERM);
    return kb_test_mship_wait(pid, 60);
}

typedef struct handling {
    double t;
    uint32_t key, seq;
    int name;
    unsigned part;
} handling;

static int by_time(const void *a, const void *b)
{
    double x = ((const handling *)a)->t, y = ((const handling *)b)->t;
    return x < y ? -1 : x > y;
}

/* Append the lines "time kKEY seq name attempt" of `path` to *hs. */
static void read_log(const char *path, kb_test_history *h, handling **hs, size_t *n, size_t *cap)
{
    FILE *f = fopen(path, "r");
    char line[256], name[32];
    double t;
    unsigned key, seq, attempt;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "%lf k%u %u %31s %u", &t, &key, &seq, name, &attempt) != 5)
            continue;
        int who = 0;
        while (who < KB_TEST_MSHIP_NAMES - 1 && h->names[who][0] != '\0' &&
               strcmp(h->names[who], name) != 0)
            who++;
        if (h->names[who][0] == '\0')
            snprintf(h->names[who], sizeof h->names[who], "%s", name);
        h->by_name[who]++;
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 65536;
            *hs = realloc(*hs, *cap * sizeof **hs);
        }
        (*hs)[(*n)++] = (handling){t, key, seq, who, 0};
    }
    if (f != NULL)
        fclose(f);
}

/* The longest gap of each partition from `since` that reaches into the
 * publishing (up to `last`); a partition never handled again after `since`
 * pauses until the end of the history. */
static void pauses(kb_test_history *h, const handling *hs, size_t n, unsigned partitions,
                   double since, double last)
{
    double end = n > 0 ? hs[n - 1].t : last;
    for (unsigned p = 0; p < partitions; p++) {
        double prev = since, worst = 0, from = since;
        for (size_t i = 0; i < n; i++) {
            if (hs[i].t < since || hs[i].part != p)
                continue;
            if (hs[i].t - prev > worst) {
                worst = hs[i].t - prev;
                from = prev;
            }
            prev = hs[i].t;
            if (prev > last)
                break;
        }
        if (prev < last && end - prev > worst) {
            worst = end - prev;
            from = prev;
        }
        h->over_2s += worst > 2.0;
        if (worst > h->pause) {
            h->pause = worst;
            h->pause_partition = p;
            h->pause_from = from - since;
        }
    }
}

int kb_test_mship_history(const kb_test_mship *m, unsigned partitions, double since,
                          kb_test_history *h)
{
    memset(h, 0, sizeof *h);
    h->flush_rc = h->drain_rc = -100;
    char path[400], line[256];
    snprintf(path, sizeof path, "%s/summary", m->dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    long keys = 1;
    double first = 0, last = 0, t;
    int rc;
    while (fgets(line, sizeof line, f) != NULL) {
        sscanf(line, "keys %ld", &keys);
        sscanf(line, "published %ld", &h->published);
        sscanf(line, "first %lf", &first);
        sscanf(line, "last %lf", &last);
        if (sscanf(line, "flush %d", &rc) == 1)
            h->flush_rc = rc;
        if (sscanf(line, "drain %d %lf", &rc, &t) == 2) {
            h->drain_rc = rc;
            h->drain_s = t - last;
        }
    }
    fclose(f);
    handling *hs = NULL;
    size_t n = 0, cap = 0;
    DIR *d = opendir(m->dir);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".log") == 0) {
            snprintf(path, sizeof path, "%s/%s", m->dir, e->d_name);
            read_log(path, h, &hs, &n, &cap);
        }
    }
    if (d != NULL)
        closedir(d);
    if (n > 0)   /* hs is NULL without a line */
        qsort(hs, n, sizeof *hs, by_time);
    for (size_t i = 0; i < n; i++) {
        char key[16];
        int kl = snprintf(key, sizeof key, "k%u", hs[i].key);
        hs[i].part = kb_partition_of(key, (size_t)kl, partitions);
    }
    /* per key, in handling order: a sequence is new (last + 1), a duplicate
     * (at most the last) or a violation (a gap) */
    long per_key = h->published / keys + 1;
    uint32_t *lastseq = calloc((size_t)keys, sizeof *lastseq);
    bool *seen = calloc((size_t)(keys * (per_key + 1)), sizeof *seen);
    for (size_t i = 0; i < n; i++) {
        const handling *x = &hs[i];
        if (x->key >= (uint32_t)keys || x->seq > (uint32_t)per_key) {
            h->order_violations++;
            continue;
        }
        if (x->seq == lastseq[x->key] + 1) {
            lastseq[x->key] = x->seq;
            h->distinct++;
            h->last_handled_s = x->t - last;
        } else if (x->seq <= lastseq[x->key]) {
            h->duplicates++;
        } else {
            h->order_violations++;
            lastseq[x->key] = x->seq;
        }
        seen[x->key * (per_key + 1) + x->seq] = true;
    }
    for (long i = 0; i < h->published; i++)
        h->lost += !seen[(i % keys) * (per_key + 1) + i / keys + 1];
    h->handled = (long)n;
    pauses(h, hs, n, partitions, since, last);
    free(seen);
    free(lastseq);
    free(hs);
    return 0;
}

void kb_test_mship_print(const char *what, const kb_test_history *h)
{
    printf("# %s: %ld published, %ld handled: %ld lost, %ld order violations, %ld duplicates; "
           "longest partition pause %.2f s (partition %u, from %+.2f s), %u partitions over 2 s; "
           "kb_flush %d, kb_drain %d %.2f s and the last handled %.2f s after the last publish; "
           "handled by",
           what, h->published, h->handled, h->lost, h->order_violations, h->duplicates, h->pause,
           h->pause_partition, h->pause_from, h->over_2s, h->flush_rc, h->drain_rc, h->drain_s,
           h->last_handled_s);
    for (int i = 0; i < KB_TEST_MSHIP_NAMES && h->names[i][0] != '\0'; i++)
        printf(" %s %ld", h->names[i], h->by_name[i]);
    printf("\n");
    fflush(stdout);
}

/* light enough that a loaded 2-core box keeps up: a pause is the change's,
 * not a backlog of a starved consumer */
#define RATE 250
#define KEYS 100
#define SECONDS 12
#define CHANGE_AT 4
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZER 1
#else
#define SANITIZER 0
#endif

static void run(kb_test_mship *m, kb_test_mship_change change, kb_test_mship_fn fn,
                void *opaque, kb_test_history *h)
{
    assert_true((m->c1 = kb_test_mship_consumer(m, "c1")) > 0);
    if (change != KB_TEST_MSHIP_JOIN)
        assert_true((m->c2 = kb_test_mship_consumer(m, "c2")) > 0);
    sleep(2);   /* the two share the partitions before the load starts */
    pid_t producer = kb_test_mship_producer(m, RATE, KEYS, SECONDS);
    assert_true(producer > 0);
    sleep(CHANGE_AT);
    char said[200];
    double at = kb_test_mship_now();
    switch (change) {
    case KB_TEST_MSHIP_JOIN:
        assert_true((m->c2 = kb_test_mship_consumer(m, "c2")) > 0);
        snprintf(said, sizeof said, "a second consumer process joins under load");
        break;
    case KB_TEST_MSHIP_LEAVE:
        assert_int_equal(kb_test_mship_stop(m->c2), 0);
        m->c2 = -1;
        snprintf(said, sizeof said, "one of two consumer processes leaves (SIGTERM)");
        break;
    case KB_TEST_MSHIP_ROLLING:
        assert_int_equal(kb_test_mship_stop(m->c1), 0);
        assert_true((m->c1 = kb_test_mship_consumer(m, "c1b")) > 0);
        sleep(4);
        assert_int_equal(kb_test_mship_stop(m->c2), 0);
        assert_true((m->c2 = kb_test_mship_consumer(m, "c2b")) > 0);
        snprintf(said, sizeof said, "rolling restart of two consumer processes (SIGTERM)");
        break;
    case KB_TEST_MSHIP_OTHER:
        fn(m, opaque, said, sizeof said);
        break;
    }
    /* the publishing, kb_flush (up to 60 s more) and kb_drain (120 s), unless
     * a consumer process dies meanwhile (a sanitizer's report) */
    pid_t *consumers[2] = {&m->c1, &m->c2};
    int prc = -1, crc[2] = {0, 0}, status;
    bool died = false;
    for (int i = 0; i < (SECONDS + 200) * 10 && !died; i++, usleep(100000)) {
        if (waitpid(producer, &status, WNOHANG) == producer) {
            prc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            producer = -1;
            break;
        }
        for (int j = 0; j < 2; j++)
            if (*consumers[j] > 0 && waitpid(*consumers[j], &status, WNOHANG) == *consumers[j]) {
                crc[j] = -1;
                *consumers[j] = -1;
                died = true;
            }
    }
    if (producer > 0)
        kb_test_mship_wait(producer, 0);
    sleep(1);
    for (int j = 0; j < 2; j++)
        if (*consumers[j] > 0) {
            crc[j] = kb_test_mship_stop(*consumers[j]);
            *consumers[j] = -1;
        }
    assert_int_equal(kb_test_mship_history(m, KB_TEST_MSHIP_PARTITIONS, at - 1, h), 0);
    kb_test_mship_print(said, h);
    if (prc != 0 || crc[0] != 0 || crc[1] != 0) {
        print_err(m, "producer");
        print_warnings(m);
    }
    assert_int_equal(prc, 0);
    assert_int_equal(crc[0], 0);   /* kb_close returned KB_OK, no sanitizer report */
    assert_int_equal(crc[1], 0);
}

void kb_test_mship_case(kb_test_mship *m, const char *prog, const char *url,
                        kb_test_mship_change change, kb_test_mship_fn fn, void *opaque,
                        double bound)
{
    kb_test_history h;
    assert_int_equal(kb_test_mship_init(m, prog, url, "mship.events"), 0);
    run(m, change, fn, opaque, &h);
    double limit = SANITIZER ? 60.0 : bound;
    if (h.lost != 0 || h.order_violations != 0 || h.pause > limit || h.drain_rc != KB_OK)
        print_warnings(m);
    kb_assert_ok(h.flush_rc);
    kb_assert_ok(h.drain_rc);
    assert_true(h.published >= (long)RATE * CHANGE_AT / 2);   /* a leader's loss holds publishes up */
    assert_int_equal(h.lost, 0);
    assert_int_equal(h.order_violations, 0);
    assert_true(h.pause <= limit);
}
