/* Redis Streams transport: shared state of its files, and the functions each
 * file offers. Layers, top down; a file calls only files below it:
 *
 *   redis.c            ops table, redis.* keys, open, topic_open, stop, close
 *   redis_sentinel.c   redis-sentinel://: the +switch-master listener thread
 *   redis_keeper.c     the keeper thread's loop: one call per job (below)
 *   redis_consume.c    subscribe; the reader thread's loop: read rounds, fenced reads
 *   redis_sweep.c      recovery of a partition just taken (its pending list)
 *   redis_deliver.c    an entry checked and handed to the pool; lane-full waiting
 *   redis_entry.c      an entry read: its event, or why it is a dead letter (pure)
 *   redis_frame.c      the frame layout: events packed in one entry, read and written (pure)
 *   redis_settle.c     ack, dead_letter, release, still_owned; the keeper's send job
 *   redis_runs.c       handler runs recorded on the server; the crash journal; attempts of a sweep
 *   redis_progress.c   which events of a frame are settled: kept, recorded, skipped
 *   redis_dlq.c        dead letters: packed, stored (fenced), listed, replayed
 *   redis_drain.c      kb_drain: wait until the group settled what we added
 *   redis_admin.c      groups, topics, group removal and peek (the operator's)
 *   redis_stats.c      broker figures per topic and partition
 *   redis_publish.c    kb_publish appends XADDs to the backlog; flush; close
 *   redis_batch.c      frames filled on the publish path: events of a partition, one XADD
 *   redis_sender.c     the sender thread: writes the backlog, reads replies, resends
 *   redis_report.c     delivery reports of publishes: kept under pub_lock, sent after
 *   redis_backlog.c    accepted publishes until the server confirmed them; RESP encoding
 *   redis_lease.c      take, renew, hand back partition leases (keeper job)
 *   redis_members.c    membership heartbeat and departed consumers (keeper job)
 *   redis_jobs.c       each partition's queue of acks and dead letters
 *   redis_meta.c       topic metadata and consumer groups on the server
 *   redis_limit.c      the server's proto-max-bulk-len
 *   redis_conn.c       connections: the primary (Sentinels asked), handshake, backoff, cut
 *   redis_url.c        the redis:// and redis-sentinel:// URLs (check_url)
 *   redis_fields.c     replies: field maps, stream IDs, header fields
 *   redis_reply.c      reply objects: one reply in a few blocks it owns
 *
 * Threads and connections (a blocking read never shares a connection):
 *   - publishers append to the backlog (pub_lock) and, when nothing older
 *     waits to be written and at most one XADD awaits its reply, write
 *     theirs themselves without blocking;
 *   - kb-redis-sender: writes the rest of the backlog pipelined on the publish connection,
 *     reads the replies, and after a lost connection resends what was not
 *     confirmed, in order (at least once);
 *   - kb-redis-reader: one XREADGROUP reads all owned partitions of all
 *     subscribed topics, on its own connection;
 *   - kb-redis-keeper: sends fenced XACKs and dead letters,
 *     heartbeats membership, takes and renews leases, on its own connection;
 *   - application calls that need an answer (subscribe, DLQ listing):
 *     the control connection under ctl_lock; kb_stats and
 *     kb_partition_stats_get (the metrics endpoint's collector) on a
 *     connection of their own under stats_lock;
 *   - kb-redis-watch (redis-sentinel:// only): listens for +switch-master
 *     on a Sentinel and cuts the connections to a primary that is no more. */
#ifndef KB_REDIS_INT_H
#define KB_REDIS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include <keybus/transport.h>

#define KB_REDIS_ID_MAX 48      /* "ms-seq" of two 64-bit numbers, NUL included */
#define KB_REDIS_BULK_DEFAULT (512 * 1024 * 1024)   /* Redis's default proto-max-bulk-len */
#define KB_REDIS_KEY_MAX 300    /* kb:{topic}:lease:N for a topic of up to 255 bytes */
#define KB_REDIS_SENTINELS_MAX 16
#define KB_REDIS_MASTER_MAX 128  /* a Sentinel master name, NUL included */
#define KB_REDIS_BATCH_MAX 4096  /* redis.publish_batch's ceiling: events in one frame */
#define KB_REDIS_EVENT_ID_MAX (KB_REDIS_ID_MAX + 6)   /* a frame's event: "<entry ID>.<index>" */
#define KB_REDIS_SKEW_MS 60000
/* Records of entries nobody settles (deleted while pending) go with their
 * hash (runs, frames' progress): a week after its last write. */
#define KB_REDIS_RECORD_TTL_MS "604800000"  /* clock skew between members' hosts tolerated in scores */
/* Lua: OR the bitmap b into field f of the frames' progress hash k and renew
 * its expiry. Bits are only ever set: a bitmap that left an executor before
 * another event's dead letter set that event's bit (the keeper holds a
 * frame's progress behind its dead letters) must not clear it. */
#define KB_REDIS_PROGRESS_OR_LUA                                                                  \
    "local function progress_or(k,f,b) local v=redis.call('hget',k,f) or '' local o={} "          \
    "for i=1,math.max(#v,#b) do "                                                                 \
    "o[i]=string.char(bit.bor(string.byte(v,i) or 0,string.byte(b,i) or 0)) end "                \
    "redis.call('hset',k,f,table.concat(o)) redis.call('pexpire',k," KB_REDIS_RECORD_TTL_MS ") end "
/* A string of a reply longer than its connection's cap (kb_redis_limits.cap),
 * or that would take an entry's fields past kb_redis_limits.entry: kept as
 * its length alone (`integer`, str NULL), never copied. Not a hiredis type:
 * code that looks for REDIS_REPLY_STRING passes it by. */
#define KB_REDIS_REPLY_OVER 100

/* The limits.* an entry read back is held to. `cap`: the longest string a
 * reply of the transport's connections is copied with, the largest of the
 * others (64 KiB at least); `entry`: the bytes of strings copied for the
 * fields of one entry ([id, fields]), key + payload + header bytes + 64 KiB
 * (field names, `a`, a dead letter's own fields). */
typedef struct kb_redis_limits {
    size_t key, payload, headers, header_bytes, cap, entry;
} kb_redis_limits;

/* A host and port: a Sentinel, or the primary it names. */
typedef struct kb_redis_addr {
    char host[256];
    int port;
} kb_redis_addr;

/* One connection with reconnect backoff. Used by one owner at a time (its
 * thread or its lock); only kb__redis_conn_cut may come from another thread. */
