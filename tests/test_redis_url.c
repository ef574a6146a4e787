/* The redis:// URL and the redis.* keys, read exactly (issue 17): every part
 * checked when `transport` is set, messages that name the part and never the
 * password, userinfo percent-decoded and as long as the key allows, cross-key
 * rules at kb_open, and a malformed dead-letter ID as KB_EINVAL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/server.h"

#define MARKER "Zq7markerPW"   /* must appear in no message */

static void no_marker(const char *err)
{
    if (strstr(err, MARKER) != NULL)
        fail_msg("the password leaked: \"%s\"", err);
    if (strstr(kb_last_error(), MARKER) != NULL)
        fail_msg("the password leaked into kb_last_error: \"%s\"", kb_last_error());
}

/* Refused by kb_conf_set, with a message naming `part`. */
static void set_fails(const char *url, const char *part)
{
    kb_conf *c = kb_conf_new();
    char err[512] = "";
    int rc = kb_conf_set(c, "transport", url, err, sizeof err);
    kb_conf_destroy(c);
    if (rc == KB_OK)
        fail_msg("kb_conf_set accepted %s", url);
    assert_int_equal(rc, KB_EINVAL);
    no_marker(err);
    if (strstr(err, part) == NULL)
        fail_msg("for %s: \"%s\" does not name the %s", url, err, part);
}

static void malformed_urls_refused_at_set(void **state)
{
    (void)state;
    set_fails("redis://u:" MARKER "@h:0", "port");
    set_fails("redis://u:" MARKER "@h:+44849", "port");
    set_fails("redis://u:" MARKER "@h:65536", "port");
    set_fails("redis://u:" MARKER "@h/-0", "path");
    set_fails("redis://u:" MARKER "@h/+1", "path");
    set_fails("redis://u:" MARKER "@h/1/2", "path");
    set_fails("redis://u:" MARKER "@h/1x", "path");
    set_fails("redis://u:" MARKER "@h/100001", "path");
    set_fails("redis://u:" MARKER "@h/ 64", "whitespace");
    set_fails("redis://u:" MARKER "@h/64 ", "whitespace");
    set_fails("redis://u:" MARKER "@h?db=1", "query");
    set_fails("redis://u:" MARKER "@", "host");
    set_fails("redis://u:" MARKER "%zz@h", "password");
    set_fails("redis://u:" MARKER "/x@h", "URL");
    set_fails("rediss://u:" MARKER "@h", "TLS");
}

