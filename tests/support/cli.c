#include "cli.h"

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
