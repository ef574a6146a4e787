/* No secret in any message (issue 17): malformed inputs, each carrying a
 * marker password, through kb_conf_set, INI files, the environment at
 * kb_open, kb_last_error and the log callback; kb_conf_get masks secrets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>
#include <keybus/transport.h>

#include "support/check.h"

#define MARK "hunter2MARK"

struct leak_case {
    const char *key, *value;
};

static const struct leak_case cases[] = {
    {"transport", "redis:/:" MARK "@10.0.0.5:6379"},
    {"transport", "mem://u:" MARK "@x"},
    {"transport", "foo://u:" MARK "@x"},
    {"transport", "mem://u:" MARK "@h:0"},
    {"transport", "mem://u:" MARK "@[zz]:1"},
    {"transport", "mem://u:" MARK "%zz@x"},
    {"transport", "mem://u:" MARK "[@x"},
    {"transport", "mem://u:" MARK "@x#frag"},
    {"transport", "mem://u:" MARK "@x@y"},
    {"transport", "mem://u:" MARK "/x@h"},
    {"transport", "mem://u:" MARK "?x@h"},
    {"transport", "mem://u:" MARK " x@h"},
    {"transport", "mem://u:" MARK "@h:6379" MARK},
    {"nats.token:" MARK, "x"},
    {"pool.workers", MARK},
    {"pool.workers", "12" MARK},
    {"pool.idle", MARK},
    {"conf.env", MARK},
    {"group", MARK " x"},
    {"consumer", MARK "0123456789012345678901234567890123456789012345678901234567890123456789"
                      "0123456789012345678901234567890123456789012345678901234567890123456789"},
};

static char logged[8192];

static void capture_log(int level, const char *msg, void *opaque)
{
    (void)level, (void)opaque;
    strncat(logged, msg, sizeof logged - strlen(logged) - 1);
}

static void assert_clean(const char *where, size_t i, const char *text)
{
    if (strstr(text, MARK) != NULL)
        fail_msg("case %zu (%s): the secret is in \"%s\"", i, where, text);
}

static void conf_set_never_quotes_a_secret(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[512] = "";
        kb_err_clear();
        assert_int_not_equal(kb_conf_set(c, cases[i].key, cases[i].value, err, sizeof err), KB_OK);
        assert_true(err[0] != '\0');
        assert_clean("errstr", i, err);
        assert_clean("kb_last_error", i, kb_last_error());
    }
    kb_conf_destroy(c);
}

static void ini_files_never_quote_a_secret(void **state)
{
    (void)state;
    char path[] = "/tmp/keybus-secret-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        for (int form = 0; form < 3; form++) {
            FILE *f = fopen(path, "w");
            assert_non_null(f);
            if (form == 0)   /* as written */
                fprintf(f, "group = g\n%s = %s\n", cases[i].key, cases[i].value);
            else if (form == 1)   /* ':' for '=' */
                fprintf(f, "%s: %s\n", cases[i].key, cases[i].value);
            else   /* an inline comment after the value */
                fprintf(f, "%s = %s # note\n", cases[i].key, cases[i].value);
            fclose(f);
            kb_conf *c = kb_conf_new();
            char err[512] = "";
            kb_err_clear();
            assert_int_not_equal(kb_conf_load(c, path, err, sizeof err), KB_OK);
            assert_clean("file errstr", i, err);
            assert_clean("file kb_last_error", i, kb_last_error());
            assert_int_not_equal(kb_conf_load(c, path, NULL, 0), KB_OK);
            assert_clean("file kb_last_error, errstr NULL", i, kb_last_error());
            kb_conf_destroy(c);
        }
    }
    unlink(path);
}

