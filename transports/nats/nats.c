/* nats:// — the NATS JetStream transport: its configuration keys, its URL
 * rules, the ops table, and open/close. The files below it, top-down (a file
 * calls only files listed after it):
 *   concerns:  nats_connect, nats_consume (feeder thread), nats_leaser (lease
 *              thread: rounds), nats_acker (acker thread), nats_dlq,
 *              nats_drain, nats_stats, nats_admin (the operator's
 *              listings, group removal, peek), nats_publish, nats_runs
 *   leases:    nats_lease (ownership, hand-over, claims), nats_watch
 *              (membership as it changes), nats_consumers (a claim's
 *              consumer), nats_kv (the lease bucket, pipelined), nats_late
 *              (its renewals answered late)
 *   pipes:     nats_batch, nats_send, nats_tally, nats_topic, nats_claim
 *   helpers:   nats_hdr, nats_frame, nats_msg, nats_names, nats_flight
 * and nats_types.h, the state they share. Layout and choices:
 * docs/transports-nats.md. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <string.h>

#include "nats_acker.h"
#include "nats_admin.h"
#include "nats_batch.h"
#include "nats_claim.h"
#include "nats_connect.h"
#include "nats_consume.h"
#include "nats_dlq.h"
#include "nats_drain.h"
#include "nats_flight.h"
#include "nats_lease.h"
#include "nats_names.h"
#include "nats_publish.h"
#include "nats_runs.h"
#include "nats_send.h"
#include "nats_stats.h"
#include "nats_topic.h"
#include "nats_watch.h"

#define MS_HOUR 3600000

static const kb_conf_prop nats_props[] = {
    {"nats.storage", KB_CONF_ENUM, "file", 0, 8,
     "JetStream storage of the topic streams: `file` or `memory`.", "file|memory"},
    {"nats.ack_wait_ms", KB_CONF_INT, "30000", 100, MS_HOUR,
     "Consumer AckWait. The oldest unfinished event of a partition gets an "
     "in-progress ack every third of it, so long handlers keep their message."},
    {"nats.max_ack_pending", KB_CONF_INT, "4096", 16, 1 << 20,
     "Consumer MaxAckPending per partition: events delivered to this process and "
     "not yet acked."},
    {"nats.fetch_batch", KB_CONF_INT, "256", 1, 4096,
     "Messages per pull request (bounded: see docs/transports-nats.md)."},
    {"nats.fetch_expires_ms", KB_CONF_INT, "1000", 10, 60000,
     "Server-side expiry of one pull request."},
    {"nats.ack_interval_ms", KB_CONF_INT, "2", 1, 1000,
     "How often the completion frontier of each partition is acked (AckAll)."},
    {"nats.topic_consumer", KB_CONF_ENUM, "auto", 0, 8,
     "`auto`: a process that takes every partition of a topic at once (a lone member) "
     "reads it through one consumer instead of one per partition, which a server "
     "creates in about a millisecond each; `off`: always one per partition, so that "
     "`kb_drain` in another process never waits for an event of another partition. "
     "See docs/transports-nats.md.",
     "auto|off"},
    {"nats.lease_ttl_ms", KB_CONF_INT, "10000", 500, MS_HOUR,
     "Partition lease and membership TTL; renewed every third of it. A dead "
     "process's partitions move after at most this long. It is the lease bucket's "
     "TTL: the first `kb_subscribe` creates the bucket with it or sets it on the "
     "existing bucket (refused by the server: `kb_subscribe` fails naming both "
     "values). Every process sharing the bucket must use the same value."},
    {"nats.lease_bucket", KB_CONF_STR, "keybus_leases", 1, 64,
     "JetStream KV bucket holding partition leases and members."},
    {"nats.publish_max_pending", KB_CONF_INT, "16384", 1, 1 << 20,
     "Asynchronous publishes in flight. Each topic's publish backlog holds up to "
     "this many times `nats.publish_batch` events; `kb_publish` waits up to "
     "`pool.enqueue_timeout_ms` for room, then `KB_EFULL`."},
    {"nats.publish_batch", KB_CONF_INT, "64", 1, 4096,
     "Events of one partition packed into one JetStream message (a frame), which "
     "divides the server's per-message work among them; 1 sends each event as its "
     "own message. A lone event always goes out as a plain message. See "
     "docs/transports-nats.md."},
    {"nats.publish_linger_us", KB_CONF_INT, "1000", 0, 1000000,
     "How long a frame that is not full may wait for more events. The first event "
     "after a quiet spell of this long is sent at once, so sparse traffic is not "
     "delayed."},
    {"nats.publish_timeout_ms", KB_CONF_INT, "5000", 100, MS_HOUR,
     "How long publishes may wait for an ack while the connection reads nothing before they are sent again in order (same Nats-Msg-Id)."},
    {"nats.dup_window_ms", KB_CONF_INT, "120000", 1000, 24 * MS_HOUR,
     "Stream duplicate window for Nats-Msg-Id when the stream is created."},
    {"nats.replicas", KB_CONF_INT, "1", 1, 5,
     "Copies JetStream keeps of each topic stream and of the lease bucket, on as many "
     "servers of a cluster (3 rides out the loss of one). Given when they are created; "
     "a stream or bucket that exists with another count is left as it is, and the "
     "publish or subscribe fails with `KB_EINVAL` naming both. See docs/deployment.md."},
    {"nats.connect_wait_ms", KB_CONF_INT, "0", 0, MS_HOUR,
     "How long `kb_open` keeps trying an unreachable server; 0 = fail at once "
     "with `KB_ETRANSPORT`."},
    {"nats.reconnect_wait_ms", KB_CONF_INT, "100", 1, 60000,
     "First reconnect delay; doubles per attempt up to `nats.reconnect_max_wait_ms`."},
    {"nats.reconnect_max_wait_ms", KB_CONF_INT, "2000", 1, MS_HOUR,
     "Cap on the reconnect delay."},
    {"nats.write_deadline_ms", KB_CONF_INT, "2000", 100, MS_HOUR,
     "How long one write to the server may wait for room in the socket; then the "
     "connection is taken as broken, reopened, and publishes not yet acked are "
     "sent again. Bounds `kb_publish` when the network black-holes packets."},
    {"nats.ping_interval_ms", KB_CONF_INT, "1000", 100, MS_HOUR,
     "Interval of the client's PINGs; a server silent for about three intervals is "
     "taken as gone, as with `nats.write_deadline_ms`."},
    {"nats.token", KB_CONF_SECRET, "", 0, 4096,
     "Authentication token (instead of one in the URL). Never logged."},
    {"nats.token_file", KB_CONF_TEXT, "", 0, 4096,
     "File holding `nats.token` (one final newline dropped), read once by `kb_open`."},
    {"nats.creds_file", KB_CONF_SECRET, "", 0, 4096,
     "User credentials file (JWT and NKey seed)."},
    {"nats.tls_ca", KB_CONF_TEXT, "", 0, 4096,
     "CA certificates file; setting any `nats.tls_*` key turns TLS on."},
    {"nats.tls_cert", KB_CONF_TEXT, "", 0, 4096, "Client certificate file (with `nats.tls_key`)."},
    {"nats.tls_key", KB_CONF_TEXT, "", 0, 4096, "Client private key file."},
    {"nats.tls_hostname", KB_CONF_TEXT, "", 0, 255,
     "Expected server host name in its certificate."},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL},
};

/* nats://[user:password@ | token@]host[:port][,host[:port]...]: no path, no
 * query. kb_url_parse checked the rest (percent-decoded userinfo, strict
 * decimal ports, each entry of a host list). */
