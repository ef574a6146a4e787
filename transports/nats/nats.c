/* nats:// — JetStream transport: connection, topics, and the ops table.
 * Layout and choices: docs/transports-nats.md. */
#include <stdio.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../../core/err.h"
#include "nats_int.h"

int64_t kb__nats_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void kb__nats_sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int kb__nats_errf(const char *what, natsStatus s, jsErrCode jerr)
{
    const char *text = nats_GetLastError(NULL);
    kb_errf(NULL, 0, "nats: %s: %s%s%s (jetstream error %d)", what, natsStatus_GetText(s),
             text ? ": " : "", text ? text : "", (int)jerr);
    return s == NATS_NO_MEMORY ? KB_ENOMEM : s == NATS_TIMEOUT ? KB_ETIMEDOUT : KB_ETRANSPORT;
}

/* Stream names may not hold '.', so dots become '_' and a hash of the
 * original name keeps "a.b" and "a_b" apart. */
void kb__nats_stream_name(char *buf, size_t len, const char *topic)
{
    int n = snprintf(buf, len, "KB_%s", topic);
    for (int i = 3; i < n && (size_t)i < len; i++)
        if (buf[i] == '.')
            buf[i] = '_';
    size_t o = strlen(buf);
    snprintf(buf + o, len - o, "_%08x", kb_fnv1a32(topic, strlen(topic)));
}

long kb__nats_subject_part(kb_transport *t, const char *topic, const char *subj)
{
    size_t tl = strlen(topic);
    if (strncmp(subj, "kb.", 3) != 0 || strncmp(subj + 3, topic, tl) != 0 || subj[3 + tl] != '.')
        return -1;
    char *end = NULL;
    unsigned long n = strtoul(subj + 4 + tl, &end, 10);
    return end != subj + 4 + tl && *end == '\0' && n < t->partitions ? (long)n : -1;
}

static int ensure_stream(kb_transport *t, kb_nats_topic *tp)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, t->js, tp->stream, NULL, &jerr);
    if (s == NATS_OK) {
        jsStreamInfo_Destroy(si);
        return KB_OK;
    }
    char subj[KB_NATS_NAME];
    snprintf(subj, sizeof subj, "kb.%s.*", tp->name);
    const char *subjects[] = {subj};
    jsStreamConfig cfg;
    jsStreamConfig_Init(&cfg);
    cfg.Name = tp->stream;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Storage = t->storage;
    cfg.Duplicates = t->dup_window_ms * 1000000;
    cfg.AllowDirect = true;   /* dead letters are listed with direct gets */
    s = js_AddStream(&si, t->js, &cfg, NULL, &jerr);
    jsStreamInfo_Destroy(si);
    if (s != NATS_OK && jerr != JSStreamNameExistErr)
        return kb__nats_errf(tp->stream, s, jerr);
    return KB_OK;
}

kb_nats_topic *kb__nats_topic(kb_transport *t, const char *topic, bool create)
{
    for (kb_nats_topic *tp = atomic_load_explicit(&t->topics, memory_order_acquire); tp;
         tp = tp->next)
        if (strcmp(tp->name, topic) == 0)
            return tp;
    if (!create)
        return NULL;
    pthread_mutex_lock(&t->topics_lock);
    kb_nats_topic *tp = kb__nats_topic(t, topic, false);
    if (tp == NULL && (tp = calloc(1, sizeof *tp)) != NULL) {
        tp->name = strdup(topic);
        kb__nats_stream_name(tp->stream, sizeof tp->stream, topic);
        snprintf(tp->dlq_subject, sizeof tp->dlq_subject, "kb.%s.dlq", topic);
        tp->subjects = calloc(t->partitions, sizeof *tp->subjects);
        for (uint32_t i = 0; tp->subjects != NULL && i < t->partitions; i++)
            snprintf(tp->subjects[i], sizeof tp->subjects[i], "kb.%s.%u", topic, i);
        bool mem = tp->name == NULL || tp->subjects == NULL || kb__nats_batch_init(t, tp) != KB_OK;
        if (mem || ensure_stream(t, tp) != KB_OK) {
            if (mem)
                kb_errf(NULL, 0, "nats: out of memory");
            kb__nats_batch_free(t, tp);
            free(tp->subjects);
            free(tp->name);
            free(tp);
            tp = NULL;
        } else {
            tp->next = atomic_load_explicit(&t->topics, memory_order_relaxed);
            atomic_store_explicit(&t->topics, tp, memory_order_release);
        }
    }
    pthread_mutex_unlock(&t->topics_lock);
    return tp;
}

