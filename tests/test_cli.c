/* The keybus CLI, run as a process on mem://: arguments checked before any
 * connection (usage, exit 2), strict numbers, -h/--help exit 0, no secret in
 * its output, escaped text output and exact JSON. In the ASan build a leak
 * on an error exit changes the exit status, which the cases assert. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/text.h"
#include "support/cli.h"

#define MARK "hunter2MARK"

/* Run the CLI with args (NULL-terminated); stdout and stderr captured. */
static void cli(kb_test_cli_result *r, const char *const *args)
{
    kb_test_cli(r, KB_CLI, args);
}

struct cli_case {
    const char *args[8];
    int status;
    const char *out, *err;   /* substrings expected (NULL: not checked) */
};

static void arguments_are_checked_before_the_bus_opens(void **state)
{
    (void)state;
    const struct cli_case cases[] = {
        {{"-h"}, 0, "usage: keybus", NULL},
        {{"--help"}, 0, "usage: keybus", NULL},
        {{"-X", "pool.workers=8", "-h"}, 0, "usage: keybus", NULL},
        {{NULL}, 2, NULL, "keybus: no command (see: keybus --help)\n"},
        {{"bogus"}, 2, NULL, "unknown command"},
        {{"-X", "transport=redis://127.0.0.1:1", "bogus"}, 2, NULL, "unknown command"},
        {{"-X", "transport=mem://", "bogus"}, 2, NULL, "unknown command"},
        {{"-Q", "stats", "t"}, 2, NULL, "unknown option"},
        {{"-X"}, 2, NULL, "-X needs an argument"},
        {{"stats", "t", "-X"}, 2, NULL, "-X needs an argument"},
        {{"publish", "t"}, 2, NULL, "keybus publish: wrong number of arguments (see: keybus help publish)\n"},
        {{"stats"}, 2, NULL, "wrong number of arguments"},
        {{"stats", "t", "u"}, 2, NULL, "wrong number of arguments"},
        {{"stats", "t", "--json", "--text"}, 2, NULL, "exclude each other"},
        {{"stats", "t", "--bogus"}, 2, NULL, "keybus stats: unknown option (see: keybus help stats)"},
        {{"stats", "t", "-g"}, 2, NULL, "keybus stats: unknown option (see: keybus help stats)\n"},
        {{"dlq-replay", "t"}, 2, NULL, "wrong number of arguments"},
        {{"dlq-delete", "t"}, 2, NULL, "wrong number of arguments"},
        {{"dlq-purge"}, 2, NULL, "wrong number of arguments"},
        {{"partitions"}, 2, NULL, "wrong number of arguments"},
        {{"top"}, 2, NULL, "wants at least one TOPIC"},
        {{"top", "ok", "bad topic"}, 2, NULL, "allowed: letters"},
        {{"dlq-list", "t", "abc"}, 2, NULL, "MAX must be"},
        {{"dlq-list", "t", "0"}, 2, NULL, "MAX must be"},
        {{"dlq-list", "t", "2x"}, 2, NULL, "MAX must be"},
        {{"dlq-list", "t", "-1"}, 2, NULL, "unknown option"},
        {{"dlq-list", "t", " 5"}, 2, NULL, "MAX must be"},
        {{"dlq-list", "t", "99999999999"}, 2, NULL, "MAX must be"},
        {{"dlq-list", "t", "5"}, 4, NULL, "keybus dlq-list: not found: "},   /* as stats */
        {{"dlq-list", "t", "--json"}, 4, NULL, "keybus dlq-list: not found: "},
        {{"partitions", "t"}, 4, NULL, "keybus partitions: not found: "},
        /* the broker-only commands: arguments first, then "needs a broker" */
        {{"peek"}, 2, NULL, "wants exactly one TOPIC"},
        {{"peek", "t", "-n", "0"}, 2, NULL, "-n wants a decimal count in 1..10000"},
        {{"peek", "t", "-n", "10001"}, 2, NULL, "-n wants a decimal count"},
        {{"peek", "t", "-n"}, 2, NULL, "-n is missing its argument"},
        {{"peek", "t", "-g", "a b"}, 2, NULL, "keybus peek: -g: "},
        {{"peek", "bad topic"}, 2, NULL, "keybus peek: topic: topic has ' '"},
        {{"peek", "t", "--bogus"}, 2, NULL, "unknown option"},
        {{"groups"}, 2, NULL, "keybus groups: wants exactly one TOPIC"},
        {{"groups", "bad topic"}, 2, NULL, "allowed: letters"},
        {{"group-delete", "t"}, 2, NULL, "keybus group-delete: wants TOPIC and GROUP"},
        {{"group-delete", "t", "a b"}, 2, NULL, "keybus group-delete: GROUP: "},
        {{"group-delete", "t", "g", "--bogus"}, 2, NULL, "unknown option"},
        {{"topics", "t"}, 2, NULL, "keybus topics: takes no arguments (only --json)"},
        {{"peek", "t"}, 4, NULL, "keybus peek: not found: mem:// keeps no consumer groups"},
        {{"groups", "t"}, 4, NULL, "keybus groups: not found: mem:// keeps no consumer groups"},
        {{"group-delete", "t", "g"}, 4, NULL, "this needs a broker (redis:// or nats://)"},
        {{"topics"}, 4, NULL, "keybus topics: not found: mem:// keeps no consumer groups"},
        {{"topics", "--json"}, 4, NULL, "this needs a broker"},
        {{"help"}, 0, "usage: keybus", NULL},
        {{"help", "consume"}, 0, "usage: keybus [-c FILE] [-X key=value]... consume TOPIC", NULL},
        {{"help", "bogus"}, 2, NULL, "unknown command"},
        {{"consume", "--help"}, 0, "exactly COUNT", NULL},
        {{"-V"}, 0, "keybus " KB_VERSION_STRING " (library " KB_VERSION_STRING ")\n", NULL},
        {{"--version"}, 0, "keybus " KB_PROJECT_VERSION " ", NULL},   /* CMake's is the header's */
        {{"--man"}, 0, ".TH KEYBUS 1", NULL},
        {{"-X", "pool.workers=abc", "stats", "t"}, 2, NULL, "pool.workers"},
        {{"-c", "/tmp", "stats", "t"}, 2, NULL, "not a regular file"},
        {{"-c", "/nonexistent/keybus.ini", "stats", "t"}, 2, NULL, "cannot read"},
        {{"stats", "t"}, 4, NULL, "keybus stats: not found: "},   /* never used here */
        {{"stats", "bad topic"}, 2, NULL, "allowed: letters"},   /* before any connection */
        {{"-X", "transport=redis://127.0.0.1:1", "stats", "bad\x1btopic"}, 2, NULL, "0x1b"},
        {{"dlq-replay", "t", "nope"}, 1, NULL, "keybus dlq-replay: "},
        {{"publish", "t", "k", "v"}, 4, NULL, "keybus publish: not found: "},
        {{"-X", "pool.workers=16", "conf"}, 0, "pool.workers = 16\n", NULL},
        {{"conf", "-X", "pool.workers=17"}, 0, "pool.workers = 17\n", NULL},   /* after it */
        {{"conf", "-Xpool.workers=18"}, 0, "pool.workers = 18\n", NULL},
        {{"conf", "--", "-Xpool.workers=18"}, 2, NULL, "wrong number of arguments"},
        {{"conf-doc"}, 0, "# keybus configuration", NULL},
        {{"produce"}, 2, NULL, "wants exactly one TOPIC"},
        {{"consume", "t", "u"}, 2, NULL, "wants exactly one TOPIC"},
        {{"consume", "bad topic"}, 2, NULL, "allowed: letters"},
        {{"consume", "t", "-n", "0"}, 2, NULL, "-n wants a decimal count"},
        {{"consume", "t", "-n", "5x"}, 2, NULL, "-n wants a decimal count"},
        {{"consume", "t", "--timeout-ms", "-1"}, 2, NULL, "--timeout-ms wants"},
        {{"consume", "t", "-K", ","}, 2, NULL, "unknown option"},
        {{"consume", "t", "-g"}, 2, NULL, "missing its argument"},
        {{"consume", "t"}, 1, NULL, "nothing to consume: mem://"},   /* at once */
        {{"produce", "t", "--json"}, 2, NULL, "unknown option"},
        {{"produce", "t", "-K", ""}, 2, NULL, "non-empty delimiter"},
        {{"produce", "t", "-g", "x"}, 2, NULL, "unknown option"},
        {{"-X", "pool.workers=abc", "consume", "t"}, 2, NULL, "pool.workers"},
        {{"consume", "-g", "bad group\n", "t"}, 2, NULL, "-g: "},
        {{"-X", "transport=redis://127.0.0.1:1", "consume", "-g", "bad group\n", "t"}, 2, NULL,
         "-g: "},
        {{"produce", "t"}, 0, NULL, "0 events published"},   /* stdin is empty */
    };
    static kb_test_cli_result r;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cli(&r, cases[i].args);
        if (r.status != cases[i].status)
            fail_msg("case %zu (%s ...): exit %d, want %d; stderr: %s", i,
                     cases[i].args[0] ? cases[i].args[0] : "", r.status, cases[i].status, r.err);
        if (cases[i].out != NULL && strstr(r.out, cases[i].out) == NULL)
            fail_msg("case %zu: stdout \"%s\" lacks \"%s\"", i, r.out, cases[i].out);
        if (cases[i].err != NULL && strstr(r.err, cases[i].err) == NULL)
            fail_msg("case %zu: stderr \"%s\" lacks \"%s\"", i, r.err, cases[i].err);
    }
}