static int nats_check_url(const kb_url *u, char *errstr, size_t errlen)
{
    if (u->host[0] == '\0') {
        kb_errf(errstr, errlen, "transport: nats:// URL without a host");
        return KB_EINVAL;
    }
    if (u->path[0] != '\0' && strcmp(u->path, "/") != 0) {
        kb_errf(errstr, errlen, "transport: nats:// takes no path (\"%.64s\")", u->path);
        return KB_EINVAL;
    }
    if (u->query != NULL) {
        kb_errf(errstr, errlen, "transport: nats:// takes no query (options are nats.* keys)");
        return KB_EINVAL;
    }
    return KB_OK;
}

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
    /* an ENUM key: file or memory, checked when set */
    t->storage = strcmp(kb_conf_str(c, "nats.storage"), "memory") == 0 ? js_MemoryStorage
                                                                        : js_FileStorage;
    t->partitions = (uint32_t)kb_conf_int(c, "partitions");
    t->ack_wait_ms = kb_conf_int(c, "nats.ack_wait_ms");
    t->max_ack_pending = kb_conf_int(c, "nats.max_ack_pending");
    t->fetch_batch = kb_conf_int(c, "nats.fetch_batch");
    t->fetch_expires_ms = kb_conf_int(c, "nats.fetch_expires_ms");
    t->ack_interval_ms = kb_conf_int(c, "nats.ack_interval_ms");
    t->lease_ttl_ms = kb_conf_int(c, "nats.lease_ttl_ms");
    t->topic_consumer = strcmp(kb_conf_str(c, "nats.topic_consumer"), "auto") == 0;
    t->publish_timeout_ms = kb_conf_int(c, "nats.publish_timeout_ms");
    t->dup_window_ms = kb_conf_int(c, "nats.dup_window_ms");
    t->replicas = (int)kb_conf_int(c, "nats.replicas");
    t->reconnect_wait_ms = kb_conf_int(c, "nats.reconnect_wait_ms");
    t->reconnect_max_ms = kb_conf_int(c, "nats.reconnect_max_wait_ms");
    t->enqueue_timeout_ms = kb_bus_enqueue_timeout_ms(t->bus);
    t->max_attempts = (uint32_t)kb_conf_int(c, "retry.max_attempts");
    t->max_headers = (size_t)kb_conf_int(c, "limits.max_headers");
    t->max_header_bytes = (size_t)kb_conf_int(c, "limits.max_header_bytes");
    t->max_key_bytes = (size_t)kb_conf_int(c, "limits.max_key_bytes");
    t->max_payload_bytes = (size_t)kb_conf_int(c, "limits.max_payload_bytes");
    t->batch_events = (uint32_t)kb_conf_int(c, "nats.publish_batch");
    t->publish_max_pending = kb_conf_int(c, "nats.publish_max_pending");
    t->linger_ns = kb_conf_int(c, "nats.publish_linger_us") * 1000;
    snprintf(t->id, sizeof t->id, "%s", kb_conf_str(c, "consumer"));
    snprintf(t->group, sizeof t->group, "%s", kb_conf_str(c, "group"));
    t->start_latest = strcmp(kb_conf_str(c, "group.start"), "latest") == 0;
    snprintf(t->bucket, sizeof t->bucket, "%s", kb_conf_str(c, "nats.lease_bucket"));
    if (!group_ok(t->group)) {
        kb_errf(errstr, errlen, "group \"%s\": nats:// allows only letters, digits, '-', '_' "
                 "and '=' (it names JetStream consumers and KV keys)", t->group);
        return KB_EINVAL;
    }
    snprintf(t->bus_id, sizeof t->bus_id, "%016" PRIx64, kb_bus_random(t->bus));
    return KB_OK;
}

