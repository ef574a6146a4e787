/* The operator's look-without-touching commands on a real broker (issue 41,
 * items 4 to 6): `test_cli_admin redis|nats`.
 *   - stats, partitions and top refuse a group that does not exist (exit 4,
 *     "group G does not exist on topic T");
 *   - peek prints what the group would get (pending first, then the rest)
 *     as consume prints it, and leaves the group's figures, pending
 *     entries, consumers and leases as they were; a group that does not
 *     exist sees what a new one would;
 *   - groups, topics and metrics without TOPIC list what the broker stores;
 *   - group-delete is refused while a live member holds a lease, accepted
 *     with --force, and exit 4 for a group that does not exist. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/cli.h"
#include "support/suite.h"

#define EVENTS 20
#define KEYS 5

static const char *kind = "redis";
static kb_test_server server;
static char url[160];
static char transport[200];   /* "transport=<url>", for -X */

/* One event per NATS message: consume -n splits no frame. */
static const char *const unframed[] = {"nats.publish_batch", "1", NULL};

static void unique_topic(char *buf, size_t len, const char *name)
{
    static int seq;
    snprintf(buf, len, "adm.%s.%d.%d", name, (int)getpid(), ++seq);
}

/* Run the command with args and `-X transport=URL` after them. */
static void run(kb_test_cli_result *r, const char *const *args)
{
    kb_test_cli_x(r, KB_CLI, args, transport);
}

static void publish_numbered(const char *topic, int n)
{
    kb_test_publish_numbered(url, strcmp(kind, "nats") == 0 ? unframed : NULL, topic, n, KEYS);
}

/* What the broker holds for the group, for a before/after comparison:
 * `groups --json` (pending, lag, consumers, leases) and `partitions --json`
 * (per partition pending, lag, redelivered, owner), plus on Redis the raw
 * XINFO GROUPS and XPENDING of every partition. */
