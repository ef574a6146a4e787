/* Redis Streams transport: the ops table, its configuration keys, open,
 * topic_open, stop and close. What each hook does lives in a file of its own
 * (redis_int.h lists them by layer). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "redis_int.h"

#define CLOSE_FLOOR_NS 150000000   /* a close whose deadline passed still tries this long */

/* The redis.* keys, for both schemes. */
static const kb_conf_prop redis_props[] = {
    {"redis.connect_timeout_ms", KB_CONF_INT, "2000", 1, 600000,
     "Redis: TCP connect timeout, also for reconnects."},
    {"redis.read_timeout_ms", KB_CONF_INT, "5000", 1, 600000,
     "Redis: socket read/write timeout; must exceed `redis.block_ms`."},
    {"redis.block_ms", KB_CONF_INT, "100", 1, 60000,
     "Redis: `XREADGROUP BLOCK` time; bounds how fast a consumer notices new leases and close."},
    {"redis.batch", KB_CONF_INT, "256", 1, 100000,
     "Redis: starting `COUNT` per `XREADGROUP` (it grows up to 8x while reads come back "
     "full, and halves back while it times the partitions that bring entries exceeds 8x) and `COUNT` per recovery "
     "(`XPENDING`/`XAUTOCLAIM`) page."},
    {"redis.maxlen", KB_CONF_INT, "0", 0, INT64_MAX,
     "Redis: trim each partition stream with `MAXLEN ~ n` on publish; 0 = no trimming. "
     "Trimming may delete entries nobody acked yet."},
    {"redis.lease_ttl_ms", KB_CONF_INT, "10000", 100, 3600000,
     "Redis: partition lease and membership TTL; renewed 4 times per TTL. A dead "
     "process's partitions move after about this long."},
    {"redis.fenced_reads", KB_CONF_BOOL, "true", 0, 1,
     "Redis: `true` = each read is validated on the server before its entries are delivered "
     "(one `MGET` of the leases and `XPENDING` of each partition it returned entries of; entries "
     "read after the lease was lost are swept again), so a process "
     "paused past its lease cannot take entries the next owner should get; `false` = plain "
     "`XREADGROUP`, fenced only by the local lease deadline (a pause between that check and "
     "the read can strand entries and reorder their keys)."},
    {"redis.publish_buffer_bytes", KB_CONF_INT, "4194304", 65536, INT64_MAX,
     "Redis: bound on the publishes held until the server confirms them (their `XADD` "
     "commands, in bytes); they are sent again after a lost connection. When it is full, "
     "`kb_publish` waits up to `pool.enqueue_timeout_ms`, then returns `KB_EFULL`."},
    {"redis.publish_batch", KB_CONF_INT, "64", 1, KB_REDIS_BATCH_MAX,
     "Redis: events of one partition packed into one stream entry (a frame), which divides "
     "the server's per-entry work among them; 1 sends each event as its own entry with the "
     "fields `k`/`d`/`a`/`h.*`. A lone event always goes out as a plain entry. See "
     "docs/transports-redis.md."},
    {"redis.publish_linger_us", KB_CONF_INT, "1000", 0, 1000000,
     "Redis: how long a frame that is not full may wait for more events. The first event "
     "after a quiet spell of this long is sent at once, so sparse traffic is not delayed. "
     "0 sends every event at once, as a plain entry: no frames."},
    {"redis.wait_replicas", KB_CONF_INT, "0", 0, 100,
     "Redis: after the `XADD`s of each publish batch, `WAIT` until this many replicas "
     "confirmed them; `kb_flush` fails with `KB_ETRANSPORT` naming the shortfall (\"1 of 2 "
     "replicas confirmed within 500 ms\") when fewer did within `redis.wait_timeout_ms`, "
     "and the delivery callback reports each such event failed with that reason (an event "
     "is reported stored only once its `WAIT` confirmed it). Replication stays asynchronous: this narrows the window a failover can lose, it does "
     "not close it. 0 = no `WAIT`."},
    {"redis.wait_timeout_ms", KB_CONF_INT, "1000", 1, 600000,
     "Redis: how long each `WAIT` (`redis.wait_replicas`) waits for the replicas; below "
     "`redis.read_timeout_ms`."},
    {"redis.connect_wait_ms", KB_CONF_INT, "0", 0, 3600000,
     "How long `kb_open` keeps trying an unreachable server (with the reconnect "
     "backoff); 0 = fail at once with `KB_ETRANSPORT`."},
    {"redis.reconnect_min_ms", KB_CONF_INT, "50", 1, 60000,
     "Redis: first reconnect delay; doubles per failure, with jitter."},
    {"redis.reconnect_max_ms", KB_CONF_INT, "5000", 1, 600000,
     "Redis: cap on the reconnect delay."},
    {"redis.password", KB_CONF_SECRET, "", 0, 4096,
     "Password for AUTH (with the URL's user name, if any), instead of one in the URL. "
     "Never logged."},
    {"redis.password_file", KB_CONF_TEXT, "", 0, 4096,
     "File holding `redis.password` (one final newline dropped), read once by `kb_open`."},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL},
};

