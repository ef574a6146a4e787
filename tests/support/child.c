#include <signal.h>
#include <stdio.h>

#include "child.h"

kb_bus *kb_test_child_open(const char *const *kv)
{
    kb_conf *c = kb_conf_new();
    char err[256];
    for (size_t i = 0; kv[i] != NULL; i += 2)
        if (kb_conf_set(c, kv[i], kv[i + 1], err, sizeof err) != KB_OK) {
            fprintf(stderr, "%s\n", err);
            kb_conf_destroy(c);
            return NULL;
        }
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fprintf(stderr, "kb_open: %s\n", err);
    return b;
}

int kb_test_child_consume(const char *const *kv, const char *topic, kb_handler_fn fn)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);   /* before any keybus thread starts */
    kb_bus *b = kb_test_child_open(kv);
    if (b == NULL)
        return 2;
    if (kb_subscribe(b, topic, fn, NULL) != KB_OK) {
        fprintf(stderr, "kb_subscribe: %s\n", kb_last_error());
        return 2;
    }
    int sig;
    sigwait(&set, &sig);
    return kb_close(b, 10000) == KB_OK ? 0 : 1;
}
