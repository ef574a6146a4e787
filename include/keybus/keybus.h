/*
 * keybus: an in-process keyed worker pool used as an event bus, with pluggable
 * transports (mem://, redis://, nats://).
 *
 * Conventions for every function below:
 *   - Returns KB_OK (0) or a negative KB_E* code; kb_strerror() names it.
 *   - Calls that take `char *errstr, size_t errlen` write a NUL-terminated
 *     message naming the problem on failure (errstr may be NULL).
 *   - "Thread: any" means the call may be made from any thread at any time,
 *     concurrently with any other "any" call on the same object.
 *   - Closing: every call that takes a kb_bus, or a kb_topic of it, may run
 *     concurrently with kb_close on that bus. A call that begins once kb_close
 *     has begun returns KB_ECLOSED (kb_topic_get: NULL), its text saying so,
 *     unless its arguments are wrong first (KB_EINVAL, or KB_ENOTFOUND for a
 *     mem:// topic nobody subscribed);
 *     kb_close waits for the calls already in progress to return before it
 *     frees anything. A call that begins after kb_close has *returned* is
 *     undefined behaviour (use after free), even one a thread was about to
 *     make when kb_close started: the application must know every other
 *     thread has made its last call by the time kb_close returns (joined it,
 *     or saw it receive KB_ECLOSED and stop, before kb_close returned).
 */
#ifndef KEYBUS_KEYBUS_H
#define KEYBUS_KEYBUS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KB_EXPORT __attribute__((visibility("default")))
#else
#define KB_EXPORT
#endif

#define KB_VERSION_MAJOR 0
#define KB_VERSION_MINOR 1
#define KB_VERSION_PATCH 0
#define KB_VERSION_STRING "0.1.0"
/* One number that compares in release order: 0xMMmmpp (0.1.0 is 0x000100). */
#define KB_VERSION_NUM ((KB_VERSION_MAJOR << 16) | (KB_VERSION_MINOR << 8) | KB_VERSION_PATCH)

typedef struct kb_conf kb_conf;
typedef struct kb_bus kb_bus;
typedef struct kb_topic kb_topic;

enum {                      /* every call returns KB_OK or a negative code */
    KB_OK = 0,
    KB_EINVAL = -1,         /* bad argument: NULL/empty key or topic, bad config value */
    KB_EFULL = -2,          /* lane stayed full for the whole enqueue timeout */
    KB_ECLOSED = -3,        /* bus closing or closed */
    KB_ETRANSPORT = -4,     /* broker unreachable or protocol error */
    KB_ENOMEM = -5,
    KB_ETOOBIG = -6,        /* key or payload over its configured limit */
    KB_ENOTFOUND = -7,      /* unknown config key, unknown URL scheme, no subscriber (mem) */
    KB_ETIMEDOUT = -8,      /* flush/close deadline passed */
};

/* Static string for a KB_* code ("unknown error" otherwise). Thread: any. */
KB_EXPORT const char *kb_strerror(int code);

/* The version of the library the program runs with, "MAJOR.MINOR.PATCH": a
 * static string, equal to KB_VERSION_STRING when the program was built with
 * the same headers. Thread: any. */
KB_EXPORT const char *kb_version(void);

/* Text naming the problem of this thread's last failed keybus call, for calls
 * that take no errstr (kb_publish, kb_subscribe, ...). Valid until this thread's
 * next failing call. Thread: any (thread-local). */
KB_EXPORT const char *kb_last_error(void);

/* The KB_E* code of this thread's last failed kb_open or kb_topic_get, the
 * calls that return NULL instead of a code (KB_ETRANSPORT: the broker is
 * unreachable or refused; KB_EINVAL: a bad configuration or name; KB_ENOMEM;
 * KB_ECLOSED), KB_OK before any. Only those calls set it: calls that return
 * an int code give it directly. Their text is kb_last_error() until another
 * call fails on this thread. Thread: any (thread-local). */
KB_EXPORT int kb_last_error_code(void);

/* ---------------------------------------------------------------------------
 * Configuration: librdkafka-style key/value pairs, validated on set against one
 * property table (see docs/CONFIGURATION.md). A kb_conf is not thread-safe:
 * one thread builds it, then hands it to kb_open. Once an open bus owns it,
 * it does not change: kb_conf_set and kb_conf_apply_env return KB_EINVAL,
 * and the kb_conf_set_*_cb / kb_conf_set_log setters leave the callback as it
 * is (kb_last_error says so): the bus's threads read it unlocked.
 * ------------------------------------------------------------------------- */