/* ---- topics ---- */

static void topic_free(kb_transport_topic *tt)
{
    for (uint32_t i = 0; tt->parts != NULL && i < tt->nparts; i++) {
        kb__redis_jobs_free(&tt->parts[i].jobs);
        kb__redis_jobs_free(&tt->parts[i].sending);
        free(tt->parts[i].frame.buf);
        pthread_mutex_destroy(&tt->parts[i].lock);
    }
    free(tt->parts);
    free(tt->name);
    free(tt);
}

/* Names only: the server is asked when the topic is first published to or
 * subscribed (topic_open must not wait for the broker). */
static int redis_topic_open(kb_transport *t, const char *topic, kb_transport_topic **out,
                            char *errstr, size_t errlen)
{
    kb_transport_topic *tt = calloc(1, sizeof *tt);
    if (tt == NULL || (tt->name = strdup(topic)) == NULL ||
        (tt->parts = calloc(t->partitions, sizeof *tt->parts)) == NULL) {
        if (tt != NULL)
            free(tt->name);
        free(tt);
        kb_errf(errstr, errlen, "topic %s: out of memory", topic);
        return KB_ENOMEM;
    }
    tt->t = t;
    tt->nparts = t->partitions;
    tt->meta_rc = 1;   /* not checked yet */
    snprintf(tt->dlq, sizeof tt->dlq, "kb:{%s}:dlq", topic);
    snprintf(tt->members, sizeof tt->members, "kb:{%s}:members", topic);
    snprintf(tt->meta, sizeof tt->meta, "kb:{%s}:meta", topic);
    for (uint32_t i = 0; i < tt->nparts; i++) {
        kb_redis_part *p = &tt->parts[i];
        p->tt = tt;
        p->index = i;
        pthread_mutex_init(&p->lock, NULL);
        snprintf(p->stream, sizeof p->stream, "kb:{%s}:p:%u", topic, i);
        snprintf(p->lease, sizeof p->lease, "kb:{%s}:lease:%u", topic, i);
        /* per group: each group settles its own copy of the entry */
        snprintf(p->done, sizeof p->done, "kb:{%s}:done:%s:%u", topic, t->group, i);
    }
    /* topic_open is serialised by the bus: no other writer */
    tt->opened_next = atomic_load(&t->opened);
    atomic_store(&t->opened, tt);
    *out = tt;
    return KB_OK;
}

/* ---- life cycle ---- */

static void redis_stop(kb_transport *t)
{
    kb__redis_consume_stop(t);
}

static void transport_free(kb_transport *t)
{
    kb_transport_topic *tt = atomic_load(&t->opened);
    while (tt != NULL) {
        kb_transport_topic *next = tt->opened_next;
        topic_free(tt);
        tt = next;
    }
    kb__redis_backlog_free(&t->backlog);
    kb__redis_reports_free(&t->reports);
    kb__redis_reports_free(&t->unvouched);
    for (int i = 0; i < 2; i++)
        if (t->sender_wake[i] >= 0)
            close(t->sender_wake[i]);
    kb__redis_conn_close(&t->pub);
    kb__redis_conn_close(&t->ctl);
    kb__redis_conn_close(&t->stats);
    kb__redis_conn_close(&t->kc);
    kb__redis_conn_close(&t->rconn);
    pthread_mutex_destroy(&t->primary_lock);
    pthread_mutex_destroy(&t->pub_lock);
    pthread_mutex_destroy(&t->ctl_lock);
    pthread_mutex_destroy(&t->stats_lock);
    kb_signal_free(t->reader_wake);
    kb_signal_free(t->keeper_wake);
    kb_signal_free(t->settled);
    kb_signal_free(t->pub_progress);
    if (t->url != NULL && t->url->password != NULL)
        memset(t->url->password, 0, strlen(t->url->password));
    kb_url_free(t->url);
    free(t);
}