static void snapshot(const char *topic, const char *group, char *out, size_t cap)
{
    static kb_test_cli_result r;
    char g[160];
    snprintf(g, sizeof g, "group=%s", group);
    run(&r, (const char *[]){"groups", topic, "--json", NULL});
    assert_int_equal(r.status, 0);
    int n = snprintf(out, cap, "%s", r.out);
    run(&r, (const char *[]){"partitions", topic, "--json", "-X", g, NULL});
    assert_int_equal(r.status, 0);
    n += snprintf(out + n, cap - (size_t)n, "%s", r.out);
    if (strcmp(kind, "redis") != 0)
        return;
    const char *port = strrchr(url, ':') + 1;
    char path[64];
    snprintf(path, sizeof path, "/tmp/keybus-cli-admin-%d.txt", (int)getpid());
    /* XPENDING's rows are ID, consumer, idle ms, deliveries: all but the
     * idle time, which runs on */
    for (int i = 0; i < 8; i++)
        assert_int_equal(kb_test_sh("redis-cli -p %d XINFO GROUPS 'kb:{%s}:p:%d' %s '%s' "
                                    "&& redis-cli -p %d XPENDING 'kb:{%s}:p:%d' %s - + 100 "
                                    "| awk 'NR %% 4 != 3' >> '%s'",
                                    atoi(port), topic, i, i ? ">>" : ">", path, atoi(port), topic,
                                    i, group, path),
                         0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t got = fread(out + n, 1, cap - (size_t)n - 1, f);
    out[(size_t)n + got] = '\0';
    fclose(f);
    unlink(path);
}

static void missing_group_is_not_found(void **state)
{
    (void)state;
    char topic[96], want[200];
    unique_topic(topic, sizeof topic, "missing");
    publish_numbered(topic, EVENTS);
    static kb_test_cli_result r;
    snprintf(want, sizeof want, "not found: group nobody does not exist on topic %s\n", topic);
    const char *const cmds[][6] = {
        {"stats", topic, "-X", "group=nobody", NULL},
        {"stats", topic, "--text", "-X", "group=nobody", NULL},
        {"partitions", topic, "-X", "group=nobody", NULL},
        {"partitions", topic, "--json", "-X", "group=nobody", NULL},
        {"top", topic, "-X", "group=nobody", NULL},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        run(&r, cmds[i]);
        if (r.status != 4 || strstr(r.err, want) == NULL || r.out[0] != '\0')
            fail_msg("%s: exit %d, out %s, err %s", cmds[i][0], r.status, r.out, r.err);
    }
    /* the default group, named the same way */
    run(&r, (const char *[]){"stats", topic, NULL});
    assert_int_equal(r.status, 4);
    assert_non_null(strstr(r.err, "group keybus does not exist on topic"));
}

static void peek_leaves_everything_as_it_was(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "peek");
    publish_numbered(topic, EVENTS);
    static kb_test_cli_result r;
    /* a group that does not exist: what a new one gets, said on stderr */
    run(&r, (const char *[]){"peek", topic, "-g", "fresh", "-n", "100", NULL});
    if (r.status != 0 || kb_test_lines(r.out) != EVENTS ||
        strstr(r.err, "group fresh does not exist on topic") == NULL)
        fail_msg("peek of a new group: exit %d, %zu lines: %s", r.status, kb_test_lines(r.out),
                 r.err);
    run(&r, (const char *[]){"groups", topic, "--json", NULL});
    assert_int_equal(r.status, 0);
    assert_null(strstr(r.out, "\"fresh\""));   /* peek made no group */

    /* consume 5 of the group: it acks them and leaves what it read beyond
     * them unacknowledged (pending) */
    run(&r, (const char *[]){"consume", topic, "-g", "ops", "-n", "5", NULL});
    assert_int_equal(r.status, 0);
    assert_int_equal(kb_test_lines(r.out), 5);
    static char consumed[sizeof r.out];
    memcpy(consumed, r.out, sizeof consumed);

    static char before[65536], after[65536];
    snapshot(topic, "ops", before, sizeof before);
    run(&r, (const char *[]){"peek", topic, "-g", "ops", "-n", "100", NULL});
    if (r.status != 0 || kb_test_lines(r.out) != EVENTS - 5 || r.err[0] != '\0')
        fail_msg("peek: exit %d, %zu lines: %s%s", r.status, kb_test_lines(r.out), r.out, r.err);
    /* printed as consume prints: key, payload, partition, id, attempt */
    for (const char *s = r.out, *nl; (nl = strchr(s, '\n')) != NULL; s = nl + 1) {
        char line[256], key[16];
        snprintf(line, sizeof line, "%.*s", (int)(nl - s), s);
        int payload = -1;
        if (sscanf(line, "%15[^\t]\t%d\tpartition=", key, &payload) != 2 ||
            strstr(line, "\tid=") == NULL || strstr(line, "\tattempt=") == NULL)
            fail_msg("peek line: %s", line);
        /* nothing consume acknowledged comes again */
        char mine[64];
        snprintf(mine, sizeof mine, "%s\t%d\t", key, payload);
        if (strstr(consumed, mine) != NULL)
            fail_msg("peek shows an acknowledged event: %s", line);
    }
    run(&r, (const char *[]){"peek", topic, "-g", "ops", "-n", "3", "--json", NULL});
    assert_int_equal(r.status, 0);
    assert_int_equal(kb_test_lines(r.out), 3);
    assert_non_null(strstr(r.out, "{\"topic\":\""));
    assert_non_null(strstr(r.out, "\"attempt\":"));
    snapshot(topic, "ops", after, sizeof after);
    assert_string_equal(before, after);

    /* events not yet delivered come after what the group holds pending, in order */
    kb_bus *b = kb_test_open(url, strcmp(kind, "nats") == 0 ? unframed : NULL, NULL);
    for (int i = 0; i < 5; i++) {
        char payload[16];
        int pl = snprintf(payload, sizeof payload, "new%d", i);
        kb_assert_ok(kb_publish(b, topic, "n", 1, payload, (size_t)pl));
    }
    kb_assert_ok(kb_flush(b, 30000));
    kb_assert_ok(kb_close(b, 30000));
    run(&r, (const char *[]){"peek", topic, "-g", "ops", "-n", "100", NULL});
    assert_int_equal(r.status, 0);
    assert_int_equal(kb_test_lines(r.out), EVENTS);
    const char *tail = r.out;
    for (int i = 0; i < EVENTS - 5; i++)
        tail = strchr(tail, '\n') + 1;
    for (int i = 0; i < 5; i++) {
        char want[16];
        snprintf(want, sizeof want, "n\tnew%d\t", i);
        if (strncmp(tail, want, strlen(want)) != 0)
            fail_msg("undelivered event %d is not line %d: %s", i, EVENTS - 5 + i, r.out);
        tail = strchr(tail, '\n') + 1;
    }
    /* the rest is still the group's: a consumer gets exactly it */
    run(&r, (const char *[]){"consume", topic, "-g", "ops", "-n", "20", "--timeout-ms", "30000",
                             NULL});
    if (r.status != 0 || kb_test_lines(r.out) != EVENTS)
        fail_msg("consume the rest: exit %d, %zu lines: %s", r.status, kb_test_lines(r.out),
                 r.err);
    run(&r, (const char *[]){"peek", topic, "-g", "ops", NULL});
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, "");
    /* a topic the broker does not have */
    run(&r, (const char *[]){"peek", "adm.nosuch", NULL});
    assert_int_equal(r.status, 4);
    assert_non_null(strstr(r.err, "keybus peek: not found: "));
}

