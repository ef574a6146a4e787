/* Two consumer processes share a topic through file:// (examples/transport):
 * the first takes every partition, the second joins mid-stream and the first
 * hands half over once what it delivered from them is settled. Every event is
 * handled once, and per key in order across both processes (handler start
 * times, CLOCK_MONOTONIC, rise with the sequence). And a consumer started
 * after another stopped resumes at the group's committed offset.
 *   test_plugin_procs LIBKB_FILE_SO URL                      the test
 *   test_plugin_procs consume LIBKB_FILE_SO URL TOPIC OUT    a consumer: handles
 *       until its stdin closes, then writes what it handled to OUT */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/check.h"

#define KEYS 100
#define PER_KEY 200                 /* sequences 1..PER_KEY; half before the second joins */
#define EVENTS (KEYS * PER_KEY)

extern char **environ;
static const char *plugin, *url;

struct handled {
    uint32_t key, seq;
    int64_t start_ns;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static kb_bus *open_bus_parts(const char *partitions, char *err, size_t errlen)
{
    kb_conf *c = kb_conf_new();
    if (kb_conf_set(c, "partitions", partitions, err, errlen) != KB_OK ||
        kb_conf_set(c, "transport.plugins", plugin, err, errlen) != KB_OK ||
        kb_conf_set(c, "transport", url, err, errlen) != KB_OK ||
        kb_conf_set(c, "file.poll_ms", "20", err, errlen) != KB_OK ||
        kb_conf_set(c, "pool.queue_capacity", "64", err, errlen) != KB_OK) {
        kb_conf_destroy(c);
        return NULL;
    }
    return kb_open(c, err, errlen);
}

static kb_bus *open_bus(char *err, size_t errlen)
{
    return open_bus_parts("8", err, errlen);
}

/* ---- the consumer process ---- */

struct log {
    struct handled *h;
    _Atomic size_t n;
    size_t cap;
};

static int record(const kb_event *ev, void *opaque)
{
    struct log *l = opaque;
    struct handled h = {0, 0, now_ns()};
    if (ev->payload_len == 2 * sizeof(uint32_t)) {
        memcpy(&h.key, ev->payload, sizeof h.key);
        memcpy(&h.seq, (const char *)ev->payload + sizeof h.key, sizeof h.seq);
    }
    size_t i = atomic_fetch_add(&l->n, 1);
    if (i < l->cap)
        l->h[i] = h;
    return KB_HANDLED;
}

static int consume(const char *topic, const char *out)
{
    char err[512];
    struct log l = {calloc(2 * EVENTS, sizeof *l.h), 0, 2 * EVENTS};
    kb_bus *b = open_bus(err, sizeof err);
    if (b == NULL || l.h == NULL || kb_subscribe(b, topic, record, &l) != KB_OK) {
        fprintf(stderr, "consumer: %s\n", b == NULL ? err : kb_last_error());
        return 1;
    }
    char c;
    while (read(0, &c, 1) > 0)   /* the parent closes our stdin to stop us */
        ;
    int rc = kb_close(b, 30000);
    size_t n = atomic_load(&l.n) < l.cap ? atomic_load(&l.n) : l.cap;
    FILE *f = fopen(out, "wb");
    if (rc != KB_OK || f == NULL || fwrite(l.h, sizeof *l.h, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "consumer: close %d, writing %s failed\n", rc, out);
        return 1;
    }
    free(l.h);
    return 0;
}

/* ---- the test ---- */

struct child {
    pid_t pid;
    int stdin_fd;
    char out[4096];
};

static void spawn_consumer(struct child *ch, const char *topic, const char *name)
{
    snprintf(ch->out, sizeof ch->out, "%s/%s.%s.handled", url + strlen("file://"), topic, name);
    int fds[2];   /* close-on-exec: the next consumer must not inherit this one's stdin */
    assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[0], 0);
    char *argv[] = {"test_plugin_procs", "consume", (char *)plugin, (char *)url,
                    (char *)topic, ch->out, NULL};
    int rc = posix_spawn(&ch->pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[0]);
    assert_int_equal(rc, 0);
    ch->stdin_fd = fds[1];
}