/* The URL as it may appear in messages: user info replaced. */
static void redact(char *out, size_t len, const char *url)
{
    const char *sep = strstr(url, "://");
    const char *host = sep ? sep + 3 : url;
    const char *at = strrchr(host, '@');
    if (at == NULL)
        snprintf(out, len, "%s", url);
    else
        snprintf(out, len, "%.*s***@%s", (int)(host - url), url, at + 1);
}

/* Exponential reconnect backoff with jitter, capped. */
static int64_t reconnect_delay(natsConnection *nc, int attempts, void *closure)
{
    (void)nc;
    kb_transport *t = closure;
    int64_t d = t->reconnect_wait_ms;
    for (int i = 1; i < attempts && d < t->reconnect_max_ms; i++)
        d *= 2;
    if (d > t->reconnect_max_ms)
        d = t->reconnect_max_ms;
    return d / 2 + (int64_t)(rand() % (int)(d / 2 + 1));
}

static void on_async_error(natsConnection *nc, natsSubscription *sub, natsStatus err,
                           void *closure)
{
    (void)nc, (void)sub;
    kb_transport *t = closure;
    kb_log(t->bus, 4, "nats %s: %s", t->url_safe, natsStatus_GetText(err));
}

/* nats.c delivers connection callbacks on its own thread, in order; the
 * closed callback is the last, so nats_close waits for it before freeing. */