/* New configuration holding every default. Caller owns it: kb_conf_destroy, or
 * pass it to kb_open (which takes it on success). NULL on out of memory. */
KB_EXPORT kb_conf *kb_conf_new(void);

/* Validate and store one value (the string is copied).
 * KB_ENOTFOUND for an unknown key or URL scheme, KB_EINVAL for a bad value. */
KB_EXPORT int kb_conf_set(kb_conf *c, const char *key, const char *value, char *errstr,
                          size_t errlen);

/* Current value of `key` as text, copied into buf (truncated to buflen-1).
 * Secret keys read back as `***` and URLs without their userinfo
 * (docs/CONFIGURATION.md, Secrets); transports read the real values with
 * kb_conf_str. KB_ENOTFOUND for an unknown key. */
KB_EXPORT int kb_conf_get(const kb_conf *c, const char *key, char *buf, size_t buflen);

/* Read an INI file (a regular file; the grammar is in docs/CONFIGURATION.md):
 * top-level `key = value` lines and `[section]` blocks whose keys become
 * `section.key`. A file with `[keybus]` / `[keybus.NAME]` sections is shared
 * with the application: only those sections are read (as the top level and
 * section NAME), the others are left alone. Stops at the first bad line;
 * errstr (and kb_last_error) is `path:LINE: reason`, never quoting a secret. */
KB_EXPORT int kb_conf_load(kb_conf *c, const char *path, char *errstr, size_t errlen);

/* Apply KEYBUS_<KEY> environment variables (dots as underscores, upper case),
 * e.g. KEYBUS_TRANSPORT, KEYBUS_POOL_WORKERS. kb_open calls this itself (unless
 * conf.env is false). Precedence, whatever the order of the calls: defaults <
 * INI file < environment < kb_conf_set. Every value is validated, also one that
 * code overrides. Variables are read with secure_getenv (none in a setuid
 * process). KEYBUS_TRANSPORT_PLUGINS is refused (KB_EINVAL), here and by
 * kb_open even with conf.env false: the environment never chooses code to
 * load. KB_EINVAL on a conf an open bus owns. */
KB_EXPORT int kb_conf_apply_env(kb_conf *c, char *errstr, size_t errlen);

/* Severity of a log line (syslog's numbers). */
typedef enum kb_log_level {
    KB_LOG_ERROR = 3,
    KB_LOG_WARNING = 4,
    KB_LOG_NOTICE = 5,
    KB_LOG_INFO = 6,
    KB_LOG_DEBUG = 7,
} kb_log_level;

/* Log sink for what the bus reports out of band (lost dead letters,
 * reconnects, unknown KEYBUS_* names). `msg` is valid only during the call,
 * one line of well-formed UTF-8 without control characters: text from
 * outside (broker keys and errors, environment names) has every control
 * byte (C0, DEL, C1) and every byte of ill-formed UTF-8 written as \xHH, so
 * a callback may print it as it is. The callback runs on internal threads:
 * it must be thread-safe. Default: lines on stderr for KB_LOG_WARNING and
 * worse, the same text. */
typedef void (*kb_log_fn)(int level, const char *msg, void *opaque);
KB_EXPORT void kb_conf_set_log(kb_conf *c, kb_log_fn fn, void *opaque);

/* Call fn for every key, in the order of docs/CONFIGURATION.md (core keys,
 * then each registered transport's), with its value as kb_conf_get shows it:
 * secrets as `***`, URLs without their userinfo. `key` and `value` are valid
 * only during the call. Thread: the conf's (no other call on it meanwhile). */
typedef void (*kb_conf_each_fn)(const char *key, const char *value, void *opaque);
KB_EXPORT void kb_conf_each(const kb_conf *c, kb_conf_each_fn fn, void *opaque);

/* Write the configuration reference (docs/CONFIGURATION.md, Markdown) to
 * `out`: every key of the core and of the transports registered so far, with
 * type, default, range and doc. The stream stays the caller's. Thread: any. */
KB_EXPORT void kb_conf_write_reference(FILE *out);

/* The outcome of one published event on a broker (librdkafka's delivery
 * report): stored, or failed for good. Strings and bytes are valid only
 * during the callback. */