static void the_environment_never_quotes_a_secret(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (strchr(cases[i].key, ':') != NULL)
            continue;
        char name[128] = "KEYBUS_";
        for (const char *k = cases[i].key; *k; k++) {
            char ch = *k == '.' ? '_' : (char)(*k >= 'a' && *k <= 'z' ? *k - 32 : *k);
            strncat(name, &ch, 1);
        }
        setenv(name, cases[i].value, 1);
        setenv("KEYBUS_NATS_TOKNE", MARK, 1);   /* an unknown name: logged by name only */
        kb_conf *c = kb_conf_new();
        kb_conf_set_log(c, capture_log, NULL);
        logged[0] = '\0';
        char err[512] = "";
        kb_err_clear();
        kb_bus *b = kb_open(c, err, sizeof err);
        unsetenv(name);
        unsetenv("KEYBUS_NATS_TOKNE");
        if (b != NULL)
            fail_msg("case %zu: %s accepted", i, name);
        assert_clean("kb_open errstr", i, err);
        assert_clean("kb_open kb_last_error", i, kb_last_error());
        assert_clean("log", i, logged);
        kb_conf_destroy(c);
    }
    /* a bus that opens logs the unknown name, not its value */
    setenv("KEYBUS_NATS_TOKNE", MARK, 1);
    kb_conf *c = kb_conf_new();
    kb_conf_set_log(c, capture_log, NULL);
    logged[0] = '\0';
    kb_bus *b = kb_open(c, NULL, 0);
    unsetenv("KEYBUS_NATS_TOKNE");
    assert_non_null(b);
    assert_non_null(strstr(logged, "KEYBUS_NATS_TOKNE"));
    assert_clean("log", 0, logged);
    kb_assert_ok(kb_close(b, 1000));
}

/* A transport whose keys hold secrets, to read them back masked. */
static int sec_check_url(const kb_url *u, char *errstr, size_t errlen)
{
    (void)u, (void)errstr, (void)errlen;
    return KB_OK;
}

static const kb_conf_prop sec_props[] = {
    {"sec.password", KB_CONF_SECRET, "", 0, 4096, "A password.", NULL},
    {"sec.token", KB_CONF_TEXT, "", 0, 4096, "A token declared as text.", NULL},
    {"sec.ca_file", KB_CONF_TEXT, "", 0, 4096, "A path.", NULL},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL, NULL},
};

/* Never opened: only its keys are read. */
static int sec_open(kb_transport **t, kb_bus *bus, const kb_conf *c, char *errstr, size_t errlen)
{
    (void)t, (void)bus, (void)c;
    kb_errf(errstr, errlen, "sec:// never opens");
    return KB_EINVAL;
}

static int sec_topic_open(kb_transport *t, const char *topic, kb_transport_topic **out,
                          char *errstr, size_t errlen)
{
    (void)t, (void)topic, (void)out, (void)errstr, (void)errlen;
    return KB_EINVAL;
}

static int sec_subscribe(kb_transport *t, kb_transport_topic *tt, kb_sink *sink)
{
    (void)t, (void)tt, (void)sink;
    return KB_EINVAL;
}

static int sec_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason)
{
    (void)t, (void)d, (void)reason;
    return KB_EINVAL;
}

static int sec_close(kb_transport *t, int64_t deadline_ns)
{
    (void)t, (void)deadline_ns;
    return KB_OK;
}

static const kb_transport_ops sec_ops = {
    .abi_version = KB_TRANSPORT_ABI, .scheme = "sec", .flags = KB_TRANSPORT_F_LOCAL,
    .props = sec_props, .check_url = sec_check_url, .open = sec_open,
    .topic_open = sec_topic_open, .subscribe = sec_subscribe, .dead_letter = sec_dead_letter,
    .close = sec_close,
};

struct seen {
    int keys;
    char all[16384];
};

static void collect(const char *key, const char *value, void *arg)
{
    struct seen *s = arg;
    s->keys++;
    strncat(s->all, key, sizeof s->all - strlen(s->all) - 1);
    strncat(s->all, "=", sizeof s->all - strlen(s->all) - 1);
    strncat(s->all, value, sizeof s->all - strlen(s->all) - 1);
    strncat(s->all, "\n", sizeof s->all - strlen(s->all) - 1);
}

