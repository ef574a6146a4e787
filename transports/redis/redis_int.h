/* Redis Streams transport: shared state of its files.
 *
 * Threads and connections (a blocking read never shares a connection):
 *   - publishers: one pipelined connection under pub_lock (redis.c);
 *   - one reader thread and connection for every subscribed topic: one
 *     XREADGROUP reads all owned partitions of all topics (redis_consume.c);
 *   - one keeper thread: heartbeats, leases, batched fenced XACKs, dead letters
 *     (redis_lease.c, redis_dlq.c);
 *   - application calls that need an answer (subscribe, stats, DLQ listing):
 *     the control connection under ctl_lock. */
#ifndef KB_REDIS_INT_H
#define KB_REDIS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include <keybus/transport.h>

#include "../../core/headers.h"
#include "../../core/sync.h"

#define KB_REDIS_ID_MAX 48      /* "ms-seq" of two 64-bit numbers, NUL included */
#define KB_REDIS_TOPIC_BUCKETS 1024   /* topic lookup by name: a chain per fnv1a32 % this */
#define KB_REDIS_BULK_DEFAULT (512 * 1024 * 1024)   /* Redis's default proto-max-bulk-len */

/* Where to connect; the password never reaches a log line or an errstr. */
typedef struct kb_redis_addr {
    char host[256];
    int port;
    char user[128];
    char pass[256];
    int db;
} kb_redis_addr;

/* One connection with reconnect backoff. Not thread-safe: its owner locks. */
typedef struct kb_redis_conn {
    const struct kb_transport *t;
    const char *name;             /* "publish", "consumer", ... for log lines */
    redisContext *c;              /* NULL while down */
    int failures;                 /* consecutive failed connects */
    int64_t next_try_ns;          /* backoff: no connect before this */
    bool was_down;                /* log "reconnected" once it is back */
} kb_redis_conn;

/* An ack or a dead letter waiting for the keeper. */
typedef struct kb_redis_job {
    char id[KB_REDIS_ID_MAX];
    char *dead;                   /* NULL: ack. Else malloc'd dead-letter fields (see dlq) */
    bool again;                   /* keeper: the server refused it for now (LOADING...) */
} kb_redis_job;

typedef struct kb_redis_jobs {
    kb_redis_job *v;
    size_t n, cap;
} kb_redis_jobs;

enum { KB_PART_FREE, KB_PART_OWNED, KB_PART_DRAINING };

/* A partition of a subscribed topic, as this process sees it. */
typedef struct kb_redis_part {
    _Atomic int state;            /* KB_PART_* (keeper writes) */
    _Atomic int64_t deadline_ns;  /* lease valid locally until then (monotonic) */
    _Atomic uint32_t epoch;       /* bumped on each acquisition: consumer re-sweeps */
    _Atomic int64_t inflight;     /* delivered, not yet acked / dead / released */
    uint32_t swept;               /* reader only: epoch whose sweep is done; 0 = sweep due */
    struct kb_redis_wait *waiting; /* reader only: entries read, their lane full (consume.c) */
    uint32_t sweeping;            /* reader only: epoch of a sweep paused on a full lane */
    char sweep_cursor[KB_REDIS_ID_MAX];   /* where that sweep goes on; "" = its last page */
    uint32_t index;               /* N */
    struct kb_redis_topic *rt;
    int64_t renewed_ns;           /* keeper only: last successful renew */
    pthread_mutex_t lock;         /* guards jobs */
    kb_redis_jobs jobs;
    kb_redis_jobs sending;        /* keeper only: taken from jobs, not yet confirmed */
    char stream[300];             /* kb:{topic}:p:N */
    char lease[300];              /* kb:{topic}:lease:N */
} kb_redis_part;

/* A subscribed topic. Linked into t->topics and into its bucket of
 * t->by_name (both push-only until close). */
typedef struct kb_redis_topic {
    struct kb_redis_topic *next;
    struct kb_redis_topic *same_bucket;
    struct kb_transport *t;
    char *name;
    kb_sink *sink;
    uint32_t nparts;
    kb_redis_part *parts;
    char dlq[300];                /* kb:{topic}:dlq */
    char members[300];            /* kb:{topic}:members */
    _Atomic bool fresh;           /* subscribed since the keeper's last pass */
} kb_redis_topic;

/* A topic published to: metadata checked once, count of accepted publishes
 * (replays included), and per partition the ID of the newest entry this
 * process added, "" for none (what kb_drain waits for; under pub_lock). */
typedef struct kb_redis_pubtopic {
    struct kb_redis_pubtopic *next;
    char *name;
    int meta_rc;                  /* KB_OK or why publishing is refused */
    _Atomic uint64_t published;
    char (*last)[KB_REDIS_ID_MAX];
} kb_redis_pubtopic;

