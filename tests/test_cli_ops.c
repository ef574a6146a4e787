/* What an operator does with the keybus command on a real broker (issue 28,
 * items 5 and 6): `test_cli_ops redis|nats`. Every command gets its
 * configuration from -X after the command's own arguments.
 *   - consume -n N prints and acknowledges exactly N; the next consumer of
 *     the group gets exactly the rest, in order per key;
 *   - consume prints headers (text and --json);
 *   - dlq-list --json (headers, time, reason), dlq-replay says what it
 *     replayed, dlq-delete, dlq-purge; dlq-list of a topic that does not
 *     exist exits 4, as stats does (test_cli);
 *   - partitions --json parses back, one object per partition;
 *   - top redraws under tmux and ends on q. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/cli.h"
#include "support/suite.h"

#define KEYS 10

static const char *kind = "redis";
static kb_test_server server;
static char url[160];
static char transport[200];   /* "transport=<url>", for -X */

static void unique_topic(char *buf, size_t len, const char *name)
{
    static int seq;
    snprintf(buf, len, "ops.%s.%d.%d", name, (int)getpid(), ++seq);
}

/* Run the command with args and `-X transport=URL` after them. */
static void run(kb_test_cli_result *r, const char *const *args)
{
    kb_test_cli_x(r, KB_CLI, args, transport);
}

/* The number after "name": in a JSON line, or -1. */
static long long json_number(const char *obj, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", name);
    const char *s = strstr(obj, pat);
    return s != NULL ? strtoll(s + strlen(pat), NULL, 10) : -1;
}

/* The string value of "name" (no escapes expected) into out, or "". */
static void json_text(const char *obj, const char *name, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", name);
    const char *s = strstr(obj, pat);
    out[0] = '\0';
    if (s != NULL) {
        s += strlen(pat);
        snprintf(out, cap, "%.*s", (int)strcspn(s, "\""), s);
    }
}

/* One event per NATS message: a frame split by -n comes back whole to the
 * next consumer (docs/cli.md, consume), which would print its first events
 * again. */
static const char *const unframed[] = {"nats.publish_batch", "1", NULL};


static void publish_numbered(const char *topic, int n)
{
    kb_test_publish_numbered(url, strcmp(kind, "nats") == 0 ? unframed : NULL, topic, n, KEYS);
}

/* consume --json lines: each event once, in order per key, into seen[]. */
static void note_events(const char *out, unsigned char *seen, int total, int last[KEYS])
{
    for (const char *s = out, *nl; (nl = strchr(s, '\n')) != NULL; s = nl + 1) {
        char line[1024], key[32], payload[32];
        snprintf(line, sizeof line, "%.*s", (int)(nl - s), s);
        json_text(line, "key", key, sizeof key);
        json_text(line, "payload", payload, sizeof payload);
        int k = atoi(key + 1), seq = atoi(payload);
        if (key[0] != 'k' || k < 0 || k >= KEYS || seq < 0 || seq >= total)
            fail_msg("unexpected line: %s", line);
        if (seen[seq]++ != 0)
            fail_msg("event %d printed twice: %s", seq, line);
        if (seq <= last[k])
            fail_msg("key k%d: %d after %d", k, seq, last[k]);
        last[k] = seq;
    }
}

