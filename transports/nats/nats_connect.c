/* The connection: options from the configuration and the URL, the
 * connection callbacks nats.c runs on its own threads, and the JetStream
 * context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_connect.h"
#include "nats_kv.h"
#include "nats_lease.h"
#include "nats_names.h"
#include "nats_send.h"

/* Exponential reconnect backoff with jitter, capped; in milliseconds. */
static int64_t reconnect_delay(natsConnection *nc, int attempts, void *closure)
{
    (void)nc;
    kb_transport *t = closure;
    uint32_t failures = attempts > 1 ? (uint32_t)attempts - 1 : 0;
    return kb_backoff_ns(t->reconnect_wait_ms, t->reconnect_max_ms, failures,
                         kb_bus_random(t->bus)) / 1000000;
}

static void on_async_error(natsConnection *nc, natsSubscription *sub, natsStatus err,
                           void *closure)
{
    (void)sub;
    kb_transport *t = closure;
    const char *why = NULL;
    natsConnection_GetLastError(nc, &why);
    kb_log(t->bus, KB_LOG_WARNING, "nats %s: %s%s%s", t->url_safe, natsStatus_GetText(err),
           why != NULL && why[0] ? ": " : "", why != NULL ? why : "");
}

/* nats.c delivers connection callbacks on its own thread, in order; the
 * closed callback is the last, so nats_close waits for it before freeing. */
static void on_closed(natsConnection *nc, void *closure)
{
    (void)nc;
    kb_transport *t = closure;
    atomic_store(&t->nc_closed, 1);
    kb_signal_notify(t->nc_event);
}

/* The server's max_payload, from its INFO; frames stay well below it. It can
 * differ after a reconnect (another server, a new configuration). */
static void read_limits(kb_transport *t, natsConnection *nc)
{
    int64_t maxp = natsConnection_GetMaxPayload(nc);
    size_t m = maxp > 0 ? (size_t)maxp : 1024 * 1024;
    atomic_store(&t->max_payload, m);
    atomic_store(&t->batch_bytes, m / 4 < 256 * 1024 ? m / 4 : 256 * 1024);
}

/* Guarded like the publish acks: one nats.c runs after close gave up waiting
 * for the closed callback would find the signals and the bus freed. */
static void on_reconnected(natsConnection *nc, void *closure)
{
    kb_transport *t = closure;
    if (!kb__nats_cb_begin(t))
        return;
    read_limits(t, nc);
    atomic_fetch_add(&t->reconnects, 1);
    kb__nats_send_reconnected(t);   /* the resends go now */
    kb__nats_lease_kick(t);        /* acks the server lost: asked again at once */
    kb_log(t->bus, KB_LOG_INFO, "nats %s: reconnected (max_payload %zu)", t->url_safe,
           atomic_load(&t->max_payload));
    kb_bus_state_report(t->bus, KB_STATE_RECONNECTED, t->url_safe);
    kb__nats_cb_end(t);
}

/* The consumer's connection (t->feed_nc): a reconnect reissues every pull
 * request (the feeder watches t->reconnects) and acks again what the server
 * may have lost (the lease thread); no publish goes over it. */
static void on_feed_disconnected(natsConnection *nc, void *closure)
{
    (void)nc;
    kb_transport *t = closure;
    if (!atomic_load(&t->closing))
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: consumer connection lost, reconnecting",
               t->url_safe);
}

static void on_feed_reconnected(natsConnection *nc, void *closure)
{
    (void)nc;
    kb_transport *t = closure;
    atomic_fetch_add(&t->reconnects, 1);
    kb__nats_lease_kick(t);
    kb_log(t->bus, KB_LOG_INFO, "nats %s: consumer connection reconnected", t->url_safe);
}

static void on_feed_closed(natsConnection *nc, void *closure)
{
    (void)nc;
    kb_transport *t = closure;
    atomic_store(&t->feed_closed, 1);
    kb_signal_notify(t->nc_event);
}

/* Connected after kb_open's first attempt failed (nats.connect_wait_ms). */
static void on_connected(natsConnection *nc, void *closure)
{
    kb_transport *t = closure;
    read_limits(t, nc);
    atomic_store(&t->connected, 1);
    kb_signal_notify(t->nc_event);
}

static int is_connected(void *arg)
{
    return atomic_load(&((kb_transport *)arg)->connected);
}

/* One server of a host list kb_url_parse checked ("h:p", "[v6]:p", "h") as
 * nats.c's URL; a missing port is 4222. */
static char *server_url(const char *e, size_t n)
{
    const char *close = e[0] == '[' ? memchr(e, ']', n) : NULL;
    bool port = close != NULL ? close + 1 < e + n : memchr(e, ':', n) != NULL;
    size_t len = n + 16;
    char *url = malloc(len);
    if (url != NULL)
        snprintf(url, len, "nats://%.*s%s", (int)n, e, port ? "" : ":4222");
    return url;
}