static int nats_close(kb_transport *t, int64_t deadline);

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
    pthread_rwlock_init(&t->pub_lock, NULL);
    pthread_mutex_init(&t->tally_mu, NULL);
    pthread_mutex_init(&t->kv_lock, NULL);
    pthread_mutex_init(&t->watch_mu, NULL);
    t->resent = kb_signal_new();
    t->nc_event = kb_signal_new();
    t->lease_wake = kb_signal_new();
    t->acker_wake = kb_signal_new();
    t->acked = kb_signal_new();
    t->flight = kb__nats_flight_new();
    kb_url_redact(kb_conf_str(c, "transport"), t->url_safe, sizeof t->url_safe);
    int rc = KB_OK;
    if (t->resent == NULL || t->nc_event == NULL || t->lease_wake == NULL ||
        t->acker_wake == NULL || t->acked == NULL || t->flight == NULL) {
        kb_errf(errstr, errlen, "nats: out of memory");
        rc = KB_ENOMEM;
    }
    if (rc == KB_OK)
        rc = configure(t, c, errstr, errlen);
    if (rc == KB_OK)
        rc = kb__nats_connect(t, c, errstr, errlen);
    if (rc == KB_OK)
        rc = kb__nats_acker_start(t, errstr, errlen);
    if (rc == KB_OK)
        rc = kb__nats_leaser_start(t, errstr, errlen);
    if (rc != KB_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", errstr != NULL && errlen > 0 ? errstr : kb_last_error());
        nats_close(t, kb_deadline_ns(2000));
        kb_errf(errstr, errlen, "%s", why);
        return rc;
    }
    *out = t;
    return KB_OK;
}

static int nats_topic_open(kb_transport *t, const char *topic, kb_transport_topic **out,
                           char *errstr, size_t errlen)
{
    kb_kit_backlog *backlog = kb__nats_backlog_new(t, errstr, errlen);
    return backlog != NULL ? kb__nats_topic_new(t, topic, backlog, out, errstr, errlen)
                           : KB_ENOMEM;
}

static int leaser_done(void *arg)
{
    return atomic_load(&((kb_transport *)arg)->leaser_done);
}

