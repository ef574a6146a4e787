/*
 * Writing a transport: the ops table a transport fills, and the SDK the bus
 * offers it. Everything a transport needs is in this header (docs/transports.md
 * walks through examples/transport/, a transport built against the installed
 * headers only). A transport is picked by the scheme of the `transport` URL.
 *
 * Life of a bus, as a transport sees it:
 *   open -> topic_open (once per topic) -> (publish | subscribe | flush | drain |
 *   stats)* -> stop or stop_by -> (ack | dead_letter | release)* while the pools
 *   drain -> close.
 * ack, dead_letter, release, still_owned and run_begins run on executor threads,
 * concurrently with each other and with publish (release also on the
 * kb_close caller's thread, for deliveries never handled); everything else
 * is called from application threads. All hooks of one bus may run concurrently unless
 * said otherwise; the transport serialises its own state.
 *
 * Errors: a hook that fails returns a negative KB_E* code and says why with
 * kb_errf (into its errstr when it has one, and always into kb_last_error).
 */
#ifndef KEYBUS_TRANSPORT_H
#define KEYBUS_TRANSPORT_H

#include <stdarg.h>
#include <stdbool.h>
#include <keybus/keybus.h>
#include <keybus/pool.h>      /* kb_fnv1a32: the partition of a key */

