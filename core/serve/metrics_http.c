/* metrics.listen: a libmicrohttpd endpoint on its own thread serving
 * GET /metrics (Prometheus text) and GET /partitions (JSON). keybus binds the
 * socket itself, so a failure names the address and the system's reason. */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve.h"

#define HTTP_TIMEOUT_S 10

struct kb_metrics_http {
    struct MHD_Daemon *daemon;
};

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
    kb_bus *b = cls;
    bool metrics = strcmp(url, "/metrics") == 0, partitions = strcmp(url, "/partitions") == 0;
    if (!metrics && !partitions)
        return text_reply(c, MHD_HTTP_NOT_FOUND, "keybus serves /metrics and /partitions\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return text_reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET only\n");
    kb_metrics_snap s;
    int rc = kb__metrics_collect(b, true, &s);
    size_t len = 0;
    char *body = NULL;
    if (rc == KB_OK && metrics)
        body = kb__metrics_prom(&s, &len);
    else if (rc == KB_OK && (body = kb__metrics_partitions_json(&s)) != NULL)
        len = strlen(body);
    kb__metrics_snap_free(&s);
    if (body == NULL)
        return text_reply(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                          rc == KB_ECLOSED ? "bus closing\n" : "out of memory\n");
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

int kb__metrics_http_start(kb_bus *b, const char *addr, struct kb_metrics_http **out,
                           char *errstr, size_t errlen)
{
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
    /* The daemon's thread inherits the mask: signals stay the application's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    h->daemon = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | (v6 ? MHD_USE_IPv6 : 0), 0, NULL,
                                 NULL, serve, b, MHD_OPTION_LISTEN_SOCKET, fd,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_TIMEOUT_S,
                                 MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (h->daemon == NULL) {
        close(fd);
        free(h);
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
    MHD_stop_daemon(h->daemon);   /* waits for a request in progress; closes the socket */
    free(h);
}
