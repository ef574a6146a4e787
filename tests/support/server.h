/* Test harness: real redis-server / nats-server processes on a free loopback
 * port, in their own temp dir, stopped by PID. */
#ifndef KB_TEST_SERVER_H
#define KB_TEST_SERVER_H

#include <sys/types.h>

typedef struct kb_test_server {
    const char *kind;        /* "redis", "sentinel" (redis-sentinel), "nats",
                              * "nats-conf" (all from the dir's server.conf) or
                              * "prometheus" */
    pid_t pid;               /* 0 when not running */
    int port;
    char dir[256];           /* data dir, removed by kb_test_server_stop */
    char url[128];           /* redis://127.0.0.1:PORT or nats://127.0.0.1:PORT */
    const char *extra[16];   /* extra server arguments, NULL-terminated */
} kb_test_server;

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int kb_test_free_port(void);

/* Start `kind` on a free port in a fresh temp dir, with `extra` arguments
 * (NULL-terminated, may be NULL) appended; waits up to 10 s until it accepts
 * connections. Returns 0 or -1 (with a message on stderr). */
int kb_test_server_start(kb_test_server *s, const char *kind, const char *const *extra);

/* Start again on the same port and dir (after a kill), same arguments. */
int kb_test_server_restart(kb_test_server *s);

/* Send `sig` to the server and, for fatal signals, reap it. */
void kb_test_server_signal(kb_test_server *s, int sig);

/* Stop (SIGTERM, then SIGKILL after 5 s), reap, remove the temp dir. */
void kb_test_server_stop(kb_test_server *s);

/* Wait until something accepts connections on 127.0.0.1:port (0) or timeout (-1). */
int kb_test_wait_port(int port, int timeout_ms);

/* Something else on a port: a forked listener on a free loopback port that
 * accepts every connection, writes `greeting` (NULL: nothing) and keeps it
 * open. Returns the port (and *pid), or -1. */
int kb_test_fake_start(const char *greeting, pid_t *pid);

/* Stop a fake listener (SIGKILL) and reap it. */
void kb_test_fake_stop(pid_t pid);

/* Like kb_test_server_start, with `conf` (the server's own configuration
 * syntax) in server.conf of its dir, passed as `-c server.conf` (nats-server). */
int kb_test_server_start_conf(kb_test_server *s, const char *kind, const char *conf);

/* A Prometheus server (Debian's `prometheus`) on a free loopback port that
 * scrapes `target` (host:port) every second; stopped by kb_test_server_stop. */
int kb_test_prometheus_start(kb_test_server *s, const char *target);

#endif /* KB_TEST_SERVER_H */