/* The servers' URLs without userinfo (nats.c would not percent-decode it),
 * and the decoded user and password (or token: a user without password),
 * which nats.c gives every server of the list. */
static natsStatus set_servers(natsOptions *o, const kb_url *u)
{
    char one[600];
    const char *list = u->host;
    if (strchr(u->host, ',') == NULL) {
        bool v6 = strchr(u->host, ':') != NULL;
        snprintf(one, sizeof one, "%s%s%s:%d", v6 ? "[" : "", u->host, v6 ? "]" : "",
                 u->port ? u->port : 4222);
        list = one;
    }
    int n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    char **urls = calloc((size_t)n, sizeof *urls);
    natsStatus s = urls != NULL ? NATS_OK : NATS_NO_MEMORY;
    int i = 0;
    for (const char *e = list; s == NATS_OK && i < n; i++) {
        size_t len = strcspn(e, ",");
        if ((urls[i] = server_url(e, len)) == NULL)
            s = NATS_NO_MEMORY;
        e += len + (e[len] == ',');
    }
    if (s == NATS_OK)
        s = natsOptions_SetServers(o, (const char **)urls, n);
    for (int j = 0; urls != NULL && j < n; j++)
        free(urls[j]);
    free(urls);
    if (s == NATS_OK && u->user != NULL && u->password != NULL)
        s = natsOptions_SetUserInfo(o, u->user, u->password);
    else if (s == NATS_OK && u->user != NULL)
        s = natsOptions_SetToken(o, u->user);
    return s;
}

static natsStatus set_options(kb_transport *t, natsOptions *o, const kb_conf *c, const kb_url *u)
{
    const char *token = kb_conf_str(c, "nats.token"), *creds = kb_conf_str(c, "nats.creds_file");
    const char *ca = kb_conf_str(c, "nats.tls_ca"), *cert = kb_conf_str(c, "nats.tls_cert");
    const char *key = kb_conf_str(c, "nats.tls_key"), *host = kb_conf_str(c, "nats.tls_hostname");
    natsStatus s = set_servers(o, u);
    if (s == NATS_OK && token[0])
        s = natsOptions_SetToken(o, token);
    if (s == NATS_OK && creds[0])
        s = natsOptions_SetUserCredentialsFromFiles(o, creds, NULL);
    if (s == NATS_OK && (ca[0] || cert[0] || key[0] || host[0]))
        s = natsOptions_SetSecure(o, true);
    if (s == NATS_OK && ca[0])
        s = natsOptions_LoadCATrustedCertificates(o, ca);
    if (s == NATS_OK && (cert[0] || key[0]))
        s = natsOptions_LoadCertificatesChain(o, cert, key);
    if (s == NATS_OK && host[0])
        s = natsOptions_SetExpectedHostname(o, host);
    if (s == NATS_OK)
        s = natsOptions_SetName(o, t->id);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, -1);
    if (s == NATS_OK)
        s = natsOptions_SetCustomReconnectDelay(o, reconnect_delay, t);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectBufSize(o, 0);   /* see kb__nats_send */
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, 2000);
    /* A black-holed network: writes fail after the deadline instead of
     * blocking for ever, and a silent server is noticed after two missed
     * PONGs; either way nats.c reconnects and kb__nats_disconnected takes
     * back the publishes not yet acked. */
    if (s == NATS_OK)
        s = natsOptions_SetWriteDeadline(o, kb_conf_int(c, "nats.write_deadline_ms"));
    if (s == NATS_OK)
        s = natsOptions_SetPingInterval(o, kb_conf_int(c, "nats.ping_interval_ms"));
    if (s == NATS_OK)
        s = natsOptions_SetMaxPingsOut(o, 2);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(o, on_async_error, t);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(o, kb__nats_disconnected, t);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(o, on_reconnected, t);
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(o, on_closed, t);
    return s;
}

/* nats.c's reason with the secret file's path replaced by its key's name
 * (nats.creds_file is a secret: messages name the key, never the value). */
static void reason_of(natsStatus s, const char *creds, char *out, size_t len)
{
    const char *why = kb__nats_reason(s);
    const char *at = creds[0] ? strstr(why, creds) : NULL;
    if (at == NULL)
        snprintf(out, len, "%s", why);
    else
        snprintf(out, len, "%.*snats.creds_file%s", (int)(at - why), why, at + strlen(creds));
}

int kb__nats_feed_connect(kb_transport *t)
{
    if (atomic_load(&t->feed_nc) != NULL)
        return KB_OK;
    natsConnection *nc = NULL;
    natsStatus s = natsConnection_Connect(&nc, t->feed_opts);
    if (s != NATS_OK) {
        char why[256];
        reason_of(s, t->creds_file, why, sizeof why);
        kb_errf(NULL, 0, "nats %s: cannot connect the consumer: %s", t->url_safe, why);
        return s == NATS_NO_MEMORY ? KB_ENOMEM : KB_ETRANSPORT;
    }
    atomic_store(&t->feed_nc, nc);
    return KB_OK;
}