typedef struct kb_redis_conn {
    const struct kb_transport *t;
    const char *name;             /* "publish", "consumer", ... for log lines */
    redisContext *c;              /* NULL while down */
    redisContext *connecting;     /* in its handshake: a cut shuts it down too */
    int failures;                 /* consecutive failed connects */
    int64_t next_try_ns;          /* backoff: no connect before this */
    bool was_down;                /* log "reconnected" once it is back */
    int64_t deadline_ns;          /* blocking calls end by then (close); INT64_MAX: none */
    pthread_mutex_t lock;         /* c and gen against kb__redis_conn_cut / _kick */
    _Atomic bool cut;             /* closing: shut down, never reconnected */
    uint32_t gen;                 /* t->primary_gen of the address c is connected to */
} kb_redis_conn;

/* An ack or a dead letter waiting for the keeper. */
typedef struct kb_redis_job {
    char id[KB_REDIS_EVENT_ID_MAX]; /* an entry's; a dead letter's may be a frame's event's */
    char *dead;                   /* NULL: ack. Else malloc'd dead-letter fields (see dlq) */
    uint32_t events;              /* an ack of a frame: its events (their run records go) */
    char *done;                   /* a frame's progress: malloc'd bitmap of its settled
                                   * events (redis_progress.c), else NULL */
    bool again;                   /* keeper: the server refused it for now (LOADING...) */
    bool held;                    /* keeper: a frame's ack or progress waiting this pass for
                                   * a dead letter of one of its events (redis_settle.c) */
} kb_redis_job;

typedef struct kb_redis_jobs {
    kb_redis_job *v;
    size_t n, cap;
} kb_redis_jobs;

enum { KB_PART_FREE, KB_PART_OWNED, KB_PART_DRAINING };

/* Events of a partition waiting to go out as one entry, in the frame
 * layout (redis_frame.c); pub_lock. */
typedef struct kb_redis_pframe {
    char *buf;
    size_t len, cap;
    uint32_t count;
    int64_t first_ns;             /* when its first event came */
    int64_t last_send_ns;         /* when the partition last sent one: quiet since */
} kb_redis_pframe;

/* A frame entry read: its events are deliveries of their own, whose cookie
 * points here; the entry is acked once every one is settled, and stays
 * pending when one was released unsettled. */
typedef struct kb_redis_fstate {
    _Atomic uint32_t refs;        /* events handed out and not settled, + 1 while the reader
                                   * hands them out */
    _Atomic bool released;        /* an event went back unsettled: no ack */
    uint32_t epoch;               /* the lease it was read under */
    uint32_t events;
    char id[KB_REDIS_ID_MAX];
    _Atomic int64_t unrecorded_ns; /* its first event settled since its progress was last
                                   * queued; 0: none (redis_progress.c) */
    _Atomic uint64_t settled[];   /* a bit per event settled (handled or dead-lettered) */
} kb_redis_fstate;

/* A delivery's cookie: a frame's event's is its kb_redis_fstate (aligned),
 * a plain entry's the lease epoch it was read under, tagged in the low bit. */
static inline void *kb__redis_cookie_plain(uint32_t epoch)
{
    return (void *)((uintptr_t)epoch << 1 | 1);
}

static inline kb_redis_fstate *kb__redis_cookie_frame(const void *cookie)
{
    return ((uintptr_t)cookie & 1) ? NULL : (kb_redis_fstate *)(uintptr_t)cookie;
}

/* A partition of a topic, as this process sees it. */
typedef struct kb_redis_part {
    _Atomic int state;            /* KB_PART_* (keeper writes) */
    _Atomic int64_t deadline_ns;  /* lease valid locally until then (monotonic) */
    _Atomic uint32_t epoch;       /* bumped on each acquisition: consumer re-sweeps */
    _Atomic int64_t inflight;     /* delivered, not yet acked / dead / released */
    uint32_t swept;               /* reader only: epoch whose sweep is done; 0 = sweep due */
    struct kb_redis_wait *waiting; /* reader only: entries read, their lane full (deliver.c) */
    bool hot;                     /* reader only: its last read returned entries */
    int64_t warm_ns;              /* reader only: when a read last returned entries of it */
    uint32_t sweeping;            /* reader only: epoch of a sweep paused on a full lane */
    struct {
        kb_redis_fstate *fs;      /* reader only: the frame whose events are being handed out */
        uint32_t next;            /* its first event not handed out */
    } fcur;
    char sweep_cursor[KB_REDIS_ID_MAX];   /* where that sweep goes on; "" = its last page */
    /* reader only: the newest entry handed to the pool (or to the dead
     * letters) under lease `handed_epoch`. A sweep again under the same lease
     * starts after it: what it covers was taken here (claimed again, an event
     * still running or not yet acked would run twice); what of it is
     * released or declined comes again after a hand-over. Unless
     * `sweep_whole`: an event of it must come again now (its dead letter
     * lost), or another consumer's entries were still pending after such a
     * sweep (`sweep_after`, until a read passes its checks): below the
     * mark, as after a failover that lost our claim of them. */
    char handed[KB_REDIS_ID_MAX];
    uint32_t handed_epoch;
    bool sweep_whole;
    bool sweep_after;
    uint32_t index;               /* N */
    struct kb_transport_topic *tt;
    pthread_mutex_t lock;         /* guards jobs */
    kb_redis_jobs jobs;
    kb_redis_jobs sending;        /* keeper only: taken from jobs, not yet confirmed */
    char last_id[KB_REDIS_ID_MAX]; /* newest entry this process added, "" for none (pub_lock) */
    kb_redis_pframe frame;        /* the events to go out next (pub_lock) */
    bool refused;                 /* an XADD of it was refused "not now" on the sender's
                                   * connection, which is being left (pub_lock) */
    char stream[KB_REDIS_KEY_MAX];   /* kb:{topic}:p:N */
    char lease[KB_REDIS_KEY_MAX];    /* kb:{topic}:lease:N */
    char done[KB_REDIS_KEY_MAX + 130]; /* kb:{topic}:done:<group>:N: the group's progress of
                                        * frames (redis_progress.c) */
} kb_redis_part;

/* A topic this bus used: made
 * by topic_open, linked into t->opened; once subscribed also into
 * t->subscribed (both push-only until close). */
struct kb_transport_topic {
    struct kb_transport_topic *opened_next;
    struct kb_transport_topic *sub_next;
    struct kb_transport *t;
    char *name;
    kb_sink *sink;                /* set before the topic joins t->subscribed */
    uint32_t nparts;
    kb_redis_part *parts;
    char dlq[KB_REDIS_KEY_MAX];       /* kb:{topic}:dlq */
    char members[KB_REDIS_KEY_MAX];   /* kb:{topic}:members */
    char meta[KB_REDIS_KEY_MAX];      /* kb:{topic}:meta */
    _Atomic bool subscribed;
    _Atomic bool fresh;           /* subscribed since the keeper's last pass */
    struct kb_redis_leases *leases;   /* keeper only: the kit's lease manager (redis_lease.c) */
    /* publishing: metadata checked once, accepted publishes */
    _Atomic int meta_rc;          /* 1 until checked, then KB_OK or why publishing is refused */
    _Atomic uint64_t published;   /* replays included */
    _Atomic uint64_t trimmed;     /* entries found deleted while pending (redis_sweep.c) */
};

