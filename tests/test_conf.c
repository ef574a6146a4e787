/* Configuration: defaults, validation with errstr naming the key, INI files,
 * environment overrides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <keybus/keybus.h>
#include <keybus/transport.h>

#include "support/check.h"

static void assert_value(kb_conf *c, const char *key, const char *want)
{
    char buf[256];
    kb_assert_ok(kb_conf_get(c, key, buf, sizeof buf));
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
    kb_assert_ok(kb_conf_get(c, "consumer", consumer, sizeof consumer));
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
        {"transport", "mem://h:0", KB_EINVAL, {"transport", "URL port"}},
        {"transport", "mem://h:+44849", KB_EINVAL, {"transport", "URL port"}},
        {"transport", "mem://[::1", KB_EINVAL, {"transport", "URL host"}},
        {"transport", "mem://u:p%zz@h", KB_EINVAL, {"transport", "URL password"}},
        {"pool.idle", "sleep", KB_EINVAL, {"pool.idle", "not one of"}},
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
    /* strictly decimal: no blanks, '+', hex */
    const char *not_decimal[] = {" 64 ", "64 ", "+64", "0x40", "6 4", "--1", "-"};
    for (size_t i = 0; i < sizeof not_decimal / sizeof *not_decimal; i++)
        assert_int_equal(kb_conf_set(c, "pool.workers", not_decimal[i], NULL, 0), KB_EINVAL);
    kb_assert_ok(kb_conf_set(c, "pool.workers", "064", NULL, 0));
    assert_int_equal(kb_conf_int(c, "pool.workers"), 64);
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
    kb_assert_ok(kb_conf_load(c, path, err, sizeof err));
    assert_value(c, "pool.workers", "64");
    assert_value(c, "pool.queue_capacity", "8");
    assert_value(c, "retry.max_attempts", "3");
    assert_value(c, "partitions", "16");

    write_file(path, "[pool]\nworkers = 64\nthreads = many\n");
    assert_int_equal(kb_conf_load(c, path, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "pool.threads"));
    assert_non_null(strstr(err, ":3:"));

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

/* Loads `text` as an INI file into a fresh conf: the rc; errstr in err. */
static int load_text(kb_conf **c, const char *text, char *err, size_t errlen)
{
    char path[] = "/tmp/keybus-ini-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, text);
    *c = kb_conf_new();
    int rc = kb_conf_load(*c, path, err, errlen);
    unlink(path);
    return rc;
}

struct ini_case {
    const char *text;
    int line;                /* 0: loads; else the error names this line */
    const char *key, *want;  /* after a successful load */
};

