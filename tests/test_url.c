/* kb_url_parse / kb_url_redact: RFC 3986 parts, percent-decoded userinfo,
 * bracketed IPv6, strict ports, messages naming the part. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/transport.h>

struct good {
    const char *url, *scheme, *user, *password, *host;
    int port;
    const char *path, *query;
};

static void check_str(const char *url, const char *what, const char *got, const char *want)
{
    if (want == NULL ? got != NULL : got == NULL || strcmp(got, want) != 0)
        fail_msg("%s: %s is \"%s\", want \"%s\"", url, what, got ? got : "(null)",
                 want ? want : "(null)");
}

static void parts_are_split_and_decoded(void **state)
{
    (void)state;
    const struct good cases[] = {
        {"mem://", "mem", NULL, NULL, "", 0, "", NULL},
        {"REDIS://h:6379", "redis", NULL, NULL, "h", 6379, "", NULL},
        {"redis://:s3cret%21@host", "redis", NULL, "s3cret!", "host", 0, "", NULL},
        {"redis://u%40x:p%2F%23%3F%25%40@h:1/2?a=b", "redis", "u@x", "p/#?%@", "h", 1, "/2",
         "a=b"},
        {"redis://u:pa:ss@h", "redis", "u", "pa:ss", "h", 0, "", NULL},
        {"redis://u:@h", "redis", "u", "", "h", 0, "", NULL},
        {"nats://[::1]:4222", "nats", NULL, NULL, "::1", 4222, "", NULL},
        {"nats://[2001:db8::7]", "nats", NULL, NULL, "2001:db8::7", 0, "", NULL},
        {"nats://[::ffff:10.0.0.1]:65535", "nats", NULL, NULL, "::ffff:10.0.0.1", 65535, "", NULL},
        {"x://h:007", "x", NULL, NULL, "h", 7, "", NULL},
        {"x://u:p@h1:1,[::1]:2,h3/m", "x", "u", "p", "h1:1,[::1]:2,h3", 0, "/m", NULL},
        /* the scheme may be written again before each server (the NATS tools' form) */
        {"nats://h1:1,nats://h2:2,NATS://[::1]:3", "nats", NULL, NULL, "h1:1,h2:2,[::1]:3", 0, "",
         NULL},
        {"x://u:p@h1:1,x://h2/m,x://y", "x", "u", "p", "h1:1,h2", 0, "/m,x://y", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[256] = "";
        kb_url *u = kb_url_parse(cases[i].url, err, sizeof err);
        if (u == NULL)
            fail_msg("%s: %s", cases[i].url, err);
        check_str(cases[i].url, "scheme", u->scheme, cases[i].scheme);
        check_str(cases[i].url, "user", u->user, cases[i].user);
        check_str(cases[i].url, "password", u->password, cases[i].password);
        check_str(cases[i].url, "host", u->host, cases[i].host);
        check_str(cases[i].url, "path", u->path, cases[i].path);
        check_str(cases[i].url, "query", u->query, cases[i].query);
        assert_int_equal(u->port, cases[i].port);
        kb_url_free(u);
    }
}

struct bad {
    const char *url, *part;   /* the errstr names the part */
};