/* One accepted publish: its XADD's bytes in the backlog, its partition (the
 * reply's ID becomes the partition's last_id) and its largest argument. Or,
 * with p NULL, the WAIT the sender queued after `events` of them
 * (redis.wait_replicas); `lost`: some of them were confirmed on a connection
 * that then broke, so its answer on the next one cannot vouch for them. */
typedef struct kb_redis_pubrec {
    kb_redis_part *p;
    size_t len, big;
    uint32_t events;              /* an XADD's: the events in its entry (a frame's n) */
    bool lost;
} kb_redis_pubrec;

/* Bytes of records, filled in order; a record never spans two chunks. */
typedef struct kb_redis_chunk {
    struct kb_redis_chunk *next;   /* the newer one */
    size_t len, cap;               /* bytes of buf used, allocated */
    char buf[];
} kb_redis_chunk;

/* Accepted publishes the server has not confirmed, oldest first (pub_lock):
 * their XADDs back to back in a list of chunks, from `head` in `oldest` to
 * the end of `newest`, written up to `sent` in `sending`; one record each in
 * the ring rec (n from `first`). Replies come in order: each confirms the
 * oldest record. A lost connection rewinds `sent` to `head`. Records never
 * move (a buffer compacted by memmove had cost the publisher a copy of every
 * byte and the page faults of its growth); emptied chunks are kept for reuse,
 * up to the bound's worth. */
typedef struct kb_redis_backlog {
    kb_redis_chunk *oldest, *newest, *sending, *spare;
    size_t spares, spare_max;     /* chunks in spare, and at most (the bound's worth) */
    size_t head, sent;            /* offsets in oldest, in sending */
    size_t held;                  /* bytes of the records */
    kb_redis_pubrec *rec;
    size_t first, n, rcap;
} kb_redis_backlog;

/* One delivery report kept: offsets of its strings in the batch's bytes. */
typedef struct kb_redis_report {
    kb_redis_part *p;
    int result;
    size_t key, key_len, id, why;
} kb_redis_report;

/* Reports kept while pub_lock is held, sent once it is released. */
typedef struct kb_redis_reports {
    kb_redis_report *v;
    size_t n, cap;
    char *bytes;
    size_t len, bcap;
} kb_redis_reports;

struct kb_transport {
    kb_bus *bus;
    kb_url *url;                  /* host, port, user, password (never logged), path */
    int db;
    char where[300];              /* "host:port" (or "master via Sentinel h:p,...") for messages */
    /* redis-sentinel:// (redis_sentinel.c): the primary is asked of the Sentinels */
    bool sentinel;
    char master[KB_REDIS_MASTER_MAX];
    kb_redis_addr sentinels[KB_REDIS_SENTINELS_MAX];
    size_t n_sentinels;
    pthread_mutex_t primary_lock; /* primary, sentinel_first */
    kb_redis_addr primary;        /* as a Sentinel last named it; port 0: not yet */
    size_t sentinel_first;        /* the one that answered last is asked first */
    _Atomic uint32_t primary_gen; /* bumped each time the primary changes */
    kb_thread *watcher;           /* kb-redis-watch */
    _Atomic bool watcher_stop;
    /* configuration */
    uint32_t partitions;
    char group[129];
    const char *group_start;      /* XGROUP CREATE's ID for a new group: "0" or "$" */
    char consumer[129];
    char token[160];              /* lease value: consumer + '#' + per-process nonce */
    int connect_timeout_ms, read_timeout_ms, block_ms, batch;
    int64_t maxlen;
    int lease_ttl_ms;
    bool fenced_reads;            /* reads run in a lease-checking script (redis.fenced_reads) */
    int backoff_min_ms, backoff_max_ms;
    uint32_t max_attempts;
    kb_redis_limits lim;          /* limits.*: entries read are held to them */

    _Atomic(kb_transport_topic *) opened;       /* every topic_open */
    _Atomic(kb_transport_topic *) subscribed;   /* what the reader and the keeper serve */

    /* publishing (redis_publish.c, redis_sender.c) */
    pthread_mutex_t pub_lock;
    kb_redis_backlog backlog;     /* pub_lock */
    size_t buffer_bytes;          /* redis.publish_buffer_bytes: the backlog's bound */
    int publish_batch;            /* redis.publish_batch: events per frame at most */
    int64_t linger_ns;            /* redis.publish_linger_us */
    size_t frames_open;           /* partitions with an open frame (pub_lock) */
    size_t frames_bytes;          /* bytes of the open frames (pub_lock) */
    int64_t frames_due_ns;        /* no open frame is due before (pub_lock) */
    int enqueue_timeout_ms;       /* pool.enqueue_timeout_ms: wait for room, then KB_EFULL */
    _Atomic size_t pub_held;      /* backlog and open frames' bytes, for publishers waiting for room */
    _Atomic uint64_t pub_unconfirmed;   /* backlog records and open frames, for kb_flush */
    uint64_t pub_failed;          /* events refused by the server since the last flush (pub_lock) */
    struct {                      /* a transient refusal: the replies still due are read
                                   * before the connection is left (redis_sender.c; pub_lock) */
        bool on;
        size_t due;               /* records written whole when it came: each is answered */
        size_t answered;          /* records answered since, the refused one first */
        uint64_t ahead;           /* events stored ahead of a refused one of their stream */
        const char *stream;       /* one such stream */
        uint64_t total;           /* such events since kb_open */
    } refusal;
    bool pub_careful;             /* since a transient refusal: one record in flight until
                                   * the server stores one (redis_sender.c; pub_lock) */
    int wait_replicas, wait_timeout_ms;   /* redis.wait_replicas, redis.wait_timeout_ms */
    uint64_t wait_short;          /* stored, but fewer replicas confirmed, since the last flush (pub_lock) */
    uint64_t wait_pending;        /* stored, no WAIT answered since (pub_lock) */
    char wait_error[300];         /* the last shortfall (pub_lock) */
    char pub_error[1024];         /* why the last one was refused (pub_lock) */
    char pub_lost[512];           /* why the publish connection last dropped (pub_lock) */
    /* delivery reports, with a delivery callback (redis_report.c) */
    kb_redis_reports reports;     /* the sender's batch (pub_lock; sent outside it) */
    kb_redis_reports unvouched;   /* stored, reported once a WAIT answers (pub_lock) */
    size_t unvouched_lost;        /* the first ones of them were confirmed on a connection
                                   * lost since: no WAIT can vouch for them (pub_lock) */
    bool pub_down;                /* sender only: DISCONNECTED reported, RECONNECTED not yet */
    kb_signal *pub_progress;      /* records confirmed or failed: flush and room waiters */
    kb_redis_conn pub;            /* the sender's own */
    kb_thread *sender;            /* started by the first publish (pub_lock) */
    int sender_wake[2];           /* a pipe: publishers and close kick the sender's poll */
    _Atomic bool sender_kicked, sender_stop;
    bool sender_busy;             /* it owes a write or awaits replies: it comes back to the
                                   * backlog without a kick (pub_lock) */
    bool pub_direct;              /* the connection is up and rewound: publishers may write
                                   * to it (pub_lock) */
    int64_t direct_since_ns;      /* a publisher's write the sender, idle, has not seen:
                                   * its reply is due from then (pub_lock) */
    _Atomic int64_t sender_deadline_ns;   /* close: connects end by then */
    int64_t bulk_max;             /* server's proto-max-bulk-len (redis_limit.c; pub_lock) */
    size_t frame_max;             /* a frame's body at most, once the server dropped the
                                   * connection over a larger one; 0: none seen (pub_lock) */
    bool bulk_known;              /* read from the server, not assumed (pub_lock) */