typedef struct kb_delivery_report {
    const char *topic;
    const void *key;      size_t key_len;
    uint32_t    partition;
    int         result;       /* KB_OK: the broker stored it; else a KB_E* code */
    const char *id;           /* the broker's ID when stored (Redis entry ID, NATS
                                 "<seq>" or "<seq>.<index>" in a frame); "" when failed */
    const char *error;        /* why it failed; "" when stored */
} kb_delivery_report;
typedef void (*kb_delivery_fn)(const kb_delivery_report *r, void *opaque);

/* Call fn exactly once per event kb_publish* accepted on a broker transport
 * (librdkafka's contract): result KB_OK with its ID once the broker stored it
 * (with redis.wait_replicas > 0: once WAIT confirmed it on that many
 * replicas), or a KB_E* code and a reason once it failed for good: refused
 * by the broker (what kb_flush then reports too), a replica shortfall (the
 * reason names the replicas; the event is stored on the primary), dropped
 * for lack of memory (KB_ENOMEM), or given up by kb_close (its deadline, an
 * unreachable broker): those are reported during kb_close, before it
 * returns, on its thread. A failed report means "not confirmed", not "not
 * stored": the broker may have stored an event whose answer was lost, and
 * keeps it. An event sent again after a broken connection is reported once,
 * when it is settled. mem:// reports nothing: its kb_publish result is the
 * outcome. fn runs on a transport thread (or kb_close's), never inside
 * kb_publish, so it must be thread-safe and quick; it may publish (with the
 * backlog full, that fails with KB_EFULL after pool.enqueue_timeout_ms: this
 * thread is the one that makes room; during kb_close, with KB_ECLOSED) but
 * not call kb_close, kb_flush or kb_drain. NULL: no reports (the default). */
KB_EXPORT void kb_conf_set_delivery_cb(kb_conf *c, kb_delivery_fn fn, void *opaque);

/* A transport's connection state, as the application sees it. */
typedef enum kb_state {
    KB_STATE_CONNECTED = 1,     /* first connected, in kb_open */
    KB_STATE_DISCONNECTED = 2,  /* the connection broke; the transport reconnects */
    KB_STATE_RECONNECTED = 3,   /* back, after a DISCONNECTED */
} kb_state;
typedef void (*kb_state_fn)(const char *scheme, kb_state state, const char *reason,
                            void *opaque);

/* Call fn when the transport's connection to its broker changes state, with
 * the scheme ("redis", "nats") and a reason (never a password); valid only
 * during the call. Redis reports its publishing connection, NATS its one
 * connection. fn runs on a transport thread (CONNECTED on kb_open's): it
 * must be thread-safe and quick. NULL: none (the default). */
KB_EXPORT void kb_conf_set_state_cb(kb_conf *c, kb_state_fn fn, void *opaque);

/* Copy of a configuration, or NULL on out of memory. */
KB_EXPORT kb_conf *kb_conf_dup(const kb_conf *c);

KB_EXPORT void kb_conf_destroy(kb_conf *c);

/* ---------------------------------------------------------------------------
 * The bus.
 * ------------------------------------------------------------------------- */

/* Open a bus: apply the environment, connect the transport, start executors.
 * Takes ownership of `c` on success only; on failure the caller still owns it,
 * errstr says why (KB_ETRANSPORT-class failures name the URL, never a
 * password) and kb_last_error_code() gives the class. Thread: any. */
KB_EXPORT kb_bus *kb_open(kb_conf *c, char *errstr, size_t errlen);

/* Stop intake (every call that begins from now on returns KB_ECLOSED, see
 * "Closing" at the top; publishers blocked on a full mem:// lane, kb_flush
 * and kb_drain wake with KB_ECLOSED), wait for the calls in progress on
 * other threads to return (kb_stats and the dead-letter calls finish their
 * round trips, bounded by their own timeouts; a broker publisher waiting for
 * room in the backlog waits up to pool.enqueue_timeout_ms), handle what is
 * queued until `timeout_ms` (< 0: no deadline), ack what was handled, leave
 * the rest unacked on brokers, stop threads, free everything.
 * Returns KB_ETIMEDOUT when the deadline cut the drain short, or the
 * transport's error (KB_ETRANSPORT, text in kb_last_error) when events that
 * kb_publish accepted could not be sent to the broker; each of them has had
 * its failed delivery report by then (kb_conf_set_delivery_cb: the callback
 * runs on this thread, its time on top of the deadline). Call once, from a
 * thread that is not a handler and not inside another keybus call (a
 * dead-letter or log callback): KB_EINVAL there; a second kb_close racing
 * the first returns KB_ECLOSED. `b` is invalid afterwards. */