static void consume_n_takes_exactly_n(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "count");
    enum { TOTAL = 100, FIRST = 7 };
    publish_numbered(topic, TOTAL);
    static kb_test_cli_result r;
    unsigned char seen[TOTAL] = {0};
    int last[KEYS];
    for (int k = 0; k < KEYS; k++)
        last[k] = -1;
    run(&r, (const char *[]){"consume", topic, "-g", "ops", "-n", "7", "--json", NULL});
    if (r.status != 0 || kb_test_lines(r.out) != FIRST || strstr(r.err, "7 events handled") == NULL)
        fail_msg("consume -n 7: exit %d, %zu lines; stderr: %s", r.status, kb_test_lines(r.out),
                 r.err);
    note_events(r.out, seen, TOTAL, last);
    /* the rest is the group's: the next consumer gets exactly it */
    run(&r, (const char *[]){"consume", topic, "-g", "ops", "-n", "93", "--json",
                             "--timeout-ms", "30000", NULL});
    if (r.status != 0 || kb_test_lines(r.out) != TOTAL - FIRST)
        fail_msg("consume -n 93: exit %d, %zu lines; stderr: %s", r.status,
                 kb_test_lines(r.out), r.err);
    note_events(r.out, seen, TOTAL, last);
    for (int i = 0; i < TOTAL; i++)
        if (seen[i] != 1)
            fail_msg("event %d printed %d times", i, seen[i]);
    /* and acknowledged: nothing pending or waiting for the group */
    run(&r, (const char *[]){"stats", topic, "--text", "-X", "group=ops", NULL});
    if (r.status != 0 || strstr(r.out, "\ngroup ops\n") == NULL ||
        strstr(r.out, "\nbroker_pending 0\n") == NULL ||
        strstr(r.out, "\nbroker_lag 0\n") == NULL)
        fail_msg("stats after both: exit %d: %s%s", r.status, r.out, r.err);

    /* partitions --json: one object per partition, parsed back */
    run(&r, (const char *[]){"partitions", topic, "--json", "-X", "group=ops", NULL});
    assert_int_equal(r.status, 0);
    assert_int_equal(kb_test_lines(r.out), 8);
    kb_test_check_schema(KB_SOURCE_DIR, "keybus-partitions.json", r.out);
    long long length = 0;
    int i = 0;
    for (const char *s = r.out, *nl; (nl = strchr(s, '\n')) != NULL; s = nl + 1, i++) {
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(nl - s), s);
        if (line[0] != '{' || line[strlen(line) - 1] != '}' || json_number(line, "partition") != i ||
            json_number(line, "pending") != 0 || json_number(line, "lag") != 0 ||
            json_number(line, "redelivered") < 0 || strstr(line, "\"owner\":\"") == NULL ||
            strstr(line, "\"group\":\"ops\"") == NULL)
            fail_msg("partition %d: %s", i, line);
        length += json_number(line, "length");
    }
    assert_true(length > 0 && length <= TOTAL);   /* entries / messages: a frame holds several */
    run(&r, (const char *[]){"partitions", topic, "-X", "group=ops", NULL});
    assert_int_equal(r.status, 0);
    assert_int_equal(kb_test_lines(r.out), 10);   /* the topic and group, a header, the rows */
    assert_non_null(strstr(r.out, "redelivered"));
    assert_non_null(strstr(r.out, "  group ops\n"));
}

static void consume_prints_headers(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "headers");
    kb_bus *b = kb_test_open(url, NULL, NULL);
    kb_topic *t = kb_topic_get(b, topic, NULL, 0);
    assert_non_null(t);
    kb_header h[2] = {{"traceparent", "00-abc-01", 9}, {"bin", "\xff\x01", 2}};
    kb_msg m = {.key = "k", .key_len = 1, .payload = "p", .payload_len = 1, .headers = h,
                .n_headers = 2};
    kb_assert_ok(kb_publish_ex(t, &m));
    kb_assert_ok(kb_flush(b, 30000));
    kb_assert_ok(kb_close(b, 30000));
    static kb_test_cli_result r;
    run(&r, (const char *[]){"consume", topic, "-g", "j", "-n", "1", "--json", NULL});
    if (r.status != 0 ||
        strstr(r.out, "\"headers\":[{\"name\":\"traceparent\",\"value\":\"00-abc-01\"},"
                      "{\"name\":\"bin\",\"value_base64\":\"/wE=\"}]}") == NULL)
        fail_msg("consume --json: exit %d: %s%s", r.status, r.out, r.err);
    run(&r, (const char *[]){"consume", topic, "-g", "t", "-n", "1", NULL});
    if (r.status != 0 ||
        strstr(r.out, "\tattempt=1\theader.traceparent=00-abc-01\theader.bin=\\xFF\\x01\n") == NULL)
        fail_msg("consume: exit %d: %s%s", r.status, r.out, r.err);
}

static int dead_on_arrival(const kb_event *ev, void *opaque)
{
    atomic_int *n = opaque;
    kb_event_set_reason(ev, "bad order %.*s", (int)ev->payload_len, (const char *)ev->payload);
    atomic_fetch_add(n, 1);
    return KB_DEAD;
}

