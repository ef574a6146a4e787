#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int kb_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

int kb_test_wait_port(int port, int timeout_ms)
{
    struct timespec nap = {0, 20 * 1000000L};
    for (int waited = 0; waited <= timeout_ms; waited += 20) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return 0;
        nanosleep(&nap, NULL);
    }
    return -1;
}

static int spawn(kb_test_server *s)
{
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    const char *argv[48];
    int n = 0;
    if (strcmp(s->kind, "sentinel") == 0) {
        /* Sentinel keeps its state in sentinel.conf: an empty one to start
         * from, the monitor lines as arguments (s->extra) */
        char conf[300];
        snprintf(conf, sizeof conf, "%s/sentinel.conf", s->dir);
        FILE *f = fopen(conf, "a");
        if (f == NULL || fclose(f) != 0)
            return -1;
        const char *base[] = {"redis-sentinel", "sentinel.conf", "--port", port, "--bind", "127.0.0.1",
                              "--dir", s->dir, "--daemonize", "no", "--protected-mode", "no",
                              "--logfile", "server.log"};
        for (size_t i = 0; i < sizeof base / sizeof *base; i++)
            argv[n++] = base[i];
    } else if (strcmp(s->kind, "redis") == 0) {
        const char *base[] = {"redis-server", "--port", port, "--bind", "127.0.0.1", "--dir", s->dir,
                              "--save", "", "--daemonize", "no", "--protected-mode", "no",
                              "--logfile", "server.log"};
        for (size_t i = 0; i < sizeof base / sizeof *base; i++)
            argv[n++] = base[i];
    } else if (strcmp(s->kind, "prometheus") == 0) {
        /* scrape targets in the dir's prometheus.yml (kb_test_prometheus_start) */
        static char listen[64];
        snprintf(listen, sizeof listen, "--web.listen-address=127.0.0.1:%d", s->port);
        const char *base[] = {"prometheus", "--config.file=prometheus.yml", listen,
                              "--storage.tsdb.path=data", "--log.level=error"};
        for (size_t i = 0; i < sizeof base / sizeof *base; i++)
            argv[n++] = base[i];
    } else if (strcmp(s->kind, "nats-conf") == 0) {
        /* everything (ports, store dir, cluster) in the dir's server.conf */
        const char *base[] = {"nats-server", "-c", "server.conf", "-l", "server.log"};
        for (size_t i = 0; i < sizeof base / sizeof *base; i++)
            argv[n++] = base[i];
    } else {
        const char *base[] = {"nats-server", "-js", "-a", "127.0.0.1", "-p", port, "-sd", s->dir,
                              "-l", "server.log"};
        for (size_t i = 0; i < sizeof base / sizeof *base; i++)
            argv[n++] = base[i];
    }
    for (int i = 0; s->extra[i] != NULL && n < 46; i++)
        argv[n++] = s->extra[i];
    argv[n] = NULL;

    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* die with the test: an orphaned server would hold ctest's pipes open */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (chdir(s->dir) != 0)
            _exit(126);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    s->pid = pid;
    if (kb_test_wait_port(s->port, 10000) != 0) {
        fprintf(stderr, "%s-server did not listen on %d within 10 s (log in %s)\n", s->kind,
                s->port, s->dir);
        kb_test_server_signal(s, SIGKILL);
        return -1;
    }
    return 0;
}

int kb_test_server_start(kb_test_server *s, const char *kind, const char *const *extra)
{
    memset(s, 0, sizeof *s);
    s->kind = kind;
    for (int i = 0; extra != NULL && extra[i] != NULL && i < 15; i++)
        s->extra[i] = extra[i];
    snprintf(s->dir, sizeof s->dir, "/tmp/keybus-%s-XXXXXX", kind);
    if (mkdtemp(s->dir) == NULL)
        return -1;
    for (int tries = 0; tries < 5; tries++) {
        s->port = kb_test_free_port();
        snprintf(s->url, sizeof s->url, "%s://127.0.0.1:%d", kind, s->port);
        if (spawn(s) == 0)
            return 0;
    }
    return -1;
}

int kb_test_server_restart(kb_test_server *s)
{
    return spawn(s);
}

void kb_test_server_signal(kb_test_server *s, int sig)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, sig);
    if (sig == SIGKILL || sig == SIGTERM) {
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
}

void kb_test_server_stop(kb_test_server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        for (int i = 0; i < 250; i++) {
            if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
                s->pid = 0;
                break;
            }
            struct timespec nap = {0, 20 * 1000000L};
            nanosleep(&nap, NULL);
        }
        if (s->pid > 0)
            kb_test_server_signal(s, SIGKILL);
    }
    if (s->dir[0] != '\0') {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", s->dir);
        s->dir[0] = '\0';
    }
}

int kb_test_fake_start(const char *greeting, pid_t *pid)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *pid = fork();
    if (*pid < 0) {
        close(fd);
        return -1;
    }
    if (*pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;) {   /* accepted sockets stay open until the process dies */
            int c = accept(fd, NULL, NULL);
            if (c >= 0 && greeting != NULL && write(c, greeting, strlen(greeting)) < 0)
                close(c);
        }
    }
    close(fd);
    return ntohs(a.sin_port);
}

void kb_test_fake_stop(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

int kb_test_server_start_conf(kb_test_server *s, const char *kind, const char *conf)
{
    /* Started once for a dir and a port, then again with the file. */
    if (kb_test_server_start(s, kind, NULL) != 0)
        return -1;
    kb_test_server_signal(s, SIGTERM);
    char path[300];
    snprintf(path, sizeof path, "%s/server.conf", s->dir);
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs(conf, f) < 0 || fclose(f) != 0)
        return -1;
    s->extra[0] = "-c";
    s->extra[1] = "server.conf";
    s->extra[2] = NULL;
    return kb_test_server_restart(s);
}

int kb_test_prometheus_start(kb_test_server *s, const char *target)
{
    memset(s, 0, sizeof *s);
    s->kind = "prometheus";
    snprintf(s->dir, sizeof s->dir, "/tmp/keybus-prometheus-XXXXXX");
    if (mkdtemp(s->dir) == NULL)
        return -1;
    char path[300];
    snprintf(path, sizeof path, "%s/prometheus.yml", s->dir);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
               "scrape_configs:\n  - job_name: keybus\n    static_configs:\n"
               "      - targets: ['%s']\n", target);
    if (fclose(f) != 0)
        return -1;
    for (int tries = 0; tries < 5; tries++) {
        s->port = kb_test_free_port();
        snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", s->port);
        if (spawn(s) == 0)
            return 0;
    }
    return -1;
}