KB_EXPORT int kb_close(kb_bus *b, int timeout_ms);

/* Metadata carried beside the payload (Kafka headers, CloudEvents attributes,
 * W3C traceparent): up to limits.max_headers per event, names and values
 * together at most limits.max_header_bytes. Kept through retries, dead
 * letters and replay; on brokers readable by other clients (docs/headers.md). */
typedef struct kb_header {
    const char *name;     /* 1..64 bytes of [A-Za-z0-9._-], not starting with
                             "Kb-" or "Nats-" (any case): those are keybus's and NATS's */
    const void *value;    size_t value_len;     /* bytes other than NUL, CR and LF */
} kb_header;

#define KB_MAX_HEADERS 64          /* ceiling of limits.max_headers */
#define KB_MAX_HEADER_NAME 64      /* longest header name */

typedef struct kb_event {
    const char *topic;
    const void *key;      size_t key_len;       /* aggregate ID, bytes */
    const void *payload;  size_t payload_len;
    uint32_t    attempt;                        /* handler runs begun so far + 1: 1 on first
                                                   delivery (docs/transports.md, "Attempts
                                                   are handler runs") */
    const char *id;                             /* transport message ID ("" for mem) */
    const kb_header *headers; size_t n_headers; /* in publish order */
} kb_event;                                     /* valid only during the handler call */

/* Handler results. KB_DECLINE: not taken: the event is given back unhandled,
 * as kb_close gives back what it holds (brokers: left unacknowledged for the
 * group, which hands it out again, here after a hand-over or elsewhere;
 * mem://: dropped). Per-key order holds only when
 * every later event of the key is declined too: it is for a consumer that
 * stops taking events (`keybus consume -n`), not for skipping one. */
enum { KB_HANDLED = 0, KB_RETRY = 1, KB_DEAD = 2, KB_DECLINE = 3 };

/* Runs on an executor thread; never concurrently with another call for the same
 * lane (so never twice at once for one key). Any other result means KB_RETRY.
 * A handler may call kb_publish but not kb_close, kb_flush or kb_drain (they
 * return KB_EINVAL there: they would wait for the handler itself). */
typedef int (*kb_handler_fn)(const kb_event *ev, void *opaque);

/* Why this event is being given up on, for its dead letter (kb_dead_letter's
 * reason): call it in the handler, then return KB_DEAD, or KB_RETRY on the
 * last attempt. printf format; the text is copied (up to 255 bytes). A later
 * call replaces it. KB_EINVAL unless `ev` is the event this thread's handler
 * is running for. Thread: the handler's, during the call. */