static void dead_letters_listed_replayed_deleted_purged(void **state)
{
    (void)state;
    char topic[96];
    unique_topic(topic, sizeof topic, "dlq");
    static atomic_int handled;
    kb_bus *b = kb_test_open(url, NULL, NULL);
    kb_assert_ok(kb_subscribe(b, topic, dead_on_arrival, &handled));
    kb_topic *t = kb_topic_get(b, topic, NULL, 0);
    kb_header h = {"traceparent", "00-dead-01", 10};
    for (int i = 0; i < 3; i++) {
        char payload[8];
        snprintf(payload, sizeof payload, "p%d", i);
        kb_msg m = {.key = "k0", .key_len = 2, .payload = payload, .payload_len = 2,
                    .headers = &h, .n_headers = 1};
        kb_assert_ok(kb_publish_ex(t, &m));
    }
    kb_assert_ok(kb_drain(b, 30000));
    kb_topic_stats st;
    for (int i = 0; i < 300 && (kb_stats(b, topic, &st) != KB_OK || st.dlq_length < 3); i++)
        usleep(100 * 1000);
    assert_int_equal(st.dlq_length, 3);
    kb_assert_ok(kb_close(b, 30000));

    static kb_test_cli_result r;
    run(&r, (const char *[]){"dlq-list", topic, "--json", NULL});
    assert_int_equal(r.status, 0);
    assert_int_equal(kb_test_lines(r.out), 3);
    kb_test_check_schema(KB_SOURCE_DIR, "keybus-dlq-list.json", r.out);
    char ids[3][64];
    int i = 0;
    for (const char *s = r.out, *nl; (nl = strchr(s, '\n')) != NULL; s = nl + 1, i++) {
        char line[2048], reason[64], want[64];
        snprintf(line, sizeof line, "%.*s", (int)(nl - s), s);
        json_text(line, "id", ids[i], sizeof ids[i]);
        json_text(line, "reason", reason, sizeof reason);
        snprintf(want, sizeof want, "bad order p%d", i);
        if (ids[i][0] == '\0' || strcmp(reason, want) != 0 || json_number(line, "time_ms") <= 0 ||
            json_number(line, "attempts") != 1 ||
            strstr(line, "\"headers\":[{\"name\":\"traceparent\",\"value\":\"00-dead-01\"}]") == NULL)
            fail_msg("dead letter %d: %s", i, line);
    }
    run(&r, (const char *[]){"dlq-replay", topic, ids[0], NULL});
    char said[256];
    snprintf(said, sizeof said, "replayed %s to %s\tpartition=", ids[0], topic);
    if (r.status != 0 || strstr(r.out, said) == NULL ||
        strstr(r.out, "\treason=bad order p0\tkey=k0\n") == NULL)
        fail_msg("dlq-replay: exit %d: %s%s", r.status, r.out, r.err);
    run(&r, (const char *[]){"dlq-delete", topic, ids[1], NULL});
    snprintf(said, sizeof said, "deleted %s\n", ids[1]);
    if (r.status != 0 || strcmp(r.out, said) != 0)
        fail_msg("dlq-delete: exit %d: %s%s", r.status, r.out, r.err);
    run(&r, (const char *[]){"dlq-delete", topic, ids[1], NULL});
    assert_int_equal(r.status, 4);   /* gone */
    run(&r, (const char *[]){"dlq-purge", topic, NULL});   /* the one left */
    if (r.status != 0 || strcmp(r.out, "purged 1 dead letters\n") != 0)
        fail_msg("dlq-purge: exit %d: %s%s", r.status, r.out, r.err);
    run(&r, (const char *[]){"dlq-list", topic, NULL});
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, "");

    /* a topic the broker does not have: not found, as for stats */
    run(&r, (const char *[]){"dlq-list", "ops.nosuch", NULL});
    assert_int_equal(r.status, 4);
    assert_non_null(strstr(r.err, "keybus dlq-list: not found: "));
    run(&r, (const char *[]){"metrics", "ops.nosuch", NULL});
    assert_int_equal(r.status, 4);
    assert_non_null(strstr(r.err, "keybus metrics: not found: "));
    assert_string_equal(r.out, "");
    /* a configuration kb_open refuses: exit 2, its class named */
    run(&r, (const char *[]){"stats", topic, "-X", "retry.backoff_ms=100", "-X",
                             "retry.max_backoff_ms=50", NULL});
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "keybus stats: invalid argument: "));
}

/* ---- top, under tmux ---- */

/* The pane's text into buf. */
static void capture(const char *sock, char *buf, size_t len)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "tmux -L %s capture-pane -p -t top", sock);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(buf, 1, len - 1, p);
    buf[n] = '\0';
    pclose(p);
}