    /* control */
    pthread_mutex_t ctl_lock;
    kb_redis_conn ctl;
    /* the figures' own (redis_stats.c): a scrape of many partitions never
     * holds ctl_lock, which dead-lettering and draining take */
    pthread_mutex_t stats_lock;
    kb_redis_conn stats;

    /* the reader */
    kb_thread *reader;
    kb_redis_conn rconn;          /* the reader's own: blocking reads */
    kb_signal *reader_wake;       /* a lease taken, or stop */
    _Atomic uint64_t leases_taken; /* bumped by the keeper for each round that took one */
    _Atomic bool consumers_stop, reader_done;

    /* the keeper */
    kb_thread *keeper;
    kb_redis_conn kc;
    kb_signal *keeper_wake;       /* work queued, a topic subscribed, or stop */
    _Atomic bool keeper_stop, keeper_done;
    _Atomic int64_t close_deadline_ns;   /* what the keeper's goodbye may spend */
    _Atomic uint64_t jobs_queued; /* acks / dead letters waiting for the keeper */
    _Atomic uint64_t dead_queued; /* dead letters not yet stored or dropped */
    _Atomic uint64_t fenced;      /* acks / dead letters refused: lease lost */
    _Atomic uint64_t unowned;     /* deliveries released by still_owned: lease lost */
    _Atomic uint64_t stray;       /* reads that found another consumer's entries: re-swept */
    _Atomic uint64_t forged_members; /* heartbeats that removed members scored in the future */
    _Atomic bool duties_now;      /* new topics: take their leases without waiting a tick */
    bool jobs_unsent;             /* keeper only: `sending` left over after a failure */
    bool check_refused;           /* keeper only: the last lease check before acks was refused */
    /* the keeper settled acks or dead letters on the server (kb_drain and
     * kb_dead_letters wait on it) */
    _Atomic uint64_t settle_rounds;
    kb_signal *settled;
};

/* ---- redis_sentinel.c ---- */
/* Start / stop the +switch-master listener (redis-sentinel:// only). */
int kb__redis_watcher_start(kb_transport *t, char *errstr, size_t errlen);
void kb__redis_watcher_stop(kb_transport *t);

/* ---- redis_consume.c ---- */
int kb__redis_subscribe(kb_transport *t, kb_transport_topic *tt, kb_sink *sink);
/* Stop the reader: no kb_sink_deliver after it returns. */
void kb__redis_consume_stop(kb_transport *t);

/* ---- redis_keeper.c ---- */
int kb__redis_keeper_start(kb_transport *t, char *errstr, size_t errlen);
/* Last acks and dead letters, leases handed back, all before the deadline. */
void kb__redis_keeper_stop(kb_transport *t, int64_t deadline_ns);

/* ---- redis_sweep.c ---- */
enum { KB_REDIS_DELIVERED, KB_REDIS_PART_GONE, KB_REDIS_CLOSING, KB_REDIS_LANE_FULL };
/* Deliver partition `part`'s pending entries (its PEL) under lease `epoch`. */
int kb__redis_sweep(kb_transport_topic *tt, uint32_t part, uint32_t epoch);
/* The sweep script's reply [runs, [cursor, entries, deleted IDs]], read: its
 * parts point into r; `ents` and `gone` NULL when not arrays, `cursor` NULL
 * on the last page. False: not that shape. Pure (tests/fuzz/fuzz_redis_reply.c). */
typedef struct kb_redis_swept {
    const redisReply *runs, *ents, *gone;
    const char *cursor;
} kb_redis_swept;
bool kb__redis_sweep_reply(const redisReply *r, kb_redis_swept *out);

/* ---- redis_deliver.c ---- */
/* Hand one entry ([id, fields]) to the pool: KB_REDIS_* */
int kb__redis_deliver(kb_transport_topic *tt, uint32_t part, const redisReply *e, uint32_t attempt,
                      unsigned flags, uint32_t epoch, int timeout_ms);
/* Hand ents[*next..] over, in runs (one executor wake per run), until one
 * is not taken: KB_REDIS_*, and *next the first entry not handed over (a
 * frame stopped in the middle: p->fcur says where). `runs`: a sweep's
 * recorded runs per entry (kb__redis_sweep_attempt), NULL: 1 each. head_alone: ents[*next]
 * was refused for a full lane before; it goes alone, the runs after it. */
int kb__redis_deliver_run(kb_transport_topic *tt, uint32_t part, const redisReply *ents,
                          size_t *next, const redisReply *runs, unsigned flags, uint32_t epoch,
                          int timeout_ms, bool head_alone);
/* A reply whose entries wait for lane space in one or more partitions. */
typedef struct kb_redis_held kb_redis_held;
kb_redis_held *kb__redis_held_new(redisReply *r);   /* NULL: out of memory (r not taken) */
void kb__redis_held_unref(kb_redis_held *h);
/* Queue ents[from..] behind what waits in p; false when out of memory. */
bool kb__redis_wait_push(kb_redis_part *p, kb_redis_held *h, const redisReply *ents, size_t from,
                         uint32_t epoch, const redisReply *runs);
void kb__redis_wait_drop(kb_redis_part *p);
int kb__redis_wait_deliver(kb_redis_part *p, int timeout_ms);
/* Wait up to ms, until stop or a lease taken since t->leases_taken was `taken`. */
void kb__redis_reader_nap(kb_transport *t, uint64_t taken, int ms);

/* ---- redis_entry.c ---- */
/* An entry ([id, fields]) read: an event, or a dead letter and why. Points into e. */
typedef struct kb_redis_entry {
    const char *id;
    const redisReply *fields;
    const redisReply *key, *payload;   /* an event's */
    kb_header headers[KB_MAX_HEADERS];
    size_t n_headers;
    uint32_t attempt;             /* the event's; a dead letter's attempts so far */
    bool ref;                     /* a dead letter stored as a reference (ID, size, reason):
                                   * a field over its limit is not copied */
    char why[300];                /* a dead letter's reason */
} kb_redis_entry;
enum { KB_REDIS_ENTRY_NONE, KB_REDIS_ENTRY_EVENT, KB_REDIS_ENTRY_DEAD };
/* KB_REDIS_ENTRY_*: NONE for a reply that is no entry (nothing to ack).
 * `attempt`: the run a handler would start, raised by the entry's "a" field;
 * above max_attempts the entry is a dead letter: it ran that often. */
