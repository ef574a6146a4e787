#include "cli.h"
#include "bus.h"
#include "check.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void slurp(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(path);
}

void kb_test_cli(kb_test_cli_result *r, const char *cli, const char *const *args)
{
    char out[] = "/tmp/keybus-cli-out-XXXXXX", err[] = "/tmp/keybus-cli-err-XXXXXX";
    int fo = mkstemp(out), fe = mkstemp(err);
    assert_true(fo >= 0 && fe >= 0);
    char *argv[32] = {(char *)cli};
    size_t n = 1;
    for (; args[n - 1] != NULL && n < 31; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fo, 1);
    posix_spawn_file_actions_adddup2(&fa, fe, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);   /* produce reads it */
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, cli, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    close(fo);
    close(fe);
    r->status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    slurp(out, r->out, sizeof r->out);
    slurp(err, r->err, sizeof r->err);
}

int kb_test_sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

void kb_test_cli_x(kb_test_cli_result *r, const char *cli, const char *const *args,
                   const char *setting)
{
    const char *argv[32];
    size_t n = 0;
    for (; args[n] != NULL && n < 28; n++)
        argv[n] = args[n];
    argv[n++] = "-X";
    argv[n++] = setting;
    argv[n] = NULL;
    kb_test_cli(r, cli, argv);
}

size_t kb_test_lines(const char *s)
{
    size_t n = 0;
    for (; *s != '\0'; s++)
        n += *s == '\n';
    return n;
}

void kb_test_check_schema(const char *source_dir, const char *schema, const char *text)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/keybus-schema-%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    int rc = kb_test_sh("python3 %s/tests/check_schema.py %s/docs/schemas/%s %s %s/docs/formats.md",
                        source_dir, source_dir, schema, path, source_dir);
    unlink(path);
    assert_int_equal(rc, 0);
}

void kb_test_publish_numbered(const char *url, const char *const *settings, const char *topic,
                              int n, int keys)
{
    kb_bus *b = kb_test_open(url, settings, NULL);
    for (int i = 0; i < n; i++) {
        char key[16], payload[16];
        int kl = snprintf(key, sizeof key, "k%d", i % keys);
        int pl = snprintf(payload, sizeof payload, "%d", i);
        kb_assert_ok(kb_publish(b, topic, key, (size_t)kl, payload, (size_t)pl));
    }
    kb_assert_ok(kb_flush(b, 30000));
    kb_assert_ok(kb_close(b, 30000));
}
