/* The $JS.ACK reply-subject parser of the NATS transport (nats_msg.c, hand
 * written for speed) pinned against nats.c's own natsMsg_GetMetaData: on
 * real messages from a real server (v1 subjects, first deliveries and
 * redeliveries), and on v1 and v2 subjects built by hand (nats-server 2.9
 * sends v1 only), with and without a domain and the trailing random token. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nats/nats.h>

#include "../transports/nats/nats_msg.h"
#include "support/server.h"

static kb_test_server srv;
static natsConnection *nc;

/* Both parsers agree on the consumer, delivery count and stream sequence of
 * a received message (natsMsg_GetMetaData wants one a subscription got). */
static void agree(natsMsg *m)
{
    const char *reply = natsMsg_GetReply(m);
    assert_non_null(reply);
    jsMsgMetaData *md = NULL;
    natsStatus s = natsMsg_GetMetaData(&md, m);
    kb_nats_meta mine;
    int rc = kb__nats_parse_ack(reply, &mine);
    if (s != NATS_OK) {
        if (rc == 0)
            fail_msg("%s: nats.c refuses it (%s), keybus reads it", reply, nats_GetLastError(NULL));
    } else {
        assert_int_equal(rc, 0);
        assert_string_equal(mine.consumer, md->Consumer);
        assert_int_equal(mine.delivered, (uint64_t)md->NumDelivered);
        assert_int_equal(mine.sseq, md->Sequence.Stream);
        assert_int_equal(mine.dseq, md->Sequence.Consumer);
    }
    jsMsgMetaData_Destroy(md);
}

static void real_messages(void **state)
{
    (void)state;
    jsCtx *js = NULL;
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    const char *subjects[] = {"ackparse.>"};
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = "ACKPARSE";
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    assert_int_equal(js_AddStream(NULL, js, &sc, NULL, NULL), NATS_OK);
    for (int i = 0; i < 5; i++)
        assert_int_equal(js_Publish(NULL, js, "ackparse.a", "v", 1, NULL, NULL), NATS_OK);
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Config.AckWait = 200 * 1000000LL;   /* redeliveries come quickly */
    assert_int_equal(js_PullSubscribe(&sub, js, "ackparse.a", "kb_c_1_7", NULL, &so, NULL),
                     NATS_OK);
    int seen = 0, redelivered = 0;
    for (int round = 0; round < 20 && redelivered == 0; round++) {
        natsMsgList l = {0};
        if (natsSubscription_Fetch(&l, sub, 5, 2000, NULL) != NATS_OK)
            continue;
        for (int i = 0; i < l.Count; i++) {
            agree(l.Msgs[i]);
            kb_nats_meta mine;
            assert_int_equal(kb__nats_parse_ack(natsMsg_GetReply(l.Msgs[i]), &mine), 0);
            redelivered += mine.delivered > 1;
            seen++;
        }
        natsMsgList_Destroy(&l);   /* unacked: they come again */
    }
    assert_true(seen >= 5);
    assert_true(redelivered > 0);
    natsSubscription_Destroy(sub);
    jsCtx_Destroy(js);
}

/* v2 subjects as a server would send them. A real server drops a client's
 * publish whose reply is a $JS.ACK subject and 2.9 sends v1 only, so a fake
 * server on a socket (this thread) delivers them: MSG lines with these
 * replies, once the client subscribed. */
static const char *const built[] = {
    /* v1: stream, consumer, delivered, sseq, dseq, ts, pending */
    "$JS.ACK.KB_t_1234abcd.grp_3_17.1.42.40.1700000000000000000.5",
    "$JS.ACK.S.c.7.9007199254740993.1.1.0",
    /* v2: domain ("_" for none), account hash, the v1 fields, a random token */
    "$JS.ACK._.ACCHASH.KB_t_1234abcd.grp_3_17.2.42.40.1700000000000000000.5.tok123",
    "$JS.ACK.hub.ACCHASH.KB_t_1234abcd.grp_3_17.3.99.41.1700000000000000000.0.tok",
    "$JS.ACK.hub.ACCHASH.S.c.4.5.6.1700000000000000000.0",
    /* malformed */
    "$JS.ACK.S.c.1.2.3",
    "$JS.ACK.S.c.x.0.1.1.0",
};
#define N_BUILT (sizeof built / sizeof built[0])

static int fake_listener = -1;

static void *fake_server(void *arg)
{
    (void)arg;
    int fd = accept(fake_listener, NULL, NULL);
    if (fd < 0)
        return NULL;
    static const char info[] = "INFO {\"server_id\":\"fake\",\"version\":\"2.9.0\",\"proto\":1,"
                               "\"headers\":true,\"max_payload\":1048576}\r\n";
    if (write(fd, info, sizeof info - 1) < 0)
        goto out;
    char buf[4096];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
        char *eol;
        while ((eol = strstr(buf, "\r\n")) != NULL) {
            *eol = '\0';
            char sid[32];
            if (strncmp(buf, "PING", 4) == 0) {
                if (write(fd, "PONG\r\n", 6) < 0)
                    goto out;
            } else if (sscanf(buf, "SUB ackparse.built %31s", sid) == 1) {
                for (size_t i = 0; i < N_BUILT; i++) {
                    char msg[512];
                    int ml = snprintf(msg, sizeof msg, "MSG ackparse.built %s %s 1\r\nx\r\n", sid,
                                      built[i]);
                    if (write(fd, msg, (size_t)ml) < 0)
                        goto out;
                }
            }
            len -= (size_t)(eol + 2 - buf);
            memmove(buf, eol + 2, len + 1);
        }
    }
out:
    close(fd);
    return NULL;
}

static void built_subjects(void **state)
{
    (void)state;
    fake_listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(fake_listener, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fake_listener, 1), 0);
    assert_int_equal(getsockname(fake_listener, (struct sockaddr *)&a, &al), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fake_server, NULL), 0);
    char url[64];
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", ntohs(a.sin_port));
    natsConnection *fc = NULL;
    natsSubscription *sub = NULL;
    assert_int_equal(natsConnection_ConnectTo(&fc, url), NATS_OK);
    assert_int_equal(natsConnection_SubscribeSync(&sub, fc, "ackparse.built"), NATS_OK);
    for (size_t i = 0; i < N_BUILT; i++) {
        natsMsg *m = NULL;
        assert_int_equal(natsSubscription_NextMsg(&m, sub, 5000), NATS_OK);
        assert_string_equal(natsMsg_GetReply(m), built[i]);
        agree(m);
        natsMsg_Destroy(m);
    }
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(fc);
    pthread_join(th, NULL);
    close(fake_listener);
    kb_nats_meta mine;
    assert_int_not_equal(kb__nats_parse_ack("_INBOX.abc.1.2.3", &mine), 0);
    assert_int_equal(kb__nats_parse_ack(built[3], &mine), 0);
    assert_string_equal(mine.consumer, "grp_3_17");
    assert_int_equal(mine.delivered, 3);
    assert_int_equal(mine.sseq, 99);
    assert_int_equal(mine.dseq, 41);
}

static int setup(void **state)
{
    (void)state;
    if (kb_test_server_start(&srv, "nats", NULL) != 0)
        return -1;
    return natsConnection_ConnectTo(&nc, srv.url) == NATS_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    natsConnection_Destroy(nc);
    kb_test_server_stop(&srv);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(built_subjects),
        cmocka_unit_test(real_messages),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