/* Every step shares the caller's deadline, even on a server that answers
 * nothing: the reader stops, the keeper sends the last acks and dead letters
 * and hands the leases back while the sender writes what is still held. */
static int redis_close(kb_transport *t, int64_t deadline_ns)
{
    int64_t floor = kb_now_ns() + CLOSE_FLOOR_NS;
    int64_t end = deadline_ns < floor ? floor : deadline_ns;
    kb__redis_watcher_stop(t);
    kb__redis_consume_stop(t);
    kb__redis_keeper_stop(t, end);
    int rc = kb__redis_pub_close(t, end);
    transport_free(t);
    return rc;
}

/* The configuration as kb_open takes it: KB_OK, or KB_EINVAL with errstr. */
static int read_conf(kb_transport *t, const kb_conf *c, char *errstr, size_t errlen)
{
    t->partitions = (uint32_t)kb_conf_int(c, "partitions");
    snprintf(t->group, sizeof t->group, "%s", kb_conf_str(c, "group"));
    t->group_start = strcmp(kb_conf_str(c, "group.start"), "latest") == 0 ? "$" : "0";
    snprintf(t->consumer, sizeof t->consumer, "%s", kb_conf_str(c, "consumer"));
    t->connect_timeout_ms = (int)kb_conf_int(c, "redis.connect_timeout_ms");
    t->read_timeout_ms = (int)kb_conf_int(c, "redis.read_timeout_ms");
    t->block_ms = (int)kb_conf_int(c, "redis.block_ms");
    t->batch = (int)kb_conf_int(c, "redis.batch");
    t->maxlen = kb_conf_int(c, "redis.maxlen");
    t->lease_ttl_ms = (int)kb_conf_int(c, "redis.lease_ttl_ms");
    t->fenced_reads = kb_conf_bool(c, "redis.fenced_reads");
    t->backoff_min_ms = (int)kb_conf_int(c, "redis.reconnect_min_ms");
    t->backoff_max_ms = (int)kb_conf_int(c, "redis.reconnect_max_ms");
    t->max_attempts = (uint32_t)kb_conf_int(c, "retry.max_attempts");
    kb_redis_limits *l = &t->lim;
    l->key = (size_t)kb_conf_int(c, "limits.max_key_bytes");
    l->payload = (size_t)kb_conf_int(c, "limits.max_payload_bytes");
    l->headers = (size_t)kb_conf_int(c, "limits.max_headers");
    l->header_bytes = (size_t)kb_conf_int(c, "limits.max_header_bytes");
    /* never below 64 KiB: lease tokens, XINFO rows and scripts' answers are
     * copied whatever the limits of events */
    l->cap = KB_REDIS_HEADER_BYTES;
    l->cap = l->key > l->cap ? l->key : l->cap;
    l->cap = l->payload > l->cap ? l->payload : l->cap;
    l->cap = l->header_bytes > l->cap ? l->header_bytes : l->cap;
    l->entry = l->key + l->payload + l->header_bytes + KB_REDIS_HEADER_BYTES;
    t->buffer_bytes = (size_t)kb_conf_int(c, "redis.publish_buffer_bytes");
    t->publish_batch = (int)kb_conf_int(c, "redis.publish_batch");
    t->linger_ns = kb_conf_int(c, "redis.publish_linger_us") * 1000;
    kb__redis_backlog_init(&t->backlog, t->buffer_bytes);
    t->enqueue_timeout_ms = kb_bus_enqueue_timeout_ms(t->bus);
    t->wait_replicas = (int)kb_conf_int(c, "redis.wait_replicas");
    t->wait_timeout_ms = (int)kb_conf_int(c, "redis.wait_timeout_ms");
    if (t->wait_replicas > 0 && t->wait_timeout_ms >= t->read_timeout_ms) {
        kb_errf(errstr, errlen, "redis.wait_timeout_ms (%d) must be below redis.read_timeout_ms (%d)",
                t->wait_timeout_ms, t->read_timeout_ms);
        return KB_EINVAL;
    }
    if (t->read_timeout_ms <= t->block_ms) {
        kb_errf(errstr, errlen, "redis.read_timeout_ms (%d) must exceed redis.block_ms (%d)",
                t->read_timeout_ms, t->block_ms);
        return KB_EINVAL;
    }
    if (t->backoff_min_ms > t->backoff_max_ms) {
        kb_errf(errstr, errlen, "redis.reconnect_min_ms (%d) must not exceed "
                "redis.reconnect_max_ms (%d)", t->backoff_min_ms, t->backoff_max_ms);
        return KB_EINVAL;
    }
    return KB_OK;
}