static void groups_topics_and_metrics_list_the_broker(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "list");
    publish_numbered(topic, EVENTS);
    static kb_test_cli_result r;
    run(&r, (const char *[]){"groups", topic, NULL});
    assert_int_equal(r.status, 0);
    assert_int_equal(kb_test_lines(r.out), 2);   /* the topic and the header: no group yet */
    run(&r, (const char *[]){"consume", topic, "-g", "billing", "-n", "3", NULL});
    assert_int_equal(r.status, 0);
    run(&r, (const char *[]){"groups", topic, "--json", NULL});
    char want[256];
    snprintf(want, sizeof want, "{\"topic\":\"%s\",\"group\":\"billing\",\"partitions\":8,"
             "\"leases\":0,", topic);
    if (r.status != 0 || kb_test_lines(r.out) != 1 || strncmp(r.out, want, strlen(want)) != 0 ||
        strstr(r.out, "\"consumers\":[") == NULL)
        fail_msg("groups --json: exit %d: %s%s", r.status, r.out, r.err);
    kb_test_check_schema(KB_SOURCE_DIR, "keybus-groups.json", r.out);
    run(&r, (const char *[]){"groups", topic, NULL});
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "\nbilling "));
    run(&r, (const char *[]){"groups", "adm.nosuch", NULL});
    assert_int_equal(r.status, 4);

    run(&r, (const char *[]){"topics", "--json", NULL});
    assert_int_equal(r.status, 0);
    snprintf(want, sizeof want, "{\"topic\":\"%s\",\"partitions\":8,\"length\":%d,"
             "\"groups\":[\"billing\"]}\n", topic, EVENTS);
    if (strstr(r.out, want) == NULL)
        fail_msg("topics --json lacks %s: %s", want, r.out);
    kb_test_check_schema(KB_SOURCE_DIR, "keybus-topics.json", r.out);
    run(&r, (const char *[]){"topics", NULL});
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, topic));
    assert_non_null(strstr(r.out, "  billing\n"));

    /* metrics without a TOPIC: the broker's topics, looked up */
    run(&r, (const char *[]){"metrics", NULL});
    assert_int_equal(r.status, 0);
    snprintf(want, sizeof want, "topic=\"%s\"", topic);
    if (strstr(r.out, want) == NULL)
        fail_msg("metrics lacks %s", want);
}

static int keep(const kb_event *ev, void *opaque)
{
    (void)ev;
    (void)opaque;
    return KB_DECLINE;   /* hold nothing: only the leases matter here */
}

static void group_delete_refused_while_leased(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "delete");
    publish_numbered(topic, EVENTS);
    static kb_test_cli_result r;
    run(&r, (const char *[]){"group-delete", topic, "live", NULL});
    assert_int_equal(r.status, 4);   /* no such group yet */
    assert_non_null(strstr(r.err, "group live does not exist on topic"));

    /* a live member of group "live" holding every partition */
    static const char *const live[] = {"group", "live", NULL};
    kb_bus *b = kb_test_open(url, live, NULL);
    kb_assert_ok(kb_subscribe(b, topic, keep, NULL));
    kb_topic_stats st = {0};
    for (int i = 0; i < 300 && (kb_stats(b, topic, &st) != KB_OK || st.partitions_owned < 8); i++)
        usleep(50 * 1000);
    assert_int_equal(st.partitions_owned, 8);
    bool listed = false;
    for (int i = 0; i < 100 && !listed; i++) {
        run(&r, (const char *[]){"groups", topic, "--json", NULL});
        listed = strstr(r.out, "\"group\":\"live\"") != NULL && strstr(r.out, "\"leases\":8") != NULL;
        if (!listed)
            usleep(100 * 1000);
    }
    if (!listed)
        fail_msg("groups never showed 8 leases of group live: %s", r.out);

    run(&r, (const char *[]){"group-delete", topic, "live", NULL});
    if (r.status != 1 || strstr(r.err, "is leased by its consumer") == NULL ||
        strstr(r.err, "a live member") == NULL)
        fail_msg("group-delete while leased: exit %d: %s%s", r.status, r.out, r.err);
    run(&r, (const char *[]){"groups", topic, "--json", NULL});
    assert_non_null(strstr(r.out, "\"group\":\"live\""));   /* still there */

    run(&r, (const char *[]){"group-delete", topic, "live", "--force", NULL});
    if (r.status != 0 || strcmp(r.out, "deleted group live of topic ") < 0 ||
        strstr(r.out, topic) == NULL)
        fail_msg("group-delete --force: exit %d: %s%s", r.status, r.out, r.err);
    kb_assert_ok(kb_close(b, 10000));
}

/* `test_cli_admin KIND` */
int main(int argc, char **argv)
{
    kind = argc > 1 ? argv[1] : "redis";
    unsetenv("KEYBUS_TRANSPORT");   /* every command gets it with -X after its arguments */
    if (kb_test_broker_for(kind, &server, url, sizeof url) != 0)
        return 1;
    snprintf(transport, sizeof transport, "transport=%s", url);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(missing_group_is_not_found),
        cmocka_unit_test(peek_leaves_everything_as_it_was),
        cmocka_unit_test(groups_topics_and_metrics_list_the_broker),
        cmocka_unit_test(group_delete_refused_while_leased),
    };
    return kb_test_run_group("cli_admin", kind, tests, sizeof tests / sizeof tests[0], &server);
}