static void no_secret_is_printed(void **state)
{
    (void)state;
    char path[] = "/tmp/keybus-cli-ini-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char ini[] = "[pool]\nworkers = 4\ntransport = mem://u:" MARK "@x\n";
    assert_int_equal(write(fd, ini, strlen(ini)), (ssize_t)strlen(ini));
    close(fd);
    const struct cli_case cases[] = {
        {{"-X", "nats.token:" MARK, "stats", "t"}, 2, NULL, "no '='"},
        {{"-X", "transport=redis:/:" MARK "@10.0.0.5:6379", "stats", "t"}, 2, NULL, "not a URL"},
        {{"-X", "transport=mem://u:" MARK "@x", "stats", "t"}, 2, NULL, "transport"},
        {{"-X", "transport=mem://u:" MARK "@x", "conf"}, 2, NULL, "transport"},
        {{"-X", "nats.token:" MARK "=x", "stats", "t"}, 2, NULL, "unknown configuration key"},
        {{"-X", "pool.workers=" MARK, "stats", "t"}, 2, NULL, "pool.workers"},
        {{"-c", path, "stats", "t"}, 2, NULL, ":3:"},
        {{"--token=" MARK, "stats", "t"}, 2, NULL, "unknown option"},
        {{"--" MARK, "stats", "t"}, 2, NULL, "unknown option"},
    };
    static kb_test_cli_result r;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cli(&r, cases[i].args);
        if (r.status != cases[i].status)
            fail_msg("case %zu: exit %d, want %d; stderr: %s", i, r.status, cases[i].status,
                     r.err);
        if (strstr(r.err, cases[i].err) == NULL)
            fail_msg("case %zu: stderr \"%s\" lacks \"%s\"", i, r.err, cases[i].err);
        if (strstr(r.out, MARK) != NULL || strstr(r.err, MARK) != NULL)
            fail_msg("case %zu: the secret is printed: %s%s", i, r.out, r.err);
    }
    unlink(path);
}