/* The URL, checked again: KEYBUS_TRANSPORT reaches kb_open unchecked. */
static int read_url(kb_transport *t, const char *url, char *errstr, size_t errlen)
{
    char why[300];
    t->url = kb_url_parse(url, why, sizeof why);
    if (t->url == NULL) {
        kb_errf(errstr, errlen, "transport: %s", why);
        return KB_EINVAL;
    }
    if (kb__redis_check_url(t->url, errstr, errlen) != KB_OK)
        return KB_EINVAL;
    if (strcmp(t->url->scheme, "redis-sentinel") == 0) {
        t->sentinel = true;
        kb__redis_sentinel_url(t->url, t->sentinels, &t->n_sentinels, t->master);
        size_t n = (size_t)snprintf(t->where, sizeof t->where, "%s via Sentinel", t->master);
        for (size_t i = 0; i < t->n_sentinels && n < sizeof t->where; i++) {
            const kb_redis_addr *a = &t->sentinels[i];
            bool v6 = strchr(a->host, ':') != NULL;
            n += (size_t)snprintf(t->where + n, sizeof t->where - n, "%s%s%.64s%s:%d", i ? "," : " ",
                                  v6 ? "[" : "", a->host, v6 ? "]" : "", a->port);
        }
        return KB_OK;
    }
    if (t->url->port == 0)
        t->url->port = 6379;
    t->db = kb__redis_url_db(t->url);
    bool v6 = strchr(t->url->host, ':') != NULL;
    snprintf(t->where, sizeof t->where, "%s%.255s%s:%d", v6 ? "[" : "", t->url->host,
             v6 ? "]" : "", t->url->port);
    return KB_OK;
}

/* redis.password into the URL's place, which the handshake reads. */
static int take_password(kb_transport *t, const char *password, char *errstr, size_t errlen)
{
    if (password[0] == '\0')
        return KB_OK;
    if (t->url->password != NULL) {
        kb_errf(errstr, errlen, "redis.password: the transport URL has a password too: set one");
        return KB_EINVAL;
    }
    if ((t->url->password = strdup(password)) == NULL) {
        kb_errf(errstr, errlen, "redis: out of memory");
        return KB_ENOMEM;
    }
    return KB_OK;
}

/* The control connection, tried until redis.connect_wait_ms has passed (0:
 * once), so a service may start before its server: an unreachable server
 * or a refused AUTH is a kb_open error only then. */