#ifdef __cplusplus
extern "C" {
#endif

/* The ops table's version. A table may say an older version the bus still
 * loads: its ops end where that version's did, and the ones added since read
 * as NULL (docs/transports.md, "Compatibility").
 *   5: the table up to `close`.
 *   6: `stop_by` (stop with kb_close's deadline) and the administration hooks
 *      `groups`, `group_delete`, `topics`, `peek` added at the end. */
#define KB_TRANSPORT_ABI 6
/* The oldest table version kb_transport_register and transport.plugins take. */
#define KB_TRANSPORT_ABI_MIN 5

typedef struct kb_transport kb_transport;              /* the transport's state per bus */
typedef struct kb_transport_topic kb_transport_topic;  /* the transport's state per topic */
typedef struct kb_sink kb_sink;                        /* a topic subscribed in this process */

/* A message handed to a sink, and handed back in ack/dead_letter/release. */
typedef struct kb_delivery {
    const char *topic;
    kb_transport_topic *tt;  /* the topic's state (set by the bus on the way back) */
    const void *key;      size_t key_len;
    const void *payload;  size_t payload_len;
    uint32_t    partition;
    uint32_t    attempt;  /* handler runs so far, this one included (1 = first) */
    const char *id;       /* broker message ID ("" when none) */
    void       *cookie;   /* the transport's own; the bus only carries it */
    const kb_header *headers; size_t n_headers;   /* borrowed, like key and payload */
    unsigned    flags;    /* KB_DELIVERY_F_* */
} kb_delivery;

enum {
    /* The broker handed this event out before (a crash, a hand-over): its
     * earlier runs are on record, so the bus calls run_begins before each
     * of its runs. */
    KB_DELIVERY_F_REDELIVERED = 1u << 0,
};

enum {
    /* Exactly one thread per topic calls kb_sink_deliver, so lanes use the
     * single-producer ring operations. Debug builds check the promise. */
    KB_TRANSPORT_F_SINGLE_FEEDER = 1u << 0,
    /* In-process delivery (mem://): the bus enqueues published events into
     * this process's pools itself, without calling publish — the one fast
     * path the core keeps for a transport. publish and ack may be NULL. */
    KB_TRANSPORT_F_LOCAL = 1u << 1,
    /* publish carries kb_msg headers to the broker and deliveries bring them
     * back; without it the bus refuses events with headers (KB_EINVAL). */
    KB_TRANSPORT_F_HEADERS = 1u << 2,
};

/* ---------------------------------------------------------------------------
 * Configuration properties a transport declares (its `<scheme>.*` keys):
 * kb_conf_set validates them, KEYBUS_* variables reach them and
 * `keybus conf-doc` documents them.
 * ------------------------------------------------------------------------- */
typedef enum kb_conf_type {
    KB_CONF_INT,      /* decimal integer within [min, max] */
    KB_CONF_STR,      /* non-empty text without whitespace, at most `max` bytes */
    KB_CONF_URL,      /* scheme://...; the scheme must name a registered transport */
    KB_CONF_TEXT,     /* any text, possibly empty, at most `max` bytes (paths) */
    KB_CONF_ENUM,     /* one of the '|'-separated words in `choices` */
    KB_CONF_SECRET,   /* like TEXT, but never echoed: messages name the key only */
    KB_CONF_BOOL,     /* `true` or `false` (also `1` or `0`); min 0, max 1 */
} kb_conf_type;

typedef struct kb_conf_prop {
    const char  *name;        /* "<scheme>.<key>" for a transport's keys */
    kb_conf_type type;
    const char  *def;         /* default as text; NULL: computed (core keys only) */
    int64_t      min, max;    /* INT: range; text types: 0 and the longest value */
    const char  *doc;         /* one Markdown paragraph */
    const char  *choices;     /* ENUM: "a|b|c" */
} kb_conf_prop;

/* A transport URL split per RFC 3986, userinfo percent-decoded. Strings are
 * NUL-terminated and owned by the kb_url. */
typedef struct kb_url {
    char    *scheme;      /* "redis" */
    char    *user;        /* NULL when absent */
    char    *password;    /* NULL when absent */
    char    *host;        /* "" when absent; IPv6 without brackets. Several hosts
                           * ("h1:p1,[::1]:p2"): the list as written (the scheme
                           * repeated before an entry, "nats://h1,nats://h2", is
                           * dropped), each entry checked like a single
                           * host[:port], and port 0 */
    int      port;        /* 0 when absent, else 1..65535 */
    char    *path;        /* "" or "/..." */
    char    *query;       /* NULL when absent; text after '?', not decoded */
} kb_url;

typedef struct kb_transport_ops {
    int         abi_version;  /* KB_TRANSPORT_ABI */
    const char *scheme;       /* "mem", "redis", "nats" */
    unsigned    flags;        /* KB_TRANSPORT_F_* */
    const kb_conf_prop *props;   /* this transport's keys, ending with a NULL name; may be NULL */
    /* Optional: transport-specific checks of a parsed `transport` URL, run by
     * kb_conf_set and again by kb_open (e.g. a db number in the path).
     * KB_EINVAL with an errstr naming the part; never quote the password. */
    int  (*check_url)(const kb_url *u, char *errstr, size_t errlen);

    int  (*open)(kb_transport **t, kb_bus *bus, const kb_conf *c, char *errstr, size_t errlen);
    /* Called once per topic name, the first time the bus needs it (kb_topic_get,
     * kb_subscribe, kb_stats, dead-letter calls), serialised by the bus. *out
     * lives until close and is what every per-topic hook receives, so no hook
     * looks a topic up by name. Must not wait for the broker. */
    int  (*topic_open)(kb_transport *t, const char *topic, kb_transport_topic **out,
                       char *errstr, size_t errlen);
    /* Copy what it needs; must not wait for a broker round trip, except
     * once per topic: the first publish (like the first subscribe) may make
     * one bounded round trip to check the partition count the broker
     * stores, and keeps the answer (another count: KB_EINVAL every time;
     * unreachable: asked again next time). m->hash is set. kb_publish_batch calls it once per event, in order, and stops at
     * the first error. NULL only with KB_TRANSPORT_F_LOCAL. */
    int  (*publish)(kb_transport *t, kb_transport_topic *tt, const kb_msg *m);
    /* Start feeding `sink`; the sink lives until close. KB_ETRANSPORT when the
     * consumer cannot start. */
    int  (*subscribe)(kb_transport *t, kb_transport_topic *tt, kb_sink *sink);
    /* Settle a handled delivery. NULL: nothing to acknowledge. ack and
     * dead_letter run on executors, which kb_close joins before close: they
     * must not wait on the broker longer than a short, bounded time (queue
     * the work for a transport thread instead), or kb_close overruns its
     * deadline by that much.
     * Errors: the bus calls nothing else for the delivery after either hook,
     * whatever it returns, so the hook frees the cookie in every case. An ack
     * that fails is logged (a warning with kb_last_error's text) and not
     * retried: the event stays unsettled on the broker and comes back to the
     * group (at least once). A dead_letter that fails is logged the same way
     * and counted in the topic's dead_letters_lost; whether the event then
     * stays unsettled (it runs again) or is settled anyway (it is gone) is
     * the transport's rule to document. A dead letter queued by the hook
     * (KB_OK) whose store fails later is counted with
     * kb_sink_dead_letters_lost. */
    int  (*ack)(kb_transport *t, const kb_delivery *d);
    int  (*dead_letter)(kb_transport *t, const kb_delivery *d, const char *reason);
    /* Optional: the bus gives up on an unhandled delivery at close; leave it
     * unacked so another consumer gets it, and free the cookie. */
    void (*release)(kb_transport *t, const kb_delivery *d);
    /* Send what is buffered; KB_ETIMEDOUT at the deadline (< 0: none). */
    int  (*flush)(kb_transport *t, int timeout_ms);
    /* Optional (NULL: kb_drain waits for this process's pools, as on mem://):
     * send what is buffered, then wait until the consumer group has settled
     * (acked or dead-lettered) every event this process published before the
     * call; KB_ETIMEDOUT at the deadline (< 0: none). */
    int  (*drain)(kb_transport *t, int timeout_ms);
    /* Fill the publishing/broker fields of *out. */
    int  (*stats)(kb_transport *t, kb_transport_topic *tt, kb_topic_stats *out);
    /* Optional hooks (NULL: KB_ENOTFOUND). */
    int  (*partition_stats)(kb_transport *t, kb_transport_topic *tt, uint32_t partition,
                            kb_partition_stats *out);
    int  (*dead_letters)(kb_transport *t, kb_transport_topic *tt, const char *after_id,
                         size_t max, kb_dead_letter_fn fn, void *opaque);
    int  (*dead_letter_replay)(kb_transport *t, kb_transport_topic *tt, const char *id);
    /* Optional: remove dead letter `id` without replaying it (KB_ENOTFOUND
     * when absent; kb_dead_letters_purge calls it per entry). */
    int  (*dead_letter_delete)(kb_transport *t, kb_transport_topic *tt, const char *id);
    /* Optional: called on the executor just before the handler; 0 means this
     * process no longer owns the delivery (lease lost), so it is released
     * unhandled instead. Must be cheap: it runs once per event. */
    int  (*still_owned)(kb_transport *t, const kb_delivery *d);
    /* Optional: called on the executor after still_owned, just before the
     * handler runs a delivery flagged KB_DELIVERY_F_REDELIVERED or retries
     * one (d->attempt > 1): record on the broker, before returning, that run
     * d->attempt of this event began, so a crash inside the handler still
     * counts (the next delivery's attempt is the recorded runs + 1). Rare
     * (after crashes, hand-overs and failed handlers), so one bounded round
     * trip is fine. A failure is the transport's to log: the handler runs
     * anyway, and the bus's crash journal still holds the run
     * (kb_bus_runs_journal). */
    void (*run_begins)(kb_transport *t, const kb_delivery *d);
    /* Stop consuming: no kb_sink_deliver after it returns (the pools are freed
     * later in kb_close). Acks still flow. Required unless
     * KB_TRANSPORT_F_LOCAL or stop_by is set (the bus then calls stop_by
     * instead). */
    void (*stop)(kb_transport *t);
    /* Send what is buffered (acks included), release leases, disconnect and
     * free everything (topic states included), all before `deadline_ns`
     * (kb_now_ns() clock; INT64_MAX: none) even when the broker answers
     * nothing. KB_OK, or an error (its text through kb_errf) when events that
     * publish accepted could not be sent; kb_close then returns it. */
    int  (*close)(kb_transport *t, int64_t deadline_ns);

    /* ---- Added in ABI 6 (a table of ABI 5 ends above: these read NULL) ---- */

    /* Optional: stop, told kb_close's deadline (kb_now_ns() clock; INT64_MAX:
     * none), the same one close gets; when set the bus calls it instead of
     * stop. It returns by the deadline even when the broker answers nothing:
     * a reader blocked in a synchronous call (a blocking read, libpq's
     * PQexec) is woken by shutdown(2) of its socket (SHUT_RDWR) once the
     * deadline comes, then joined. What comes after (the pools draining,
     * close) keeps to the same deadline. */
    void (*stop_by)(kb_transport *t, int64_t deadline_ns);

    /* Optional administration hooks (keybus.h, "Administration"); NULL:
     * not supported, the call returns KB_ENOTFOUND naming the transport. They
     * serve an application call (the operator's commands): a round trip or a
     * few are fine, but nothing on the broker may change but what
     * group_delete removes. Arrays and strings they return are malloc'ed,
     * one block each, and freed by the core with free() (kb_groups_free,
     * kb_topics_free); the core sorts them. */
    /* kb_groups: every group of the topic. KB_ENOTFOUND for a topic the
     * broker does not store. */
    int  (*groups)(kb_transport *t, kb_transport_topic *tt, kb_group_info **out, size_t *n);
    /* kb_group_delete (flags KB_GROUP_DELETE_F_*): refuse with KB_EINVAL
     * while a consumer of the group holds a lease, unless forced. */
    int  (*group_delete)(kb_transport *t, kb_transport_topic *tt, const char *group,
                         unsigned flags);
    /* kb_topics: every topic the broker stores. */
    int  (*topics)(kb_transport *t, kb_topic_info **out, size_t *n);
    /* kb_peek: `group` is never NULL (the core puts the `group` key in),
     * max is 1..10000; fn is called on the caller's thread, with no lock of
     * the transport held. */
    int  (*peek)(kb_transport *t, kb_transport_topic *tt, const char *group, size_t max,
                 kb_peek_fn fn, void *opaque);
} kb_transport_ops;

/* Make a transport available by its scheme (built-ins are registered already).
 * `ops` must outlive the process's use of keybus; a table of an older ABI
 * (KB_TRANSPORT_ABI_MIN and up) is read only as far as that version's ops
 * go. KB_EINVAL on a bad table, an ABI outside KB_TRANSPORT_ABI_MIN ..
 * KB_TRANSPORT_ABI, or a scheme already taken. Thread: any. */
KB_EXPORT int kb_transport_register(const kb_transport_ops *ops);

/* The table of the transport `scheme` names (built-in, registered or loaded
 * by transport.plugins; case-insensitive), or NULL. It is the bus's view of
 * the table, always of KB_TRANSPORT_ABI: the ops a table of an older ABI
 * lacks read NULL, so a tool tells which optional hooks a transport has
 * (keybus-contract does). Lives as long as the process. Thread: any. */
KB_EXPORT const kb_transport_ops *kb_transport_find(const char *scheme);

/* A transport built as a shared object exports this symbol; the
 * `transport.plugins` key dlopens each listed file, calls it and registers
 * the table it returns (its abi_version is checked). */
#define KB_TRANSPORT_PLUGIN_ENTRY "kb_transport_plugin"
typedef const kb_transport_ops *kb_transport_plugin_fn(void);

/* ---------------------------------------------------------------------------
 * Sinks: handing deliveries to the topic's pool.
 * ------------------------------------------------------------------------- */

/* Copy the delivery (key, payload, id, headers; the cookie travels as is) into
 * the topic's pool. Waits while the lane is full: up to timeout_ms (< 0: until
 * space or close) — a broker loop passes -1 and so stops reading while lanes
 * are full. KB_EFULL, KB_ECLOSED (the delivery stays the transport's),
 * KB_ENOMEM. Thread: the topic's feeder (one thread with
 * KB_TRANSPORT_F_SINGLE_FEEDER, any otherwise). */
KB_EXPORT int kb_sink_deliver(kb_sink *s, const kb_delivery *d, int timeout_ms);

/* As kb_sink_deliver for d[0..n), in order, in chunks of up to 64: a chunk's
 * records go on their lanes together and their lanes are scheduled together,
 * so an executor is usually woken once per chunk, where kb_sink_deliver may
 * wake one per delivery (a broker read of many entries); more often when a
 * chunk spans more than 32 lanes or meets a full lane. timeout_ms is for the
 * call in all (< 0: until space or close, 0: no wait): the call returns by
 * then however many full lanes it meets; with timeout_ms > 0 each lane found
 * full counts once in the topic's `rejected` stat even when it then gets room.
 * *accepted (not NULL) receives how many the pool took, always a prefix:
 * d[*accepted..n) stay the transport's and can be delivered again without
 * loss or reordering. KB_OK when all n were taken, else the error of delivery
 * *accepted (those of kb_sink_deliver; a bad delivery's KB_EINVAL errstr
 * names its index in d). Copies like kb_sink_deliver; d is only read.
 * Thread: as kb_sink_deliver. */
KB_EXPORT int kb_sink_deliver_batch(kb_sink *s, const kb_delivery *d, size_t n, int timeout_ms,
                                    size_t *accepted);

/* Count n dead letters of the sink's topic that the transport failed to
 * store after its dead_letter hook had returned KB_OK (a writer thread that
 * queued them): they go into the topic's dead_letters_lost, as the ones
 * whose hook failed do, and one warning naming the topic and `why` is
 * logged. Thread: any, until close returns. */
KB_EXPORT void kb_sink_dead_letters_lost(kb_sink *s, uint64_t n, const char *why);

/* Sink subscribed to `topic` in this bus, or NULL. Only valid while the caller
 * is inside publish or holds the sink already (mem:// uses this). */
KB_EXPORT kb_sink *kb_bus_sink(kb_bus *b, const char *topic);

/* ---------------------------------------------------------------------------
 * Reports to the application: delivery results and connection state.
 * ------------------------------------------------------------------------- */

/* Non-zero when the application set a delivery callback: a transport keeps
 * what a report needs (the key) only then. Thread: any. */
KB_EXPORT int kb_bus_delivery_wanted(const kb_bus *b);

/* Hand one event's outcome to the application's delivery callback (none
 * set: nothing). Call it exactly once per event accepted by publish, from a
 * transport thread (or from close, for what close gives up on, before it
 * returns), never inside publish and holding no lock publish takes.
 * Thread: any. */
KB_EXPORT void kb_bus_delivery_report(kb_bus *b, const kb_delivery_report *r);

/* An event publish accepted (KB_OK) failed for good later (r->result, a
 * negative KB_E* code; r->error why): reports it as kb_bus_delivery_report
 * does (the one report of this event: do not report it again), and the bus
 * remembers it, so the next kb_flush (or kb_close, when no kb_flush came
 * since) returns r->result with a text counting the failures since the
 * last kb_flush and quoting the latest — unless the transport's own flush
 * or close already failed. A transport that calls it keeps no count of its
 * own. Thread: any transport thread, never inside publish, no lock held
 * (the callback may publish). */
KB_EXPORT void kb_bus_publish_failed(kb_bus *b, const kb_delivery_report *r);

/* Tell the application's state callback that the connection changed (none
 * set: nothing); `reason` never holds a password. Thread: any. */
KB_EXPORT void kb_bus_state_report(kb_bus *b, kb_state state, const char *reason);

/* This process took (gained true; also again after a lapse) or lost/handed
 * back (false) the lease of one partition of `stream` (a stream or subject
 * name, borrowed for the call). Fires the lease_gain / lease_loss trace
 * points (docs/tracing.md). Thread: any. */
KB_EXPORT void kb_bus_lease_changed(kb_bus *b, const char *stream, uint32_t partition,
                                    int gained);

/* ---------------------------------------------------------------------------
 * Handler runs: the crash journal (docs/transports.md, "Attempts are handler
 * runs").
 * ------------------------------------------------------------------------- */

/* A run a dead process was in the middle of: event `id` of `topic`'s
 * `partition`, its run number `attempt`. Strings are borrowed for the call. */
typedef struct kb_run {
    const char *topic;
    uint32_t    partition;
    const char *id;
    uint32_t    attempt;
} kb_run;

/* Record a run on the broker ("at least `attempt` runs"), synchronously:
 * KB_OK, or a KB_E* code (the journal is then left for another process). */
typedef int kb_run_record_fn(void *opaque, const kb_run *run);

/* Start the bus's crash journal: a small file in `runs.dir`, mapped shared,
 * named by the transport's scheme, `broker` (the server, e.g. "host:port/db",
 * no secrets), `group` and `consumer`, locked (flock) while the bus lives.
 * The bus writes in it, with plain stores, the delivery each executor is
 * running (topic, partition, ID, attempt) and clears it when the handler
 * returns, so it survives kill -9 and abort() in the page cache. First,
 * journals of the same scheme, broker and group that no live process holds
 * (dead processes on this host) are adopted: `record` gets each run they were
 * in, and a journal whose runs are all recorded is deleted. Call it once,
 * from open or from the first subscribe, before the transport delivers
 * anything (nats:// does it at the first subscribe, so a bus that only
 * publishes or reads touches no broker state). KB_OK, KB_EINVAL (called
 * twice) or KB_ETRANSPORT (the directory or file cannot be used; errstr
 * names it). Thread: open's or that subscribe's, never two at once. */
KB_EXPORT int kb_bus_runs_journal(kb_bus *b, const char *broker, kb_run_record_fn *record,
                                  void *opaque, char *errstr, size_t errlen);

/* ---------------------------------------------------------------------------
 * Errors and logging.
 * ------------------------------------------------------------------------- */

/* snprintf into errstr (NULL or errlen 0: skipped) and into this thread's
 * kb_last_error text. Thread: any. */
KB_EXPORT void kb_errf(char *errstr, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Forget this thread's last error, before a call whose failure text is read
 * afterwards, so an older error is never taken for its reason. Thread: any. */
KB_EXPORT void kb_err_clear(void);

/* Report through the bus's log callback (printf format). Thread: any. */
KB_EXPORT void kb_log(kb_bus *b, kb_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* `url` with its user and password replaced by `***` (what precedes the '@';
 * without an '@', what follows a ':' in the authority unless it is a port), for messages;
 * truncated to outlen - 1. Returns out. Thread: any. */
KB_EXPORT const char *kb_url_redact(const char *url, char *out, size_t outlen);

/* ---------------------------------------------------------------------------
 * Configuration reads.
 * ------------------------------------------------------------------------- */

/* Typed reads of a key the core or a transport declares: kb_conf_int of an
 * INT key, kb_conf_bool of a BOOL key, kb_conf_str of any other type (a
 * pointer into the conf, valid while it lives). Reading a key that does not
 * exist, or through the wrong function, is a bug in the caller, never read
 * silently: debug builds (without NDEBUG) abort with a message naming the
 * key; other builds log it, set kb_last_error (KB_EINVAL) and return 0,
 * false or "". Thread: any (the conf of an open bus is read-only). */
KB_EXPORT int64_t     kb_conf_int(const kb_conf *c, const char *key);
KB_EXPORT bool        kb_conf_bool(const kb_conf *c, const char *key);
KB_EXPORT const char *kb_conf_str(const kb_conf *c, const char *key);

/* Parse a transport URL (RFC 3986: userinfo percent-decoded, bracketed IPv6,
 * strictly decimal port 1..65535). NULL with KB_EINVAL in errstr naming the
 * part (never the password), or KB_ENOMEM. The caller frees it with
 * kb_url_free. Thread: any. */
KB_EXPORT kb_url *kb_url_parse(const char *url, char *errstr, size_t errlen);
KB_EXPORT void    kb_url_free(kb_url *u);

/* ---------------------------------------------------------------------------
 * Time, threads and waiting.
 * ------------------------------------------------------------------------- */

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC). Thread: any. */
KB_EXPORT int64_t kb_now_ns(void);
/* Deadline `timeout_ms` from now; INT64_MAX for a negative timeout (none). */
KB_EXPORT int64_t kb_deadline_ns(int timeout_ms);
/* Milliseconds left until the deadline, rounded up, at least 0; -1 for
 * INT64_MAX (none). For APIs that take a timeout. */
KB_EXPORT int kb_deadline_left_ms(int64_t deadline_ns);

/* Non-zero once kb_close has begun on `b`. A transport's long waits that
 * serve an application call (kb_drain's) end then with KB_ECLOSED, so
 * kb_close is not held by them. Thread: any, while the bus exists. */
KB_EXPORT int kb_bus_closing(const kb_bus *b);

/* pool.enqueue_timeout_ms as kb_open resolved it: how long a publish waits
 * for room (a lane, a transport's send buffer) before KB_EFULL. The core's
 * keys are the core's to read: a transport asks the bus rather than reading
 * them again. Thread: any, while the bus exists (from ops->open on). */
KB_EXPORT int kb_bus_enqueue_timeout_ms(const kb_bus *b);

/* A wait that serves an application call (kb_flush's, kb_drain's), in
 * slices: calls step(arg, until_ns) with until_ns at most 100 ms ahead and
 * never past deadline_ns (INT64_MAX: none), again while it returns
 * KB_ETIMEDOUT and the deadline has not come, and returns what it returned
 * last — or KB_ECLOSED between slices once kb_close has begun, so kb_close
 * is not held by the wait. Thread: any, while the bus exists. */
KB_EXPORT int kb_bus_wait_sliced(kb_bus *b, int64_t deadline_ns,
                                 int (*step)(void *arg, int64_t until_ns), void *arg);

/* Start a thread named `name` (at most 15 characters: "kb-<scheme>-<job>"),
 * with the process's signals blocked in it. Returns
 * KB_OK or KB_ENOMEM (errno from pthread_create in the text). */
typedef struct kb_thread kb_thread;
KB_EXPORT int  kb_thread_start(kb_thread **th, const char *name, void *(*fn)(void *), void *arg);
/* Join and free it. NULL: nothing. */
KB_EXPORT void kb_thread_join(kb_thread *th);

/* A "something changed" event with deadlines (an eventcount over a futex):
 * waiters re-check their condition after every notify, so notifies may be
 * coalesced and a notify with nobody waiting costs one load. */
typedef struct kb_signal kb_signal;
KB_EXPORT kb_signal *kb_signal_new(void);           /* NULL on out of memory */
KB_EXPORT void       kb_signal_free(kb_signal *s);
/* Call after publishing the change the waiters look for. Thread: any. */
KB_EXPORT void       kb_signal_notify(kb_signal *s);
/* Wait until ready(arg) is true or `deadline_ns` passes; returns ready's last
 * value. Thread: any. */
KB_EXPORT int        kb_signal_wait(kb_signal *s, int (*ready)(void *arg), void *arg,
                                    int64_t deadline_ns);
/* A descriptor that polls readable after kb_signal_notify, for a thread that
 * waits on a broker socket and on the signal at once (poll(2), epoll): an
 * eventfd (non-blocking, close-on-exec), made at the first call and the
 * same afterwards, closed by kb_signal_free. From the first call on every
 * notify also writes it (one system call). The waiter reads it (8 bytes:
 * resets it), then checks its condition, then polls; notifies meanwhile
 * are never lost. >= 0, or KB_ENOMEM (errno's text in kb_last_error).
 * Thread: any. */
KB_EXPORT int        kb_signal_fd(kb_signal *s);

/* ---------------------------------------------------------------------------
 * Small shared mechanisms: one copy each, for every transport.
 * ------------------------------------------------------------------------- */

/* A 64-bit integer mixer (splitmix64's finaliser): spreads close inputs. */
KB_EXPORT uint64_t kb_mix64(uint64_t x);

/* A random 64-bit value from the bus's own generator (seeded at kb_open from
 * getrandom), for jitter and nonces: a transport never calls
 * rand()/random(), whose sequence is the application's. Not for secrets.
 * Thread: any, while the bus exists. */
KB_EXPORT uint64_t kb_bus_random(kb_bus *b);

/* Capped exponential backoff with jitter, in nanoseconds: the step
 * base_ms * 2^failures, capped at max_ms, half of it fixed and half drawn
 * from `rnd` (kb_bus_random), so that retries or reconnects of many lanes
 * and processes do not fire in lockstep. Thread: any. */
KB_EXPORT int64_t kb_backoff_ns(int64_t base_ms, int64_t max_ms, uint32_t failures, uint64_t rnd);

/* Rendezvous (highest-random-weight) ranking of members for a partition:
 * the index in members[0..n) that owns `partition`, or -1 when n is 0. Every
 * process computes the same owner from the same member set, whatever its
 * order (ties go to the smaller name). A member joining takes about 1/(n+1)
 * of the partitions; one leaving moves only its own. */
KB_EXPORT long kb_rendezvous_owner(const char *const *members, size_t n, uint32_t partition);

/* Grow an array to hold at least `need` elements of `elem_size` bytes
 * (doubling). *items and *cap are updated; KB_OK or KB_ENOMEM (the array is
 * unchanged). */
KB_EXPORT int kb_vec_reserve(void **items, size_t *cap, size_t need, size_t elem_size);

/* A set of names as kb_group_info and kb_topic_info hold them: v[0..n), an
 * array of malloc'ed strings (room for cap), each name once. Start it as
 * {0}; hand v and n on to the answer, or free it with kb_names_free. */
typedef struct kb_names {
    char **v;
    size_t n, cap;
} kb_names;
/* Add a copy of name[0..len) unless the set holds it already (a linear
 * search: for the few names of a listing). KB_OK or KB_ENOMEM (the set
 * unchanged). Thread: the set's owner (no other call on it meanwhile), as
 * for the two below. */
KB_EXPORT int kb_names_add(kb_names *s, const char *name, size_t len);
/* Is name[0..len) in the set? */
KB_EXPORT bool kb_names_has(const kb_names *s, const char *name, size_t len);
/* Free the strings and the array (what the set owns); it is empty again. */
KB_EXPORT void kb_names_free(kb_names *s);

/* Headers a transport reads off the wire: KB_OK, or KB_EINVAL / KB_ETOOBIG
 * with kb_last_error naming the header and the rule (`what` starts it). */
KB_EXPORT int kb_headers_check(const kb_header *h, size_t n, size_t max_n, size_t max_bytes,
                               const char *what);
/* A compact form for storing headers: size, write, read back (names and
 * values of `out` point into `src`; out holds n, at most KB_MAX_HEADERS).
 * Only for headers that passed kb_headers_check (names of 1..64 bytes). */
KB_EXPORT size_t kb_headers_packed_size(const kb_header *h, size_t n);
KB_EXPORT void   kb_headers_pack(char *dst, const kb_header *h, size_t n);
KB_EXPORT void   kb_headers_unpack(const char *src, size_t n, kb_header *out);

/* The events of a frame: several events of one partition in one broker
 * message, back to back in publish order, as redis:// and nats:// write them
 * (docs/formats.md). Per event, integers little endian:
 *     u32 key length | key | u32 payload length | payload
 * and in the layout with headers then
 *     u16 header count | per header: u8 name length | name | u32 value length | value
 * What surrounds the events (their count, which layout) is the transport's.
 * One event as kb_frame_event_read finds it; its layout is fixed for good
 * (docs/transports.md, Compatibility). */
typedef struct kb_frame_event {
    const char *key, *payload;     /* point into the frame */
    size_t key_len, payload_len;
    const char *header_block;      /* its encoded headers; NULL in the layout without */
    uint32_t n_headers;            /* headers in header_block (0 without) */
} kb_frame_event;
/* Bytes of m's event; with_headers: with its header block, of headers that
 * passed kb_headers_check. Reads m only. Thread: any (no state). */
KB_EXPORT size_t kb_frame_event_size(const kb_msg *m, bool with_headers);
/* Write m's event at dst, exactly kb_frame_event_size(m, with_headers)
 * bytes (dst and its room are the caller's; m only read). Thread: any, dst
 * not touched by another thread meanwhile. */
KB_EXPORT void kb_frame_event_put(char *dst, const kb_msg *m, bool with_headers);
/* Read the event at p, none of it past end (p <= end required): the
 * byte after it, with *ev pointing into [p, end) (borrowed: valid as long as
 * the frame's bytes), or NULL when its lengths run past end; then *ev may be
 * partly written, so read none of it. An event with key_len 0 is returned
 * like any other: whether that is allowed is the caller's rule. Header
 * names are not checked here (kb_frame_event_headers does). Thread: any,
 * *ev not touched by another thread meanwhile. */
KB_EXPORT const char *kb_frame_event_read(const char *p, const char *end, bool with_headers,
                                          kb_frame_event *ev);
/* The headers of an event that kb_frame_event_read filled (no other ev:
 * header_block is trusted to be as long as it checked): names copied,
 * NUL-terminated, into `names` (max * (KB_MAX_HEADER_NAME + 1) bytes, the
 * caller's), values pointing into the frame (borrowed like *ev); their
 * count, or -1 when over `max` or a name is empty or over
 * KB_MAX_HEADER_NAME bytes (then out and names may be partly written).
 * Thread: any, out and names not touched by another thread meanwhile. */
KB_EXPORT int kb_frame_event_headers(const kb_frame_event *ev, kb_header *out, size_t max,
                                     char *names);

#ifdef __cplusplus
}
#endif

#endif /* KEYBUS_TRANSPORT_H */
