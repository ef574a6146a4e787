/* Configuration: defaults, validation with errstr naming the key, INI files,
 * environment overrides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

static void assert_value(kb_conf *c, const char *key, const char *want)
{
    char buf[256];
    assert_int_equal(kb_conf_get(c, key, buf, sizeof buf), KB_OK);
    assert_string_equal(buf, want);
}

static void defaults_match_the_design(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    assert_value(c, "transport", "mem://");
    assert_value(c, "pool.workers", "1024");
    assert_value(c, "pool.threads", "0");
    assert_value(c, "pool.queue_capacity", "1000");
    assert_value(c, "pool.enqueue_timeout_ms", "200");
    assert_value(c, "retry.max_attempts", "5");
    assert_value(c, "retry.backoff_ms", "10");
    assert_value(c, "retry.max_backoff_ms", "5000");
    assert_value(c, "limits.max_key_bytes", "1024");
    assert_value(c, "limits.max_payload_bytes", "1048576");
    assert_value(c, "partitions", "8");
    assert_value(c, "group", "keybus");
    char consumer[128];
    assert_int_equal(kb_conf_get(c, "consumer", consumer, sizeof consumer), KB_OK);
    char pid[32];
    snprintf(pid, sizeof pid, "-%d", (int)getpid());
    assert_non_null(strstr(consumer, pid));
    kb_conf_destroy(c);
}

struct bad {
    const char *key, *value;
    int rc;
    const char *words[3];   /* the errstr must contain each */
};

static void bad_values_are_refused_and_named(void **state)
{
    (void)state;
    const struct bad cases[] = {
        {"pool.wrokers", "8", KB_ENOTFOUND, {"unknown", "pool.wrokers"}},
        {"pool.workers", "abc", KB_EINVAL, {"pool.workers", "not an integer"}},
        {"pool.workers", "12abc", KB_EINVAL, {"pool.workers", "not an integer"}},
        {"pool.workers", "", KB_EINVAL, {"pool.workers", "empty"}},
        {"pool.workers", "0", KB_EINVAL, {"pool.workers", "zero"}},
        {"pool.workers", "-5", KB_EINVAL, {"pool.workers", "negative"}},
        {"pool.workers", "99999999999999999999", KB_EINVAL, {"pool.workers", "overflows"}},
        {"pool.workers", "2000000", KB_EINVAL, {"pool.workers", "out of range"}},
        {"pool.queue_capacity", "0", KB_EINVAL, {"pool.queue_capacity", "zero"}},
        {"retry.max_attempts", "-1", KB_EINVAL, {"retry.max_attempts", "negative"}},
        {"transport", "foo://x", KB_ENOTFOUND, {"transport", "unknown URL scheme", "foo"}},
        {"transport", "localhost:6379", KB_EINVAL, {"transport", "not a URL"}},
        {"transport", "", KB_EINVAL, {"transport", "empty"}},
        {"group", "my group", KB_EINVAL, {"group", "whitespace"}},
    };
    kb_conf *c = kb_conf_new();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[256] = "";
        int rc = kb_conf_set(c, cases[i].key, cases[i].value, err, sizeof err);
        if (rc != cases[i].rc)
            fail_msg("%s=%s: rc %d, want %d", cases[i].key, cases[i].value, rc, cases[i].rc);
        for (int w = 0; w < 3 && cases[i].words[w]; w++)
            if (strstr(err, cases[i].words[w]) == NULL)
                fail_msg("%s=%s: errstr \"%s\" lacks \"%s\"", cases[i].key, cases[i].value, err,
                         cases[i].words[w]);
    }
    /* Refused values leave the old value in place. */
    assert_value(c, "pool.workers", "1024");
    assert_int_equal(kb_conf_set(c, "pool.workers", " 64 ", NULL, 0), KB_OK);
    assert_value(c, "pool.workers", " 64 ");
    assert_int_equal(kb_conf_set(c, NULL, "1", NULL, 0), KB_EINVAL);
    assert_int_equal(kb_conf_set(c, "pool.workers", NULL, NULL, 0), KB_EINVAL);
    char buf[8];
    assert_int_equal(kb_conf_get(c, "nope", buf, sizeof buf), KB_ENOTFOUND);
    kb_conf_destroy(c);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void ini_files_load_sections_as_prefixes(void **state)
{
    (void)state;
    char path[] = "/tmp/keybus-conf-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "; comment\ntransport = mem://\npartitions = 16\n\n[pool]\nworkers = 64\n"
                     "queue_capacity = 8\n[retry]\nmax_attempts = 3\n");
    kb_conf *c = kb_conf_new();
    char err[256] = "";
    assert_int_equal(kb_conf_load(c, path, err, sizeof err), KB_OK);
    assert_value(c, "pool.workers", "64");
    assert_value(c, "pool.queue_capacity", "8");
    assert_value(c, "retry.max_attempts", "3");
    assert_value(c, "partitions", "16");

    write_file(path, "[pool]\nworkers = 64\nthreads = many\n");
    assert_int_equal(kb_conf_load(c, path, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "pool.threads"));
    assert_non_null(strstr(err, "line 3"));

    write_file(path, "[pool]\nwrokers = 64\n");
    assert_int_equal(kb_conf_load(c, path, err, sizeof err), KB_ENOTFOUND);
    assert_non_null(strstr(err, "pool.wrokers"));

    write_file(path, "this is not ini\n");
    assert_int_equal(kb_conf_load(c, path, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, ":1"));

    unlink(path);
    assert_int_equal(kb_conf_load(c, path, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "cannot read"));
    kb_conf_destroy(c);
}