static void ini_grammar_has_one_rule_each(void **state)
{
    (void)state;
    const struct ini_case cases[] = {
        /* indentation is ignored, never a continuation */
        {"[pool]\nworkers = 8\n  threads = 2\n", 0, "pool.threads", "2"},
        {"[pool]\nworkers = 8\n  threads = 2\n", 0, "pool.workers", "8"},
        {"\t[pool]\n\tworkers=9\t\n", 0, "pool.workers", "9"},
        {"[ pool ]\nworkers = 9\n", 0, "pool.workers", "9"},
        /* a section is alone on its line */
        {"[pool] workers = 5\n", 1, NULL, NULL},
        {"[pool\nworkers = 5\n", 1, NULL, NULL},
        {"[]\n", 1, NULL, NULL},
        {"[po ol]\n", 1, NULL, NULL},
        /* quotes: "..." stripped with \" and \\ escapes, other quotes kept */
        {"group = \"abc\"\n", 0, "group", "abc"},
        {"group = \"a\\\"b\\\\c\"\n", 0, "group", "a\"b\\c"},
        {"group = 'abc'\n", 0, "group", "'abc'"},
        {"group = ab\"c\n", 0, "group", "ab\"c"},
        {"group = \"abc\n", 1, NULL, NULL},
        {"group = \"abc\" x\n", 1, NULL, NULL},
        {"group = \"a\\nb\"\n", 1, NULL, NULL},
        {"group = \"a b\"\n", 1, NULL, NULL},   /* blanks kept: group refuses them */
        /* comments only on their own line; '#'/';' inside a word is text */
        {"# c\n; c\n   # c\ngroup = a#b;c\n", 0, "group", "a#b;c"},
        {"[pool]\nworkers = 5 # five\n", 2, NULL, NULL},
        {"[pool]\nworkers = 5 ; five\n", 2, NULL, NULL},
        {"group = \"a #b\"\n", 1, NULL, NULL},   /* quoted: no comment (group refuses ' ') */
        {"group = a\nnats.tls_ca = ; none\n", 2, NULL, NULL},   /* a value that is a comment */
        {"group = # none\n", 1, NULL, NULL},
        /* everything else is an error naming its line; CRLF counts one line */
        {"group = a\r\n\r\nnot a pair\r\n", 3, NULL, NULL},
        {"group = a\nnats.token: hunter2\n", 2, NULL, NULL},
        {"= 5\n", 1, NULL, NULL},
        {"group = a\x1b[31m\n", 1, NULL, NULL},
        {"group = a\x7f\n", 1, NULL, NULL},   /* DEL is a control character too */
        {"\xEF\xBB\xBFgroup = bom\n", 0, "group", "bom"},
        {"group =\n", 1, NULL, NULL},   /* empty: group refuses it */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kb_conf *c;
        char err[512] = "";
        int rc = load_text(&c, cases[i].text, err, sizeof err);
        if (cases[i].line == 0) {
            if (rc != KB_OK)
                fail_msg("case %zu: %s", i, err);
            char buf[256];
            kb_assert_ok(kb_conf_get(c, cases[i].key, buf, sizeof buf));
            if (strcmp(buf, cases[i].want) != 0)
                fail_msg("case %zu: %s is \"%s\", want \"%s\"", i, cases[i].key, buf,
                         cases[i].want);
        } else {
            char at[16];
            snprintf(at, sizeof at, ":%d: ", cases[i].line);
            if (rc == KB_OK || strstr(err, at) == NULL)
                fail_msg("case %zu: rc %d, errstr \"%s\" lacks \"%s\"", i, rc, err, at);
        }
        kb_conf_destroy(c);
    }
}

