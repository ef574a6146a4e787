/* metrics.listen: a libmicrohttpd endpoint serving GET /metrics (Prometheus
 * text) and GET /partitions (JSON) from the scrape cache, one thread per
 * connection. It cannot be starved: metrics.max_connections in all,
 * metrics.max_connections_per_client per address, and a request must arrive
 * whole within REQUEST_DEADLINE_S of its connection or of the previous
 * answer (a reaper thread cuts slower ones: MHD's own timeout is for idle
 * connections, which a line every few seconds never is). keybus binds the
 * socket itself, so a failure names the address and the system's reason. */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

#define REQUEST_DEADLINE_S 5
#define REAP_EVERY_MS 250

/* A connection, from MHD's start notice to its close notice. */
struct conn {
    struct conn *next, **prev;
    int fd;
    int64_t since_ns;                  /* when its request began to arrive */
    bool answering;                    /* its request arrived: no deadline */
    bool cut;
};

struct kb_metrics_http {
    struct MHD_Daemon *daemon;
    struct kb_scrape_cache *cache;
    pthread_mutex_t lock;              /* conns, stop */
    pthread_cond_t wake;               /* the reaper: stop; CLOCK_MONOTONIC */
    struct conn *conns;
    bool stop;
    kb_thread *reaper;
};

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct kb_metrics_http *h = cls;
    struct conn *c = *socket_context;
    pthread_mutex_lock(&h->lock);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci != NULL && (c = calloc(1, sizeof *c)) != NULL) {
            c->fd = ci->connect_fd;
            c->since_ns = kb_now_ns();
            c->next = h->conns;
            c->prev = &h->conns;
            if (h->conns != NULL)
                h->conns->prev = &c->next;
            h->conns = c;
            *socket_context = c;
        }
    } else if (c != NULL) {   /* closed: MHD closes the descriptor after this returns */
        *c->prev = c->next;
        if (c->next != NULL)
            c->next->prev = c->prev;
        free(c);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&h->lock);
}

static struct conn *conn_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

/* Answered (or abandoned): the next request on the connection has its own deadline. */
static void on_completed(void *cls, struct MHD_Connection *mc, void **req,
                         enum MHD_RequestTerminationCode code)
{
    (void)req;
    (void)code;
    struct kb_metrics_http *h = cls;
    pthread_mutex_lock(&h->lock);
    struct conn *c = conn_of(mc);
    if (c != NULL) {
        c->answering = false;
        c->since_ns = kb_now_ns();
    }
    pthread_mutex_unlock(&h->lock);
}

/* Cut the connections whose request is overdue. shutdown, under the lock the
 * close notice takes, so the descriptor is still theirs; MHD then reads the
 * end of the stream and closes it. */