struct logged {
    int warnings;
    char last[512];
};

static void capture_log(int level, const char *msg, void *opaque)
{
    struct logged *l = opaque;
    if (level <= 4 && strstr(msg, "KEYBUS_") != NULL) {
        snprintf(l->last, sizeof l->last, "%s", msg);
        l->warnings++;
    }
}

/* defaults < file < environment < code, whatever the order of the calls. */
static void environment_overrides_the_file_not_the_code(void **state)
{
    (void)state;
    char path[] = "/tmp/keybus-conf-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "[pool]\nworkers = 16\nthreads = 3\n[retry]\nmax_attempts = 2\n");
    kb_conf *c = kb_conf_new();
    char err[256] = "";
    assert_int_equal(kb_conf_set(c, "pool.workers", "32", err, sizeof err), KB_OK);
    assert_int_equal(kb_conf_load(c, path, err, sizeof err), KB_OK);   /* after the code */
    assert_value(c, "pool.workers", "32");        /* code beats the file */
    assert_value(c, "pool.threads", "3");
    setenv("KEYBUS_POOL_WORKERS", "128", 1);
    setenv("KEYBUS_RETRY_MAX_ATTEMPTS", "7", 1);
    assert_int_equal(kb_conf_apply_env(c, err, sizeof err), KB_OK);
    assert_value(c, "pool.workers", "32");        /* code beats the environment */
    assert_value(c, "retry.max_attempts", "7");   /* the environment beats the file */
    assert_int_equal(kb_conf_load(c, path, err, sizeof err), KB_OK);
    assert_value(c, "retry.max_attempts", "7");   /* a later file does not undo it */

    /* a bad value is refused even for a key the code set */
    setenv("KEYBUS_POOL_WORKERS", "lots", 1);
    assert_int_equal(kb_conf_apply_env(c, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "KEYBUS_POOL_WORKERS"));
    /* kb_open applies the environment too, and refuses it the same way... */
    assert_null(kb_open(c, err, sizeof err));
    assert_non_null(strstr(err, "KEYBUS_POOL_WORKERS"));
    /* ...unless conf.env is false */
    assert_int_equal(kb_conf_set(c, "conf.env", "false", err, sizeof err), KB_OK);
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    assert_int_equal(kb_close(b, 1000), KB_OK);
    unsetenv("KEYBUS_POOL_WORKERS");
    unsetenv("KEYBUS_RETRY_MAX_ATTEMPTS");
    unlink(path);
}

/* A misspelt KEYBUS_* name is reported with the key it was meant to be. */
static void unknown_environment_names_are_reported(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    struct logged l = {0};
    kb_conf_set_log(c, capture_log, &l);
    setenv("KEYBUS_POOL_WORKRES", "8", 1);
    char err[256] = "";
    kb_bus *b = kb_open(c, err, sizeof err);
    unsetenv("KEYBUS_POOL_WORKRES");
    assert_non_null(b);
    assert_int_equal(l.warnings, 1);
    assert_non_null(strstr(l.last, "KEYBUS_POOL_WORKRES"));
    assert_non_null(strstr(l.last, "KEYBUS_POOL_WORKERS"));
    assert_int_equal(kb_close(b, 1000), KB_OK);
}

