/* The stats feed: a thread of the bus that every stats.interval_ms builds
 * one JSON document of every figure (metrics_json.c) and hands it to the
 * kb_conf_set_stats_cb callback, inside the bus's gate so that kb_close
 * waits for it and a kb_close from the callback is refused. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

struct kb_stats_feed {
    kb_bus *bus;
    const kb_serve_conf *conf;         /* the bus's, as resolved at kb_open */
    kb_thread *thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;               /* on CLOCK_MONOTONIC */
    bool stop;
};

static void emit(struct kb_stats_feed *f)
{
    kb_bus *b = f->bus;
    kb_metrics_snap s;
    if (!kb__bus_enter(b, "stats feed"))
        return;
    if (kb__metrics_collect(b, true, &s) == KB_OK) {
        char *json = kb__metrics_json(f->conf, &s);
        if (json != NULL)
            f->conf->stats_fn(b, json, strlen(json), f->conf->stats_opaque);
        else
            kb_log(b, KB_LOG_WARNING, "stats feed: out of memory for the document");
        free(json);
    }
    kb__metrics_snap_free(&s);
    kb__bus_leave(b);
}

static void *feed_main(void *arg)
{
    struct kb_stats_feed *f = arg;
    struct timespec due;
    clock_gettime(CLOCK_MONOTONIC, &due);
    pthread_mutex_lock(&f->lock);
    while (!f->stop) {
        due.tv_sec += f->conf->stats_interval_ms / 1000;
        due.tv_nsec += (long)(f->conf->stats_interval_ms % 1000) * 1000000L;
        if (due.tv_nsec >= 1000000000L) {
            due.tv_sec++;
            due.tv_nsec -= 1000000000L;
        }
        while (!f->stop && pthread_cond_timedwait(&f->wake, &f->lock, &due) == 0)
            ;
        if (f->stop)
            break;
        pthread_mutex_unlock(&f->lock);
        emit(f);
        pthread_mutex_lock(&f->lock);
        /* a callback slower than the interval: the next one is an interval
         * from now, not a burst to catch up */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > due.tv_sec || (now.tv_sec == due.tv_sec && now.tv_nsec > due.tv_nsec))
            due = now;
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

int kb__stats_feed_start(kb_bus *b, const kb_serve_conf *c, struct kb_stats_feed **out,
                         char *errstr, size_t errlen)
{
    struct kb_stats_feed *f = calloc(1, sizeof *f);
    if (f == NULL) {
        kb_errf(errstr, errlen, "stats feed: out of memory");
        return KB_ENOMEM;
    }
    f->bus = b;
    f->conf = c;
    pthread_mutex_init(&f->lock, NULL);
    kb__serve_cond_init(&f->wake);
    int rc = kb_thread_start(&f->thread, "kb-stats", feed_main, f);
    if (rc != KB_OK) {
        kb_errf(errstr, errlen, "stats feed: %s", kb_last_error());
        pthread_cond_destroy(&f->wake);
        pthread_mutex_destroy(&f->lock);
        free(f);
        return rc;
    }
    *out = f;
    return KB_OK;
}

void kb__stats_feed_stop(struct kb_stats_feed *f)
{
    if (f == NULL)
        return;
    pthread_mutex_lock(&f->lock);
    f->stop = true;
    pthread_cond_signal(&f->wake);
    pthread_mutex_unlock(&f->lock);
    kb_thread_join(f->thread);
    pthread_cond_destroy(&f->wake);
    pthread_mutex_destroy(&f->lock);
    free(f);
}