static void *reaper_main(void *arg)
{
    struct kb_metrics_http *h = arg;
    pthread_mutex_lock(&h->lock);
    while (!h->stop) {
        int64_t now = kb_now_ns(), late = now - (int64_t)REQUEST_DEADLINE_S * 1000000000;
        for (struct conn *c = h->conns; c != NULL; c = c->next)
            if (!c->answering && !c->cut && c->since_ns < late) {
                shutdown(c->fd, SHUT_RDWR);
                c->cut = true;
            }
        int64_t due_ns = now + (int64_t)REAP_EVERY_MS * 1000000;
        struct timespec due = {(time_t)(due_ns / 1000000000), (long)(due_ns % 1000000000)};
        pthread_cond_timedwait(&h->wake, &h->lock, &due);
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result text_reply(struct MHD_Connection *c, unsigned status, const char *text)
{
    char *body = strdup(text);
    return body != NULL ? reply(c, status, "text/plain; charset=utf-8", body, strlen(body))
                        : MHD_NO;
}

static enum MHD_Result serve(void *cls, struct MHD_Connection *c, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, void **state)
{
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)state;
    struct kb_metrics_http *h = cls;
    pthread_mutex_lock(&h->lock);
    struct conn *conn = conn_of(c);
    if (conn != NULL)
        conn->answering = true;
    pthread_mutex_unlock(&h->lock);
    bool metrics = strcmp(url, "/metrics") == 0, partitions = strcmp(url, "/partitions") == 0;
    if (!metrics && !partitions)
        return text_reply(c, MHD_HTTP_NOT_FOUND, "keybus serves /metrics and /partitions\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return text_reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET only\n");
    size_t len = 0;
    int rc;
    char *body = kb__scrape_cache_get(h->cache, partitions, &len, &rc);
    if (body == NULL)
        return text_reply(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                          rc == KB_ECLOSED    ? "bus closing\n"
                          : rc == KB_ENOMEM   ? "out of memory\n"
                          : rc == KB_ETIMEDOUT ? "collecting the first snapshot; ask again\n"
                                              : "the transport's figures failed; ask again\n");
    return reply(c, MHD_HTTP_OK,
                 metrics ? "text/plain; version=0.0.4; charset=utf-8" : "application/json", body,
                 len);
}

/* "host:port" or "[v6]:port" into a bound, listening socket; -1 with errstr. */
static int listen_on(const char *addr, bool *v6, char *errstr, size_t errlen)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    const char *h = addr;
    size_t hlen = colon != NULL ? (size_t)(colon - addr) : 0;
    if (hlen >= 2 && addr[0] == '[' && addr[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    if (colon == NULL || hlen == 0 || hlen >= sizeof host || colon[1] == '\0' ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1)) {
        kb_errf(errstr, errlen, "metrics.listen \"%s\": want host:port, e.g. 127.0.0.1:9464",
                addr);
        return -2;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, colon + 1, &hints, &ai);
    if (gai != 0) {
        kb_errf(errstr, errlen, "metrics.listen %s: %s", addr, gai_strerror(gai));
        return -1;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        kb_errf(errstr, errlen, "metrics.listen %s: cannot listen: %s", addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    *v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    return fd;
}

static void http_free(struct kb_metrics_http *h)
{
    kb__scrape_cache_free(h->cache);
    pthread_cond_destroy(&h->wake);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

static void reaper_stop(struct kb_metrics_http *h)
{
    pthread_mutex_lock(&h->lock);
    h->stop = true;
    pthread_cond_signal(&h->wake);
    pthread_mutex_unlock(&h->lock);
    kb_thread_join(h->reaper);
}

int kb__metrics_http_start(kb_bus *b, const kb_serve_conf *conf, struct kb_metrics_http **out,
                           char *errstr, size_t errlen)
{
    const char *addr = conf->metrics_listen;
    bool v6 = false;
    int fd = listen_on(addr, &v6, errstr, errlen);
    if (fd < 0)
        return fd == -2 ? KB_EINVAL : KB_ETRANSPORT;
    struct kb_metrics_http *h = calloc(1, sizeof *h);
    if (h == NULL) {
        close(fd);
        kb_errf(errstr, errlen, "metrics.listen %s: out of memory", addr);
        return KB_ENOMEM;
    }
    pthread_mutex_init(&h->lock, NULL);
    kb__serve_cond_init(&h->wake);
    int rc = kb__scrape_cache_start(b, conf->metrics_min_interval_ms, &h->cache, errstr, errlen);
    if (rc != KB_OK) {
        close(fd);
        http_free(h);
        return rc;
    }
    /* The daemon's threads inherit the mask: signals stay the application's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = kb_thread_start(&h->reaper, "kb-http-reap", reaper_main, h);
    if (rc == KB_OK)
        h->daemon = MHD_start_daemon(
            MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                (v6 ? MHD_USE_IPv6 : 0),
            0, NULL, NULL, serve, h, MHD_OPTION_LISTEN_SOCKET, fd,
            MHD_OPTION_CONNECTION_LIMIT, (unsigned)conf->metrics_max_connections,
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)conf->metrics_max_per_client,
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)REQUEST_DEADLINE_S,
            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (h->daemon == NULL) {
        close(fd);
        if (rc == KB_OK)
            reaper_stop(h);
        http_free(h);
        kb_errf(errstr, errlen, "metrics.listen %s: cannot start the HTTP server", addr);
        return KB_ETRANSPORT;
    }
    *out = h;
    return KB_OK;
}

void kb__metrics_http_stop(struct kb_metrics_http *h)
{
    if (h == NULL)
        return;
    kb__scrape_cache_halt(h->cache);   /* a scrape waiting for a snapshot answers 503 now */
    MHD_stop_daemon(h->daemon);        /* joins the connections' threads; closes the socket */
    reaper_stop(h);
    http_free(h);
}
