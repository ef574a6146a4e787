/* Named threads for the core and transports: every thread keybus starts
 * shows a kb-* name in top, perf and gdb, and leaves signals to the
 * application's own threads. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/transport.h>

struct kb_thread {
    pthread_t id;
};

int kb_thread_start(kb_thread **out, const char *name, void *(*fn)(void *), void *arg)
{
    *out = NULL;
    kb_thread *th = malloc(sizeof *th);
    if (th == NULL) {
        kb_errf(NULL, 0, "thread %s: out of memory", name);
        return KB_ENOMEM;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* the new thread inherits it */
    int rc = pthread_create(&th->id, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        kb_errf(NULL, 0, "thread %s: pthread_create: %s", name, strerror(rc));
        free(th);
        return KB_ENOMEM;
    }
    char shown[16];
    strncpy(shown, name, sizeof shown - 1);   /* the kernel keeps 15 bytes */
    shown[sizeof shown - 1] = '\0';
    pthread_setname_np(th->id, shown);
    *out = th;
    return KB_OK;
}

void kb_thread_join(kb_thread *th)
{
    if (th == NULL)
        return;
    pthread_join(th->id, NULL);
    free(th);
}
