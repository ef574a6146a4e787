/* A consumer process for the multi-process Redis fault tests:
 *   redis_consumer_proc URL TOPIC CONSUMER LOGFILE LEASE_TTL_MS HANDLER_DELAY_US
 * Appends "key seq\n" per handled event to LOGFILE (O_APPEND: lines of all
 * processes interleave in the order they were handled) and runs until SIGTERM. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/tracker.h"

static int log_fd;
static useconds_t delay_us;

static int handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (delay_us > 0)
        usleep(delay_us);
    char line[32];
    int n = snprintf(line, sizeof line, "%u %u\n", key, seq);
    if (write(log_fd, line, (size_t)n) != n)
        return KB_RETRY;
    return KB_HANDLED;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s URL TOPIC CONSUMER LOGFILE LEASE_TTL_MS DELAY_US\n", argv[0]);
        return 2;
    }
    log_fd = open(argv[4], O_WRONLY | O_APPEND | O_CREAT, 0644);
    delay_us = (useconds_t)atoi(argv[6]);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);   /* before any keybus thread starts */

    kb_conf *c = kb_conf_new();
    char err[256];
    const char *kv[][2] = {{"transport", argv[1]}, {"consumer", argv[3]},
                           {"redis.lease_ttl_ms", argv[5]}, {"pool.threads", "2"},
                           {"retry.backoff_ms", "1"}, {"retry.max_backoff_ms", "4"},
                           {"pool.queue_capacity", "64"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (kb_conf_set(c, kv[i][0], kv[i][1], err, sizeof err) != KB_OK) {
            fprintf(stderr, "%s\n", err);
            return 2;
        }
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL || log_fd < 0) {
        fprintf(stderr, "kb_open: %s\n", err);
        return 2;
    }
    if (kb_subscribe(b, argv[2], handler, NULL) != KB_OK) {
        fprintf(stderr, "kb_subscribe: %s\n", kb_last_error());
        return 2;
    }
    int sig;
    sigwait(&set, &sig);
    int rc = kb_close(b, 10000);
    close(log_fd);
    return rc == KB_OK ? 0 : 1;
}