static void bad_parts_are_named_without_the_password(void **state)
{
    (void)state;
    char host300[400];
    snprintf(host300, sizeof host300, "redis://%0300d:1", 0);
    const struct bad cases[] = {
        {"redis:/:SECRET@10.0.0.5:6379", "not a URL"},
        {"redis//h", "not a URL"},
        {"1x://h", "not a URL"},
        {"redis://h:0", "port"},
        {"redis://h:65536", "port"},
        {"redis://h:+44849", "port"},
        {"redis://h:-1", "port"},
        {"redis://h:", "port"},
        {"redis://h:6x", "port"},
        {"redis://h:99999999999999999999999", "port"},
        {"redis://[::1", "host"},
        {"redis://h:1,", "host list"},
        {"redis://h:1,,h2", "host list"},
        {"redis://h:1,h2:0", "port"},
        {"redis://h:1,h^2", "host"},
        {"nats://h:1,nats://", "host list"},
        {"nats://h:1,tls://h2:2", "port"},   /* another scheme is no server of this list */
        {"redis://[zz::1]:1", "host"},
        {"redis://[]:1", "host"},
        {"redis://[::1]x", "host"},
        {"redis://[fe80::1%25eth0]", "host"},
        {host300, "host"},
        {"redis://h^st", "host"},
        {"redis://u:p@ss@h", "password"},
        {"redis://u:SE[CRET@h", "password"},
        {"redis://u:SECRET%zz@h", "password"},
        {"redis://u:SECRET%2@h", "password"},
        {"redis://u:SECRET%00@h", "password"},
        {"redis://u:SECRET%0A@h", "password"},
        {"redis://u%@h", "user"},
        {"redis://u:SECRET#x@h", "'#'"},
        {"redis://u:SE/CRET@h", "path"},
        {"redis://h/a b", "whitespace"},
        {"redis://h/a\"b", "path"},
        {"redis://h/?a<b", "query"},
        {"redis://h/%G0", "path"},
        {"redis://u:SECRET\x01@h", "control"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[256] = "";
        kb_err_clear();
        kb_url *u = kb_url_parse(cases[i].url, err, sizeof err);
        if (u != NULL)
            fail_msg("%s: accepted", cases[i].url);
        if (strstr(err, cases[i].part) == NULL)
            fail_msg("%s: \"%s\" does not name \"%s\"", cases[i].url, err, cases[i].part);
        if (strstr(err, "SECRET") != NULL || strstr(kb_last_error(), "SECRET") != NULL)
            fail_msg("%s: \"%s\" shows the password", cases[i].url, err);
    }
    char *long_url = malloc(5000);
    assert_non_null(long_url);
    memset(long_url, 'a', 4999);
    memcpy(long_url, "redis://", 8);
    long_url[4999] = '\0';
    char err[256];
    assert_null(kb_url_parse(long_url, err, sizeof err));
    assert_non_null(strstr(err, "4096"));
    /* 4096 bytes in all, with a long password and user: accepted */
    memset(long_url, 'p', 4096);
    memcpy(long_url, "redis://", 8);
    long_url[2000] = ':';
    memcpy(long_url + 4096 - 7, "@h:6379", 7);
    long_url[4096] = '\0';
    kb_url *u = kb_url_parse(long_url, err, sizeof err);
    assert_non_null(u);
    assert_int_equal(strlen(u->password), 4096 - 7 - 2001);
    kb_url_free(u);
    free(long_url);
    assert_null(kb_url_parse(NULL, err, sizeof err));
}

static void redact_masks_everything_before_the_last_at(void **state)
{
    (void)state;
    const char *cases[][2] = {
        {"redis://u:SECRET@h:6379/0", "redis://***@h:6379/0"},
        {"redis://:SECRET@h", "redis://***@h"},
        {"redis://h:6379", "redis://h:6379"},
        {"redis://u:SE/CRET@h", "redis://***@h"},
        {"redis://u:SE@CRET@h", "redis://***@h"},
        {"redis://u:SE#CRET@h", "redis://***@h"},
        {"redis:/:SECRET@10.0.0.5:6379", "***@10.0.0.5:6379"},
        {"redis:SECRET", "redis:***"},
        {"nats://[::1]:4222", "nats://[::1]:4222"},
        /* several servers are hosts, not a password */
        {"nats://n1:4222,n2:4222", "nats://n1:4222,n2:4222"},
        {"redis-sentinel://h1:26379,h2,[::1]:26380/mymaster",
         "redis-sentinel://h1:26379,h2,[::1]:26380/mymaster"},
        {"nats://user:SECRET,n2:4222", "nats://user:***"},
        {"nats://n1:4222,user:SECRET", "nats://n1:***"},
        {"nats://n1:4222,nats://n2:4222", "nats://n1:4222,n2:4222"},
    };
    char out[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_string_equal(kb_url_redact(cases[i][0], out, sizeof out), cases[i][1]);
    assert_string_equal(kb_url_redact(NULL, out, sizeof out), "(null)");
    /* truncated output never shows the userinfo */
    assert_string_equal(kb_url_redact("redis://u:SECRET@h", out, 10), "redis://*");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parts_are_split_and_decoded),
        cmocka_unit_test(bad_parts_are_named_without_the_password),
        cmocka_unit_test(redact_masks_everything_before_the_last_at),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
