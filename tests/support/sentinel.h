/* Test harness: a Redis primary, one replica of it and three Sentinels
 * watching it, all real servers on free loopback ports, each in its own temp
 * dir, stopped by PID (server.h). */
#ifndef KB_TEST_SENTINEL_H
#define KB_TEST_SENTINEL_H

#include "server.h"

#define KB_TEST_MASTER "kbmaster"   /* the name the Sentinels know the primary by */

typedef struct kb_test_sentinels {
    kb_test_server node[2];          /* node[0] starts as primary, node[1] as its replica */
    kb_test_server sentinel[3];
    char url[256];                   /* redis-sentinel://<the three Sentinels>/kbmaster */
    char primary_port[16];           /* arguments the servers keep pointers to */
    char down_after[16], failover_timeout[16];
} kb_test_sentinels;

/* Start the five; the Sentinels (quorum 2) call the primary down after
 * `down_after_ms` without an answer and give a failover `failover_timeout_ms`.
 * Returns once every Sentinel sees the replica and the two other Sentinels
 * (up to 30 s): 0, or -1 (said on stderr; what started is stopped). */
int kb_test_sentinels_start(kb_test_sentinels *s, int down_after_ms, int failover_timeout_ms);

/* Index (0 or 1) of the node that Sentinel `i` names the primary, or -1. */
int kb_test_sentinels_primary(const kb_test_sentinels *s, int i);

/* Stop every server still running and remove their dirs. */
void kb_test_sentinels_stop(kb_test_sentinels *s);

#endif /* KB_TEST_SENTINEL_H */
