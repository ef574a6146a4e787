/* docs/formats.md holds: the JSON the tools print matches docs/schemas/
 * (tests/check_schema.py, python3-jsonschema), and the page names every
 * field. argv[1]: mem (keybus-bench --json) | redis | nats (keybus stats,
 * keybus consume --json, on a broker the harness starts). */
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

/* The baselines use ck's fences, which TSan cannot see (as bench_smoke). */
#if defined(__SANITIZE_THREAD__)
#define BASELINES "--no-baselines"
#else
#define BASELINES "--baselines"
#endif

static const char *kind = "mem";
static char url[160] = "mem://";
static char out[64];

static void check(const char *schema)
{
    assert_int_equal(kb_test_sh("python3 %s/tests/check_schema.py %s/docs/schemas/%s %s "
                                "%s/docs/formats.md",
                                KB_SOURCE_DIR, KB_SOURCE_DIR, schema, out, KB_SOURCE_DIR),
                     0);
}

static void bench_json_matches_its_schema(void **state)
{
    (void)state;
    assert_int_equal(kb_test_sh("%s --events 2000 --large-events 0 --scenario all " BASELINES
                                " --json - > %s 2>/dev/null", KB_BENCH, out),
                     0);
    check("keybus-bench.json");
}

static void stats_and_consume_json_match_their_schemas(void **state)
{
    (void)state;
    char topic[64];
    snprintf(topic, sizeof topic, "formats.%d", (int)getpid());
    const char *const kv[] = {"conf.env", "false", NULL};
    kb_bus *b = kb_test_open(url, kv, NULL);
    kb_assert_ok(kb_publish(b, topic, "order-1", 7, "created", 7));
    kb_assert_ok(kb_publish(b, topic, "\xff\xfe", 2, "\x80", 1));   /* base64 */
    kb_assert_ok(kb_flush(b, 30000));
    kb_assert_ok(kb_close(b, 30000));

    assert_int_equal(kb_test_sh("%s -X conf.env=false -X transport=%s consume %s -g formats -n 2 "
                                "--json --timeout-ms 20000 > %s 2>/dev/null",
                                KB_CLI, url, topic, out),
                     0);
    check("keybus-consume.json");
    assert_int_equal(kb_test_sh("grep -c . %s | grep -qx 2 && grep -q key_base64 %s", out, out), 0);
    /* stats reports a group that exists: the one consume made */
    assert_int_equal(kb_test_sh("%s -X conf.env=false -X transport=%s stats %s -X group=formats "
                                "> %s", KB_CLI, url, topic, out),
                     0);
    check("keybus-stats.json");
}

int main(int argc, char **argv)
{
    kind = argc > 1 ? argv[1] : "mem";
    snprintf(out, sizeof out, "/tmp/keybus-formats-%d.json", (int)getpid());
    kb_test_server server = {0};
    if (kb_test_broker_for(kind, &server, url, sizeof url) != 0)
        return 1;
    const struct CMUnitTest mem_tests[] = {cmocka_unit_test(bench_json_matches_its_schema)};
    const struct CMUnitTest broker_tests[] = {
        cmocka_unit_test(stats_and_consume_json_match_their_schemas)};
    bool mem = strcmp(kind, "mem") == 0;
    int failed = kb_test_run_group("formats", kind, mem ? mem_tests : broker_tests, 1, &server);
    unlink(out);
    return failed;
}