static void wellformed_urls_accepted(void **state)
{
    (void)state;
    /* users and passwords as long as the key allows; encoded @ : / # ? % */
    static char url[4096], user[600], pass[2000];
    memset(user, 'u', sizeof user - 1);
    memset(pass, 'p', sizeof pass - 1);
    const char *ok[] = {"redis://h", "redis://h/", "redis://h:1/0", "redis://h/15",
                        "redis://:p%40%3A%2F%23%3F%25@h:6379/2", "redis://[::1]:6380/3", NULL};
    kb_conf *c = kb_conf_new();
    char err[512];
    for (size_t i = 0; ok[i] != NULL; i++)
        if (kb_conf_set(c, "transport", ok[i], err, sizeof err) != KB_OK)
            fail_msg("%s refused: %s", ok[i], err);
    snprintf(url, sizeof url, "redis://%s:%s@h", user, pass);
    kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
    /* a bracketed host that is no IPv6 address: refused at kb_conf_set with
     * a reason; a real one that nothing listens on: at kb_open */
    char v6[400] = "redis://[";
    for (int i = 0; i < 70; i++)
        strcat(v6, "0000:");
    strcat(v6, "1]:6379");
    assert_int_equal(kb_conf_set(c, "transport", v6, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "IPv6"));
    kb_assert_ok(kb_conf_set(c, "transport", "redis://[::1]:1", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.connect_timeout_ms", "500", err, sizeof err));
    err[0] = '\0';
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_null(b);
    assert_non_null(strstr(err, "cannot connect"));
    kb_conf_destroy(c);
}

/* A password with every character that needs encoding, longer than the old
 * 255-byte limit, sent decoded to a real server. */
static void encoded_password_on_server(void **state)
{
    (void)state;
    static char pass[700], enc[2200], url[2400];
    snprintf(pass, sizeof pass, "%s@:/#?%%", MARKER);
    size_t n = strlen(pass);
    memset(pass + n, 'x', 600);
    pass[n + 600] = '\0';
    size_t o = 0;
    for (const char *p = pass; *p; p++)
        o += (size_t)(strchr("@:/#?%", *p) ? sprintf(enc + o, "%%%02X", (unsigned char)*p)
                                           : sprintf(enc + o, "%c", *p));
    kb_test_server s;
    const char *extra[] = {"--requirepass", pass, NULL};
    assert_int_equal(kb_test_server_start(&s, "redis", extra), 0);
    snprintf(url, sizeof url, "redis://:%s@127.0.0.1:%d/1", enc, s.port);
    kb_bus *b = kb_test_open(url, NULL, NULL);
    kb_assert_ok(kb_publish(b, "url.t", "k", 1, "v", 1));
    kb_assert_ok(kb_flush(b, 5000));
    kb_assert_ok(kb_close(b, 5000));
    /* the wrong password: refused, and not quoted */
    snprintf(url, sizeof url, "redis://:%s-wrong@127.0.0.1:%d", MARKER, s.port);
    kb_conf *c = kb_conf_new();
    char err[512] = "";
    kb_assert_ok(kb_conf_set(c, "transport", url, err, sizeof err));
    assert_null(kb_open(c, err, sizeof err));
    assert_non_null(strstr(err, "AUTH"));
    no_marker(err);
    kb_conf_destroy(c);
    kb_test_server_stop(&s);
}

/* redis.password, and redis.password_file read at kb_open; an unreadable
 * file and a password set twice are refused by name. */
static void password_key_and_file_on_server(void **state)
{
    (void)state;
    kb_test_server s;
    const char *extra[] = {"--requirepass", MARKER, NULL};
    assert_int_equal(kb_test_server_start(&s, "redis", extra), 0);
    const char *const by_key[] = {"redis.password", MARKER, NULL};
    kb_bus *b = kb_test_open(s.url, by_key, NULL);
    kb_assert_ok(kb_publish(b, "url.pw", "k", 1, "v", 1));
    kb_assert_ok(kb_close(b, 5000));

    char path[] = "/tmp/kb-redis-pw-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, MARKER "\n", strlen(MARKER) + 1), (ssize_t)strlen(MARKER) + 1);
    close(fd);
    const char *const by_file[] = {"redis.password_file", path, NULL};
    b = kb_test_open(s.url, by_file, NULL);
    kb_assert_ok(kb_publish(b, "url.pw", "k", 1, "v", 1));
    kb_assert_ok(kb_close(b, 5000));

    char err[512] = "";
    kb_conf *c = kb_test_conf(s.url, by_file, NULL);
    kb_assert_ok(kb_conf_set(c, "redis.password", "other", err, sizeof err));
    assert_null(kb_open(c, err, sizeof err));
    assert_non_null(strstr(err, "redis.password and redis.password_file are both set"));
    kb_conf_destroy(c);
    unlink(path);
    c = kb_test_conf(s.url, by_file, NULL);
    assert_null(kb_open(c, err, sizeof err));
    assert_int_equal(kb_last_error_code(), KB_EINVAL);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "No such file"));
    kb_conf_destroy(c);
    kb_test_server_stop(&s);
}

static void reconnect_bounds_checked_at_open(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[512] = "";
    kb_assert_ok(kb_conf_set(c, "transport", "redis://:" MARKER "@127.0.0.1:1", err,
                             sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.reconnect_min_ms", "300", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "redis.reconnect_max_ms", "200", err, sizeof err));
    assert_null(kb_open(c, err, sizeof err));
    assert_non_null(strstr(err, "redis.reconnect_min_ms (300) must not exceed "
                                "redis.reconnect_max_ms (200)"));
    no_marker(err);
    kb_conf_destroy(c);
}

static void malformed_replay_id_is_einval(void **state)
{
    (void)state;
    kb_test_server s;
    assert_int_equal(kb_test_server_start(&s, "redis", NULL), 0);
    kb_bus *b = kb_test_open(s.url, NULL, NULL);
    const char *bad[] = {"abc", "", "1", "-1", "1-", "1-2-3", "1-x", " 1-2",
                         "99999999999999999999-0", "1-99999999999999999999", NULL};
    for (size_t i = 0; bad[i] != NULL; i++) {
        int rc = kb_dead_letter_replay(b, "url.dlq", bad[i]);
        if (rc != KB_EINVAL)
            fail_msg("replay of \"%s\": %d, not KB_EINVAL", bad[i], rc);
    }
    assert_int_equal(kb_dead_letter_replay(b, "url.dlq", "1-1"), KB_ENOTFOUND);
    kb_assert_ok(kb_close(b, 5000));
    kb_test_server_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(malformed_urls_refused_at_set),
        cmocka_unit_test(wellformed_urls_accepted),
        cmocka_unit_test(encoded_password_on_server),
        cmocka_unit_test(password_key_and_file_on_server),
        cmocka_unit_test(reconnect_bounds_checked_at_open),
        cmocka_unit_test(malformed_replay_id_is_einval),
    };
    return cmocka_run_group_tests_name("redis_url", tests, NULL, NULL);
}