static void ini_reads_long_lines_whole_and_stops_at_the_first_error(void **state)
{
    (void)state;
    /* a 5000-byte value is read whole: the key's own limit refuses it, on line 2 */
    char *text = malloc(20000);
    assert_non_null(text);
    snprintf(text, 20000, "# long\nconsumer = %05000d\n", 7);
    kb_conf *c;
    char err[512] = "";
    assert_int_equal(load_text(&c, text, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, ":2: consumer"));
    kb_conf_destroy(c);
    /* a comment line of 8000 bytes is fine; a line over 8448 bytes is an error naming it */
    memset(text, 0, 20000);
    strcpy(text, "group = a\n#");
    memset(text + strlen(text), 'x', 8000);
    strcat(text, "\ngroup = b\n");
    kb_assert_ok(load_text(&c, text, err, sizeof err));
    assert_value(c, "group", "b");
    kb_conf_destroy(c);
    strcpy(text, "group = a\n\n#");
    memset(text + strlen(text), 'x', 9000);
    strcat(text, "\ngroup = b\n");
    assert_int_equal(load_text(&c, text, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, ":3: line longer than"));
    assert_value(c, "group", "a");
    kb_conf_destroy(c);
    free(text);

    /* loading stops at the first error, and the reason survives errstr == NULL */
    char path[] = "/tmp/keybus-ini-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "[pool]\nworkers = 8\nbogus line\nthreads = 2\nnope = 1\n");
    c = kb_conf_new();
    kb_err_clear();
    assert_int_equal(kb_conf_load(c, path, NULL, 0), KB_EINVAL);
    assert_non_null(strstr(kb_last_error(), path));
    assert_non_null(strstr(kb_last_error(), ":3: expected `key = value`"));
    assert_value(c, "pool.workers", "8");
    assert_value(c, "pool.threads", "0");
    kb_conf_destroy(c);
    unlink(path);

    /* only regular files */
    c = kb_conf_new();
    assert_int_equal(kb_conf_load(c, "/tmp", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "not a regular file (a directory)"));
    assert_int_equal(kb_conf_load(c, "/dev/zero", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "not a regular file (a device)"));
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
    kb_assert_ok(kb_conf_set(c, "pool.workers", "32", err, sizeof err));
    kb_assert_ok(kb_conf_load(c, path, err, sizeof err));   /* after the code */
    assert_value(c, "pool.workers", "32");        /* code beats the file */
    assert_value(c, "pool.threads", "3");
    setenv("KEYBUS_POOL_WORKERS", "128", 1);
    setenv("KEYBUS_RETRY_MAX_ATTEMPTS", "7", 1);
    kb_assert_ok(kb_conf_apply_env(c, err, sizeof err));
    assert_value(c, "pool.workers", "32");        /* code beats the environment */
    assert_value(c, "retry.max_attempts", "7");   /* the environment beats the file */
    kb_assert_ok(kb_conf_load(c, path, err, sizeof err));
    assert_value(c, "retry.max_attempts", "7");   /* a later file does not undo it */

    /* a bad value is refused even for a key the code set */
    setenv("KEYBUS_POOL_WORKERS", "lots", 1);
    assert_int_equal(kb_conf_apply_env(c, err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "KEYBUS_POOL_WORKERS"));
    /* kb_open applies the environment too, and refuses it the same way... */
    assert_null(kb_open(c, err, sizeof err));
    assert_non_null(strstr(err, "KEYBUS_POOL_WORKERS"));
    /* ...unless conf.env is false */
    kb_assert_ok(kb_conf_set(c, "conf.env", "false", err, sizeof err));
    kb_bus *b = kb_open(c, err, sizeof err);
    assert_non_null(b);
    kb_assert_ok(kb_close(b, 1000));
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
    kb_assert_ok(kb_close(b, 1000));
}

static void open_checks_cross_key_rules(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256] = "";
    kb_assert_ok(kb_conf_set(c, "retry.backoff_ms", "100", err, sizeof err));
    kb_assert_ok(kb_conf_set(c, "retry.max_backoff_ms", "10", err, sizeof err));
    assert_null(kb_open(c, err, sizeof err));   /* caller still owns c */
    assert_non_null(strstr(err, "retry.max_backoff_ms"));
    assert_non_null(strstr(err, "retry.backoff_ms"));

    kb_assert_ok(kb_conf_set(c, "retry.max_backoff_ms", "1000", err, sizeof err));
    kb_conf *d = kb_conf_dup(c);
    assert_non_null(d);
    assert_value(d, "retry.backoff_ms", "100");
    kb_conf_destroy(c);
    kb_bus *b = kb_open(d, err, sizeof err);
    assert_non_null(b);
    kb_assert_ok(kb_close(b, 1000));
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
        kb_assert_ok(kb_conf_set(c, "pool.idle", ok[i], err, sizeof err));
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
 * bus runs are refused (they would double-free it or change a live bus),
 * its callbacks' setters included. */
static void a_conf_belongs_to_one_open_bus(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256] = "";
    kb_assert_ok(kb_conf_set(c, "pool.workers", "16", err, sizeof err));
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
    /* nor its callbacks, which the bus's threads read unlocked */
    kb_conf_set_delivery_cb(c, NULL, NULL);
    assert_non_null(strstr(kb_last_error(), "kb_conf_set_delivery_cb: this kb_conf belongs to an open bus"));
    kb_conf_set_log(c, NULL, NULL);
    assert_non_null(strstr(kb_last_error(), "kb_conf_set_log: this kb_conf belongs to an open bus"));
    kb_conf_destroy(c);   /* a no-op while the bus owns it */
    kb_assert_ok(kb_subscribe(b, "t", nop_handler, NULL));
    kb_topic_stats st;
    kb_assert_ok(kb_stats(b, "t", &st));
    assert_int_equal(st.lanes, 16);
    kb_assert_ok(kb_close(b, 1000));   /* frees the conf once */
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

