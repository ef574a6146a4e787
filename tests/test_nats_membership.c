/* Membership changes under load on a 3-node JetStream cluster (nats.replicas
 * = 3, the URL naming all three seeds, nats.lease_ttl_ms = 3000): a node lost
 * for good (the topic stream's leader, the lease bucket's leader, a node that
 * leads neither), a rolling restart of the two consumer processes, a second
 * process joining. keybus-membership (bench/membership.c) runs a producer at
 * 250 events/s over 100 keys and the consumer processes. Each case asserts
 * no event lost, per-key order, and the longest pause of one partition within
 * a wide bound: a node lost 6 x (lease TTL + 2 s), a membership change 12 s
 * (the targets are TTL + 2 s and 2 s; a loaded 2-CPU machine stretches the
 * server's own elections). The measured figures are printed
 * ("# ..."); sanitizer builds assert only that handling resumes (60 s).
 * Usage: test_nats_membership PATH_TO_keybus-membership */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <nats/nats.h>

#include "support/membership.h"
#include "support/nats_cluster.h"
#include "support/suite.h"

#define TTL_S 3.0   /* nats.lease_ttl_ms */

static const char *prog;
static kb_test_nats_cluster cluster;
static kb_test_mship mship;

typedef enum { STREAM_LEADER, KV_LEADER, NEITHER } victim;

/* Kill -9 the node `*opaque` names, and leave it down. */
static void lose_node(kb_test_mship *m, void *opaque, char *said, size_t len)
{
    char stream[256];
    kb_test_nats_stream(m->topic, stream, sizeof stream);
    int s = kb_test_nats_cluster_leader(&cluster, stream);
    int kv = kb_test_nats_cluster_leader(&cluster, "KV_keybus_leases"), node = -1;
    switch (*(victim *)opaque) {
    case STREAM_LEADER:
        node = s;
        break;
    case KV_LEADER:
        node = kv;
        break;
    case NEITHER:
        for (int i = 0; i < KB_TEST_CLUSTER_NODES && node < 0; i++)
            if (i != s && i != kv)
                node = i;
        break;
    }
    assert_in_range(node, 0, KB_TEST_CLUSTER_NODES - 1);
    kb_test_server_signal(&cluster.node[node], SIGKILL);
    snprintf(said, len, "n%d killed -9 and left down (stream leader n%d, lease bucket leader n%d)",
             node, s, kv);
}

static void run(kb_test_mship_change change, victim v, double bound)
{
    kb_test_mship_case(&mship, prog, cluster.url, change, lose_node, &v, bound);
}

static void stream_leader_lost(void **state)
{
    (void)state;
    run(KB_TEST_MSHIP_OTHER, STREAM_LEADER, 6 * (TTL_S + 2));
}

static void kv_leader_lost(void **state)
{
    (void)state;
    run(KB_TEST_MSHIP_OTHER, KV_LEADER, 6 * (TTL_S + 2));
}

static void bystander_lost(void **state)
{
    (void)state;
    run(KB_TEST_MSHIP_OTHER, NEITHER, 6 * (TTL_S + 2));
}

static void rolling_restart(void **state)
{
    (void)state;
    run(KB_TEST_MSHIP_ROLLING, NEITHER, 12.0);
}

static void join_under_load(void **state)
{
    (void)state;
    run(KB_TEST_MSHIP_JOIN, NEITHER, 12.0);
}

/* A fresh cluster per case: a node lost for good stays lost. */
static int setup(void **state)
{
    (void)state;
    return kb_test_nats_cluster_start(&cluster);
}

static int teardown(void **state)
{
    (void)state;
    kb_test_mship_cleanup(&mship);
    kb_test_nats_cluster_stop(&cluster);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    prog = argv[1];
    setenv("KEYBUS_NATS_REPLICAS", "3", 1);
    setenv("KEYBUS_NATS_LEASE_TTL_MS", "3000", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(stream_leader_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(kv_leader_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(bystander_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(rolling_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(join_under_load, setup, teardown),
    };
    int rc = cmocka_run_group_tests_name("nats_membership", tests, NULL, NULL);
    nats_Close();
    return rc;
}