static void text_is_escaped_and_json_exact(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    const char raw[] = "a\nb\tc\rd\\e\x1b[31mf\x7fg\xc3\xa9h\xc2\x9bi\xffj\xe2\x82k\0l";
    kb_cli_escape(f, raw, sizeof raw - 1);
    fputc('|', f);
    kb_cli_json_string(f, "q\"b\\s\n\x01\xc3\xa9", 9);
    fputc('|', f);
    kb_cli_json_string(f, "r\xffs\xe2\x82", 5);   /* text that is not UTF-8 (a reason) */
    fclose(f);
    assert_string_equal(buf, "a\\nb\\tc\\rd\\\\e\\x1B[31mf\\x7Fg\xc3\xa9h\\xC2\\x9Bi\\xFFj\\xE2\\x82k"
                             "\\x00l|\"q\\\"b\\\\s\\u000a\\u0001\xc3\xa9\"|"
                             "\"r\\ufffds\\ufffd\\ufffd\"");
    free(buf);

    /* consume --json: UTF-8 (C1 controls and NUL included) as a string,
     * anything else base64 */
    f = open_memstream(&buf, &len);
    assert_non_null(f);
    kb_cli_json_bytes(f, "key", "\xc2\x9b\0a", 4);
    fputc(',', f);
    kb_cli_json_bytes(f, "key", "\xff\x00x", 3);
    fputc(',', f);
    kb_cli_json_bytes(f, "key", "\xe2\x82", 2);
    fputc(',', f);
    kb_cli_json_bytes(f, "key", "", 0);
    fclose(f);
    assert_string_equal(buf, "\"key\":\"\xc2\x9b\\u0000a\",\"key_base64\":\"/wB4\","
                             "\"key_base64\":\"4oI=\",\"key\":\"\"");
    free(buf);
}

