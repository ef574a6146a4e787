#include "nats_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

/* One HTTP/1.0 GET of `path` on 127.0.0.1:port: the status code, or -1. */
static int http_status(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[256], resp[64] = "";
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    int code = -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, req, (size_t)n) == n &&
        read(fd, resp, sizeof resp - 1) > 12)
        sscanf(resp, "HTTP/%*s %d", &code);
    close(fd);
    return code;
}

int kb_test_nats_cluster_healthy(const kb_test_nats_cluster *c, int i, int timeout_ms)
{
    struct timespec nap = {0, 100 * 1000000L};
    for (int waited = 0; waited <= timeout_ms; waited += 100) {
        if (http_status(c->http_port[i], "/healthz") == 200)
            return 0;
        nanosleep(&nap, NULL);
    }
    return -1;
}

int kb_test_nats_cluster_index(const char *name)
{
    if (name == NULL || name[0] != 'n' || name[1] < '0' ||
        name[1] >= '0' + KB_TEST_CLUSTER_NODES || name[2] != '\0')
        return -1;
    return name[1] - '0';
}

int kb_test_nats_cluster_leader(const kb_test_nats_cluster *c, const char *stream)
{
    for (int tries = 0; tries < 150; tries++) {
        for (int i = 0; i < KB_TEST_CLUSTER_NODES; i++) {
            if (c->node[i].pid <= 0)
                continue;
            natsConnection *nc = NULL;
            jsCtx *js = NULL;
            jsStreamInfo *si = NULL;
            int leader = -1;
            if (natsConnection_ConnectTo(&nc, c->node[i].url) == NATS_OK &&
                natsConnection_JetStream(&js, nc, NULL) == NATS_OK &&
                js_GetStreamInfo(&si, js, stream, NULL, NULL) == NATS_OK && si->Cluster != NULL)
                leader = kb_test_nats_cluster_index(si->Cluster->Leader);
            jsStreamInfo_Destroy(si);
            jsCtx_Destroy(js);
            natsConnection_Destroy(nc);
            if (leader >= 0)
                return leader;
        }
        usleep(100000);
    }
    return -1;
}

static int write_conf(const kb_test_nats_cluster *c, int i)
{
    char path[300];
    snprintf(path, sizeof path, "%s/server.conf", c->node[i].dir);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "server_name: n%d\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\n"
               "jetstream { store_dir: \"%s/js\" }\n"
               "cluster {\n  name: kbcluster\n  listen: 127.0.0.1:%d\n  routes: [\n",
            i, c->node[i].port, c->http_port[i], c->node[i].dir, c->route_port[i]);
    for (int j = 0; j < KB_TEST_CLUSTER_NODES; j++)
        if (j != i)
            fprintf(f, "    nats-route://127.0.0.1:%d\n", c->route_port[j]);
    fprintf(f, "  ]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

static int start_once(kb_test_nats_cluster *c)
{
    memset(c, 0, sizeof *c);
    size_t o = (size_t)snprintf(c->url, sizeof c->url, "nats://");
    for (int i = 0; i < KB_TEST_CLUSTER_NODES; i++) {
        kb_test_server *s = &c->node[i];
        s->kind = "nats-conf";
        snprintf(s->dir, sizeof s->dir, "/tmp/keybus-ncluster-XXXXXX");
        if (mkdtemp(s->dir) == NULL) {
            s->dir[0] = '\0';
            kb_test_nats_cluster_stop(c);
            return -1;
        }
        s->port = kb_test_free_port();
        c->route_port[i] = kb_test_free_port();
        c->http_port[i] = kb_test_free_port();
        snprintf(s->url, sizeof s->url, "nats://127.0.0.1:%d", s->port);
        o += (size_t)snprintf(c->url + o, sizeof c->url - o, "%s127.0.0.1:%d", i ? "," : "",
                              s->port);
    }
    for (int i = 0; i < KB_TEST_CLUSTER_NODES; i++)
        if (write_conf(c, i) != 0 || kb_test_server_restart(&c->node[i]) != 0) {
            fprintf(stderr, "nats cluster: node n%d did not start (log in %s)\n", i,
                    c->node[i].dir);
            kb_test_nats_cluster_stop(c);
            return -1;
        }
    for (int i = 0; i < KB_TEST_CLUSTER_NODES; i++)
        if (kb_test_nats_cluster_healthy(c, i, 30000) != 0) {
            fprintf(stderr, "nats cluster: node n%d not healthy within 30 s (log in %s)\n", i,
                    c->node[i].dir);
            kb_test_nats_cluster_stop(c);
            return -1;
        }
    return 0;
}

int kb_test_nats_cluster_start(kb_test_nats_cluster *c)
{
    /* a free port handed out here can be taken by another test before its
     * node binds it: then the node exits, and a fresh set of ports is tried */
    for (int attempt = 0; attempt < 3; attempt++)
        if (start_once(c) == 0)
            return 0;
    return -1;
}

int kb_test_nats_cluster_restart(kb_test_nats_cluster *c, int i)
{
    if (kb_test_server_restart(&c->node[i]) != 0)
        return -1;
    if (kb_test_nats_cluster_healthy(c, i, 30000) == 0)
        return 0;
    /* /healthz waits for the node's streams to catch up, which nats-server
     * 2.9 can stall for minutes on a loaded machine ("Catchup for stream ...
     * stalled"); the cluster keeps its quorum without it, which is all the
     * tests ask of a restarted node: serving is enough */
    if (http_status(c->http_port[i], "/varz") != 200)
        return -1;
    fprintf(stderr, "nats cluster: node %d restarted, serving, its streams not caught up in 30 s\n",
            i);
    return 0;
}

void kb_test_nats_cluster_stop(kb_test_nats_cluster *c)
{
    for (int i = 0; i < KB_TEST_CLUSTER_NODES; i++)
        if (c->node[i].dir[0] != '\0')
            kb_test_server_stop(&c->node[i]);
}
