/* A consumer process for test_runs (attempts are handler runs):
 *   runs_proc MODE URL TOPIC LOGFILE RUNS_DIR
 * with retry.max_attempts = 3, one executor and the stable consumer name
 * "runs-proc". Appends one line per handler call to LOGFILE (O_APPEND):
 *   "H key seq id attempt"  handled
 *   "C key seq id attempt"  about to abort() (MODE poison, on key 0 seq 3)
 *   "R key seq id attempt"  running, and blocking until killed (MODE block,
 *                           the first call; the rest of the read batch waits
 *                           in the lanes, never run)
 * MODE framed is poison, and also runs key 0 seq 4 as MODE block does (its
 * frame stays unacked); MODE handle handles everything. Runs until SIGTERM,
 * then kb_close. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/child.h"
#include "support/tracker.h"

static int log_fd;
static const char *mode;

static void log_line(char what, uint32_t key, uint32_t seq, const kb_event *ev)
{
    char line[200];
    int n = snprintf(line, sizeof line, "%c %u %u %s %u\n", what, key, seq, ev->id, ev->attempt);
    if (write(log_fd, line, (size_t)n) != n)
        abort();   /* the test would miscount: fail loudly */
}

static int handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    bool framed = strcmp(mode, "framed") == 0;
    if ((strcmp(mode, "poison") == 0 || framed) && key == 0 && seq == 3) {
        log_line('C', key, seq, ev);
        abort();
    }
    if (strcmp(mode, "block") == 0 || (framed && key == 0 && seq == 4)) {
        log_line('R', key, seq, ev);
        for (;;)
            pause();   /* until kill -9 */
    }
    log_line('H', key, seq, ev);
    return KB_HANDLED;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s poison|block|framed|handle URL TOPIC LOGFILE RUNS_DIR\n", argv[0]);
        return 2;
    }
    mode = argv[1];
    log_fd = open(argv[4], O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (log_fd < 0) {
        perror(argv[4]);
        return 2;
    }
    const char *ttl_key = strncmp(argv[2], "nats:", 5) == 0 ? "nats.lease_ttl_ms"
                                                             : "redis.lease_ttl_ms";
    /* conf.env false: ctest's KEYBUS_RUNS_DIR would override the test's runs.dir */
    const char *const kv[] = {"conf.env", "false", "transport", argv[2], "consumer", "runs-proc",
                              "runs.dir", argv[5], ttl_key, "1000", "pool.threads", "1",
                              "retry.max_attempts", "3", "retry.backoff_ms", "1",
                              "retry.max_backoff_ms", "4", NULL};
    int rc = kb_test_child_consume(kv, argv[3], handler);
    close(log_fd);
    return rc;
}