static int stop_consumer(struct child *ch)
{
    close(ch->stdin_fd);
    int status;
    if (waitpid(ch->pid, &status, 0) != ch->pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Distinct lease holders of the topic's partitions; every partition held
 * when *all_held. */
static int owners(kb_bus *b, const char *topic, int *all_held)
{
    char seen[8][128];
    int n = 0;
    *all_held = 1;
    for (uint32_t p = 0; p < 8; p++) {
        kb_partition_stats ps;
        if (kb_partition_stats_get(b, topic, p, &ps) != KB_OK || ps.owner[0] == '\0') {
            *all_held = 0;
            continue;
        }
        int known = 0;
        for (int i = 0; i < n; i++)
            known |= strcmp(seen[i], ps.owner) == 0;
        if (!known)
            snprintf(seen[n++], sizeof seen[0], "%s", ps.owner);
    }
    return n;
}

/* Poll until the partitions are held by `want` consumers, all of them, or 30 s. */
static int wait_owners(kb_bus *b, const char *topic, int want)
{
    int64_t deadline = now_ns() + 30 * 1000000000LL;
    struct timespec pause = {0, 5000000};
    int all, n;
    while ((n = owners(b, topic, &all)) != want || !all) {
        if (now_ns() > deadline)
            return n;
        nanosleep(&pause, NULL);
    }
    return n;
}

static void publish_seqs(kb_bus *b, const char *topic, uint32_t from, uint32_t to)
{
    for (uint32_t s = from; s <= to; s++)
        for (uint32_t k = 0; k < KEYS; k++) {
            char key[16];
            uint32_t payload[2] = {k, s};
            int len = snprintf(key, sizeof key, "agg-%u", k);
            kb_assert_ok(kb_publish(b, topic, key, (size_t)len, payload, sizeof payload));
        }
}

static size_t read_handled(const char *path, struct handled *into, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return 0;
    size_t n = fread(into, sizeof *into, cap, f);
    fclose(f);
    return n;
}

static void two_consumers_share_a_topic(void **state)
{
    (void)state;
    char err[512], topic[64];
    snprintf(topic, sizeof topic, "procs.%d", (int)getpid());
    kb_bus *b = open_bus(err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open(%s): %s", url, err);
    struct child first, second;
    spawn_consumer(&first, topic, "first");
    assert_int_equal(wait_owners(b, topic, 1), 1);
    publish_seqs(b, topic, 1, PER_KEY / 2);
    spawn_consumer(&second, topic, "second");
    assert_int_equal(wait_owners(b, topic, 2), 2);   /* the first handed half over */
    publish_seqs(b, topic, PER_KEY / 2 + 1, PER_KEY);
    kb_assert_ok(kb_drain(b, 60000));     /* the group settled all of it */
    assert_int_equal(stop_consumer(&first), 0);
    assert_int_equal(stop_consumer(&second), 0);
    kb_assert_ok(kb_close(b, 30000));

    struct handled *all = calloc(2 * EVENTS, sizeof *all);
    assert_non_null(all);
    size_t n1 = read_handled(first.out, all, 2 * EVENTS);
    size_t n2 = read_handled(second.out, all + n1, 2 * EVENTS - n1);
    assert_true(n1 > 0);
    assert_true(n2 > 0);
    assert_int_equal(n1 + n2, EVENTS);               /* nothing lost, nothing twice */
    static int64_t start[KEYS][PER_KEY + 1];
    memset(start, 0, sizeof start);
    for (size_t i = 0; i < n1 + n2; i++) {
        assert_true(all[i].key < KEYS && all[i].seq >= 1 && all[i].seq <= PER_KEY);
        assert_int_equal(start[all[i].key][all[i].seq], 0);
        start[all[i].key][all[i].seq] = all[i].start_ns;
    }
    size_t out_of_order = 0;
    for (uint32_t k = 0; k < KEYS; k++)
        for (uint32_t s = 2; s <= PER_KEY; s++)
            out_of_order += start[k][s] <= start[k][s - 1];
    assert_int_equal(out_of_order, 0);
    free(all);
}

/* A consumer that starts after another stopped resumes at the group's
 * committed offset: it handles what came after, and nothing again. */
static void a_restart_resumes_where_the_group_stopped(void **state)
{
    (void)state;
    char err[512], topic[64];
    snprintf(topic, sizeof topic, "restart.%d", (int)getpid());
    kb_bus *b = open_bus(err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open(%s): %s", url, err);
    struct child before, after;
    spawn_consumer(&before, topic, "before");
    publish_seqs(b, topic, 1, 10);
    kb_assert_ok(kb_drain(b, 60000));
    assert_int_equal(stop_consumer(&before), 0);
    publish_seqs(b, topic, 11, 20);                  /* nobody consumes these yet */
    spawn_consumer(&after, topic, "after");
    kb_assert_ok(kb_drain(b, 60000));
    assert_int_equal(stop_consumer(&after), 0);
    kb_assert_ok(kb_close(b, 30000));

    struct handled *h = calloc(2 * EVENTS, sizeof *h);
    assert_non_null(h);
    assert_int_equal(read_handled(before.out, h, 2 * EVENTS), KEYS * 10);
    size_t n = read_handled(after.out, h, 2 * EVENTS);
    assert_int_equal(n, KEYS * 10);
    for (size_t i = 0; i < n; i++)
        assert_true(h[i].seq >= 11 && h[i].seq <= 20);
    free(h);
}

static int count_handled(const kb_event *ev, void *opaque)
{
    (void)ev;
    atomic_fetch_add((_Atomic size_t *)opaque, 1);
    return KB_HANDLED;
}

/* The topic keeps the partition count it was made with: a process configured
 * with another is refused at publish and subscribe, naming both, and what
 * was published stays for a consumer with the right count. */
static void another_partition_count_is_refused(void **state)
{
    (void)state;
    char err[512];
    const char *topic = "mismatch.t";
    kb_bus *eight = open_bus_parts("8", err, sizeof err);
    assert_non_null(eight);
    for (int i = 0; i < 10; i++) {
        char key[16];
        int len = snprintf(key, sizeof key, "k%d", i);
        kb_assert_ok(kb_publish(eight, topic, key, (size_t)len, "x", 1));
    }
    kb_assert_ok(kb_close(eight, 10000));

    kb_bus *four = open_bus_parts("4", err, sizeof err);
    assert_non_null(four);
    _Atomic size_t wrong = 0;
    assert_int_equal(kb_subscribe(four, topic, count_handled, &wrong), KB_EINVAL);
    assert_non_null(strstr(kb_last_error(), "partitions=8"));
    assert_non_null(strstr(kb_last_error(), "partitions=4"));
    assert_int_equal(kb_publish(four, topic, "k", 1, "x", 1), KB_EINVAL);
    assert_non_null(strstr(kb_last_error(), "partitions=8"));
    assert_non_null(strstr(kb_last_error(), "partitions=4"));
    kb_assert_ok(kb_close(four, 10000));
    assert_int_equal(atomic_load(&wrong), 0);

    eight = open_bus_parts("8", err, sizeof err);
    assert_non_null(eight);
    _Atomic size_t handled = 0;
    kb_assert_ok(kb_subscribe(eight, topic, count_handled, &handled));
    for (int i = 0; i < 1000 && atomic_load(&handled) < 10; i++)
        usleep(10000);
    kb_assert_ok(kb_close(eight, 10000));
    assert_int_equal(atomic_load(&handled), 10);
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "consume") == 0) {
        plugin = argv[2];
        url = argv[3];
        return consume(argv[4], argv[5]);
    }
    if (argc != 3 || strncmp(argv[2], "file://", 7) != 0) {
        fprintf(stderr, "usage: test_plugin_procs LIBKB_FILE_SO file://DIR\n");
        return 2;
    }
    plugin = argv[1];
    url = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(another_partition_count_is_refused),
        cmocka_unit_test(two_consumers_share_a_topic),
        cmocka_unit_test(a_restart_resumes_where_the_group_stopped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
