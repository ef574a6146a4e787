/* A consumer process of keybus-torture, on the public API only:
 *   torture_consumer LOG NAME KEY VALUE [KEY VALUE ...]
 * opens a bus with the KEY VALUE configuration, subscribes to the torture
 * topic and appends one line per handled event to LOG:
 *   H <mono_ns> <wall_ns> <name> <pid> <key> <seq> <attempt>
 * with one write(2) before the handler returns, so a kill -9 loses no line
 * of an event that was handled (the kernel holds it) and every event whose
 * line is missing was not acked either: it comes again. Runs until SIGTERM,
 * then kb_close: exit 0 when it returned KB_OK, 1 when not, 2 when no bus. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/child.h"
#include "support/tracker.h"
#include "torture.h"

static int log_fd = -1;
static const char *name;
static pid_t pid;

static int handler(const kb_event *ev, void *opaque)
{
    (void)opaque;
    uint32_t key, seq;
    kb_tracker_decode(ev, &key, &seq);
    char line[200];
    int n = snprintf(line, sizeof line, "H %lld %lld %s %d %u %u %u\n",
                     (long long)kb_torture_mono_ns(), (long long)kb_torture_wall_ns(), name,
                     (int)pid, key, seq, ev->attempt);
    if (n <= 0 || (size_t)n >= sizeof line || write(log_fd, line, (size_t)n) != n)
        return KB_RETRY;   /* not recorded: not handled either */
    return KB_HANDLED;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc % 2 != 1) {
        fprintf(stderr, "usage: %s LOG NAME KEY VALUE [KEY VALUE ...]\n", argv[0]);
        return 2;
    }
    log_fd = open(argv[1], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (log_fd < 0) {
        perror(argv[1]);
        return 2;
    }
    name = argv[2];
    pid = getpid();
    return kb_test_child_consume((const char *const *)argv + 3, KB_TORTURE_TOPIC, handler);
}
