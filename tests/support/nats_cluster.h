/* Test harness: a 3-node NATS JetStream cluster, real nats-server processes
 * on free loopback ports, each with its own store dir and a generated config
 * file (server_name, jetstream store_dir, cluster name/listen/routes, a
 * monitoring port), stopped by PID (server.h). */
#ifndef KB_TEST_NATS_CLUSTER_H
#define KB_TEST_NATS_CLUSTER_H

#include "server.h"

#define KB_TEST_CLUSTER_NODES 3

typedef struct kb_test_nats_cluster {
    kb_test_server node[KB_TEST_CLUSTER_NODES];   /* node[i] is server_name "n<i>" */
    int route_port[KB_TEST_CLUSTER_NODES];
    int http_port[KB_TEST_CLUSTER_NODES];
    char url[256];   /* nats://127.0.0.1:p0,127.0.0.1:p1,127.0.0.1:p2 */
} kb_test_nats_cluster;

/* Start the three nodes and wait (up to 30 s) until every one reports
 * JetStream healthy with a meta leader (GET /healthz); a node that does not
 * start (a port taken meanwhile) makes it try again on other ports, three
 * times at most. Returns 0, or -1 (said on stderr; what started is stopped). */
int kb_test_nats_cluster_start(kb_test_nats_cluster *c);

/* Restart node i (after a kill) on its ports, dir and config; waits until it
 * is healthy again (up to 30 s), or at least serving when its streams have
 * not caught up by then (said on stderr). 0 or -1. */
int kb_test_nats_cluster_restart(kb_test_nats_cluster *c, int i);

/* Wait until node i answers GET /healthz with 200 (JetStream current, a meta
 * leader known): 0, or -1 after timeout_ms. */
int kb_test_nats_cluster_healthy(const kb_test_nats_cluster *c, int i, int timeout_ms);

/* The node leading JetStream stream `stream` (its index), asked of any node
 * running; -1 when none names one within 15 s. */
int kb_test_nats_cluster_leader(const kb_test_nats_cluster *c, const char *stream);

/* Index of the node whose server_name is `name` ("n0".."n2"), or -1. */
int kb_test_nats_cluster_index(const char *name);

/* Stop every node still running and remove their dirs. */
void kb_test_nats_cluster_stop(kb_test_nats_cluster *c);

#endif /* KB_TEST_NATS_CLUSTER_H */
