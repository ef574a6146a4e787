/* keybus consume TOPIC [-g GROUP] [-n COUNT] [--json] [--timeout-ms MS]:
 * print events as the handler takes them, until COUNT were handled or a
 * signal arrives; then kb_close stops intake and handles what this process
 * already holds: printed and acked after a signal, declined (left
 * unacknowledged for the group) once COUNT were printed. */
#include "command.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "text.h"

struct consumer {
    const struct kb_cli_stream *s;
    uint32_t partitions;       /* the topic's broker partitions; 0: none (mem://) */
    int count_reached;         /* eventfd the handler writes once COUNT were handled, or
                                  output failed */
    _Atomic uint64_t taken;    /* events the handler took a turn for, declined ones included */
    _Atomic uint64_t handled;
    _Atomic int out_errno;     /* stdout failed (a closed pipe, a full disk): stop */
};

static int on_event(const kb_event *ev, void *opaque)
{
    struct consumer *c = opaque;
    /* exactly COUNT: a turn past it gives the event back unacked, whichever
     * lane comes first */
    if (atomic_load(&c->out_errno) != 0 ||
        (c->s->count != 0 && atomic_fetch_add(&c->taken, 1) >= c->s->count))
        return KB_DECLINE;
    flockfile(stdout);   /* one whole line per event, whatever lane prints */
    kb_cli_event_print(ev, c->partitions, c->s->json);
    bool failed = fflush(stdout) != 0 || ferror(stdout);
    int err = errno;
    funlockfile(stdout);
    if (failed) {
        /* Not printed, so not taken: it stays unacked (the main thread
         * closes at once and declines the rest). */
        int none = 0;
        if (atomic_compare_exchange_strong(&c->out_errno, &none, err ? err : EIO))
            eventfd_write(c->count_reached, 1);
        return KB_DECLINE;
    }
    uint64_t n = atomic_fetch_add(&c->handled, 1) + 1;
    if (n == c->s->count)
        eventfd_write(c->count_reached, 1);
    return KB_HANDLED;
}

int kb_cli_consume(kb_bus *b, const struct kb_cli_stream *s, int stop, int *closed)
{
    struct consumer c = {.s = s};
    kb_topic_stats st;
    memset(&st, 0, sizeof st);
    kb_stats(b, s->topic, &st);   /* a topic not yet written still has its partitions; mem: 0 */
    c.partitions = st.partitions;
    if ((c.count_reached = eventfd(0, EFD_CLOEXEC)) < 0) {
        kb_cli_errf("eventfd: %s", strerror(errno));
        kb_cli_report("consume", KB_ENOMEM);
        *closed = kb_close(b, s->timeout_ms);
        return KB_ENOMEM;
    }
    int rc = kb_subscribe(b, s->topic, on_event, &c);
    if (rc == KB_OK)   /* scripts and tests wait for this line before signalling */
        fprintf(stderr, "keybus consume: consuming %s (SIGINT or SIGTERM to stop)\n", s->topic);
    while (rc == KB_OK) {
        struct pollfd pf[2] = {{.fd = stop, .events = POLLIN},
                               {.fd = c.count_reached, .events = POLLIN}};
        if (poll(pf, 2, -1) > 0 || errno != EINTR)
            break;   /* a signal, or COUNT handled: kb_close drains the rest */
    }
    int out_errno = atomic_load(&c.out_errno);
    if (rc == KB_OK && out_errno != 0) {
        kb_cli_errf("writing to stdout: %s", strerror(out_errno));
        rc = KB_ETRANSPORT;
    }
    kb_cli_report("consume", rc);
    /* kb_close runs the handler for what this process still holds: `c`
     * lives until it returns. Output failed: handle nothing more. */
    *closed = kb_close(b, out_errno != 0 ? 0 : s->timeout_ms);
    fprintf(stderr, "keybus consume: %llu events handled\n",
            (unsigned long long)atomic_load(&c.handled));
    close(c.count_reached);
    return rc;
}