int kb__redis_entry_read(const redisReply *e, uint32_t part, uint32_t nparts, uint32_t attempt,
                         uint32_t max_attempts, const kb_redis_limits *lim, kb_redis_entry *out);
/* A frame's event checked as entries are: KB_REDIS_ENTRY_EVENT with its
 * headers (pointing into ev and out->names), or _DEAD with why. */
typedef struct kb_redis_event {
    kb_header headers[KB_MAX_HEADERS];
    size_t n_headers;
    char names[KB_MAX_HEADERS * (KB_MAX_HEADER_NAME + 1)];
    uint32_t attempt;
    char why[300];
} kb_redis_event;
int kb__redis_event_read(const kb_frame_event *ev, uint32_t part, uint32_t nparts,
                         uint32_t attempt, uint32_t max_attempts, const kb_redis_limits *lim,
                         kb_redis_event *out);

/* ---- redis_frame.c: the frame layout (pure) ---- */
/* A frame's events always carry their header block (kb_frame_event_size and
 * _put with with_headers; kb_frame_event_headers reads the block). */
typedef struct kb_redis_frame {
    const char *p, *end;
    uint32_t left;                 /* events not yet read */
} kb_redis_frame;
/* The next event of a checked frame (or of one being filled); false at its
 * end. */
static inline bool kb__redis_frame_next(kb_redis_frame *f, kb_frame_event *ev)
{
    const char *next = f->left > 0 ? kb_frame_event_read(f->p, f->end, true, ev) : NULL;
    if (next == NULL)
        return false;
    f->p = next;
    f->left--;
    return true;
}
/* Entry fields ([name, value, ...]) of a frame: no "k", an "f". */
bool kb__redis_is_frame(const redisReply *fields);
/* Check a frame's fields: 0 with *f ready, or -1 with why. */
int kb__redis_frame_open(const redisReply *fields, kb_redis_frame *f, char *why, size_t len);

/* ---- redis_batch.c: frames filled on the publish path (caller holds pub_lock) ---- */
/* One XADD's arguments. */
typedef struct kb_redis_args {
    const char *argv[12 + 2 * KB_MAX_HEADERS];
    size_t lens[12 + 2 * KB_MAX_HEADERS];
    char names[KB_MAX_HEADERS * (KB_MAX_HEADER_NAME + 3)];   /* "h." + name, NUL */
    char maxlen[24];
} kb_redis_args;
/* XADD p->stream [MAXLEN ~ n] * and, for m (NULL: none, a frame's fields
 * follow), k, d, a, h.*: the count of arguments. Thread: any. */
int kb__redis_xadd_args(const kb_transport *t, const kb_redis_part *p, const kb_msg *m,
                        kb_redis_args *a);
/* m into p's open frame, sent on when full or after a quiet spell;
 * *opened: it opened a frame that waits (the sender's timer). */
int kb__redis_batch_add(kb_transport *t, kb_redis_part *p, const kb_msg *m, bool *opened);
/* Open frames a linger old (all: every one) into the backlog; when the next
 * one is due (INT64_MAX: none open). */
int64_t kb__redis_frames_due(kb_transport *t, bool all);
/* Every frame in the backlog whose body is over `max` (the server refused
 * it) replaced, in place and order, by entries of its events within `max`
 * (an event larger than that alone, as a plain entry); true when one was.
 * Out of memory: the backlog stays as it was. */
bool kb__redis_frames_split(kb_transport *t, size_t max);
/* Call fn for every event of the open frames (close: reported failed). */
void kb__redis_frames_each(kb_transport *t, void (*fn)(void *arg, kb_redis_part *p,
                                                         const kb_frame_event *ev), void *arg);
/* Bytes and records held, for waiters. */
static inline void kb__redis_pub_counts(kb_transport *t)
{
    atomic_store(&t->pub_held, t->backlog.held + t->frames_bytes);
    atomic_store(&t->pub_unconfirmed, (uint64_t)(t->backlog.n + t->frames_open));
}

/* ---- redis_publish.c ---- */
int kb__redis_publish(kb_transport *t, kb_transport_topic *tt, const kb_msg *m);
int kb__redis_flush(kb_transport *t, int timeout_ms);
/* Wait until the server confirmed every accepted publish or the deadline:
 * KB_OK, KB_ETIMEDOUT (still held, to be sent), or KB_ETRANSPORT for what
 * the server refused since the last call (`who` starts the message). */
int kb__redis_pub_confirmed(kb_transport *t, int64_t deadline_ns, const char *who);
/* At close: send until the deadline, stop the sender; KB_OK, or
 * KB_ETRANSPORT naming the publishes never confirmed. */
int kb__redis_pub_close(kb_transport *t, int64_t deadline_ns);
/* An entry this process added outside the publish connection (a replay):
 * counted as published, and its ID noted for kb_drain. */
void kb__redis_pub_note(kb_transport *t, kb_transport_topic *tt, uint32_t part, const char *id);

/* ---- redis_sender.c ---- */
/* Start the sender (caller holds pub_lock; once). */
int kb__redis_sender_start(kb_transport *t);
/* Wake it: new records, or stop. Thread: any. */
void kb__redis_sender_kick(kb_transport *t);
/* Write the backlog's unsent bytes now from the calling thread, without
 * blocking, when the connection is up (caller holds pub_lock). True when
 * the sender need not be kicked. */
bool kb__redis_sender_write_now(kb_transport *t);
/* Stop it (close, after its wait for confirmations); with records still
 * unconfirmed the server is silent: the connection is cut. */
void kb__redis_sender_stop(kb_transport *t);

/* ---- redis_report.c (a batch is its owner's: under pub_lock, or the sender's) ---- */
/* Room in a batch (zeroed, or in use) for the reports of one XADD of up to
 * `events` events whose keys take up to key_max bytes, kept however it is
 * used; false when out of memory. */
bool kb__redis_reports_init(kb_redis_reports *rs, size_t key_max, size_t events);
/* Keep the reports of the XADD at xadd[0, len) to p, one per event in its
 * entry: `result` KB_OK with the entry's ID, or a KB_E* code and why. False
 * when the batch cannot grow. */
bool kb__redis_report_keep(kb_redis_reports *rs, kb_redis_part *p, const char *xadd, size_t len,
                           int result, const char *id, const char *why);
/* Will report i of `from` fit in rs (it may grow for it)? */
bool kb__redis_reports_fits(kb_redis_reports *rs, const kb_redis_reports *from, size_t i);
/* Copy report i of `from` into rs (it fits), as stored with its ID when
 * result is KB_OK, else failed with `why`. */