/* Booleans: true/false, also 1/0, read with kb_conf_bool. */
static void booleans_read_as_booleans(void **state)
{
    (void)state;
    kb_conf *c = kb_conf_new();
    char err[256];
    assert_true(kb_conf_bool(c, "conf.env"));
    kb_assert_ok(kb_conf_set(c, "conf.env", "0", err, sizeof err));
    assert_false(kb_conf_bool(c, "conf.env"));
    kb_assert_ok(kb_conf_set(c, "conf.env", "true", err, sizeof err));
    assert_true(kb_conf_bool(c, "conf.env"));
    assert_int_equal(kb_conf_set(c, "conf.env", "yes", err, sizeof err), KB_EINVAL);
    assert_non_null(strstr(err, "conf.env: not a boolean"));
    kb_conf_destroy(c);
}

/* One misread in a child: debug builds abort naming the key; others return
 * the zero value with KB_EINVAL and a text naming it. */
static void expect_misread(int which, const char *key, const char *why)
{
    fflush(NULL);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        kb_conf *c = kb_conf_new();
        kb_err_clear();
        int zero = which == 0 ? kb_conf_int(c, key) == 0
                 : which == 1 ? kb_conf_str(c, key)[0] == '\0'
                              : !kb_conf_bool(c, key);
        _exit(zero && kb_last_error_code() == KB_EINVAL && strstr(kb_last_error(), key) != NULL &&
              strstr(kb_last_error(), why) != NULL ? 0 : 1);
    }
    close(fds[1]);
    char out[1024] = "";
    size_t n = 0;
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(fds[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)r;
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
#ifdef NDEBUG
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("reading %s: want 0 / \"\" / false and KB_EINVAL naming it; stderr: %s", key, out);
#else
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        fail_msg("reading %s: want abort() in a debug build; stderr: %s", key, out);
#endif
    if (strstr(out, key) == NULL || strstr(out, why) == NULL)
        fail_msg("reading %s: stderr does not say \"%s\": %s", key, why, out);
}

/* A key nobody declares, or read through the function of another type, is a
 * bug in the caller: never a silent 0 or "". */
static void misread_keys_are_hard_errors(void **state)
{
    (void)state;
    expect_misread(0, "pool.wrokers", "no such configuration key");
    expect_misread(1, "trasnport", "no such configuration key");
    expect_misread(2, "conf.evn", "no such configuration key");
    expect_misread(0, "transport", "of type URL");
    expect_misread(1, "pool.workers", "of type integer");
    expect_misread(1, "conf.env", "of type boolean");
    expect_misread(2, "pool.idle", "of type enumeration");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_match_the_design),
        cmocka_unit_test(bad_values_are_refused_and_named),
        cmocka_unit_test(ini_files_load_sections_as_prefixes),
        cmocka_unit_test(ini_grammar_has_one_rule_each),
        cmocka_unit_test(ini_reads_long_lines_whole_and_stops_at_the_first_error),
        cmocka_unit_test(environment_overrides_the_file_not_the_code),
        cmocka_unit_test(unknown_environment_names_are_reported),
        cmocka_unit_test(open_checks_cross_key_rules),
        cmocka_unit_test(errors_have_names),
        cmocka_unit_test(idle_strategy_is_one_of_four),
        cmocka_unit_test(a_conf_belongs_to_one_open_bus),
        cmocka_unit_test(booleans_read_as_booleans),
        cmocka_unit_test(misread_keys_are_hard_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
