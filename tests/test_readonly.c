/* Read-only calls and commands create and change nothing on the broker
 * (issue 31, item 4): kb_stats, kb_partition_stats_get, kb_dead_letters and
 * `keybus stats` / `dlq-list` / `conf` on a topic that was never used say
 * "not found" (KB_ENOTFOUND, exit status 4) and leave the server empty: no
 * stream, no lease bucket on NATS; no key on Redis.
 * `keybus peek` / `groups` / `topics` on a used topic change nothing either.
 *   test_readonly nats | redis */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef KB_TEST_WITH_NATS
#include <nats/nats.h>
#endif
#ifdef KB_TEST_WITH_REDIS
#include <hiredis/hiredis.h>
#endif

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/check.h"
#include "support/suite.h"

extern char **environ;
static kb_test_server server;
static const char *kind;
static char url[128];

static kb_bus *open_bus(void)
{
    kb_conf *c = kb_conf_new();
    char err[256];
    kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open: %s", err);
    return b;
}

/* `keybus -X transport=URL args...`: its exit status. */
static int cli(const char *a1, const char *a2)
{
    char transport[160];
    snprintf(transport, sizeof transport, "transport=%s", url);
    char *argv[] = {(char *)KB_CLI, "-X", transport, (char *)a1, (char *)a2, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, KB_CLI, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* What the server holds: NATS streams (KB_... topics and KV_... buckets
 * alike), or Redis keys. */
static long broker_objects(void)
{
#ifdef KB_TEST_WITH_NATS
    if (strcmp(kind, "nats") == 0) {
        natsConnection *nc = NULL;
        jsCtx *js = NULL;
        assert_int_equal(natsConnection_ConnectTo(&nc, url), NATS_OK);
        assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
        jsStreamNamesList *names = NULL;
        natsStatus s = js_StreamNames(&names, js, NULL, NULL);
        assert_true(s == NATS_OK || s == NATS_NOT_FOUND);
        long n = names != NULL ? names->Count : 0;
        for (long i = 0; i < n; i++)
            fprintf(stderr, "stream on the server: %s\n", names->List[i]);
        jsStreamNamesList_Destroy(names);
        jsCtx_Destroy(js);
        natsConnection_Destroy(nc);
        return n;
    }
#endif
#ifdef KB_TEST_WITH_REDIS
    if (strcmp(kind, "redis") == 0) {
        redisContext *c = redisConnect("127.0.0.1", server.port);
        assert_true(c != NULL && c->err == 0);
        redisReply *r = redisCommand(c, "DBSIZE");
        assert_true(r != NULL && r->type == REDIS_REPLY_INTEGER);
        long n = (long)r->integer;
        freeReplyObject(r);
        redisFree(c);
        return n;
    }
#endif
    fail_msg("no client for %s", kind);
    return -1;
}

static int count_dead(const kb_dead_letter *dl, void *opaque)
{
    (void)dl;
    ++*(int *)opaque;
    return 0;
}

/* First in the binary: the server is empty when it starts. */
static void never_used_topic_is_not_found_and_nothing_is_created(void **state)
{
    (void)state;
    assert_int_equal(broker_objects(), 0);
    kb_bus *b = open_bus();
    const char *topic = "ro.never";
    kb_topic_stats st;
    assert_int_equal(kb_stats(b, topic, &st), KB_ENOTFOUND);
    kb_partition_stats ps;
    assert_int_equal(kb_partition_stats_get(b, topic, 0, &ps), KB_ENOTFOUND);
    int seen = 0;
    assert_int_equal(kb_dead_letters(b, topic, NULL, 10, count_dead, &seen), KB_ENOTFOUND);
    assert_non_null(strstr(kb_last_error(), topic));
    const char *id = strcmp(kind, "nats") == 0 ? "1" : "1-1";   /* a well-formed ID */
    assert_int_equal(kb_dead_letter_replay(b, topic, id), KB_ENOTFOUND);
    assert_int_equal(seen, 0);
    kb_assert_ok(kb_close(b, 5000));

    assert_int_equal(cli("stats", topic), 4);
    assert_int_equal(cli("dlq-list", topic), 4);
    assert_int_equal(cli("conf", NULL), 0);
    assert_int_equal(broker_objects(), 0);
}

/* A topic that exists reads from any bus, one that never published or
 * subscribed it too; reading it adds nothing. */
static void used_topic_reads_from_a_monitor(void **state)
{
    (void)state;
    const char *topic = "ro.used";
    kb_bus *b = open_bus();
    kb_assert_ok(kb_publish(b, topic, "k", 1, "v", 1));
    kb_assert_ok(kb_flush(b, 5000));
    kb_assert_ok(kb_close(b, 5000));
    long before = broker_objects();
    assert_true(before > 0);

    kb_bus *monitor = open_bus();
    kb_topic_stats st;
    kb_assert_ok(kb_stats(monitor, topic, &st));
    assert_int_equal(st.broker_length, 1);
    int seen = 0;
    kb_assert_ok(kb_dead_letters(monitor, topic, NULL, 10, count_dead, &seen));
    assert_int_equal(seen, 0);
    kb_partition_stats ps;
    uint32_t p = kb_fnv1a32("k", 1) % st.partitions;
    kb_assert_ok(kb_partition_stats_get(monitor, topic, p, &ps));
    assert_int_equal(ps.length, 1);
    assert_string_equal(ps.owner, "");
    kb_assert_ok(kb_close(monitor, 5000));
    /* no group consumes it: stats refuses the default group, creating none */
    assert_int_equal(cli("stats", topic), 4);
    assert_int_equal(cli("dlq-list", topic), 0);
    /* peek shows what a new group would get, and makes none */
    assert_int_equal(cli("peek", topic), 0);
    assert_int_equal(cli("groups", topic), 0);
    assert_int_equal(cli("topics", NULL), 0);
    assert_int_equal(broker_objects(), before);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    kind = argv[1];
    if (kb_test_broker_for(kind, &server, url, sizeof url) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(never_used_topic_is_not_found_and_nothing_is_created),
        cmocka_unit_test(used_topic_reads_from_a_monitor),
    };
    int failed = kb_test_run_group("readonly", kind, tests, sizeof tests / sizeof *tests, &server);
#ifdef KB_TEST_WITH_NATS
    nats_Close();
#endif
    return failed;
}