static void open_checks_cross_key_rules(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256] = "";
    assert_int_equal(kb_conf_set(c, "retry.backoff_ms", "100", err, sizeof err), KB_OK);
    assert_int_equal(kb_conf_set(c, "retry.max_backoff_ms", "10", err, sizeof err), KB_OK);
    assert_null(kb_open(c, err, sizeof err));   /* caller still owns c */
    assert_non_null(strstr(err, "retry.max_backoff_ms"));
    assert_non_null(strstr(err, "retry.backoff_ms"));

    assert_int_equal(kb_conf_set(c, "retry.max_backoff_ms", "1000", err, sizeof err), KB_OK);
    kb_conf *d = kb_conf_dup(c);
    assert_non_null(d);
    assert_value(d, "retry.backoff_ms", "100");
    kb_conf_destroy(c);
    kb_bus *b = kb_open(d, err, sizeof err);
    assert_non_null(b);
    assert_int_equal(kb_close(b, 1000), KB_OK);
}

/* pool.idle takes the four strategy names and nothing else. */
static void idle_strategy_is_one_of_four(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256] = "";
    assert_value(c, "pool.idle", "adaptive");
    const char *ok[] = {"spin", "yield", "block", "adaptive"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(kb_conf_set(c, "pool.idle", ok[i], err, sizeof err), KB_OK);
        assert_value(c, "pool.idle", ok[i]);
    }
    const char *bad[] = {"sleep", "Spin", "spin ", "", "adaptive|spin"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kb_conf_set(c, "pool.idle", bad[i], err, sizeof err), KB_EINVAL);
        assert_non_null(strstr(err, "pool.idle"));
    }
    assert_value(c, "pool.idle", "adaptive");
    kb_conf_destroy(c);
}

static int nop_handler(const kb_event *ev, void *opaque)
{
    (void)ev, (void)opaque;
    return KB_HANDLED;
}

/* A conf belongs to one bus: a second kb_open of it and changes while the
 * bus runs are refused (they would double-free it or change a live bus). */
static void a_conf_belongs_to_one_open_bus(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256] = "";
    assert_int_equal(kb_conf_set(c, "pool.workers", "16", err, sizeof err), KB_OK);
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    assert_null(kb_open(c, err, sizeof err));
    assert_non_null(strstr(err, "already belongs"));
    assert_int_equal(kb_conf_set(c, "pool.workers", "7", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "open bus"));
    assert_value(c, "pool.workers", "16");
    setenv("KEYBUS_POOL_WORKERS", "3", 1);   /* nor through the environment */
    assert_int_equal(kb_conf_apply_env(c, err, sizeof err), KB_EINVAL);
    unsetenv("KEYBUS_POOL_WORKERS");
    assert_value(c, "pool.workers", "16");
    kb_conf_destroy(c);   /* a no-op while the bus owns it */
    assert_int_equal(kb_subscribe(b, "t", nop_handler, NULL), KB_OK);
    kb_topic_stats st;
    assert_int_equal(kb_stats(b, "t", &st), KB_OK);
    assert_int_equal(st.lanes, 16);
    assert_int_equal(kb_close(b, 1000), KB_OK);   /* frees the conf once */
}

static void errors_have_names(void **state)
{
    (void)state;
    const int codes[] = {KB_OK, KB_EINVAL, KB_EFULL, KB_ECLOSED, KB_ETRANSPORT,
                         KB_ENOMEM, KB_ETOOBIG, KB_ENOTFOUND, KB_ETIMEDOUT};
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
        assert_string_not_equal(kb_strerror(codes[i]), "unknown error");
    assert_string_equal(kb_strerror(-99), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_match_the_design),
        cmocka_unit_test(bad_values_are_refused_and_named),
        cmocka_unit_test(ini_files_load_sections_as_prefixes),
        cmocka_unit_test(environment_overrides_the_file_not_the_code),
        cmocka_unit_test(unknown_environment_names_are_reported),
        cmocka_unit_test(open_checks_cross_key_rules),
        cmocka_unit_test(errors_have_names),
        cmocka_unit_test(idle_strategy_is_one_of_four),
        cmocka_unit_test(a_conf_belongs_to_one_open_bus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
