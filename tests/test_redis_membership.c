/* Membership changes under load on Redis (redis.lease_ttl_ms = 3000): a
 * second consumer process joining, one of two leaving with SIGTERM, a rolling
 * restart of both. keybus-membership (bench/membership.c) runs a producer at
 * 250 events/s over 100 keys and the consumer processes. Each case asserts
 * no event lost, per-key order, and the longest pause of one partition within
 * 8 s (the target is 2 s); the measured figures are printed ("# ...");
 * sanitizer builds assert only that handling resumes (60 s).
 * Usage: test_redis_membership PATH_TO_keybus-membership */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>

#include "support/membership.h"
#include "support/server.h"

static const char *prog;
static kb_test_server server;
static kb_test_mship mship;

static void run(kb_test_mship_change change)
{
    kb_test_mship_case(&mship, prog, server.url, change, NULL, NULL, 8.0);
}

static void join_under_load(void **state)
{
    (void)state;
    run(KB_TEST_MSHIP_JOIN);
}

static void leave_under_load(void **state)
{
    (void)state;
    run(KB_TEST_MSHIP_LEAVE);
}

static void rolling_restart(void **state)
{
    (void)state;
    run(KB_TEST_MSHIP_ROLLING);
}

/* A fresh server per case: each starts from an empty group. */
static int setup(void **state)
{
    (void)state;
    return kb_test_server_start(&server, "redis", NULL);
}

static int teardown(void **state)
{
    (void)state;
    kb_test_mship_cleanup(&mship);
    kb_test_server_stop(&server);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    prog = argv[1];
    setenv("KEYBUS_REDIS_LEASE_TTL_MS", "3000", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(join_under_load, setup, teardown),
        cmocka_unit_test_setup_teardown(leave_under_load, setup, teardown),
        cmocka_unit_test_setup_teardown(rolling_restart, setup, teardown),
    };
    return cmocka_run_group_tests_name("redis_membership", tests, NULL, NULL);
}
