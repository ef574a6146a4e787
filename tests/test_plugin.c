/* Loading transports with `transport.plugins`: a file that is missing, a
 * shared object without the entry symbol and a plugin built for another
 * transport ABI are refused with KB_EINVAL and a message naming the file and
 * the problem; the same plugin may be named again; once loaded, its scheme
 * and its `<scheme>.*` keys are validated like built-in ones and the
 * configuration reference documents them.
 *   test_plugin LIBKB_FILE_SO BAD_ABI_SO NO_ENTRY_SO */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>

#include "support/check.h"
#include <keybus/transport.h>   /* kb_conf_int */

static const char *file_so, *bad_abi_so, *no_entry_so;

/* kb_conf_set's result; its message in err. */
static int set(kb_conf *c, const char *key, const char *value, char *err, size_t errlen)
{
    err[0] = '\0';
    return kb_conf_set(c, key, value, err, errlen);
}

static void unknown_before_loading(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[512];
    assert_int_equal(set(c, "transport", "file:///tmp/kb", err, sizeof err), KB_ENOTFOUND);
    assert_non_null(strstr(err, "unknown URL scheme \"file\""));
    assert_int_equal(set(c, "file.poll_ms", "100", err, sizeof err), KB_ENOTFOUND);
    kb_conf_destroy(c);
}

/* `plugins` fails with KB_EINVAL, and the message names `path` and holds `why`. */
static void refused(const char *plugins, const char *path, const char *why)
{
    kb_conf *c = kb_conf_new();
    char err[1024];
    int rc = set(c, "transport.plugins", plugins, err, sizeof err);
    kb_conf_destroy(c);
    if (rc != KB_EINVAL || strstr(err, path) == NULL || strstr(err, why) == NULL)
        fail_msg("transport.plugins=%s: %d \"%s\"; wanted KB_EINVAL naming %s and \"%s\"",
                 plugins, rc, err, path, why);
}

static void bad_plugins_are_refused_by_name(void **state)
{
    (void)state;
    refused("/nonexistent/libkb_nothing.so", "/nonexistent/libkb_nothing.so",
            "No such file");
    refused(no_entry_so, no_entry_so, "exports no kb_transport_plugin()");
    refused(bad_abi_so, bad_abi_so, "built for transport ABI 2");
    /* a list stops at its first bad entry, and says which */
    char list[8192];
    snprintf(list, sizeof list, "%s,%s", file_so, bad_abi_so);
    refused(list, bad_abi_so, "ABI 2");
    refused(",", "transport.plugins", "empty path");
}

static void loaded_twice_and_keys_validated(void **state)
{
    (void)state;
    kb_conf *a = kb_conf_new(), *b = kb_conf_new();
    char err[512];
    kb_assert_ok(set(a, "transport.plugins", file_so, err, sizeof err));
    kb_assert_ok(set(a, "transport.plugins", file_so, err, sizeof err));
    kb_assert_ok(set(b, "transport.plugins", file_so, err, sizeof err));

    kb_assert_ok(set(a, "transport", "file:///tmp/kb-plugin", err, sizeof err));
    assert_int_equal(set(a, "transport", "file://host/tmp", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "three slashes"));
    assert_int_equal(set(a, "transport", "file://", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "needs a directory"));
    kb_assert_ok(set(a, "file.poll_ms", "250", err, sizeof err));
    assert_int_equal(kb_conf_int(a, "file.poll_ms"), 250);
    assert_int_equal(set(a, "file.poll_ms", "0", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "file.poll_ms"));
    kb_assert_ok(set(a, "file.fsync", "never", err, sizeof err));
    assert_int_equal(set(a, "file.fsync", "sometimes", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "file.fsync"));
    /* a conf made after the load knows the keys too */
    kb_conf *c = kb_conf_new();
    kb_assert_ok(set(c, "file.fsync", "never", err, sizeof err));
    kb_conf_destroy(c);
    kb_conf_destroy(a);
    kb_conf_destroy(b);
}

static void configuration_reference_documents_the_keys(void **state)
{
    (void)state;
    char *doc = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&doc, &len);
    assert_non_null(out);
    kb_conf_write_reference(out);
    fclose(out);
    int has = strstr(doc, "| `file.poll_ms` | integer | `50` | 1 .. 60000 | `KEYBUS_FILE_POLL_MS` |") != NULL &&
              strstr(doc, "| `file.fsync` | one of | `flush` | flush|never | `KEYBUS_FILE_FSYNC` |") != NULL;
    if (!has)
        fail_msg("conf-doc lacks the file.* keys:\n%s", doc);
    free(doc);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: test_plugin LIBKB_FILE_SO BAD_ABI_SO NO_ENTRY_SO\n");
        return 2;
    }
    file_so = argv[1];
    bad_abi_so = argv[2];
    no_entry_so = argv[3];
    const struct CMUnitTest tests[] = {   /* in this order: the first runs before any load */
        cmocka_unit_test(unknown_before_loading),
        cmocka_unit_test(bad_plugins_are_refused_by_name),
        cmocka_unit_test(loaded_twice_and_keys_validated),
        cmocka_unit_test(configuration_reference_documents_the_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