/* Both connections reported closed (the consumer's if it was made). */
/* nats.c's closed callbacks have run and the membership watch's last
 * message callback has returned: no callback of nats.c touches t again. */
static int nc_closed(void *arg)
{
    kb_transport *t = arg;
    return atomic_load(&t->nc_closed) &&
           (atomic_load(&t->feed_nc) == NULL || atomic_load(&t->feed_closed)) &&
           kb__nats_watch_done(t);
}

/* 1/parts of the time left before deadline for one wait on nats.c: 2 s
 * without a deadline, at least 1 ms. */
static int close_share_ms(int64_t deadline, int parts)
{
    int left = kb_deadline_left_ms(deadline);
    return left < 0 ? 2000 / parts : left / parts > 0 ? left / parts : 1;
}

/* Every step shares the caller's deadline, also when the server answers
 * nothing: the lease thread gets until then to leave its loop; the last acks,
 * lease releases and publish acks wait only for the time left, and are
 * skipped once it is gone; closing the connection unblocks whatever still
 * waits on nats.c. */
static int nats_close(kb_transport *t, int64_t deadline)
{
    kb__nats_stop(t);
    atomic_store(&t->closing, 1);
    kb_signal_notify(t->acker_wake);
    kb_signal_notify(t->lease_wake);
    kb_thread_join(t->acker);   /* its tick does no round trip */
    bool leaser_out = t->leaser == NULL || kb_signal_wait(t->lease_wake, leaser_done, t, deadline);
    int rc = KB_OK;
    char why[512] = "";
    if (t->js != NULL && leaser_out && kb_now_ns() < deadline) {
        kb__nats_ack_pass(t, true);   /* the last frontier acks and progress records */
        /* Acks on the consumer's connection, progress records on nc. A
         * consumer's connection that is not up gets no share of the deadline
         * (its acks are lost either way), a slow one a quarter: nc's flush and
         * the lease releases must still have time. */
        natsConnection *feed = atomic_load(&t->feed_nc);
        natsStatus s = NATS_OK;
        if (feed != NULL && natsConnection_Status(feed) != NATS_CONN_STATUS_CONNECTED)
            s = NATS_CONNECTION_DISCONNECTED;
        else if (feed != NULL)
            s = natsConnection_FlushTimeout(feed, close_share_ms(deadline, 4));
        natsStatus s_nc = natsConnection_FlushTimeout(t->nc, close_share_ms(deadline, 1));
        if (s == NATS_OK)
            s = s_nc;
        if (s != NATS_OK)   /* not an error of kb_close: docs/transports-nats.md */
            kb_log(t->bus, KB_LOG_WARNING, "nats %s: the last acks may be lost (no answer to "
                   "the PING behind them: %s); their events come again to the next owner",
                   t->url_safe, kb__nats_reason(s));
        kb__nats_lease_release_all(t, deadline);   /* after the acks: the next owner starts there */
    }
    if (t->js != NULL) {
        /* past the deadline: one short best-effort attempt */
        int64_t until = kb_now_ns() < deadline ? deadline : kb_deadline_ns(50);
        if ((rc = kb__nats_flush_until(t, until)) != KB_OK)
            snprintf(why, sizeof why, "%s", kb_last_error());
    }
    bool closed = t->nc == NULL;
    if (atomic_load(&t->feed_nc) != NULL)
        natsConnection_Close(atomic_load(&t->feed_nc));
    if (t->nc != NULL) {
        natsConnection_Close(t->nc);   /* the lease thread's requests return now */
        /* nats.c's closed callback is the last one: then t may go */
        closed = kb_signal_wait(t->nc_event, nc_closed, t,
                                deadline > kb_now_ns() ? deadline : kb_deadline_ns(1000));
    }
    /* The lease thread may still be inside a KV call when the deadline cut
     * its wait short: nothing it uses (KV, JetStream, the connection) goes
     * before it has left. Its calls fail at once on the closed connection. */
    kb_thread_join(t->leaser);
    /* nats.c does not join the threads of its publish-ack and disconnected
     * callbacks: one under way may still hold an item of a backlog, and one
     * for an ack nats.c took before the take-back is still to come */
    kb__nats_take_back_all(t);
    bool quiet = kb__nats_pub_cbs_end(t, deadline > kb_now_ns() ? deadline
                                                                : kb_deadline_ns(1000));
    /* what close gives up on is reported failed before it returns */
    char gave_up[700];
    if (why[0])
        snprintf(gave_up, sizeof gave_up, "kb_close gave up: %s", why);
    else
        snprintf(gave_up, sizeof gave_up, "kb_close gave up: nats %s unreachable at close",
                 t->url_safe);
    uint64_t unsent = 0;
    for (kb_nats_topic *tp = atomic_load(&t->topics); tp; tp = tp->next)
        unsent += kb__nats_send_close(tp, gave_up);
    kb__nats_batch_give_up(t, gave_up);
    kvStore_Destroy(t->kv);
    kb__nats_runs_close(t);
    jsCtx_Destroy(t->js);
    jsCtx_Destroy(t->js_round);
    natsSubscription_Destroy(t->inbox_sub);
    natsSubscription_Destroy(t->probe_sub);
    natsSubscription_Destroy(t->kv_sub);
    free(t->kv_late);
    natsSubscription_Destroy(t->watch_sub);
    if (closed)
        kb__nats_watch_free(t);
    natsConnection_Destroy(atomic_load(&t->feed_nc));
    natsOptions_Destroy(t->feed_opts);
    free(t->creds_file);
    natsConnection_Destroy(t->nc);
    for (kb_nats_topic *tp = atomic_load(&t->topics), *next; tp; tp = next) {
        next = tp->next;
        if (atomic_load(&tp->unowned))
            kb_log(t->bus, KB_LOG_NOTICE,
                   "nats %s: %s: %llu queued events released unhandled after a lost lease",
                   t->url_safe, tp->name, (unsigned long long)atomic_load(&tp->unowned));
        unsent += kb__nats_topic_free(t, tp);
    }
    for (size_t i = 0; i < KB_NATS_TOPIC_CHUNKS; i++)
        free(atomic_load(&t->topic_chunks[i]));
    kb_signal_free(t->resent);
    if (closed)   /* else the watch may still kick the lease thread */
        kb_signal_free(t->lease_wake);
    kb_signal_free(t->acker_wake);
    kb_signal_free(t->acked);
    pthread_mutex_destroy(&t->tally_mu);
    pthread_mutex_destroy(&t->kv_lock);
    if (closed)
        pthread_mutex_destroy(&t->watch_mu);
    pthread_rwlock_destroy(&t->pub_lock);
    kb__nats_flight_free(t->flight);
    pthread_mutex_destroy(&t->topics_lock);
    pthread_mutex_destroy(&t->sub_lock);
    if (closed)
        kb_signal_free(t->nc_event);
    if (closed && quiet)
        free(t);
    else   /* nats.c may still run our closed or a publish ack's callback: leave it t */
        kb_log(NULL, KB_LOG_WARNING, "nats: %s", closed ? "a publish ack's callback did not "
               "come in time" : "the connection did not report closed in time");
#if defined(__GLIBC__)
    malloc_trim(0);   /* claims' rings and topics: give the pages back */
#endif
    if (unsent > 0) {
        kb_errf(NULL, 0, "nats: %llu published events never sent (%s)", (unsigned long long)unsent,
                why[0] ? why : "server unreachable at close");
        return KB_ETRANSPORT;
    }
    if (rc != KB_OK)   /* the last flush did not end in time */
        kb_errf(NULL, 0, "%s", why);
    return rc;
}

