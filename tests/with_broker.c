/* Run a program against a real broker the harness starts (tests/support/
 * server.c): `with_broker KIND PROGRAM ARGS...` starts KIND (redis, nats)
 * on a free port, runs PROGRAM with every argument "@URL@" replaced by the
 * broker's URL, stops the broker and exits with PROGRAM's status. ctest runs
 * keybus-contract this way. */
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "support/server.h"

extern char **environ;

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: with_broker KIND PROGRAM ARGS... (@URL@: the broker's URL)\n");
        return 2;
    }
    kb_test_server s = {0};
    if (kb_test_server_start(&s, argv[1], NULL) != 0)
        return 2;
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "@URL@") == 0)
            argv[i] = s.url;
    pid_t pid;
    int status = 0, rc = posix_spawn(&pid, argv[2], NULL, NULL, argv + 2, environ);
    if (rc != 0)
        fprintf(stderr, "with_broker: %s: %s\n", argv[2], strerror(rc));
    else
        while (waitpid(pid, &status, 0) < 0)
            ;
    kb_test_server_stop(&s);
    if (rc != 0)
        return 2;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