void kb__redis_reports_move(kb_redis_reports *to, kb_redis_reports *from, size_t i, int result,
                            const char *why);
/* Hand every report to the application's callback, emptying the batch.
 * Caller holds no lock. */
void kb__redis_reports_send(kb_transport *t, kb_redis_reports *rs);
/* The same, every one failed with `code` and `why` (they were stored, but
 * what they waited for never came). */
void kb__redis_reports_fail(kb_transport *t, kb_redis_reports *rs, int code, const char *why);
/* Report every event of the XADD at xadd[0, len) to p failed at once
 * (close: the sender has stopped, the backlog's bytes stay put). Caller
 * holds no lock. */
void kb__redis_report_now(kb_transport *t, kb_redis_part *p, const char *xadd, size_t len,
                          int code, const char *why);
/* The same for one event of key `key` (an open frame's). */
void kb__redis_report_key(kb_transport *t, kb_redis_part *p, const char *key, size_t key_len,
                          int code, const char *why);
void kb__redis_reports_free(kb_redis_reports *rs);

/* ---- redis_backlog.c (caller holds pub_lock, but for the RESP encoding) ---- */
/* Bytes of one command in the backlog (its RESP encoding). Thread: any. */
size_t kb__redis_backlog_cmd_bytes(int argc, const size_t *lens);
/* Write that encoding of argv/lens at out (kb__redis_backlog_cmd_bytes of
 * room); the end of what it wrote. Thread: any. */
char *kb__redis_cmd_put(char *out, int argc, const char **argv, const size_t *lens);
/* An empty backlog whose emptied chunks are kept for reuse up to `bound` bytes. */
void kb__redis_backlog_init(kb_redis_backlog *bl, size_t bound);
/* Append one XADD (RESP of argv/lens) as a record; false when out of memory. */
bool kb__redis_backlog_add(kb_redis_backlog *bl, kb_redis_part *p, size_t big, int argc,
                           const char **argv, const size_t *lens);
/* The oldest record is confirmed: taken off. */
kb_redis_pubrec kb__redis_backlog_pop(kb_redis_backlog *bl);
/* Append a copy of record r, whose bytes are at `bytes` (another backlog's);
 * false when out of memory. */
bool kb__redis_backlog_copy(kb_redis_backlog *bl, const kb_redis_pubrec *r, const char *bytes);
/* Take off every record whose largest argument exceeds `max` and that
 * `drop` (NULL: all) takes, with its XADD's bytes; the events they held.
 * Needs no memory. */
uint64_t kb__redis_backlog_drop_over(kb_redis_backlog *bl, size_t max,
                                     bool (*drop)(void *arg, const kb_redis_pubrec *r,
                                                  const char *bytes),
                                     void *arg);
/* Call fn for every record, oldest first, with its bytes. */
void kb__redis_backlog_each(const kb_redis_backlog *bl,
                            void (*fn)(void *arg, const kb_redis_pubrec *r, const char *bytes),
                            void *arg);
/* Publishes held (records other than WAITs). */
uint64_t kb__redis_backlog_events(const kb_redis_backlog *bl);
static inline size_t kb__redis_backlog_bytes(const kb_redis_backlog *bl)
{
    return bl->held;
}
/* The next bytes to write, in one chunk: their length in *len (0: all sent). */
const char *kb__redis_backlog_unsent(kb_redis_backlog *bl, size_t *len);
/* `n` of those bytes were written. */
void kb__redis_backlog_wrote(kb_redis_backlog *bl, size_t n);
/* Some bytes written are not confirmed yet: replies are due. */
bool kb__redis_backlog_due(const kb_redis_backlog *bl);
/* A new connection: everything unconfirmed is written again, oldest first. */
void kb__redis_backlog_rewind(kb_redis_backlog *bl);
/* Records written whole since the last rewind, from the oldest: a reply is
 * due for each. */
size_t kb__redis_backlog_written(const kb_redis_backlog *bl);
/* The bytes of the oldest record (n > 0). */
const char *kb__redis_backlog_oldest(const kb_redis_backlog *bl);
void kb__redis_backlog_free(kb_redis_backlog *bl);
/* `id` was added to p by this process: p->last_id is the newest (kb_drain). */
void kb__redis_note_last(kb_redis_part *p, const char *id);

/* ---- redis_settle.c ---- */
int kb__redis_ack(kb_transport *t, const kb_delivery *d);
int kb__redis_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason);
void kb__redis_release(kb_transport *t, const kb_delivery *d);
int kb__redis_still_owned(kb_transport *t, const kb_delivery *d);
/* One event of frame fs is settled or released (the reader's hold too):
 * the last one queues the entry's ack unless one was released, and frees fs. */
void kb__redis_frame_unref(kb_transport *t, kb_redis_part *p, kb_redis_fstate *fs);
/* Keeper job: send every queued ack and dead letter, pipelined. */
void kb__redis_settle_send(kb_transport *t);

/* ---- redis_runs.c ---- */
/* kb:{topic}:runs:N: entry ID -> handler runs begun (recorded only for
 * redelivered or retried entries, and by journal adoption). */
void kb__redis_runs_key(char *out, size_t len, const char *topic, uint32_t part);
/* run_begins hook: record run d->attempt of d before its handler starts. */
void kb__redis_run_begins(kb_transport *t, const kb_delivery *d);
/* At open, on the control connection: adopt dead processes' journals, start ours. */
int kb__redis_runs_start(kb_transport *t, char *errstr, size_t errlen);
/* Of a sweep's reply (kb__redis_sweep_reply's runs): the attempt of claimed
 * entry i, its recorded runs + 1, saturated; and of event j of claimed frame i. */
uint32_t kb__redis_sweep_attempt(const redisReply *runs, size_t i);
uint32_t kb__redis_sweep_event_attempt(const redisReply *runs, size_t i, uint32_t j);

/* ---- redis_progress.c ---- */
/* A frame's state for `events` events (refs 1, the reader's); NULL when out of memory. */
kb_redis_fstate *kb__redis_fstate_new(const char *id, uint32_t epoch, uint32_t events);
/* Event d of its frame is settled: noted, and the frame's progress queued
 * for the keeper when an event settled KB_REDIS_PROGRESS_MS ago or more is
 * not recorded yet. */
#define KB_REDIS_PROGRESS_MS 10
void kb__redis_progress_note(kb_transport *t, kb_redis_part *p, kb_redis_fstate *fs,
                             const kb_delivery *d);
/* Queue fs's progress now (the frame goes back unacked with events settled). */
void kb__redis_progress_queue(kb_transport *t, kb_redis_part *p, kb_redis_fstate *fs);
/* Was event j of a claimed frame settled before (the sweep's record of it)? */
bool kb__redis_progress_covers(const redisReply *runs, size_t i, uint32_t j);