/* Connect; when nats.connect_wait_ms allows, nats.c keeps trying in the
 * background (its reconnect backoff) and calls on_connected. */
static int dial(kb_transport *t, natsOptions *o, const kb_conf *c, char *errstr, size_t errlen)
{
    natsStatus s = natsConnection_Connect(&t->nc, o);
    if (s == NATS_OK)
        return KB_OK;
    char why[256];
    reason_of(s, kb_conf_str(c, "nats.creds_file"), why, sizeof why);
    int wait_ms = (int)kb_conf_int(c, "nats.connect_wait_ms");
    if (wait_ms > 0 && s != NATS_NO_MEMORY) {
        int64_t deadline = kb_deadline_ns(wait_ms);
        s = natsOptions_SetRetryOnFailedConnect(o, true, on_connected, t);
        if (s == NATS_OK)
            s = natsConnection_Connect(&t->nc, o);
        if (s == NATS_OK || (s == NATS_NOT_YET_CONNECTED &&
                             kb_signal_wait(t->nc_event, is_connected, t, deadline)))
            return KB_OK;
    }
    kb_errf(errstr, errlen, "nats %s: cannot connect: %s", t->url_safe, why);
    kb_log(t->bus, KB_LOG_ERROR, "nats %s: cannot connect: %s", t->url_safe, why);
    return s == NATS_NO_MEMORY ? KB_ENOMEM : KB_ETRANSPORT;
}

int kb__nats_connect(kb_transport *t, const kb_conf *c, char *errstr, size_t errlen)
{
    kb_url *u = kb_url_parse(kb_conf_str(c, "transport"), errstr, errlen);
    if (u == NULL)
        return KB_EINVAL;
    natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = set_options(t, o, c, u);
    if (s == NATS_OK)
        s = natsOptions_Create(&t->feed_opts);
    if (s == NATS_OK)
        s = set_options(t, t->feed_opts, c, u);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(t->feed_opts, on_feed_disconnected, t);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(t->feed_opts, on_feed_reconnected, t);
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(t->feed_opts, on_feed_closed, t);
    char feed_name[sizeof t->id + 16];
    snprintf(feed_name, sizeof feed_name, "%s-consumer", t->id);
    if (s == NATS_OK)   /* told apart from nc in logs and the server's connz */
        s = natsOptions_SetName(t->feed_opts, feed_name);
    if (s == NATS_OK && (t->creds_file = strdup(kb_conf_str(c, "nats.creds_file"))) == NULL)
        s = NATS_NO_MEMORY;
    kb_url_free(u);
    if (s != NATS_OK) {
        char why[256];
        reason_of(s, kb_conf_str(c, "nats.creds_file"), why, sizeof why);
        kb_errf(errstr, errlen, "nats %s: bad connection options: %s", t->url_safe, why);
        natsOptions_Destroy(o);
        return s == NATS_NO_MEMORY ? KB_ENOMEM : KB_EINVAL;
    }
    int rc = dial(t, o, c, errstr, errlen);
    natsOptions_Destroy(o);
    if (rc != KB_OK)
        return rc;
    read_limits(t, t->nc);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = kb_conf_int(c, "nats.publish_max_pending");
    jo.PublishAsync.AckHandler = kb__nats_pub_ack;   /* sequences for kb_drain, errors */
    jo.PublishAsync.AckHandlerClosure = t;
    jo.PublishAsync.StallWait = t->enqueue_timeout_ms > 0 ? t->enqueue_timeout_ms : 1;
    jsCtx *js = NULL;
    s = natsConnection_JetStream(&js, t->nc, &jo);
    jsOptions_Init(&jo);
    jo.Wait = kb__nats_round_wait_ms(t);   /* a bucket without a leader holds no round up */
    if (s == NATS_OK)
        s = natsConnection_JetStream(&t->js_round, t->nc, &jo);
    pthread_rwlock_wrlock(&t->pub_lock);   /* the disconnect callback reads it */
    t->js = js;
    pthread_rwlock_unlock(&t->pub_lock);
    if (s != NATS_OK) {
        kb_errf(errstr, errlen, "nats %s: no JetStream context: %s", t->url_safe,
                kb__nats_reason(s));
        return KB_ETRANSPORT;
    }
    jsAccountInfo *ai = NULL;
    jsErrCode jerr = 0;
    s = js_GetAccountInfo(&ai, t->js, NULL, &jerr);
    jsAccountInfo_Destroy(ai);
    if (s != NATS_OK) {
        kb_errf(errstr, errlen, "nats %s: JetStream not available: %s (error %d)",
                t->url_safe, kb__nats_reason(s), (int)jerr);
        return KB_ETRANSPORT;
    }
    kb_bus_state_report(t->bus, KB_STATE_CONNECTED, t->url_safe);
    return KB_OK;
}