KB_EXPORT int kb_event_set_reason(const kb_event *ev, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Route `topic` to `fn`: creates the topic's pool (pool.workers lanes) and, on a
 * broker, starts consuming. One handler per topic: KB_EINVAL if already
 * subscribed. `opaque` is passed through and stays the caller's. KB_ECLOSED
 * once kb_close has begun. Thread: any. */
KB_EXPORT int kb_subscribe(kb_bus *b, const char *topic, kb_handler_fn fn, void *opaque);

/* Copy key and payload and hand them to the transport. mem:// enqueues into the
 * topic's lane, waiting up to pool.enqueue_timeout_ms when it is full
 * (KB_EFULL); KB_ENOTFOUND when nobody subscribed. From a handler, a full
 * lane of the handler's own executor gives KB_EFULL at once: it cannot drain
 * while its executor waits. Brokers pipeline the write and return without
 * waiting for a round trip. Empty payloads are allowed
 * (payload may be NULL only when payload_len is 0). Thread: any. */
KB_EXPORT int kb_publish(kb_bus *b, const char *topic, const void *key, size_t key_len,
                         const void *payload, size_t payload_len);

/* KB_OK when `topic` is a valid topic name (1..200 bytes of [A-Za-z0-9._-],
 * no empty dot-separated part), else KB_EINVAL with errstr naming the
 * problem. For checking names before any connection. Thread: any. */
KB_EXPORT int kb_topic_name_check(const char *topic, char *errstr, size_t errlen);

/* The handle of `topic` on this bus, for publishing without a name lookup
 * per event (librdkafka's rd_kafka_topic_t). The same name gives the same
 * pointer; it stays valid until kb_close, which frees it — the caller never
 * does. A handle can be taken before anyone subscribes: on mem:// publishing
 * through it returns KB_ENOTFOUND until a handler is subscribed. NULL on a
 * bad name, a closing bus (kb_close has begun) or out of memory (errstr says
 * which; kb_last_error_code() gives the code). Thread: any. */
KB_EXPORT kb_topic *kb_topic_get(kb_bus *b, const char *topic, char *errstr, size_t errlen);

/* kb_publish through a handle: the same checks, copies and results, without
 * the topic lookup. Thread: any (handles are shared freely between threads). */
KB_EXPORT int kb_publish_to(kb_topic *t, const void *key, size_t key_len, const void *payload,
                            size_t payload_len);

/* One event to publish (kb_publish_batch; transports receive it too). key and
 * payload are borrowed for the call only. */
typedef struct kb_msg {
    const void *key;      size_t key_len;
    const void *payload;  size_t payload_len;
    uint32_t    hash;     /* kb_fnv1a32(key), computed by keybus: callers leave it 0 */
    const kb_header *headers; size_t n_headers; /* optional (NULL, 0) */
} kb_msg;

/* The broker partition of an aggregate key: kb_fnv1a32(key) % partitions
 * (the `partitions` key; 0 when partitions is 0 or 1). The one rule every transport, plugin
 * and tool routes by, so a key's events share one partition. Thread: any. */
KB_EXPORT uint32_t kb_partition_of(const void *key, size_t key_len, uint32_t partitions);
/* The same from the key's kb_fnv1a32 (kb_msg.hash in a transport's publish). */
KB_EXPORT uint32_t kb_partition_of_hash(uint32_t hash, uint32_t partitions);

/* kb_publish_to for one event with headers: the same checks and results, and
 * KB_ETOOBIG / KB_EINVAL for headers over limits.max_headers or
 * limits.max_header_bytes, or with a bad name or value. Copies everything.
 * Thread: any. */
KB_EXPORT int kb_publish_ex(kb_topic *t, const kb_msg *m);

/* Publish msgs[0..n) in order, as n kb_publish_to calls would, but cheaper:
 * on mem:// consecutive events of one lane are pushed together and each lane
 * is scheduled, and its executor woken, at most once per call; brokers
 * pipeline the writes (Redis) or pack them into frames (NATS). Per-key order
 * holds within and across batches. Stops at the first event that fails
 * (a bad key, KB_ETOOBIG, or a lane still full after pool.enqueue_timeout_ms)
 * and returns its error; *accepted (may be NULL) receives how many were taken,
 * always a prefix, so msgs[*accepted..n) can be sent again without loss or
 * reordering. The array and what it points to stay the caller's. Thread: any. */
KB_EXPORT int kb_publish_batch(kb_topic *t, const kb_msg *msgs, size_t n, size_t *accepted);

/* mem: wait until everything published before the call is handled (or
 * dead-lettered); brokers: until every publish so far is accepted by the
 * server (durable; nothing about handling). KB_ETIMEDOUT at the deadline
 * (< 0: none). KB_ECLOSED when kb_close begins before or during the wait
 * (kb_close then handles or reports what is queued itself). KB_EINVAL from
 * a handler. On KB_ETIMEDOUT and KB_ECLOSED kb_last_error says so first
 * ("kb_flush: 300 ms deadline passed"), then, when the transport said
 * anything, what it still held ("4480 publishes not yet confirmed by
 * HOST:PORT, kept to be sent again; connection lost: ..."), as kb_drain
 * does; a call that succeeds leaves kb_last_error as it was. Thread: any
 * but a handler. */
KB_EXPORT int kb_flush(kb_bus *b, int timeout_ms);

/* Wait until every event this process published before the call has been
 * handled or dead-lettered by the topic's consumers, wherever they run — the
 * same meaning on every transport. mem: this process's lanes; brokers: the
 * consumer group has acknowledged, per partition, everything up to this
 * process's last published entry (so it also waits for consumers in other
 * processes, and for a consumer to exist). Use kb_flush to know events are
 * safely stored, kb_drain to know they were processed (tests, batch jobs,
 * a clean hand-over before exit). KB_ETIMEDOUT at the deadline (< 0: none);
 * KB_ECLOSED when kb_close has begun, also when it begins during the wait
 * (this process will handle nothing more: waiting on could only hold
 * kb_close up); KB_EINVAL from a handler. Thread: any but a handler. */
KB_EXPORT int kb_drain(kb_bus *b, int timeout_ms);

/* ---------------------------------------------------------------------------
 * Statistics.
 * ------------------------------------------------------------------------- */

typedef struct kb_topic_stats {
    /* this process's pool for the topic (zero when not subscribed here) */
    uint64_t received;        /* events that entered the pool */
    uint64_t handled;         /* handler returned KB_HANDLED */
    uint64_t retried;         /* handler asked for a retry */
    uint64_t dead_lettered;   /* gave up: KB_DEAD or retry.max_attempts */
    uint64_t rejected;        /* enqueues refused with KB_EFULL */
    uint64_t depth;           /* events queued now, over all lanes */
    uint64_t max_depth;       /* deepest any lane has been */
    uint32_t lanes;           /* pool.workers */
    uint32_t lanes_allocated; /* lanes that hold a ring (allocated on first use) */
    uint64_t lane_memory_bytes;  /* lane table plus allocated lanes and rings */
    uint64_t dead_letters_lost;  /* dead letters not stored, or dropped from a full
                                    store (mem.dlq_capacity); each one is logged */
    /* publishing side and broker (filled by the transport). The unit is
     * events unless said otherwise: on redis:// an entry is one event; on
     * nats:// a JetStream message (a frame) may hold several, and the server
     * counts messages */
    uint64_t published;       /* events accepted by kb_publish* in this process,
                                 dead letters replayed from it included */
    uint32_t partitions;      /* broker partitions (0 on mem://) */
    uint32_t partitions_owned;/* partitions this process consumes now */
    uint64_t broker_length;   /* events stored over all partitions */
    uint64_t broker_pending;  /* delivered but not acked, over all partitions:
                                 events on redis://, messages on nats:// */
    uint64_t broker_lag;      /* not yet delivered to the group: events on
                                 redis://, messages on nats:// */
    uint64_t dlq_length;      /* dead letters stored now (each one event) */
    uint64_t broker_frames;   /* NATS: JetStream messages holding broker_length events
                                 (frames pack several); 0 elsewhere */
    uint64_t broker_trimmed;  /* entries this process found deleted by the broker's
                                 retention (redis.maxlen, stream limits) before they were
                                 handled; each one is logged by ID */
    /* retry.scope = key (zero when not subscribed here) */
    uint64_t set_aside;       /* events set aside now behind their aggregate's retry */
    uint64_t aggregates_waiting;  /* aggregates waiting for a retry now */
} kb_topic_stats;

/* Fill *out for `topic`. Broker figures are read from the broker, so any
 * process that opens the bus sees them, also one that never published or
 * subscribed the topic (a monitor); they cost a round trip, and create or
 * change nothing on the broker. KB_ENOTFOUND when neither the pool nor the
 * transport knows the topic; KB_EINVAL, naming both counts, when the broker
 * stores it with another partition count than this bus's `partitions`;
 * KB_ECLOSED once kb_close has begun. Thread: any. */
KB_EXPORT int kb_stats(kb_bus *b, const char *topic, kb_topic_stats *out);

typedef struct kb_partition_stats {
    uint32_t partition;
    uint64_t length;          /* events stored */
    uint64_t pending;         /* delivered, not acked (unit as broker_pending) */
    uint64_t lag;             /* not yet delivered (unit as broker_lag) */
    uint64_t redelivered;     /* NATS: messages redelivered; Redis: 0 */
    uint32_t consumers;       /* consumers known to the group */
    char     owner[128];      /* consumer holding the lease ("" when none) */
} kb_partition_stats;

/* Broker view of one partition. KB_ENOTFOUND on mem://, for a partition out
 * of range, or for a topic the broker does not have (nothing is created);
 * KB_EINVAL as for kb_stats (another stored partition count); KB_ECLOSED once
 * kb_close has begun. Costs round trips. Thread: any. */
KB_EXPORT int kb_partition_stats_get(kb_bus *b, const char *topic, uint32_t partition,
                                     kb_partition_stats *out);

/* ---------------------------------------------------------------------------
 * Metrics (docs/metrics.md): every figure above, plus histograms of
 * publish-to-handle latency and handler duration, as Prometheus text or as a
 * periodic JSON document.
 * ------------------------------------------------------------------------- */

/* Write the Prometheus text exposition (format 0.0.4) of every topic this bus
 * knows (subscribed, published or looked up here) into buf, NUL-terminated,
 * and set *needed (may be NULL) to its size including the NUL. When it does
 * not fit (len < *needed) nothing useful is in buf and the result is
 * KB_ETOOBIG: call again with a larger buffer (buf may be NULL when len is 0;
 * the size may grow between calls). Broker figures cost round trips, as in
 * kb_stats. The buffer stays the caller's. KB_ECLOSED once kb_close has
 * begun. Thread: any (handlers included). */
KB_EXPORT int kb_metrics_write(kb_bus *b, char *buf, size_t len, size_t *needed);

/* The stats feed: called every stats.interval_ms (0, the default, turns it
 * off) on a thread of the bus with one JSON document (docs/formats.md,
 * "Stats feed") of `json_len` bytes, NUL-terminated, valid only during the
 * call. It may call any keybus function but kb_close (KB_EINVAL there);
 * kb_close waits for a call in progress. */
typedef void (*kb_stats_fn)(kb_bus *b, const char *json, size_t json_len, void *opaque);

/* Set the stats feed callback (NULL: none); `opaque` stays the caller's.
 * Copied by kb_conf_dup. Thread: the conf's builder. */
KB_EXPORT void kb_conf_set_stats_cb(kb_conf *c, kb_stats_fn fn, void *opaque);

/* ---------------------------------------------------------------------------
 * Dead letters: kept by every transport (mem://: a bounded store per topic,
 * mem.dlq_capacity; brokers: a dead-letter stream or subject).
 * ------------------------------------------------------------------------- */

typedef struct kb_dead_letter {
    const char *id;           /* dead-letter entry ID */
    const void *key;      size_t key_len;
    const void *payload;  size_t payload_len;
    uint32_t    partition;
    const char *original_id;
    uint32_t    attempts;
    const char *reason;       /* kb_event_set_reason's text, or why keybus gave up */
    int64_t     time_ms;      /* when it was dead-lettered, Unix time in ms (0: unknown) */
    const kb_header *headers; size_t n_headers;
} kb_dead_letter;             /* valid only during the callback */

typedef int (*kb_dead_letter_fn)(const kb_dead_letter *dl, void *opaque); /* non-zero stops */

/* Walk up to `max` dead letters of `topic`, oldest first, starting after
 * `after_id` (NULL or "" for the start); a topic without dead letters walks
 * none. On a broker, a topic it does not have is KB_ENOTFOUND (nothing is
 * created). The callback may replay the entry it is given. KB_ECLOSED once
 * kb_close has begun. Thread: any. */
KB_EXPORT int kb_dead_letters(kb_bus *b, const char *topic, const char *after_id, size_t max,
                              kb_dead_letter_fn fn, void *opaque);

/* Publish dead letter `id` back to its partition (attempt reset to 1) and remove
 * it from the dead-letter store. KB_ECLOSED once kb_close has begun. Thread: any. */
KB_EXPORT int kb_dead_letter_replay(kb_bus *b, const char *topic, const char *id);

/* Remove dead letter `id` of `topic` from the store without replaying it.
 * KB_ENOTFOUND when there is no such dead letter (or topic, on a broker;
 * nothing is created), KB_EINVAL for an ID that is not the transport's form,
 * KB_ECLOSED once kb_close has begun. Thread: any. */
KB_EXPORT int kb_dead_letter_delete(kb_bus *b, const char *topic, const char *id);

/* Remove the dead letters of `topic`, oldest first, until none is left (one
 * stored meanwhile may be removed too); *removed (may be NULL) receives how
 * many, also when it fails part way. Errors as kb_dead_letter_delete's (a
 * topic without dead letters is KB_OK with 0). Thread: any. */
KB_EXPORT int kb_dead_letters_purge(kb_bus *b, const char *topic, uint64_t *removed);

/* ---------------------------------------------------------------------------
 * Administration: what a broker stores, read without changing it, and
 * removing a consumer group (the operator's commands: `keybus topics`,
 * `groups`, `group-delete`, `peek`). On mem://, which keeps no groups or
 * stored topics, each returns KB_ENOTFOUND, its text naming the transport.
 * ------------------------------------------------------------------------- */

/* One consumer group of a topic. Strings are owned by the array
 * (kb_groups_free). */
typedef struct kb_group_info {
    char     *name;           /* the group (the `group` key of its consumers) */
    uint32_t  partitions;     /* partitions the group exists on */
    uint32_t  leases;         /* of those, partitions whose lease one of the group's
                                 consumers holds now (a live member) */
    uint64_t  pending;        /* delivered, not acked (unit as broker_pending) */
    uint64_t  lag;            /* not yet delivered (unit as broker_lag) */
    size_t    n_consumers;
    char    **consumers;      /* the names of the consumers the broker knows in the
                                 group, sorted (Redis: the group's consumers; NATS:
                                 the holders of its leases) */
} kb_group_info;

/* The consumer groups of `topic`, sorted by name, into a new array *out of
 * *n entries (none: *out NULL, *n 0); the caller frees it with
 * kb_groups_free. Costs round trips; creates or changes nothing.
 * KB_ENOTFOUND on mem:// and for a topic the broker does not store;
 * KB_EINVAL as for kb_stats (redis:// stores the topic with another
 * partition count than this bus's); KB_ECLOSED once kb_close has begun.
 * Thread: any. */
KB_EXPORT int kb_groups(kb_bus *b, const char *topic, kb_group_info **out, size_t *n);
/* Free what kb_groups returned (NULL: nothing). Thread: any. */
KB_EXPORT void kb_groups_free(kb_group_info *groups, size_t n);

/* kb_group_delete's flags. */
#define KB_GROUP_DELETE_F_FORCE 1u   /* delete even while a live member holds a lease */

/* Remove consumer group `group` of `topic` from the broker: its position,
 * pending entries and consumers (the events stay stored). Refused with
 * KB_EINVAL, naming the partition and the holder, while one of the group's
 * consumers holds a partition's lease (a live member would go on consuming
 * into a group that is gone), unless flags has KB_GROUP_DELETE_F_FORCE.
 * KB_ENOTFOUND on mem://, or when the topic or the group does not exist;
 * KB_EINVAL also as for kb_groups. KB_ECLOSED once kb_close has begun.
 * Thread: any. */
KB_EXPORT int kb_group_delete(kb_bus *b, const char *topic, const char *group, unsigned flags);

/* One topic the broker stores. Strings are owned by the array
 * (kb_topics_free). */
typedef struct kb_topic_info {
    char     *name;
    uint32_t  partitions;     /* the topic's stored partition count (0: none recorded) */
    uint64_t  length;         /* entries stored over all partitions: events on
                                 redis://, JetStream messages on nats:// (a frame
                                 holds several events) */
    size_t    n_groups;
    char    **groups;         /* its consumer groups, sorted */
} kb_topic_info;

/* Every topic the broker stores (whatever this bus's `partitions`), sorted
 * by name, into a new array *out of *n entries (none: *out NULL, *n 0);
 * the caller frees it with kb_topics_free. Costs round trips (a scan of the
 * broker's keyspace or stream list); creates or changes nothing.
 * KB_ENOTFOUND on mem://; KB_ECLOSED once kb_close has begun. Thread: any. */
KB_EXPORT int kb_topics(kb_bus *b, kb_topic_info **out, size_t *n);
/* Free what kb_topics returned (NULL: nothing). Thread: any. */
KB_EXPORT void kb_topics_free(kb_topic_info *topics, size_t n);

#define KB_PEEK_MAX 10000   /* the most events one kb_peek hands out */

/* Called by kb_peek per event; the event is valid only during the call
 * (ev->attempt: the run its next delivery would be). Non-zero stops. */
typedef int (*kb_peek_fn)(const kb_event *ev, void *opaque);

/* The next `max` (1..KB_PEEK_MAX) events consumer group `group` (NULL: the
 * `group` key) would be handed on `topic`: first the entries it holds
 * pending (delivered, not acked: what a partition's next owner takes
 * first), then those not yet delivered, each kind oldest first over all
 * partitions (Redis: by entry ID; NATS: by stream sequence). For a group
 * that does not exist, what a new group would get (group.start). Left out:
 * entries keybus would dead-letter on arrival (malformed) and, on NATS,
 * events a progress record says were handled above the group's ack floor.
 * ev->attempt is the run its next delivery would be (Redis: runs recorded
 * + 1; NATS: 1). Reads only: acknowledges, claims and creates nothing,
 * moves no lease, position or delivery count, on any broker. fn runs on
 * the caller's thread after the reads, borrowing the event for the call;
 * it may not call kb_close. KB_ENOTFOUND on mem:// and for a topic the
 * broker does not store; KB_EINVAL for a bad max or group name, and as for
 * kb_groups; KB_ECLOSED once kb_close has begun. Thread: any. */
KB_EXPORT int kb_peek(kb_bus *b, const char *topic, const char *group, size_t max,
                      kb_peek_fn fn, void *opaque);

#ifdef __cplusplus
}
#endif

#endif /* KEYBUS_KEYBUS_H */