/* ---- redis_lease.c ---- */
/* Keeper job, through the kit's lease manager: renew what we hold, take our
 * share among `members`, hand back once idle what is no longer ours
 * (`send_acks` first, so the next owner never claims an entry whose ack is
 * queued here). */
void kb__redis_lease_round(kb_transport *t, kb_transport_topic *tt, const char *const *members,
                           size_t n, void (*send_acks)(kb_transport *t));
/* At close: hand every lease of the topic back (one pipeline). */
void kb__redis_lease_release_all(kb_transport *t, kb_transport_topic *tt);
/* At close, after the keeper's last round: free the topic's lease manager. */
void kb__redis_lease_free(kb_transport_topic *tt);
/* May the consumer hand an entry of this partition to the pool now? */
bool kb__redis_part_live(kb_redis_part *p);
/* Is the lease of this partition (owned or draining) still valid here? A
 * deadline found passed is marked lapsed, so its renewal reports a loss and
 * the partition is swept before it is read again. */
bool kb__redis_lease_valid(kb_redis_part *p);

/* ---- redis_members.c ---- */
/* Keeper job: heartbeat in the topic's member set and read the live members
 * into *names (strings owned by *reply). False when the server did not answer. */
bool kb__redis_members_beat(kb_transport *t, kb_transport_topic *tt, redisReply **reply,
                            const char ***names, size_t *n, size_t *cap);
/* XGROUP DELCONSUMER for consumers that left ("" = any idle one, else only `only`). */
void kb__redis_members_prune(kb_transport *t, kb_transport_topic *tt, const char *only);
/* At close: leave the member set and the group. */
void kb__redis_members_leave(kb_transport *t, kb_transport_topic *tt);

/* ---- redis_dlq.c ---- */
/* Fields of a dead letter packed for the keeper. */
char *kb__redis_dead_pack(const kb_delivery *d, const char *reason);
/* Same for an entry as read (`fields`: the field/value array, or NULL). With
 * `ref` none of its fields: the dead letter is a reference to the entry
 * (partition, ID, reason with the size), which stays in its stream. */
char *kb__redis_dead_pack_raw(const redisReply *fields, bool ref, uint32_t partition,
                              const char *id, uint32_t attempts, const char *reason);
/* Append the fenced XADD+XACK script for one dead letter; false: out of memory. */
bool kb__redis_dead_append(redisContext *c, kb_transport *t, kb_redis_part *p,
                           const kb_redis_job *j);
int kb__redis_dead_letters(kb_transport *t, kb_transport_topic *tt, const char *after_id, size_t max,
                           kb_dead_letter_fn fn, void *opaque);
int kb__redis_dead_letter_replay(kb_transport *t, kb_transport_topic *tt, const char *id);
int kb__redis_dead_letter_delete(kb_transport *t, kb_transport_topic *tt, const char *id);
/* A DLQ entry ([id, fields], checked to be one) as kb_dead_letter, its
 * fields range-checked; strings point into e; `headers` holds
 * KB_MAX_HEADERS. Pure (tests/fuzz/fuzz_redis_reply.c). */
kb_dead_letter kb__redis_dead_letter_of(const kb_transport *t, const redisReply *e,
                                        kb_header *headers);

/* ---- redis_admin.c: the administration hooks (keybus.h) ---- */
int kb__redis_groups(kb_transport *t, kb_transport_topic *tt, kb_group_info **out, size_t *n);
int kb__redis_group_delete(kb_transport *t, kb_transport_topic *tt, const char *group,
                           unsigned flags);
int kb__redis_topics(kb_transport *t, kb_topic_info **out, size_t *n);
int kb__redis_peek(kb_transport *t, kb_transport_topic *tt, const char *group, size_t max,
                   kb_peek_fn fn, void *opaque);

/* ---- redis_drain.c ---- */
int kb__redis_drain(kb_transport *t, int timeout_ms);

/* ---- redis_stats.c ---- */
/* Our group's figures from an XINFO GROUPS reply (`last_id`: the stream's
 * last-generated-id reply). Pure (tests/fuzz/fuzz_redis_reply.c). */
typedef struct kb_redis_group_info {
    uint64_t pending, lag, consumers;
} kb_redis_group_info;
kb_redis_group_info kb__redis_group_figures(const kb_transport *t, const redisReply *groups,
                                            uint64_t length, const redisReply *last_id);
/* The same from one group's row (NULL: the group does not exist). */
kb_redis_group_info kb__redis_row_figures(const redisReply *row, uint64_t length,
                                          const redisReply *last_id);
/* A script returning a stream's last-generated-id (an error when there is no
 * stream): EVAL it with the stream as KEYS[1]. */
extern const char kb__redis_last_id_lua[];
/* Read the replies of `n` commands appended on c, the stats connection
 * (caller holds stats_lock), into r[] (free each with
 * kb__redis_reply_free). KB_ETRANSPORT drops the connection. */
int kb__redis_stats_run(kb_transport *t, redisContext *c, redisReply **r, size_t n);
int kb__redis_stats(kb_transport *t, kb_transport_topic *tt, kb_topic_stats *out);
int kb__redis_partition_stats(kb_transport *t, kb_transport_topic *tt, uint32_t partition,
                              kb_partition_stats *out);

/* ---- redis_jobs.c: each partition's queue of acks and dead letters ---- */
/* Queue a job and wake the keeper; `dead` is taken (freed, and uncounted
 * from t->dead_queued, on failure); `events`: an ack of a frame's entry, its
 * events (else 0). False when out of memory: nothing is queued. */
bool kb__redis_job_push(kb_transport *t, kb_redis_part *p, const char *id, char *dead,
                        uint32_t events);
/* Queue frame `id`'s progress (`done`, a bitmap of `events` bits, is taken). */
void kb__redis_job_progress(kb_transport *t, kb_redis_part *p, const char *id, uint32_t events,
                            char *done);
/* Move the queued jobs into p->sending (keeper); false when out of memory. */
bool kb__redis_jobs_take(kb_transport *t, kb_redis_part *p);
void kb__redis_jobs_free(kb_redis_jobs *j);
/* A dead letter was stored or dropped: wake kb_drain / kb_dead_letters. */
void kb__redis_settled(kb_transport *t);

/* ---- redis_meta.c ---- */
/* Register the topic and its partition count, or refuse a different count. */
int kb__redis_check_meta(kb_transport *t, kb_transport_topic *tt);
/* The reply to HGET kb:{topic}:meta partitions: KB_OK when it is this
 * process's count; KB_ENOTFOUND (no topic), KB_EINVAL (another count, named)
 * or KB_ETRANSPORT, with the errstr set. */
int kb__redis_stored_count(kb_transport *t, kb_transport_topic *tt, const redisReply *r);
/* Does the topic exist with this process's partition count (its
 * kb:{topic}:meta, or published or subscribed here)? Read-only: KB_OK,
 * KB_ENOTFOUND, KB_EINVAL (another count) or KB_ETRANSPORT. */
