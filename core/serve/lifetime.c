/* kb_open and kb_close: the bus's steps (bus_calls.h), with what serving
 * the bus's figures starts in between: the metrics.listen endpoint and the
 * stats feed, both started before the transport connects (a bad address
 * fails kb_open without touching the broker) and stopped first at close
 * (their calls then fail fast instead of holding kb_close up). */
#include <stdlib.h>
#include <time.h>

#include "serve.h"

struct kb_serve {
    kb_serve_conf conf;                /* the feed reads it for the bus's life */
    struct kb_metrics_http *http;      /* metrics.listen's endpoint */
    struct kb_stats_feed *feed;        /* stats.interval_ms's thread */
};

static void serve_stop(kb_bus *b)
{
    struct kb_serve *s = kb__bus_serve(b);
    if (s == NULL)
        return;
    kb__bus_set_serve(b, NULL);
    kb__stats_feed_stop(s->feed);
    kb__metrics_http_stop(s->http);
    free(s);
}

/* Start what the configuration asks for. KB_EINVAL for a bad address,
 * KB_ETRANSPORT when it cannot listen (errstr names the address), KB_ENOMEM. */
static int serve_start(kb_bus *b, char *errstr, size_t errlen)
{
    struct kb_serve *s = calloc(1, sizeof *s);
    if (s == NULL) {
        kb_errf(errstr, errlen, "kb_open: out of memory");
        return KB_ENOMEM;
    }
    kb__bus_set_serve(b, s);
    kb__bus_serve_conf(b, &s->conf);
    int rc = KB_OK;
    if (s->conf.metrics_listen[0] != '\0')
        rc = kb__metrics_http_start(b, &s->conf, &s->http, errstr, errlen);
    if (rc == KB_OK && s->conf.stats_fn != NULL && s->conf.stats_interval_ms != 0)
        rc = kb__stats_feed_start(b, &s->conf, &s->feed, errstr, errlen);
    return rc;
}

kb_bus *kb_open(kb_conf *c, char *errstr, size_t errlen)
{
    kb_bus *b = kb__bus_new(c, errstr, errlen);
    if (b == NULL)
        return NULL;
    int rc = serve_start(b, errstr, errlen);
    if (rc == KB_OK)
        rc = kb__bus_connect(b, errstr, errlen);
    if (rc == KB_OK)
        return b;
    serve_stop(b);
    kb__bus_discard(b, rc);
    return NULL;
}

int kb_close(kb_bus *b, int timeout_ms)
{
    int64_t deadline = kb_deadline_ns(timeout_ms);
    int rc = kb__bus_close_begin(b);
    if (rc != KB_OK)
        return rc;
    serve_stop(b);   /* the endpoint and the feed: their calls now fail */
    return kb__bus_close_end(b, deadline);
}
