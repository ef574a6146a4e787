/* What docs/CONFIGURATION.md and keybus.h promise beyond single keys:
 * enumerated values refused when set, an INI file shared with the
 * application, and the class of a kb_open failure (kb_last_error_code). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/check.h"

static void assert_value(kb_conf *c, const char *key, const char *want)
{
    char buf[256];
    kb_assert_ok(kb_conf_get(c, key, buf, sizeof buf));
    assert_string_equal(buf, want);
}

/* Every key whose doc lists its words: the words pass, anything else is
 * KB_EINVAL at kb_conf_set, naming the key and the words. */
static void enumerated_values_are_checked_when_set(void **state)
{
    (void)state;
    static const struct {
        const char *key, *good[4];
    } keys[] = {
        {"conf.env", {"true", "false"}},
        {"pool.idle", {"adaptive", "spin", "yield", "block"}},
        {"nats.storage", {"file", "memory"}},
        {"nats.topic_consumer", {"auto", "off"}},
    };
    kb_conf *c = kb_conf_new();
    char err[256];
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        if (kb_conf_get(c, keys[i].key, err, sizeof err) == KB_ENOTFOUND)
            continue;   /* the transport is not built */
        for (size_t j = 0; j < 4 && keys[i].good[j] != NULL; j++)
            kb_assert_ok(kb_conf_set(c, keys[i].key, keys[i].good[j], err, sizeof err));
        const char *bad[] = {"disk", "", "File", "file ", "yes"};
        for (size_t j = 0; j < sizeof bad / sizeof *bad; j++) {
            err[0] = '\0';
            assert_int_equal(kb_conf_set(c, keys[i].key, bad[j], err, sizeof err), KB_EINVAL);
            assert_non_null(strstr(err, keys[i].key));
            assert_non_null(strstr(err, keys[i].good[0]));
        }
    }
    kb_conf_destroy(c);
}

static char *temp_ini(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/keybus-rules-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static int load(kb_conf *c, const char *text, char *err, size_t errlen)
{
    char *path = temp_ini(text);
    int rc = kb_conf_load(c, path, err, errlen);
    unlink(path);
    return rc;
}

static void a_shared_file_leaves_other_sections_to_the_application(void **state)
{
    (void)state;
    char err[256] = "";
    kb_conf *c = kb_conf_new();
    /* the [keybus] section may come after the application's */
    kb_assert_ok(load(c, "top = 1\n[app]\nevents = 5\nredis = yes\n[redis]\nhost = db1\n"
                         "[keybus]\npartitions = 16\ngroup = billing\n"
                         "[keybus.pool]\nworkers = 64\n",
                      err, sizeof err));
    assert_value(c, "partitions", "16");
    assert_value(c, "group", "billing");
    assert_value(c, "pool.workers", "64");
    kb_conf_destroy(c);

    /* typos in keybus's own sections are still caught, with their line */
    c = kb_conf_new();
    assert_int_equal(load(c, "[app]\nevents = 5\n[keybus.pool]\nwrokers = 5\n", err, sizeof err),
                     KB_ENOTFOUND);
    assert_non_null(strstr(err, ":4: "));
    assert_non_null(strstr(err, "pool.wrokers"));
    assert_int_equal(load(c, "[keybus.pol]\nworkers = 5\n[app]\nx = 1\n", err, sizeof err),
                     KB_ENOTFOUND);
    assert_non_null(strstr(err, "pol.workers"));
    /* a bad value in keybus's section */
    assert_int_equal(load(c, "[keybus]\npartitions = many\n", err, sizeof err), KB_EINVAL);
    /* the application's lines follow the grammar too */
    assert_int_equal(load(c, "[app]\nnot a pair\n[keybus]\ngroup = g\n", err, sizeof err),
                     KB_EINVAL);
    assert_non_null(strstr(err, ":2: "));
    kb_conf_destroy(c);

    /* without a keybus section the file is keybus's alone: unknown keys fail */
    c = kb_conf_new();
    assert_int_equal(load(c, "[pool]\nworkers = 8\n[app]\nevents = 5\n", err, sizeof err),
                     KB_ENOTFOUND);
    assert_non_null(strstr(err, "app.events"));
    assert_value(c, "pool.workers", "8");   /* the lines above the error stay set */
    /* [keybusx] is no keybus section */
    assert_int_equal(load(c, "[keybusx]\nworkers = 8\n", err, sizeof err), KB_ENOTFOUND);
    kb_conf_destroy(c);

    /* an unclosed header is reported at its own line, not as the pair above */
    c = kb_conf_new();
    assert_int_equal(load(c, "[app]\nevents = 5\n[keybus\ngroup = g\n", err, sizeof err),
                     KB_EINVAL);
    assert_non_null(strstr(err, ":3: "));
    assert_non_null(strstr(err, "without ']'"));
    /* keybus's sections in another letter case are an error naming them */
    assert_int_equal(load(c, "[app]\nevents = 5\n[KeyBus.pool]\nworkers = 8\n", err, sizeof err),
                     KB_EINVAL);
    assert_non_null(strstr(err, ":3: "));
    assert_non_null(strstr(err, "[KeyBus.pool]"));
    assert_int_equal(load(c, "[KEYBUS]\ngroup = g\n", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "[KEYBUS]"));
    /* the keys below them are not set */
    assert_value(c, "group", "keybus");
    kb_conf_destroy(c);
}

/* kb_open returns NULL: the class of the failure is still observable. */
static void open_failures_have_a_code(void **state)
{
    (void)state;
    char err[256];
    kb_conf *c = kb_conf_new();
    kb_assert_ok(kb_conf_set(c, "retry.backoff_ms", "100", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "retry.max_backoff_ms", "10", err, sizeof err));
    assert_null(kb_open(c, err, sizeof err));
    assert_int_equal(kb_last_error_code(), KB_EINVAL);
    kb_conf_destroy(c);

    /* nothing listens on port 1 */
    const char *urls[] = {"redis://127.0.0.1:1", "nats://127.0.0.1:1"};
    for (size_t i = 0; i < 2; i++) {
        c = kb_conf_new();
        if (kb_conf_set(c, "transport", urls[i], err, sizeof err) != KB_OK) {
            kb_conf_destroy(c);
            continue;   /* the transport is not built */
        }
        kb_conf_set(c, "conf.env", "false", err, sizeof err);
        kb_conf_set(c, "redis.connect_timeout_ms", "500", err, sizeof err);
        assert_null(kb_open(c, err, sizeof err));
        assert_int_equal(kb_last_error_code(), KB_ETRANSPORT);
        assert_string_equal(kb_last_error(), err);
        kb_conf_destroy(c);
    }

    c = kb_conf_new();
    kb_conf_set(c, "conf.env", "false", err, sizeof err);
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    assert_null(kb_topic_get(b, "bad..name", err, sizeof err));
    assert_int_equal(kb_last_error_code(), KB_EINVAL);
    assert_non_null(kb_topic_get(b, "good.name", err, sizeof err));
    kb_assert_ok(kb_close(b, 1000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(enumerated_values_are_checked_when_set),
        cmocka_unit_test(a_shared_file_leaves_other_sections_to_the_application),
        cmocka_unit_test(open_failures_have_a_code),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