/* Where each XADD in flight on the publish connection goes, oldest first:
 * replies come in order, and each one's ID is noted in its topic's `last`. */
typedef struct kb_redis_origin {
    kb_redis_pubtopic *pt;
    uint32_t part;
} kb_redis_origin;

typedef struct kb_redis_origins {
    kb_redis_origin *v;
    size_t head, n, cap;          /* a ring: n entries from head */
} kb_redis_origins;

struct kb_transport {
    kb_bus *bus;
    kb_redis_addr addr;
    char where[300];              /* "host:port" for messages */
    /* configuration */
    uint32_t partitions;
    char group[129];
    char consumer[129];
    char token[160];              /* lease value: consumer + '#' + per-process nonce */
    int connect_timeout_ms, read_timeout_ms, block_ms, batch;
    int64_t maxlen;
    int lease_ttl_ms;
    bool fenced_reads;            /* reads run in a lease-checking script (redis.fenced_reads) */
    int backoff_min_ms, backoff_max_ms;
    uint32_t max_attempts;

    /* publishing */
    pthread_mutex_t pub_lock;
    kb_redis_conn pub;
    uint64_t pub_inflight;        /* sent or buffered, reply not read */
    uint64_t pub_failed;          /* failed since the last flush */
    char pub_error[1024];
    kb_redis_pubtopic *pubtopics;
    kb_redis_origins origins;     /* one per pub_inflight */
    _Atomic bool pub_dirty;       /* buffered bytes the keeper should send */
    size_t pub_big;               /* largest key or payload among unconfirmed publishes */
    int64_t bulk_max;             /* server's proto-max-bulk-len (redis_limit.c) */
    bool bulk_known;              /* read from the server, not assumed */

    /* control */
    pthread_mutex_t ctl_lock;
    kb_redis_conn ctl;

    /* subscribed topics, their reader, and the keeper */
    _Atomic(kb_redis_topic *) topics;
    _Atomic(kb_redis_topic *) by_name[KB_REDIS_TOPIC_BUCKETS];   /* every ack looks one up */
    pthread_t reader;
    bool reader_started;
    kb_redis_conn rconn;          /* the reader's own: blocking reads */
    pthread_mutex_t keeper_lock;
    pthread_cond_t keeper_cond;
    _Atomic uint64_t jobs_queued; /* acks / dead letters waiting for the keeper */
    _Atomic uint64_t dead_queued; /* dead letters not yet stored or dropped */
    _Atomic uint64_t fenced;      /* acks / dead letters refused: lease lost */
    _Atomic uint64_t unowned;     /* deliveries released by still_owned: lease lost */
    _Atomic uint64_t stray;       /* reads that found another consumer's entries: re-swept */
    _Atomic bool consumers_stop, keeper_stop;
    _Atomic bool duties_now;      /* new topics: take their leases without waiting a tick */
    bool keeper_started;
    pthread_t keeper;
    kb_redis_conn kc;
    bool jobs_unsent;             /* keeper only: `sending` left over after a failure */
    /* the keeper settled acks or dead letters on the server (kb_drain and
     * kb_dead_letters wait on it) */
    _Atomic uint64_t settle_rounds;
    kb_signal settled;
};

/* redis_conn.c */
int kb__redis_parse_url(const char *url, kb_redis_addr *a, char *errstr, size_t errlen);
void kb__redis_conn_init(kb_redis_conn *k, const struct kb_transport *t, const char *name);
/* Connected context, or NULL (errstr says why) while down or backing off. */
redisContext *kb__redis_conn_get(kb_redis_conn *k, char *errstr, size_t errlen);
/* Connect now, ignoring the backoff (kb_open, after a wait). */
redisContext *kb__redis_conn_force(kb_redis_conn *k, char *errstr, size_t errlen);
/* Drop a broken context; the next get reconnects after a backoff. */
void kb__redis_conn_fail(kb_redis_conn *k, const char *why);
void kb__redis_conn_close(kb_redis_conn *k);
/* Sleep up to ms, waking early when *stop becomes true. */
void kb__redis_nap(_Atomic bool *stop, int ms);
/* Blocking command on a connection; NULL reply drops the connection. */
redisReply *kb__redis_cmd(kb_redis_conn *k, int argc, const char **argv, const size_t *lens);
int64_t kb__redis_wall_ms(void);

/* redis.c */
int kb__redis_check_meta(struct kb_transport *t, const char *topic);
void kb__redis_pub_pump(struct kb_transport *t, bool wait_all, int64_t deadline_ns);
/* Send every buffered publish and wait for its reply until the deadline:
 * KB_OK, KB_ETIMEDOUT, or KB_ETRANSPORT for what failed since the last call
 * (`who` starts the message). */