static void conf_get_masks_secrets(void **state)
{
    (void)state;
    kb_assert_ok(kb_transport_register(&sec_ops));
    kb_conf *c = kb_conf_new();
    char err[256] = "", buf[256];
    if (kb_conf_set(c, "transport", "sec://u%3A:" MARK "@h:1/0", err, sizeof err) != KB_OK)
        fail_msg("%s", err);
    kb_assert_ok(kb_conf_set(c, "sec.password", MARK, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "sec.token", MARK, err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "sec.ca_file", "/etc/ca.pem", err, sizeof err));
    kb_assert_ok(kb_conf_get(c, "transport", buf, sizeof buf));
    assert_string_equal(buf, "sec://***@h:1/0");
    kb_assert_ok(kb_conf_get(c, "sec.password", buf, sizeof buf));
    assert_string_equal(buf, "***");
    kb_assert_ok(kb_conf_get(c, "sec.token", buf, sizeof buf));
    assert_string_equal(buf, "***");
    kb_assert_ok(kb_conf_get(c, "sec.ca_file", buf, sizeof buf));
    assert_string_equal(buf, "/etc/ca.pem");
    /* transports read the real values */
    assert_string_equal(kb_conf_str(c, "sec.password"), MARK);
    struct seen s = {0};
    kb_conf_each(c, collect, &s);
    assert_true(s.keys > 10);
    assert_null(strstr(s.all, MARK));
    assert_non_null(strstr(s.all, "sec.password=***\n"));
    /* a value too long for a secret key is refused by name and length */
    char *big = malloc(5000);
    assert_non_null(big);
    memset(big, 'x', 4999);
    memcpy(big, MARK, strlen(MARK));
    big[4999] = '\0';
    assert_int_equal(kb_conf_set(c, "sec.password", big, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "sec.password"));
    assert_null(strstr(err, MARK));
    free(big);
    kb_conf_destroy(c);
}

/* nats.token_file: read at kb_open into nats.token (masked); a missing
 * file and a token set twice are refused naming the file or both keys. */
static void secret_files_read_at_open(void **state)
{
    (void)state;
    char path[] = "/tmp/kb-token-XXXXXX", err[512];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, MARK "\n", strlen(MARK) + 1), (ssize_t)strlen(MARK) + 1);
    close(fd);
    kb_conf *c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "nats.token_file", path, err, sizeof err));
    kb_conf *twice = kb_conf_dup(c);
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    kb_assert_ok(kb_close(b, 5000));
    kb_assert_ok(kb_conf_set(twice, "nats.token", "x", err, sizeof err));
    assert_null(kb_open(twice, err, sizeof err));
    assert_non_null(strstr(err, "nats.token and nats.token_file are both set"));
    kb_conf_destroy(twice);
    unlink(path);
    c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "nats.token_file", path, err, sizeof err));
    assert_null(kb_open(c, err, sizeof err));
    assert_int_equal(kb_last_error_code(), KB_EINVAL);
    if (strstr(err, path) == NULL || strstr(err, "No such file") == NULL)
        fail_msg("an unreadable token file: \"%s\"", err);
    kb_conf_destroy(c);
}

/* What the log callback gets: control bytes (C0, DEL, C1) and ill-formed
 * UTF-8 as \xHH, well-formed UTF-8 as it is. */
static void log_lines_are_escaped(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    kb_conf_set_log(c, capture_log, NULL);
    char err[256];
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    logged[0] = '\0';
    kb_log(b, KB_LOG_WARNING, "broker says %s", "a\nb\x1b[31mc\x7f\xc3\xa9\xc2\x9b" "d\xff\xe2\x82");
    assert_string_equal(logged, "broker says a\\x0Ab\\x1B[31mc\\x7F\xc3\xa9\\xC2\\x9Bd"
                                "\\xFF\\xE2\\x82");
    kb_assert_ok(kb_close(b, 5000));
}

int main(void)
{
    unsetenv("KEYBUS_TRANSPORT");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(conf_set_never_quotes_a_secret),
        cmocka_unit_test(ini_files_never_quote_a_secret),
        cmocka_unit_test(the_environment_never_quotes_a_secret),
        cmocka_unit_test(conf_get_masks_secrets),
        cmocka_unit_test(secret_files_read_at_open),
        cmocka_unit_test(log_lines_are_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