int kb__redis_topic_known(kb_transport *t, kb_transport_topic *tt);
/* XGROUP CREATE ... <start> MKSTREAM on every partition (BUSYGROUP is fine):
 * "0" when the server lost the group (nothing published meanwhile is
 * skipped), group.start's ID at the first subscribe. */
int kb__redis_create_groups(kb_redis_conn *k, kb_transport_topic *tt, const char *start,
                            char *errstr, size_t errlen);
/* Does this error say the group is gone (FLUSHALL, a restart without AOF)? */
bool kb__redis_group_gone(const char *err);

/* ---- redis_limit.c: the server's proto-max-bulk-len (bulk_max, under pub_lock) ---- */
void kb__redis_limit_read(kb_transport *t);
/* Caller holds pub_lock. */
int kb__redis_limit_check(kb_transport *t, const char *topic, const kb_msg *m);
/* The server closed the publish connection with an argument of `big` bytes
 * unconfirmed (caller holds no lock): `out` says whether that was the cause.
 * Returns the size over which arguments are refused (the limit read now; the
 * floor when CONFIG is refused), or SIZE_MAX when the server did not answer. */
size_t kb__redis_limit_explain(kb_transport *t, size_t big, char *out, size_t len);

/* ---- redis_conn.c ---- */
void kb__redis_conn_init(kb_redis_conn *k, const kb_transport *t, const char *name);
/* Connected context, or NULL (errstr says why) while down, backing off or cut. */
redisContext *kb__redis_conn_get(kb_redis_conn *k, char *errstr, size_t errlen);
/* Connect now, ignoring the backoff (kb_open, after a wait). */
redisContext *kb__redis_conn_force(kb_redis_conn *k, char *errstr, size_t errlen);
/* Drop a broken context; the next get reconnects after a backoff. */
void kb__redis_conn_fail(kb_redis_conn *k, const char *why);
void kb__redis_conn_close(kb_redis_conn *k);
/* From any thread: shut the socket down so a blocked call returns at once,
 * and never reconnect (close gives up on a silent server). */
void kb__redis_conn_cut(kb_redis_conn *k);
/* From now on blocking calls (connects included) end by the deadline:
 * the connected context, or NULL (down, cut, or the deadline passed). */
redisContext *kb__redis_conn_until(kb_redis_conn *k, int64_t deadline_ns);
/* Blocking command on a connection; NULL reply drops the connection. */
redisReply *kb__redis_cmd(kb_redis_conn *k, int argc, const char **argv, const size_t *lens);
/* From any thread: shut the socket down if it is connected to another
 * primary than generation `gen`; its owner reconnects (to the new one). */
void kb__redis_conn_kick(kb_redis_conn *k, uint32_t gen);
/* Does this error reply say the node is a replica now (a failover)? */
bool kb__redis_readonly(const redisReply *r);

/* Where to connect: the URL's host, or the primary the Sentinels name now
 * (asked in turn; a change cuts the connections to the old one). False with
 * errstr when no Sentinel named one. *gen: the primary's generation. */
bool kb__redis_primary(kb_transport *t, int64_t deadline_ns, kb_redis_addr *out, uint32_t *gen,
                       char *errstr, size_t errlen);
/* Sentinel `from` named `a` the primary: kept and, when it is another one
 * than before, the connections made to the old one are cut. Its generation. */
uint32_t kb__redis_primary_named(kb_transport *t, size_t from, const kb_redis_addr *a);
/* A connection to Sentinel `s` with the redis.* timeouts, or NULL with `why`. */
redisContext *kb__redis_sentinel_connect(const kb_transport *t, const kb_redis_addr *s,
                                         int64_t deadline_ns, char *why, size_t len);

/* ---- redis_url.c ---- */
/* check_url hook: redis://[user[:password]@]host[:port][/db], or
 * redis-sentinel://[user[:password]@]host[:port][,host[:port]...]/<master>. */
int kb__redis_check_url(const kb_url *u, char *errstr, size_t errlen);
/* The Sentinels (default port 26379) and the master name of a checked
 * redis-sentinel:// URL. */
void kb__redis_sentinel_url(const kb_url *u, kb_redis_addr *out, size_t *n, char *master);
/* The db of a checked URL. */
int kb__redis_url_db(const kb_url *u);

/* ---- redis_reply.c ---- */

/* Every connection of the transport builds its replies with these (set on its
 * reader right after connecting); free them with kb__redis_reply_free, never
 * freeReplyObject. A string over lim->cap bytes, or past lim->entry for an
 * entry's fields, is kept as a KB_REDIS_REPLY_OVER of its length; `lim`
 * (NULL: none) outlives the reader. */
void kb__redis_reply_use(redisReader *r, const kb_redis_limits *lim);
void kb__redis_reply_free(void *reply);
/* An error reply the server may not give a moment later (LOADING, BUSY,
 * NOREPLICAS, READONLY, ...): the command was not run. Pure. */
bool kb__redis_transient(const redisReply *r);

/* ---- redis_fields.c ---- */
/* Value of `name` in a flat [name, value, ...] reply (XINFO rows, entry
 * fields), or NULL. */
const redisReply *kb__redis_map_get(const redisReply *m, const char *name);
/* The same, only when the value is a string (entry fields always are). */
const redisReply *kb__redis_field(const redisReply *fields, const char *name);
/* An XPENDING summary ([count, min, max, [[consumer, count]...]]) names
 * another consumer than ours. */
bool kb__redis_foreign_pending(const kb_transport *t, const redisReply *x);
/* Element j of an MGET reply of leases is exactly our token. */
bool kb__redis_lease_ours(const kb_transport *t, const redisReply *m, size_t j);
/* Our group's row of an XINFO GROUPS reply, or NULL. */
const redisReply *kb__redis_group_row(const kb_transport *t, const redisReply *groups);
/* The row of group `group`, or NULL. */
const redisReply *kb__redis_group_row_of(const redisReply *groups, const char *group);
/* A field written by anyone (a dead letter's, a frame's count) read as a
 * number: decimal digits only (no sign, no spaces, at most 10), below
 * `limit`; else `dflt`. Not strtoul, which takes " +4". */
uint32_t kb__redis_number_below(const redisReply *v, uint32_t limit, uint32_t dflt);
/* Compare stream IDs "ms-seq" numerically. */
int kb__redis_id_cmp(const char *a, const char *b);
/* Is `id` a full stream ID "ms-seq" (decimal, each part within 64 bits)? */
bool kb__redis_id_valid(const char *id);
/* The smallest ID after the valid ID `id` into out (n bytes); false when
 * there is none or it does not fit. */
bool kb__redis_id_after(const char *id, char *out, size_t n);
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

#endif /* KB_REDIS_INT_H */
