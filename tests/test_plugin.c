/* Loading transports with `transport.plugins`: a file that is missing, a
 * shared object without the entry symbol and a plugin built for another
 * transport ABI are refused with KB_EINVAL and a message naming the file and
 * the problem; the same plugin may be named again; once loaded, its scheme
 * and its `<scheme>.*` keys are validated like built-in ones and the
 * configuration reference documents them.
 * A plugin that is not an absolute path, is group- or world-writable, lies
 * in such a directory or belongs to another user, or is named by
 * KEYBUS_TRANSPORT_PLUGINS, is refused before any of its code runs: the
 * MARKER_SO fixture's constructor would create a file.
 *   test_plugin LIBKB_FILE_SO BAD_ABI_SO NO_ENTRY_SO MARKER_SO */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/check.h"
#include <keybus/transport.h>   /* kb_conf_int */

static const char *file_so, *bad_abi_so, *no_entry_so, *marker_so;

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

/* A copy of the marker fixture at dir/libkb_marker.so, with `mode`. */
static void copy_marker(const char *dir, char *path, size_t len, mode_t mode)
{
    snprintf(path, len, "%s/libkb_marker.so", dir);
    FILE *in = fopen(marker_so, "rb"), *out = fopen(path, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
    assert_int_equal(chmod(path, mode), 0);
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void untrusted_code_never_runs(void **state)
{
    (void)state;
    char dir[] = "/tmp/kb-plugin-XXXXXX", marker[300], so[300];
    assert_non_null(mkdtemp(dir));
    snprintf(marker, sizeof marker, "%s/marker", dir);
    setenv("KB_TEST_MARKER", marker, 1);
    copy_marker(dir, so, sizeof so, 0644);

    refused("libkb_marker.so", "libkb_marker.so", "not an absolute path");
    assert_int_equal(chmod(so, 0646), 0);
    refused(so, so, "is world-writable; refused before loading it");
    assert_int_equal(chmod(so, 0664), 0);
    refused(so, so, "is group-writable");
    assert_int_equal(chmod(so, 0644), 0);
    assert_int_equal(chmod(dir, 0777), 0);
    refused(so, dir, "is world-writable");
    assert_int_equal(chmod(dir, 0700), 0);
    if (geteuid() == 0) {   /* only root can give the file away */
        assert_int_equal(chown(so, 65534, 65534), 0);
        refused(so, so, "is owned by uid 65534");
        assert_int_equal(chown(so, 0, 0), 0);
    }
    assert_false(exists(marker));

    /* the environment: refused by kb_conf_apply_env and, with conf.env
     * false, by kb_open */
    setenv("KEYBUS_TRANSPORT_PLUGINS", so, 1);
    kb_conf *c = kb_conf_new();
    char err[1024];
    assert_int_equal(kb_conf_apply_env(c, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "KEYBUS_TRANSPORT_PLUGINS"));
    assert_non_null(strstr(err, "never from the environment"));
    kb_assert_ok(set(c, "conf.env", "false", err, sizeof err));
    err[0] = '\0';
    assert_null(kb_open(c, err, sizeof err));
    assert_int_equal(kb_last_error_code(), KB_EINVAL);
    assert_non_null(strstr(err, "never from the environment"));
    kb_conf_destroy(c);
    unsetenv("KEYBUS_TRANSPORT_PLUGINS");
    assert_false(exists(marker));

    /* the same file, trusted and named in code, runs: the marker can appear */
    refused(so, so, "exports no kb_transport_plugin()");
    assert_true(exists(marker));
    unlink(marker);
    unlink(so);
    rmdir(dir);
    unsetenv("KB_TEST_MARKER");
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
    if (argc != 5) {
        fprintf(stderr, "usage: test_plugin LIBKB_FILE_SO BAD_ABI_SO NO_ENTRY_SO MARKER_SO\n");
        return 2;
    }
    file_so = argv[1];
    bad_abi_so = argv[2];
    no_entry_so = argv[3];
    marker_so = argv[4];
    const struct CMUnitTest tests[] = {   /* in this order: the first runs before any load */
        cmocka_unit_test(unknown_before_loading),
        cmocka_unit_test(bad_plugins_are_refused_by_name),
        cmocka_unit_test(loaded_twice_and_keys_validated),
        cmocka_unit_test(untrusted_code_never_runs),
        cmocka_unit_test(configuration_reference_documents_the_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
