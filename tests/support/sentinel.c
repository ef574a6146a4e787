#include "sentinel.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

static redisContext *connect_to(int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c != NULL && c->err) {
        redisFree(c);
        return NULL;
    }
    if (c != NULL)
        redisSetTimeout(c, tv);
    return c;
}

/* A numeric field of `SENTINEL MASTER kbmaster` on Sentinel `port`, or -1. */
static long master_field(int port, const char *name)
{
    redisContext *c = connect_to(port);
    if (c == NULL)
        return -1;
    long v = -1;
    redisReply *r = redisCommand(c, "SENTINEL MASTER %s", KB_TEST_MASTER);
    for (size_t i = 0; r != NULL && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2)
        if (r->element[i]->type == REDIS_REPLY_STRING && strcmp(r->element[i]->str, name) == 0 &&
            r->element[i + 1]->type == REDIS_REPLY_STRING)
            v = strtol(r->element[i + 1]->str, NULL, 10);
    freeReplyObject(r);
    redisFree(c);
    return v;
}

int kb_test_sentinels_primary(const kb_test_sentinels *s, int i)
{
    redisContext *c = connect_to(s->sentinel[i].port);
    if (c == NULL)
        return -1;
    int at = -1;
    redisReply *r = redisCommand(c, "SENTINEL GET-MASTER-ADDR-BY-NAME %s", KB_TEST_MASTER);
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING)
        for (int n = 0; n < 2; n++)
            if (atoi(r->element[1]->str) == s->node[n].port)
                at = n;
    freeReplyObject(r);
    redisFree(c);
    return at;
}

/* Does node `port` report its replica's link online (INFO replication)? */
static bool replica_online(int port)
{
    redisContext *c = connect_to(port);
    if (c == NULL)
        return false;
    redisReply *r = redisCommand(c, "INFO replication");
    bool online = r != NULL && r->type == REDIS_REPLY_STRING && strstr(r->str, "state=online") != NULL;
    freeReplyObject(r);
    redisFree(c);
    return online;
}

/* The replica is in sync, and every Sentinel sees it and the other two (up
 * to 30 s). */
static int settled(const kb_test_sentinels *s)
{
    struct timespec nap = {0, 100 * 1000000L};
    for (int tries = 0; tries < 300; tries++) {
        int ready = replica_online(s->node[0].port) ? 0 : -1;
        for (int i = 0; i < 3; i++)
            ready += master_field(s->sentinel[i].port, "num-slaves") >= 1 &&
                     master_field(s->sentinel[i].port, "num-other-sentinels") >= 2;
        if (ready == 3)
            return 0;
        nanosleep(&nap, NULL);
    }
    fprintf(stderr, "the Sentinels did not all see the replica and each other within 30 s\n");
    return -1;
}

int kb_test_sentinels_start(kb_test_sentinels *s, int down_after_ms, int failover_timeout_ms)
{
    memset(s, 0, sizeof *s);
    /* a replica syncs at once, not after the default 5 s of diskless-sync delay */
    static const char *const primary[] = {"--repl-diskless-sync-delay", "0", NULL};
    if (kb_test_server_start(&s->node[0], "redis", primary) != 0)
        return -1;
    snprintf(s->primary_port, sizeof s->primary_port, "%d", s->node[0].port);
    snprintf(s->down_after, sizeof s->down_after, "%d", down_after_ms);
    snprintf(s->failover_timeout, sizeof s->failover_timeout, "%d", failover_timeout_ms);
    const char *replica[] = {"--replicaof", "127.0.0.1", s->primary_port,
                             "--repl-diskless-sync-delay", "0", NULL};
    const char *watch[] = {"--sentinel", "monitor", KB_TEST_MASTER, "127.0.0.1", s->primary_port, "2",
                           "--sentinel", "down-after-milliseconds", KB_TEST_MASTER, s->down_after,
                           "--sentinel", "failover-timeout", KB_TEST_MASTER, s->failover_timeout,
                           NULL};
    int rc = kb_test_server_start(&s->node[1], "redis", replica);
    size_t n = (size_t)snprintf(s->url, sizeof s->url, "redis-sentinel://");
    for (int i = 0; i < 3 && rc == 0; i++) {
        rc = kb_test_server_start(&s->sentinel[i], "sentinel", watch);
        n += (size_t)snprintf(s->url + n, sizeof s->url - n, "%s127.0.0.1:%d", i ? "," : "",
                              s->sentinel[i].port);
    }
    snprintf(s->url + n, sizeof s->url - n, "/%s", KB_TEST_MASTER);
    if (rc == 0)
        rc = settled(s);
    if (rc != 0)
        kb_test_sentinels_stop(s);
    return rc;
}

void kb_test_sentinels_stop(kb_test_sentinels *s)
{
    for (int i = 0; i < 3; i++)
        kb_test_server_stop(&s->sentinel[i]);
    for (int i = 0; i < 2; i++)
        kb_test_server_stop(&s->node[i]);
}
