/* What the metrics.listen endpoint answers from: the Prometheus text and the
 * /partitions JSON of one snapshot, collected on a thread of its own when a
 * scrape finds the last one stale, and at most once per
 * metrics.min_interval_ms. However many clients scrape, the broker sees one
 * collection per interval, and no scrape runs the transport's calls itself. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

/* How long a scrape waits for a fresh snapshot before it takes the last one
 * (or, when there is none yet, 503). */
#define FRESH_WAIT_MS 5000

struct kb_scrape_cache {
    kb_bus *b;
    int64_t min_interval_ns;
    kb_thread *thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;               /* the collector: wanted or stop; CLOCK_MONOTONIC */
    pthread_cond_t done;               /* scrapes: gen moved or stop */
    bool wanted, stop;
    uint64_t gen;                      /* collections published */
    int64_t started_ns;                /* when the published one began; 0: none */
    int64_t last_start_ns;             /* when the latest one began */
    int rc;                            /* the published one's result */
    char *prom, *parts;
    size_t prom_len, parts_len;
};

static void abs_time(int64_t ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
}

/* One collection, rendered both ways, published under the lock. */
static void collect_once(struct kb_scrape_cache *c, int64_t started)
{
    kb_metrics_snap s;
    int rc = kb__metrics_collect(c->b, true, &s);
    size_t prom_len = 0;
    char *prom = rc == KB_OK ? kb__metrics_prom(&s, &prom_len) : NULL;
    char *parts = rc == KB_OK ? kb__metrics_partitions_json(&s) : NULL;
    kb__metrics_snap_free(&s);
    if (rc == KB_OK && (prom == NULL || parts == NULL))
        rc = KB_ENOMEM;
    pthread_mutex_lock(&c->lock);
    if (rc == KB_OK) {
        free(c->prom);
        free(c->parts);
        c->prom = prom;
        c->prom_len = prom_len;
        c->parts = parts;
        c->parts_len = strlen(parts);
        c->started_ns = started;
    } else {
        free(prom);
        free(parts);
    }
    c->rc = rc;
    c->gen++;
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->lock);
}

static void *collector_main(void *arg)
{
    struct kb_scrape_cache *c = arg;
    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        if (!c->wanted) {
            pthread_cond_wait(&c->wake, &c->lock);
            continue;
        }
        int64_t next = c->last_start_ns + c->min_interval_ns, now = kb_now_ns();
        if (c->last_start_ns != 0 && now < next) {
            struct timespec due;
            abs_time(next, &due);
            pthread_cond_timedwait(&c->wake, &c->lock, &due);
            continue;
        }
        c->wanted = false;
        c->last_start_ns = now;
        pthread_mutex_unlock(&c->lock);
        collect_once(c, now);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int kb__scrape_cache_start(kb_bus *b, int64_t min_interval_ms, struct kb_scrape_cache **out,
                           char *errstr, size_t errlen)
{
    struct kb_scrape_cache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        kb_errf(errstr, errlen, "metrics.listen: out of memory");
        return KB_ENOMEM;
    }
    c->b = b;
    c->min_interval_ns = min_interval_ms * 1000000;
    pthread_mutex_init(&c->lock, NULL);
    kb__serve_cond_init(&c->wake);
    kb__serve_cond_init(&c->done);
    int rc = kb_thread_start(&c->thread, "kb-scrape", collector_main, c);
    if (rc != KB_OK) {
        kb_errf(errstr, errlen, "metrics.listen: cannot start the collector thread");
        c->thread = NULL;
        kb__scrape_cache_free(c);
        return rc;
    }
    *out = c;
    return KB_OK;
}

char *kb__scrape_cache_get(struct kb_scrape_cache *c, bool partitions, size_t *len, int *rc)
{
    pthread_mutex_lock(&c->lock);
    int64_t now = kb_now_ns();
    if (!c->stop && (c->started_ns == 0 || now - c->started_ns >= c->min_interval_ns)) {
        uint64_t gen = c->gen;
        c->wanted = true;
        pthread_cond_signal(&c->wake);
        struct timespec due;
        abs_time(now + (int64_t)FRESH_WAIT_MS * 1000000, &due);
        while (!c->stop && c->gen == gen &&
               pthread_cond_timedwait(&c->done, &c->lock, &due) == 0) {
        }
    }
    const char *text = partitions ? c->parts : c->prom;
    size_t n = partitions ? c->parts_len : c->prom_len;
    char *copy = NULL;
    *rc = c->stop ? KB_ECLOSED : text == NULL ? (c->rc != KB_OK ? c->rc : KB_ETIMEDOUT) : KB_OK;
    if (*rc == KB_OK && (copy = malloc(n + 1)) == NULL)
        *rc = KB_ENOMEM;
    if (copy != NULL) {
        memcpy(copy, text, n + 1);
        *len = n;
    }
    pthread_mutex_unlock(&c->lock);
    return copy;
}

void kb__scrape_cache_halt(struct kb_scrape_cache *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->wake);
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->lock);
    if (c->thread != NULL)
        kb_thread_join(c->thread);
    c->thread = NULL;
}

void kb__scrape_cache_free(struct kb_scrape_cache *c)
{
    if (c == NULL)
        return;
    kb__scrape_cache_halt(c);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->lock);
    free(c->prom);
    free(c->parts);
    free(c);
}
