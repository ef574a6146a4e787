/* nats:// URLs and credentials (issue 17): the URL is checked part by part
 * when it is set (no path, no query, strict port), userinfo is
 * percent-decoded, connection errors carry nats.c's own reason, and a marker
 * password or token appears in no message: not in errstr, kb_last_error or
 * the log. Several seed servers (issue 30) take the userinfo each. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <keybus/keybus.h>

#include "support/check.h"
#include "support/server.h"

#define MARKER "Mk7secretQ"

static char logged[8192];

static void log_fn(int level, const char *msg, void *opaque)
{
    (void)level, (void)opaque;
    size_t used = strlen(logged);
    snprintf(logged + used, sizeof logged - used, "%s\n", msg);
}

static void no_marker(const char *err)
{
    if (strstr(err, MARKER) != NULL)
        fail_msg("the marker leaked: %s", err);
    if (strstr(kb_last_error(), MARKER) != NULL)
        fail_msg("the marker leaked into kb_last_error: %s", kb_last_error());
    if (strstr(logged, MARKER) != NULL)
        fail_msg("the marker leaked into the log: %s", logged);
}

/* Malformed URLs are refused by kb_conf_set, naming the part. */
static void malformed_urls(void **state)
{
    (void)state;
    static const struct {
        const char *url, *part;
    } bad[] = {
        {"nats://u:" MARKER "@127.0.0.1:4222/3", "path"},
        {"nats://" MARKER "@127.0.0.1:4222/x/y", "path"},
        {"nats://u:" MARKER "@127.0.0.1:4222?tls=1", "query"},
        {"nats://u:" MARKER "@127.0.0.1:abc", "port"},
        {"nats://u:" MARKER "@127.0.0.1:+4222", "port"},
        {"nats://u:" MARKER "@127.0.0.1:0", "port"},
        {"nats://u:" MARKER "@:4222", "host"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kb_conf *c = kb_conf_new();
        char err[256] = "";
        assert_int_equal(kb_conf_set(c, "transport", bad[i].url, err, sizeof err), KB_EINVAL);
        if (strstr(err, bad[i].part) == NULL)
            fail_msg("%s: \"%s\" does not name the %s", bad[i].url, err, bad[i].part);
        no_marker(err);
        kb_conf_destroy(c);
    }
    kb_conf *c = kb_conf_new();
    char err[256] = "";
    kb_assert_ok(kb_conf_set(c, "transport", "nats://u:p%40ss@127.0.0.1:4222/", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "nats.token", MARKER "\n", err, sizeof err));
    kb_conf_destroy(c);
}

static kb_bus *try_open(const char *url, const char *key, const char *value, char *err,
                        size_t errlen)
{
    kb_conf *c = kb_conf_new();
    kb_conf_set_log(c, log_fn, NULL);
    kb_assert_ok(kb_conf_set(c, "transport", url, err, errlen));
    if (key != NULL)
        kb_assert_ok(kb_conf_set(c, key, value, err, errlen));
    kb_bus *b = kb_open(c, err, errlen);
    if (b == NULL)
        kb_conf_destroy(c);
    return b;
}

/* A password with '@', '/', '#', '?' and '%' works once percent-encoded;
 * the wrong one is refused with the server's reason, never echoed. */
static void decoded_userinfo(void **state)
{
    (void)state;
    const char *const extra[] = {"--user", "alice", "--pass", "p@ss/w#r?d%" MARKER, NULL};
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", extra), 0);
    char url[256], err[512] = "";
    snprintf(url, sizeof url, "nats://alice:p%%40ss%%2Fw%%23r%%3Fd%%25" MARKER "@127.0.0.1:%d",
             s.port);
    logged[0] = '\0';
    kb_bus *b = try_open(url, NULL, NULL, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open with a percent-encoded password: %s", err);
    kb_assert_ok(kb_close(b, 5000));

    snprintf(url, sizeof url, "nats://alice:wrong" MARKER "@127.0.0.1:%d", s.port);
    assert_null(try_open(url, NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "127.0.0.1"));
    print_message("wrong password: %s\n", err);
    assert_non_null(strstr(err, "uthorization"));   /* nats.c's reason, not just "Error" */
    no_marker(err);
    kb_test_server_stop(&s);
}

/* Several seed servers: the userinfo goes with every one, a dead first seed
 * does not stop kb_open; nats.replicas is range-checked when set, and more
 * than one replica on a server that is no cluster fails naming the server's
 * reason. */
static void server_list(void **state)
{
    (void)state;
    const char *const extra[] = {"--user", "alice", "--pass", MARKER, NULL};
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", extra), 0);
    char url[256], err[512] = "";
    snprintf(url, sizeof url, "nats://alice:" MARKER "@127.0.0.1:%d,127.0.0.1:%d",
             kb_test_free_port(), s.port);
    logged[0] = '\0';
    kb_bus *b = try_open(url, "nats.replicas", "3", err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open with a dead first seed: %s", err);
    assert_int_equal(kb_publish(b, "urls.list", "k", 1, "v", 1), KB_ETRANSPORT);
    print_message("nats.replicas=3 on one server: %s\n", kb_last_error());
    assert_non_null(strstr(kb_last_error(), "eplicas"));
    no_marker(kb_last_error());
    kb_assert_ok(kb_close(b, 5000));
    /* the form the NATS tools use: the scheme again before every server */
    snprintf(url, sizeof url, "nats://alice:" MARKER "@127.0.0.1:%d,nats://127.0.0.1:%d",
             kb_test_free_port(), s.port);
    b = try_open(url, "nats.replicas", "1", err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open with nats:// before every seed: %s", err);
    kb_assert_ok(kb_publish(b, "urls.list", "k", 1, "v", 1));
    kb_assert_ok(kb_flush(b, 10000));
    kb_assert_ok(kb_close(b, 5000));
    kb_conf *c = kb_conf_new();
    assert_int_equal(kb_conf_set(c, "nats.replicas", "6", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "nats.replicas"));
    assert_int_equal(kb_conf_set(c, "transport", "nats://127.0.0.1:1,,127.0.0.1:2", err,
                                 sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "host list"));
    kb_conf_destroy(c);
    no_marker(err);
    kb_test_server_stop(&s);
}

/* A wrong nats.token: the server's reason, not the token. */
static void wrong_token(void **state)
{
    (void)state;
    const char *const extra[] = {"--auth", "right-token", NULL};
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", extra), 0);
    char err[512] = "";
    logged[0] = '\0';
    assert_null(try_open(s.url, "nats.token", MARKER, err, sizeof err));
    assert_non_null(strstr(err, "uthorization"));
    no_marker(err);
    kb_bus *b = try_open(s.url, "nats.token", "right-token", err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open with the right token: %s", err);
    kb_assert_ok(kb_close(b, 5000));
    kb_test_server_stop(&s);
}

/* Files nats.c cannot read: its reason, not a bare "Error". */
static void unreadable_files(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "nats", NULL), 0);
    char err[512] = "";
    assert_null(try_open(s.url, "nats.creds_file", "/nonexistent/" MARKER ".creds", err,
                         sizeof err));
    print_message("missing creds file: %s\n", err);
    no_marker(err);
    assert_non_null(strstr(err, "nats.creds_file"));
    assert_null(strstr(err, ": Error"));
    assert_true(strlen(err) > strlen("nats : bad connection options: Error"));
    assert_null(try_open(s.url, "nats.tls_ca", "/nonexistent/ca.pem", err, sizeof err));
    print_message("missing CA file: %s\n", err);
    assert_non_null(strstr(err, "ca.pem"));
    kb_test_server_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(malformed_urls),
        cmocka_unit_test(decoded_userinfo),
        cmocka_unit_test(server_list),
        cmocka_unit_test(wrong_token),
        cmocka_unit_test(unreadable_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