int kb__redis_pub_settle(struct kb_transport *t, int64_t deadline_ns, const char *who);
/* An entry this process added outside the publish connection (a replay):
 * counted as published, and its ID noted for kb_drain. */
void kb__redis_pub_note(struct kb_transport *t, const char *topic, uint32_t part, const char *id);
void kb__redis_keeper_wake(struct kb_transport *t);

/* redis_limit.c: the server's proto-max-bulk-len (bulk_max, under pub_lock) */
void kb__redis_limit_read(struct kb_transport *t);
int kb__redis_limit_check(struct kb_transport *t, const char *topic, const kb_msg *m);
void kb__redis_limit_explain(struct kb_transport *t, size_t big, char *out, size_t len);

/* redis_consume.c */
void *kb__redis_consume_main(void *arg);   /* arg: the transport */
/* XGROUP CREATE ... 0 MKSTREAM on every partition (BUSYGROUP is fine). */
int kb__redis_create_groups(kb_redis_conn *k, kb_redis_topic *rt, char *errstr, size_t errlen);

/* redis_lease.c */
void *kb__redis_keeper_main(void *arg);
/* May the consumer hand an entry of this partition to the pool now? */
bool kb__redis_part_live(const kb_redis_part *p);
/* Compare stream IDs "ms-seq" numerically. */
int kb__redis_id_cmp(const char *a, const char *b);

/* redis_dlq.c */
void kb__redis_job_push(kb_redis_part *p, const char *id, char *dead);
/* Fields of a dead letter packed for the keeper (see redis_dlq.c). */
char *kb__redis_dead_pack(const kb_delivery *d, const char *reason);
/* Same for an entry as read (`fields`: the field/value array, or NULL). */
char *kb__redis_dead_pack_raw(const redisReply *fields, uint32_t partition, const char *id,
                              uint32_t attempts, const char *reason);
/* Append the fenced XADD+XACK script for one dead letter; returns commands appended. */
int kb__redis_dead_append(redisContext *c, struct kb_transport *t, kb_redis_topic *rt,
                          kb_redis_part *p, const kb_redis_job *j);
int kb__redis_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason);
int kb__redis_dead_letters(kb_transport *t, const char *topic, const char *after_id, size_t max,
                           kb_dead_letter_fn fn, void *opaque);
int kb__redis_dead_letter_replay(kb_transport *t, const char *topic, const char *id);

/* redis_fields.c */
/* Value of `name` in a flat [name, value, ...] reply (XINFO rows, entry
 * fields), or NULL. */
const redisReply *kb__redis_map_get(const redisReply *m, const char *name);
/* The same, only when the value is a string (entry fields always are). */
const redisReply *kb__redis_field(const redisReply *fields, const char *name);
/* Each header is an entry field "h.<name>" (docs/headers.md). */
#define KB_REDIS_HEADER_PREFIX "h."
#define KB_REDIS_HEADER_BYTES 65536   /* names and values of one entry: as kb_sink_deliver */
#define KB_REDIS_HEADER_FIELD_MAX (KB_MAX_HEADER_NAME + 3)   /* prefix, name, NUL */
/* Append the fields of (checked) headers h[0..n) to argv/lens; `names` holds
 * n * KB_REDIS_HEADER_FIELD_MAX bytes for the prefixed names. Returns the
 * arguments added (2n). */
size_t kb__redis_headers_args(const kb_header *h, size_t n, char *names, const char **argv,
                              size_t *lens);
/* The "h." fields of an entry ([field, value, ...]) as headers, in entry
 * order, pointing into the reply; out holds KB_MAX_HEADERS. KB_OK, or an
 * error when one breaks the kb_header rules: `why` (may be NULL) says which,
 * and out holds what was read (at most KB_MAX_HEADERS). */
int kb__redis_headers_of(const redisReply *fields, kb_header *out, size_t *n, char *why,
                         size_t whylen);

/* redis_drain.c */
int kb__redis_drain(kb_transport *t, int timeout_ms);
/* Wake kb_drain / kb_dead_letters waiters: the keeper settled something. */
void kb__redis_settled(struct kb_transport *t);

/* redis_stats.c */
/* Our group's row of an XINFO GROUPS reply, or NULL. */
const redisReply *kb__redis_group_row(const struct kb_transport *t, const redisReply *groups);
int kb__redis_stats(kb_transport *t, const char *topic, kb_topic_stats *out);
int kb__redis_partition_stats(kb_transport *t, const char *topic, uint32_t partition,
                              kb_partition_stats *out);

kb_redis_topic *kb__redis_topic_find(struct kb_transport *t, const char *name);

#endif /* KB_REDIS_INT_H */