static void top_redraws_and_quits_on_q(void **state)
{
    (void)state;
    if (kb_test_sh("command -v tmux >/dev/null") != 0)
        skip();   /* scripts/deps.sh installs it */
    char topic[96], sock[64], done[128];
    unique_topic(topic, sizeof topic, "top");
    publish_numbered(topic, 40);
    /* top reports the `group` key's group, which must exist */
    static kb_test_cli_result r;
    run(&r, (const char *[]){"consume", topic, "-g", "keybus", "-n", "1", NULL});
    assert_int_equal(r.status, 0);
    snprintf(sock, sizeof sock, "kbtop%d", (int)getpid());
    snprintf(done, sizeof done, "/tmp/keybus-top-%d.status", (int)getpid());
    unlink(done);
    assert_int_equal(kb_test_sh("TERM=xterm tmux -L %s new-session -d -s top -x 140 -y 20 "
                        "'%s top %s ops.nosuch -X %s; echo $? > %s; sleep 60'",
                        sock, KB_CLI, topic, transport, done),
                     0);
    /* three different frames (the clock line changes each second) */
    char frame[8192], first[8192] = "", seen_clock[3][16] = {{0}};
    int frames = 0;
    for (int i = 0; i < 300 && frames < 3; i++) {
        usleep(100 * 1000);
        capture(sock, frame, sizeof frame);
        const char *clock = strstr(frame, "keybus top ");
        if (clock == NULL || strstr(frame, topic) == NULL)
            continue;
        char now[16];
        snprintf(now, sizeof now, "%.8s", clock + 11);
        if (frames == 0 || strcmp(now, seen_clock[frames - 1]) != 0) {
            snprintf(seen_clock[frames++], sizeof seen_clock[0], "%s", now);
            if (frames == 1)
                snprintf(first, sizeof first, "%s", frame);
        }
    }
    if (frames < 3)
        fail_msg("top drew %d frames in 30 s: %s", frames, frame);
    /* redrawn in place: one header on the screen, the rows under it */
    const char *hdr = strstr(frame, "TOPIC");
    assert_non_null(hdr);
    assert_null(strstr(hdr + 1, "TOPIC"));
    assert_non_null(strstr(frame, "IN/s"));
    assert_non_null(strstr(frame, "not found"));   /* ops.nosuch */
    char row[256];
    snprintf(row, sizeof row, "%s", strstr(frame, topic));
    row[strcspn(row, "\n")] = '\0';
    long long parts = 0, length = 0;
    sscanf(row + strlen(topic), "%lld %lld", &parts, &length);
    if (parts != 8 || length <= 0)
        fail_msg("top's row: %s", row);
    assert_int_equal(kb_test_sh("tmux -L %s send-keys -t top q", sock), 0);
    int status = -1;
    for (int i = 0; i < 200 && status < 0; i++) {
        usleep(100 * 1000);
        FILE *f = fopen(done, "r");
        if (f != NULL && fscanf(f, "%d", &status) != 1)
            status = -1;
        if (f != NULL)
            fclose(f);
    }
    kb_test_sh("tmux -L %s kill-server", sock);
    unlink(done);
    assert_int_equal(status, 0);
}

/* `test_cli_ops KIND [consume|admin]`: ctest runs the halves apart, each
 * well under 30 s in the sanitizer builds (every command is a process). */
int main(int argc, char **argv)
{
    kind = argc > 1 ? argv[1] : "redis";
    const char *half = argc > 2 ? argv[2] : "";
    unsetenv("KEYBUS_TRANSPORT");   /* every command gets it with -X after its arguments */
    if (kb_test_broker_for(kind, &server, url, sizeof url) != 0)
        return 1;
    snprintf(transport, sizeof transport, "transport=%s", url);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(consume_n_takes_exactly_n),
        cmocka_unit_test(consume_prints_headers),
        cmocka_unit_test(dead_letters_listed_replayed_deleted_purged),
        cmocka_unit_test(top_redraws_and_quits_on_q),
    };
    size_t first = strcmp(half, "admin") == 0 ? 2 : 0;
    size_t n = strcmp(half, "consume") == 0 || strcmp(half, "admin") == 0 ? 2 : 4;
    return kb_test_run_group("cli_ops", kind, tests + first, n, &server);
}