/* The whole of /proc/PID/FILE (NULs kept) into buf; its length. */
static size_t proc_file(pid_t pid, const char *file, char *buf, size_t len)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    FILE *f = fopen(path, "rb");
    size_t n = f != NULL ? fread(buf, 1, len - 1, f) : 0;
    if (f != NULL)
        fclose(f);
    buf[n] = '\0';
    return n;
}

static bool holds(const char *buf, size_t n, const char *what)
{
    return memmem(buf, n, what, strlen(what)) != NULL;
}

/* A running produce no longer shows a secret of -X in /proc/PID/cmdline,
 * shows the other values, and dumps no core. */
static void secrets_leave_the_command_line(void **state)
{
    (void)state;
    char *const args[] = {(char *)KB_CLI, "-X", (char *)"nats.token=" MARK, "produce",
                          "-X", (char *)"pool.workers=4", "cli.argv", NULL};
    int devnull = open("/dev/null", O_RDWR), in[2];
    assert_int_equal(pipe(in), 0);   /* produce waits for its first line */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_adddup2(&fa, devnull, 1);
    posix_spawn_file_actions_adddup2(&fa, devnull, 2);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, KB_CLI, &fa, NULL, args, NULL), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(devnull);
    close(in[0]);
    static char cmdline[4096], limits[8192];
    size_t n = 0;
    for (int waited = 0; waited < 10000; waited += 50) {
        n = proc_file(pid, "cmdline", cmdline, sizeof cmdline);
        if (holds(cmdline, n, "nats.token=*"))
            break;
        usleep(50000);
    }
    proc_file(pid, "limits", limits, sizeof limits);
    close(in[1]);   /* end of input: produce exits */
    for (size_t i = 0; i < n; i++)
        cmdline[i] = cmdline[i] == '\0' ? ' ' : cmdline[i];
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (holds(cmdline, n, MARK) || !holds(cmdline, n, "nats.token=***********") ||
        !holds(cmdline, n, "produce") || !holds(cmdline, n, "pool.workers=4"))
        fail_msg("cmdline still shows the secret, or lost the rest: %.*s", (int)n, cmdline);
    const char *core = strstr(limits, "Max core file size");
    assert_non_null(core);
    if (strncmp(core + strcspn(core, "0123456789u"), "0 ", 2) != 0)
        fail_msg("core dumps still on: %.80s", core);
}

/* A service's file names its metrics endpoint, which the service holds:
 * the CLI reads the file without listening there (nor starting the feed). */
static void the_service_keys_are_left_to_the_service(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    char path[] = "/tmp/keybus-svc-XXXXXX", text[256];
    int f = mkstemp(path);
    assert_true(f >= 0);
    int n = snprintf(text, sizeof text, "[app]\nx = 1\n[keybus]\nmetrics.listen = 127.0.0.1:%d\n"
                     "stats.interval_ms = 100\n", ntohs(a.sin_port));
    assert_int_equal(write(f, text, (size_t)n), n);
    close(f);
    kb_test_cli_result r;
    cli(&r, (const char *const[]){"-c", path, "metrics", NULL});
    if (r.status != 0 || r.err[0] != '\0')
        fail_msg("metrics with the service's file: exit %d, stderr %s", r.status, r.err);
    /* conf still shows the file's values: they are the service's */
    cli(&r, (const char *const[]){"-c", path, "conf", NULL});
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "stats.interval_ms = 100"));
    unlink(path);
    close(fd);
}

int main(void)
{
    unsetenv("KEYBUS_TRANSPORT");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(arguments_are_checked_before_the_bus_opens),
        cmocka_unit_test(no_secret_is_printed),
        cmocka_unit_test(text_is_escaped_and_json_exact),
        cmocka_unit_test(secrets_leave_the_command_line),
        cmocka_unit_test(the_service_keys_are_left_to_the_service),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
