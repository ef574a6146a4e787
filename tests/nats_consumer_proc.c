/* Helper process for the NATS fault tests: consumes a topic and appends
 * "key seq consumer attempt id" lines (id: the delivery ID) to a shared log (O_APPEND: one write per event), until
 * SIGTERM. Usage: nats_consumer_proc URL TOPIC LOG CONSUMER LEASE_TTL_MS. With
 * KB_TEST_HOLD_KEY=N the handler retries every event of key N (with
 * KEYBUS_RETRY_MAX_ATTEMPTS high: an event held, unacked, while the other
 * lanes go on, when the process is killed). */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/tracker.h"

static int log_fd;
static const char *name;
static volatile sig_atomic_t done;
static long hold_key = -1;

static void on_term(int sig)
{
    (void)sig;
    done = 1;
}

static int handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    if (key == hold_key)
        return KB_RETRY;
    char line[160];
    int n = snprintf(line, sizeof line, "%u %u %s %u %s\n", key, seq, name, ev->attempt, ev->id);
    usleep(100);   /* keep some events in flight when killed */
    if (write(log_fd, line, (size_t)n) != n)
        return KB_RETRY;
    return KB_HANDLED;
}

int main(int argc, char **argv)
{
    if (argc != 6)
        return 2;
    name = argv[4];
    const char *hold = getenv("KB_TEST_HOLD_KEY");
    if (hold != NULL)
        hold_key = strtol(hold, NULL, 10);
    log_fd = open(argv[3], O_WRONLY | O_APPEND | O_CREAT, 0644);
    signal(SIGTERM, on_term);
    kb_conf *c = kb_conf_new();
    char err[256];
    if (kb_conf_set(c, "transport", argv[1], err, sizeof err) != KB_OK ||
        kb_conf_set(c, "consumer", argv[4], err, sizeof err) != KB_OK ||
        kb_conf_set(c, "nats.lease_ttl_ms", argv[5], err, sizeof err) != KB_OK ||
        kb_conf_set(c, "nats.ack_wait_ms", "2000", err, sizeof err) != KB_OK) {
        fprintf(stderr, "conf: %s\n", err);
        return 2;
    }
    /* a loaded cluster can answer its first JetStream call late: try again */
    kb_bus *b = NULL;
    for (int i = 0; i < 20 && (b = kb_open(c, err, sizeof err)) == NULL; i++) {
        fprintf(stderr, "kb_open: %s\n", err);
        usleep(500000);
    }
    if (b == NULL) {
        kb_conf_destroy(c);   /* kb_open took it only on success */
        return 3;
    }
    if (kb_subscribe(b, argv[2], handler, NULL) != KB_OK)
        return 4;
    while (!done)
        usleep(10000);
    kb_close(b, 10000);
    close(log_fd);
    return 0;
}