static void on_closed(natsConnection *nc, void *closure)
{
    (void)nc;
    atomic_store(&((kb_transport *)closure)->nc_closed, 1);
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

static void on_reconnected(natsConnection *nc, void *closure)
{
    kb_transport *t = closure;
    read_limits(t, nc);
    atomic_fetch_add(&t->reconnects, 1);
    kb_log(t->bus, 6, "nats %s: reconnected (max_payload %zu)", t->url_safe,
           atomic_load(&t->max_payload));
}

/* The group names consumers and KV keys (l.<stream>.<group>.<N>): refused
 * unless both can take it as is. (Mapping other bytes to '_' would let two
 * groups share leases and consumers.) */
static bool group_ok(const char *g)
{
    for (; *g; g++)
        if (!((*g >= 'a' && *g <= 'z') || (*g >= 'A' && *g <= 'Z') || (*g >= '0' && *g <= '9') ||
              *g == '-' || *g == '_' || *g == '='))
            return false;
    return true;
}

static int configure(kb_transport *t, const kb_conf *c, char *errstr, size_t errlen)
{
    const char *storage = kb_conf_str(c, "nats.storage");
    if (strcmp(storage, "file") == 0)
        t->storage = js_FileStorage;
    else if (strcmp(storage, "memory") == 0)
        t->storage = js_MemoryStorage;
    else {
        kb_errf(errstr, errlen, "nats.storage: \"%s\" is neither file nor memory", storage);
        return KB_EINVAL;
    }
    t->partitions = (uint32_t)kb_conf_int(c, "partitions");
    t->ack_wait_ms = kb_conf_int(c, "nats.ack_wait_ms");
    t->max_ack_pending = kb_conf_int(c, "nats.max_ack_pending");
    t->fetch_batch = kb_conf_int(c, "nats.fetch_batch");
    t->fetch_expires_ms = kb_conf_int(c, "nats.fetch_expires_ms");
    t->ack_interval_ms = kb_conf_int(c, "nats.ack_interval_ms");
    t->lease_ttl_ms = kb_conf_int(c, "nats.lease_ttl_ms");
    t->publish_timeout_ms = kb_conf_int(c, "nats.publish_timeout_ms");
    t->dup_window_ms = kb_conf_int(c, "nats.dup_window_ms");
    t->reconnect_wait_ms = kb_conf_int(c, "nats.reconnect_wait_ms");
    t->reconnect_max_ms = kb_conf_int(c, "nats.reconnect_max_wait_ms");
    t->enqueue_timeout_ms = (int)kb_conf_int(c, "pool.enqueue_timeout_ms");
    t->max_attempts = (uint32_t)kb_conf_int(c, "retry.max_attempts");
    t->max_headers = (size_t)kb_conf_int(c, "limits.max_headers");
    t->max_header_bytes = (size_t)kb_conf_int(c, "limits.max_header_bytes");
    t->batch_events = (uint32_t)kb_conf_int(c, "nats.publish_batch");
    t->linger_ns = kb_conf_int(c, "nats.publish_linger_us") * 1000;
    snprintf(t->id, sizeof t->id, "%s", kb_conf_str(c, "consumer"));
    snprintf(t->group, sizeof t->group, "%s", kb_conf_str(c, "group"));
    snprintf(t->bucket, sizeof t->bucket, "%s", kb_conf_str(c, "nats.lease_bucket"));
    if (!group_ok(t->group)) {
        kb_errf(errstr, errlen, "group \"%s\": nats:// allows only letters, digits, '-', '_' "
                 "and '=' (it names JetStream consumers and KV keys)", t->group);
        return KB_EINVAL;
    }
    unsigned char rnd[8] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        memcpy(rnd, &t, sizeof t < sizeof rnd ? sizeof t : sizeof rnd);
    for (int i = 0; i < 8; i++)
        snprintf(t->bus_id + 2 * i, 3, "%02x", rnd[i]);
    return KB_OK;
}

static natsStatus set_options(kb_transport *t, natsOptions *o, const kb_conf *c)
{
    const char *token = kb_conf_str(c, "nats.token"), *creds = kb_conf_str(c, "nats.creds_file");
    const char *ca = kb_conf_str(c, "nats.tls_ca"), *cert = kb_conf_str(c, "nats.tls_cert");
    const char *key = kb_conf_str(c, "nats.tls_key"), *host = kb_conf_str(c, "nats.tls_hostname");
    natsStatus s = natsOptions_SetURL(o, kb_conf_str(c, "transport"));
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
        s = natsOptions_SetReconnectBufSize(o, 64 * 1024 * 1024);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, 2000);
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

/* Connect, retrying up to nats.connect_wait_ms when the server is not there. */
static int connect_server(kb_transport *t, const kb_conf *c, char *errstr, size_t errlen)
{
    natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = set_options(t, o, c);
    if (s != NATS_OK) {
        const char *why = nats_GetLastError(NULL);
        kb_errf(errstr, errlen, "nats %s: bad connection options: %s", t->url_safe,
                 why ? why : natsStatus_GetText(s));
        natsOptions_Destroy(o);
        return s == NATS_NO_MEMORY ? KB_ENOMEM : KB_EINVAL;
    }
    int64_t until = kb__nats_now_ns() + kb_conf_int(c, "nats.connect_wait_ms") * 1000000;
    int64_t nap = 50;
    while ((s = natsConnection_Connect(&t->nc, o)) != NATS_OK && kb__nats_now_ns() < until) {
        kb__nats_sleep_ms(nap);
        nap = nap * 2 > 1000 ? 1000 : nap * 2;
    }
    natsOptions_Destroy(o);
    if (s != NATS_OK) {
        kb_errf(errstr, errlen, "nats %s: cannot connect: %s", t->url_safe,
                 natsStatus_GetText(s));
        return KB_ETRANSPORT;
    }
    read_limits(t, t->nc);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = kb_conf_int(c, "nats.publish_max_pending");
    jo.PublishAsync.AckHandler = kb__nats_pub_ack;   /* sequences for kb_drain, errors */
    jo.PublishAsync.AckHandlerClosure = t;
    jo.PublishAsync.StallWait = t->enqueue_timeout_ms > 0 ? t->enqueue_timeout_ms : 1;
    jsCtx *js = NULL;
    s = natsConnection_JetStream(&js, t->nc, &jo);
    pthread_rwlock_wrlock(&t->pub_lock);   /* the disconnect callback reads it */
    t->js = js;
    pthread_rwlock_unlock(&t->pub_lock);
    if (s != NATS_OK) {
        kb_errf(errstr, errlen, "nats %s: no JetStream context: %s", t->url_safe,
                 natsStatus_GetText(s));
        return KB_ETRANSPORT;
    }
    jsAccountInfo *ai = NULL;
    jsErrCode jerr = 0;
    s = js_GetAccountInfo(&ai, t->js, NULL, &jerr);
    jsAccountInfo_Destroy(ai);
    if (s != NATS_OK) {
        kb_errf(errstr, errlen, "nats %s: JetStream not available: %s (error %d)",
                 t->url_safe, natsStatus_GetText(s), (int)jerr);
        return KB_ETRANSPORT;
    }
    return KB_OK;
}

static int nats_close(kb_transport *t);

static int nats_open(kb_transport **out, kb_bus *bus, const kb_conf *c, char *errstr,
                     size_t errlen)
{
    kb_transport *t = calloc(1, sizeof *t);
    if (t == NULL) {
        kb_errf(errstr, errlen, "nats: out of memory");
        return KB_ENOMEM;
    }
    t->bus = bus;
    pthread_mutex_init(&t->topics_lock, NULL);
    pthread_mutex_init(&t->sub_lock, NULL);
    pthread_mutex_init(&t->resend_lock, NULL);
    pthread_rwlock_init(&t->pub_lock, NULL);
    pthread_mutex_init(&t->lease_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->lease_cv, &ca);
    pthread_mutex_init(&t->drain_mu, NULL);
    pthread_mutex_init(&t->tally_mu, NULL);
    pthread_cond_init(&t->drain_cv, &ca);
    pthread_condattr_destroy(&ca);
    redact(t->url_safe, sizeof t->url_safe, kb_conf_str(c, "transport"));
    int rc = configure(t, c, errstr, errlen);
    if (rc == KB_OK && (rc = connect_server(t, c, errstr, errlen)) == KB_OK)
        rc = kb__nats_lease_open(t, errstr, errlen);
    if (rc == KB_OK) {
        t->acker_started = pthread_create(&t->acker, NULL, kb__nats_acker, t) == 0;
        t->leaser_started = pthread_create(&t->leaser, NULL, kb__nats_leaser, t) == 0;
        if (!t->acker_started || !t->leaser_started) {
            kb_errf(errstr, errlen, "nats: cannot start threads");
            rc = KB_ENOMEM;
        }
    }
    if (rc != KB_OK) {
        nats_close(t);
        return rc;
    }
    *out = t;
    return KB_OK;
}

static int nats_close(kb_transport *t)
{
    kb__nats_stop(t);
    atomic_store(&t->closing, 1);
    kb__nats_lease_kick(t);
    if (t->leaser_started)
        pthread_join(t->leaser, NULL);
    if (t->acker_started)
        pthread_join(t->acker, NULL);
    int rc = KB_OK;
    char why[512] = "";
    if (t->js != NULL) {
        kb__nats_ack_pass(t);            /* the last frontier acks */
        natsConnection_FlushTimeout(t->nc, 2000);
        kb__nats_lease_release_all(t);   /* after the acks: the next owner starts there */
        if ((rc = kb__nats_flush(t, 5000)) != KB_OK)
            snprintf(why, sizeof why, "%s", kb_last_error());
    }
    natsSubscription_Destroy(t->inbox_sub);
    uint64_t unsent = kb__nats_resend_free(t);
    for (kb_nats_topic *tp = atomic_load(&t->topics), *next; tp; tp = next) {
        next = tp->next;
        for (uint32_t i = 0; tp->parts != NULL && i < t->partitions; i++)
            kb__nats_claim_free_all(&tp->parts[i]);
        if (atomic_load(&tp->unowned))
            kb_log(t->bus, 5, "nats %s: %s: %llu queued events released unhandled after a lost lease",
                   t->url_safe, tp->name, (unsigned long long)atomic_load(&tp->unowned));
        free(tp->parts);
        unsent += kb__nats_batch_free(t, tp);
        free(tp->subjects);
        free(tp->name);
        free(tp);
    }
    kvStore_Destroy(t->kv);
    jsCtx_Destroy(t->js);
    if (t->nc != NULL) {
        natsConnection_Close(t->nc);
        for (int i = 0; i < 5000 && !atomic_load(&t->nc_closed); i++)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        natsConnection_Destroy(t->nc);
    }
    pthread_cond_destroy(&t->lease_cv);
    pthread_cond_destroy(&t->drain_cv);
    pthread_mutex_destroy(&t->drain_mu);
    kb__nats_tally_free(t);
    pthread_mutex_destroy(&t->tally_mu);
    pthread_mutex_destroy(&t->lease_mu);
    pthread_rwlock_destroy(&t->pub_lock);
    pthread_mutex_destroy(&t->resend_lock);
    pthread_mutex_destroy(&t->topics_lock);
    pthread_mutex_destroy(&t->sub_lock);
    free(t);
#if defined(__GLIBC__)
    malloc_trim(0);   /* claims' rings and topics: give the pages back */
#endif
    if (unsent > 0) {
        kb_errf(NULL, 0, "nats: %llu published events never sent (%s)", (unsigned long long)unsent,
                 why[0] ? why : "server unreachable at close");
        return KB_ETRANSPORT;
    }
    if (rc != KB_OK)   /* rejected by the server: kb_flush's report */
        kb_errf(NULL, 0, "%s", why);
    return rc;
}

const kb_transport_ops kb__nats_ops = {
    .abi_version = KB_TRANSPORT_ABI,
    .scheme = "nats",
    .flags = KB_TRANSPORT_F_SINGLE_FEEDER | KB_TRANSPORT_F_HEADERS,   /* one feeder per bus */
    .open = nats_open,
    .publish = kb__nats_publish,
    .subscribe = kb__nats_subscribe,
    .ack = kb__nats_ack,
    .dead_letter = kb__nats_dead_letter,
    .release = kb__nats_release,
    .still_owned = kb__nats_still_owned,
    .flush = kb__nats_flush,
    .drain = kb__nats_drain,
    .stats = kb__nats_stats,
    .partition_stats = kb__nats_partition_stats,
    .dead_letters = kb__nats_dead_letters,
    .dead_letter_replay = kb__nats_dead_letter_replay,
    .stop = kb__nats_stop,
    .close = nats_close,
};
