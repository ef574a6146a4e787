/* A long-running consumer service: handles TOPIC's events until SIGTERM or
 * SIGINT, then drains what it holds and closes within a deadline.
 *   KEYBUS_TRANSPORT=redis://127.0.0.1:6379 ./consumer orders.events
 * The signals are blocked before kb_open, so every thread the bus starts
 * inherits the mask and the main thread takes them with sigwait: no signal
 * handler ever runs, so none can call keybus. */
#define _POSIX_C_SOURCE 200809L
#include <keybus/keybus.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>

#define CLOSE_DEADLINE_MS 10000

static _Atomic unsigned long handled;

static int on_event(const kb_event *ev, void *opaque)
{
    (void)opaque;
    flockfile(stdout);   /* handlers of different keys run on several threads */
    printf("%.*s %.*s attempt=%u\n", (int)ev->key_len, (const char *)ev->key,
           (int)ev->payload_len, (const char *)ev->payload, ev->attempt);
    fflush(stdout);
    funlockfile(stdout);
    atomic_fetch_add(&handled, 1);
    return KB_HANDLED;
}

int main(int argc, char **argv)
{
    const char *topic = argc > 1 ? argv[1] : "orders.events";
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);

    char err[256];
    kb_conf *conf = kb_conf_new();
    kb_bus *bus = kb_open(conf, err, sizeof err);   /* mem:// unless KEYBUS_TRANSPORT says otherwise */
    if (bus == NULL) {
        fprintf(stderr, "kb_open: %s\n", err);
        kb_conf_destroy(conf);
        return 1;
    }
    if (kb_subscribe(bus, topic, on_event, NULL) != KB_OK) {
        fprintf(stderr, "kb_subscribe: %s\n", kb_last_error());
        kb_close(bus, CLOSE_DEADLINE_MS);
        return 1;
    }
    fprintf(stderr, "consuming %s\n", topic);

    int sig;
    sigwait(&stop, &sig);
    /* Stop intake, handle and ack what this process already holds (the
     * group keeps the rest for the next consumer), all within the deadline. */
    int rc = kb_close(bus, CLOSE_DEADLINE_MS);
    fprintf(stderr, "signal %d: %lu events handled, close: %s\n", sig, atomic_load(&handled),
            kb_strerror(rc));
    return rc == KB_OK ? 0 : 1;
}