static redisContext *connect_first(kb_transport *t, int64_t wait_ms, char *errstr, size_t errlen)
{
    int64_t deadline = kb_deadline_ns((int)wait_ms);
    pthread_mutex_lock(&t->ctl_lock);
    redisContext *ctx;
    while ((ctx = kb__redis_conn_force(&t->ctl, errstr, errlen)) == NULL && wait_ms > 0) {
        int64_t now = kb_now_ns(), until = t->ctl.next_try_ns;
        if (now >= deadline)
            break;
        if (until > deadline)
            until = deadline;
        if (until <= now)
            continue;
        struct timespec ts = {(until - now) / 1000000000, (until - now) % 1000000000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_unlock(&t->ctl_lock);
    return ctx;
}

/* The transport's locks, connections (none connected) and signals; NULL on
 * out of memory. transport_free takes it apart. */
static kb_transport *transport_new(kb_bus *bus)
{
    kb_transport *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->bus = bus;
    kb__redis_conn_init(&t->pub, t, "publish");
    kb__redis_conn_init(&t->ctl, t, "control");
    kb__redis_conn_init(&t->stats, t, "figures");
    kb__redis_conn_init(&t->kc, t, "keeper");
    kb__redis_conn_init(&t->rconn, t, "consumer");
    pthread_mutex_init(&t->pub_lock, NULL);
    pthread_mutex_init(&t->ctl_lock, NULL);
    pthread_mutex_init(&t->stats_lock, NULL);
    pthread_mutex_init(&t->primary_lock, NULL);
    t->sender_wake[0] = t->sender_wake[1] = -1;
    atomic_store(&t->sender_deadline_ns, INT64_MAX);
    kb_signal **signals[] = {&t->reader_wake, &t->keeper_wake, &t->settled, &t->pub_progress};
    bool made = true;
    for (size_t i = 0; i < sizeof signals / sizeof *signals; i++)
        made = (*signals[i] = kb_signal_new()) != NULL && made;
    if (!made) {
        transport_free(t);
        return NULL;
    }
    return t;
}

static int redis_open(kb_transport **out, kb_bus *bus, const kb_conf *c, char *errstr,
                      size_t errlen)
{
    kb_transport *t = transport_new(bus);
    if (t == NULL) {
        kb_errf(errstr, errlen, "redis: out of memory");
        return KB_ENOMEM;
    }
    int rc = read_url(t, kb_conf_str(c, "transport"), errstr, errlen);
    if (rc == KB_OK)
        rc = read_conf(t, c, errstr, errlen);
    if (rc == KB_OK)
        rc = take_password(t, kb_conf_str(c, "redis.password"), errstr, errlen);
    if (rc != KB_OK) {
        transport_free(t);
        return rc;
    }
    /* The nonce tells this process's leases from a restarted namesake's. */
    snprintf(t->token, sizeof t->token, "%s#%016" PRIx64, t->consumer, kb_bus_random(t->bus));

    if (connect_first(t, kb_conf_int(c, "redis.connect_wait_ms"), errstr, errlen) == NULL) {
        transport_free(t);
        return KB_ETRANSPORT;
    }
    kb__redis_limit_read(t);
    if ((rc = kb__redis_runs_start(t, errstr, errlen)) != KB_OK ||
        (rc = kb__redis_keeper_start(t, errstr, errlen)) != KB_OK) {
        transport_free(t);
        return rc;
    }
    if (t->sentinel && (rc = kb__redis_watcher_start(t, errstr, errlen)) != KB_OK) {
        kb__redis_keeper_stop(t, kb_deadline_ns(0));
        transport_free(t);
        return rc;
    }
    kb_bus_state_report(bus, KB_STATE_CONNECTED, t->where);
    *out = t;
    return KB_OK;
}

/* redis:// and redis-sentinel:// differ only in how the primary is found
 * (redis_conn.c asks the Sentinels). */
#define REDIS_HOOKS                                                     \
    .abi_version = KB_TRANSPORT_ABI,                                    \
    .flags = KB_TRANSPORT_F_SINGLE_FEEDER | KB_TRANSPORT_F_HEADERS,     \
    .props = redis_props,                                               \
    .check_url = kb__redis_check_url,                                   \
    .open = redis_open,                                                 \
    .topic_open = redis_topic_open,                                     \
    .publish = kb__redis_publish,                                       \
    .subscribe = kb__redis_subscribe,                                   \
    .ack = kb__redis_ack,                                               \
    .dead_letter = kb__redis_dead_letter,                               \
    .release = kb__redis_release,                                       \
    .flush = kb__redis_flush,                                           \
    .drain = kb__redis_drain,                                           \
    .stats = kb__redis_stats,                                           \
    .partition_stats = kb__redis_partition_stats,                       \
    .dead_letters = kb__redis_dead_letters,                             \
    .dead_letter_replay = kb__redis_dead_letter_replay,                 \
    .dead_letter_delete = kb__redis_dead_letter_delete,                 \
    .still_owned = kb__redis_still_owned,                               \
    .run_begins = kb__redis_run_begins,                                 \
    .stop = redis_stop,                                                 \
    .close = redis_close,                                               \
    .groups = kb__redis_groups,                                         \
    .group_delete = kb__redis_group_delete,                             \
    .topics = kb__redis_topics,                                         \
    .peek = kb__redis_peek

const kb_transport_ops kb__redis_ops = {REDIS_HOOKS, .scheme = "redis"};

const kb_transport_ops kb__redis_sentinel_ops = {REDIS_HOOKS, .scheme = "redis-sentinel"};

/* rediss:// is registered only so the `transport` key can refuse it with a
 * reason (check_url, and redis_open for a URL that reached it unchecked). */
const kb_transport_ops kb__rediss_ops = {
    .abi_version = KB_TRANSPORT_ABI,
    .scheme = "rediss",
    .props = redis_props,
    .check_url = kb__redis_check_url,
    .open = redis_open,
};