const kb_transport_ops kb__nats_ops = {
    .abi_version = KB_TRANSPORT_ABI,
    .scheme = "nats",
    .flags = KB_TRANSPORT_F_SINGLE_FEEDER | KB_TRANSPORT_F_HEADERS,   /* one feeder per bus */
    .props = nats_props,
    .check_url = nats_check_url,
    .open = nats_open,
    .topic_open = nats_topic_open,
    .publish = kb__nats_publish,
    .subscribe = kb__nats_subscribe,
    .ack = kb__nats_ack,
    .dead_letter = kb__nats_dead_letter,
    .release = kb__nats_release,
    .still_owned = kb__nats_still_owned,
    .run_begins = kb__nats_run_begins,
    .flush = kb__nats_flush,
    .drain = kb__nats_drain,
    .stats = kb__nats_stats,
    .partition_stats = kb__nats_partition_stats,
    .dead_letters = kb__nats_dead_letters,
    .dead_letter_replay = kb__nats_dead_letter_replay,
    .dead_letter_delete = kb__nats_dead_letter_delete,
    .stop = kb__nats_stop,
    .close = nats_close,
    .groups = kb__nats_groups,
    .group_delete = kb__nats_group_delete,
    .topics = kb__nats_topics,
    .peek = kb__nats_peek,
};
