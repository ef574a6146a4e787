/* Internal state of the NATS JetStream transport, shared by its files. */
#ifndef KB_TRANSPORTS_NATS_INT_H
#define KB_TRANSPORTS_NATS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <nats/nats.h>

#include <keybus/pool.h>
#include <keybus/transport.h>

#include "../../core/headers.h"

#define KB_NATS_NAME 256           /* stream, consumer and subject buffers */
#define KB_NATS_KEY_HDR "Kb-Key"          /* the key as text (printable ASCII) */
#define KB_NATS_KEY_B64_HDR "Kb-Bin-Key"  /* the key as base64 (any bytes). Not
                                           * "Kb-Key-B64": nats.c 3.4.1 answered a
                                           * Kb-Key lookup with that header's value */
#define KB_NATS_BATCH_HDR "Kb-Batch"      /* a frame of this many events of one partition */
#define KB_NATS_FRAME_HDR_NAME "Kb-Frame" /* "2": frame entries end with headers */
#define KB_NATS_HDRS_HDR "Kb-Headers"     /* event header names in order (nats_hdr.c) */
#define KB_NATS_OMITTED_HDR "Kb-Body-Omitted"  /* dead letter stored without its body (size) */
#define KB_NATS_BATCH_MAX 4096            /* events per frame, nats.publish_batch's limit */
/* Header bytes, all within the server's max_payload (docs/transports-nats.md,
 * "Limits"). nats.c writes "NATS/1.0\r\n", "Name: value\r\n" per header, "\r\n". */
#define KB_NATS_HDR_BASE 64    /* status line, Nats-Msg-Id (<16 hex>-<u64>), end */
#define KB_NATS_FRAME_HDR 16   /* Kb-Batch: <n> */
#define KB_NATS_FRAME_V2_HDR 13   /* Kb-Frame: 2 (frames holding headers) */
#define KB_NATS_DLQ_ROOM 1024  /* dead-letter headers besides the key (reason cut to 256) */
#define KB_NATS_HDR_MAX 65535  /* JetStream refuses larger headers (error 10097) */
#define KB_NATS_MARKS 16                  /* earlier deliveries remembered per claim */

/* One delivered message (one event, or a frame of several) waiting for its
 * handlers. The natsMsg keeps the $JS.ACK reply subject that AckAll needs. */
typedef struct kb_nats_entry {
    natsMsg *msg;
    struct kb_nats_claim *claim;
    uint64_t sseq;
    int64_t since_ns;              /* delivered at, for in-progress acks */
    _Atomic uint32_t pending;      /* its events the bus is not finished with */
    _Atomic uint32_t released;     /* one of them was released unhandled */
    _Atomic uint32_t done;         /* every event handled or dead-lettered: may be acked */
} kb_nats_entry;

/* One ownership period of one partition: its own consumer, named after the
 * lease revision, so acks from an earlier owner never reach it. */
typedef struct kb_nats_claim {
    struct kb_nats_part *part;
    uint64_t rev;                  /* lease revision when acquired */
    char consumer[176];
    char next_subj[2 * KB_NATS_NAME];  /* $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer> */
    /* completion frontier: entries in delivery (= stream) order */
    kb_nats_entry *ring;
    uint32_t cap;
    _Atomic uint64_t head;         /* acker: first entry not yet acked */
    _Atomic uint64_t tail;         /* feeder: next free slot */
    _Atomic uint64_t settled;      /* entries the bus is finished with */
    _Atomic int fenced;            /* lease lost or reset: no acks, no deliveries */
    _Atomic int feeder_left;       /* the feeder will not touch it again */
    _Atomic int freed;             /* ring freed by the acker */
    _Atomic uint64_t acked_to;     /* stream sequence of the last AckAll sent */
    int64_t last_wpi_ns;           /* acker: last in-progress ack */
    uint64_t marks[KB_NATS_MARKS]; /* highest sequences earlier consumers delivered */
    uint32_t nmarks;
    /* feeder only */
    uint64_t delivered_hi;         /* highest stream sequence handed to the sink */
    bool pull_open;
    bool pull_got;                 /* a message came since the newest request */
    int pull_left;
    uint32_t pull_serial;
    int64_t pull_expires_ms;       /* grows while the partition is idle */
    int64_t pull_deadline_ns;
    struct kb_nats_claim *next;    /* older claims of the partition */
} kb_nats_claim;

/* Events of one partition waiting to go out as one message (a frame). */
typedef struct kb_nats_batch {
    pthread_mutex_t mu;            /* serialises the partition's publishes */
    char *buf;                     /* frame body: see nats_batch.c */
    size_t len, cap;
    uint32_t count;
    int64_t first_ns;              /* when the oldest buffered event came */
    int64_t last_send_ns;
    bool v2;                       /* entries carry headers (Kb-Frame: 2) */
    /* highest stream sequence the server acked for this partition's
     * publishes from this process (kb_drain's target) */
    _Atomic uint64_t stored_seq;
} kb_nats_batch;

struct kb_nats_topic;

typedef struct kb_nats_part {
    struct kb_nats_topic *topic;
    uint32_t n;
    char subject[KB_NATS_NAME];    /* kb.<topic>.<n> */
    char lease_key[2 * KB_NATS_NAME];
    _Atomic(kb_nats_claim *) claim;   /* current claim, NULL when not owned */
    _Atomic(kb_nats_claim *) claims;  /* every claim, newest first (freed at close) */
    uint64_t lease_rev;            /* lease thread only */
    int64_t lease_until_ns;        /* local lease expiry */
    bool releasing;
    bool wanted;                   /* lease thread: ranked first here */
    kb_nats_claim *feeding;        /* feeder only: the claim it works on */
} kb_nats_part;

typedef struct kb_nats_topic {
    struct kb_nats_topic *next;
    char *name;
    char stream[KB_NATS_NAME];
    char dlq_subject[KB_NATS_NAME];
    char (*subjects)[KB_NATS_NAME];  /* kb.<topic>.N, for publishing */
    kb_nats_batch *batches;        /* per partition */
    _Atomic uint64_t published;
    _Atomic uint64_t unowned;      /* deliveries released by still_owned: lease lost */
    _Atomic uint32_t frames_open;  /* partitions with buffered events */
    /* consuming side: set by subscribe */
    kb_sink *sink;
    kb_nats_part *parts;
    uint32_t sub_id;               /* in the bus's pull reply subjects */
    _Atomic int subscribed;        /* parts and sink are set */
} kb_nats_topic;

/* A publish that must be sent again, in order. */
typedef struct kb_nats_resend {
    natsMsg *msg;
    struct kb_nats_resend *next;
} kb_nats_resend;

struct kb_transport {
    kb_bus *bus;
    natsConnection *nc;
    jsCtx *js;
    kvStore *kv;
    char url_safe[512];            /* URL without credentials, for messages */
    char id[128];                  /* this process's consumer name */
    char group[129];               /* group (letters, digits, - _ =) */
    char bus_id[24];               /* prefix of Nats-Msg-Id */
    char bucket[72];               /* lease KV bucket */
    _Atomic uint64_t msg_seq;
    /* configuration */
    uint32_t partitions;
    jsStorageType storage;
    int64_t ack_wait_ms, lease_ttl_ms, publish_timeout_ms;
    int64_t max_ack_pending, fetch_batch, fetch_expires_ms, ack_interval_ms;
    int64_t dup_window_ms, reconnect_wait_ms, reconnect_max_ms;
    uint32_t batch_events;         /* nats.publish_batch */
    _Atomic size_t batch_bytes;    /* frame body limit, below max_payload */
    _Atomic size_t max_payload;    /* the server's, from its INFO (again on reconnect) */
    int64_t linger_ns;             /* nats.publish_linger_us */
    int enqueue_timeout_ms;
    uint32_t max_attempts;         /* retry.max_attempts */
    size_t max_headers, max_header_bytes;   /* limits.*: other clients' headers too */
    /* topics: append-only list, read without a lock */
    _Atomic(kb_nats_topic *) topics;
    pthread_mutex_t topics_lock;
    /* publish recovery: while `gated`, publishes queue here in order */
    pthread_rwlock_t pub_lock;
    pthread_mutex_t resend_lock;
    kb_nats_resend *resend_head, *resend_tail;
    _Atomic uint64_t resend_len;
    _Atomic int gated;
    _Atomic uint64_t pub_rejected;     /* not yet reported by flush */
    char pub_error[256];               /* last rejection, under resend_lock */
    /* threads */
    _Atomic int stopping;              /* ops->stop: feeders end */
    _Atomic int closing;               /* ops->close: everything ends */
    _Atomic int nc_closed;             /* nats.c ran our closed callback: no more callbacks */
    _Atomic int published_async;       /* js_PublishAsyncGetPendingList crashes before the
                                          first async publish in nats.c 3.4.1 (NULL map) */
    pthread_mutex_t lease_mu;          /* wakes the lease thread early */
    pthread_cond_t lease_cv;
    bool lease_kick;
    pthread_t acker, leaser;
    bool acker_started, leaser_started;
    /* consuming: one feeder thread and one inbox subscription per bus */
    natsSubscription *inbox_sub;
    char inbox[128];
    pthread_t feeder;
    bool feeder_started;
    pthread_mutex_t sub_lock;          /* serialises subscribe */
    _Atomic uint32_t nsubs;            /* topics subscribed (sub_id < nsubs) */
    _Atomic uint32_t reconnects;       /* pull requests open before one are lost */
    /* kb_drain: the acker wakes waiters when a frontier moves */
    pthread_mutex_t drain_mu;
    pthread_cond_t drain_cv;
    _Atomic int drain_waiters;
    _Atomic(kb_nats_topic *) last_acked_topic;   /* publish-ack lookups: likely the same */
    /* broker_length: events counted in frames, per topic (nats_tally.c) */
    pthread_mutex_t tally_mu;
    struct kb_nats_tally *tallies;
};

/* nats.c */
kb_nats_topic *kb__nats_topic(kb_transport *t, const char *topic, bool create);
void kb__nats_stream_name(char *out, size_t len, const char *topic);
/* Partition of a partition subject kb.<topic>.<n>, or -1 (the dead letters,
 * another topic). */
long kb__nats_subject_part(kb_transport *t, const char *topic, const char *subj);
int kb__nats_errf(const char *what, natsStatus s, jsErrCode jerr);
int64_t kb__nats_now_ns(void);
void kb__nats_sleep_ms(int64_t ms);

/* nats_msg.c: keys in headers, ack subjects */
/* v in decimal at out (room for 21 bytes), NUL-terminated; returns its length.
 * No snprintf: it runs per message and per event. */
size_t kb__nats_put_u64(char *out, uint64_t v);
/* Base64 of len bytes at out (4 * ceil(len / 3) + 1 bytes); returns its length. */
size_t kb__nats_b64_encode(const void *src, size_t len, char *out);
/* Decoded length, -1 when malformed, -2 when over cap. */
long kb__nats_b64_decode(const char *v, size_t n, char *buf, size_t cap);
int kb__nats_set_key(natsMsg *m, const void *key, size_t len);
/* Bytes of the header line kb__nats_set_key writes for this key. */
size_t kb__nats_key_hdr_len(const void *key, size_t len);
/* Key of a message into buf (cap bytes); length, or -1 with *why set. */
int kb__nats_get_key(natsMsg *m, char *buf, size_t cap, const char **why);
/* Fields of a $JS.ACK reply subject. */
typedef struct kb_nats_meta {
    char consumer[176];
    uint64_t delivered, sseq;
} kb_nats_meta;
int kb__nats_parse_ack(const char *reply, kb_nats_meta *out);
natsMsg *kb__nats_msg_clone(natsMsg *m);

/* nats_publish.c */
int kb__nats_publish(kb_transport *t, const char *topic, const kb_msg *m);
/* A message for subject with a fresh Nats-Msg-Id, the key in its header
 * unless key is NULL, and the event's headers. */
int kb__nats_msg_event(kb_transport *t, const char *subject, const void *key, size_t key_len,
                       const void *body, size_t body_len, const kb_header *h, size_t nh,
                       natsMsg **out);
/* Publish asynchronously (or queue behind resends); takes msg in every case. */
int kb__nats_send(kb_transport *t, natsMsg *msg);
int kb__nats_flush(kb_transport *t, int timeout_ms);
void kb__nats_pub_err(kb_transport *t, jsPubAckErr *pae);
void kb__nats_disconnected(natsConnection *nc, void *closure);
void kb__nats_resend(kb_transport *t);
/* Events never sent: queued for a resend, or published and not acked (taken
 * back from nats.c). Frees them; close only. */
uint64_t kb__nats_resend_free(kb_transport *t);

/* nats_batch.c: frames of several events of one partition */
typedef struct kb_nats_event {
    const char *key, *payload;
    size_t key_len, payload_len;
    const char *hdrs;              /* version 2: the entry's header block */
    uint32_t nh;                   /* headers in it */
} kb_nats_event;
typedef struct kb_nats_frame {
    const char *p, *end;
    uint32_t left;                 /* events not yet read */
    int version;                   /* 1, or 2 with Kb-Frame: 2 */
} kb_nats_frame;
/* Check a frame whose Kb-Batch header is `count` (and its Kb-Frame version);
 * -1 with *why when malformed. */
int kb__nats_frame_open(natsMsg *m, const char *count, kb_nats_frame *f, const char **why);
bool kb__nats_frame_next(kb_nats_frame *f, kb_nats_event *ev);
int kb__nats_batch_init(kb_transport *t, kb_nats_topic *tp);
/* Frees the topic's frames; returns the events still buffered in them. */
uint64_t kb__nats_batch_free(kb_transport *t, kb_nats_topic *tp);
/* Events in a message: its Kb-Batch count, or 1. */
uint32_t kb__nats_events_in(natsMsg *m);
int kb__nats_batch_add(kb_transport *t, kb_nats_topic *tp, const kb_msg *m);
/* Bytes of m's frame entry (version 2: with its header block). */
size_t kb__nats_entry_size(const kb_msg *m, bool v2);
int kb__nats_batch_send_due(kb_transport *t, bool all);

/* nats_hdr.c: event headers on messages and in frames */
typedef struct kb_nats_hdrs {
    kb_header h[KB_MAX_HEADERS];
    size_t n;
    char names[KB_MAX_HEADERS][KB_MAX_HEADER_NAME + 1];
    char *vals;                    /* values decoded from base64 */
    size_t cap;
} kb_nats_hdrs;
/* Bytes the headers take on a message (header lines and Kb-Headers). */
size_t kb__nats_hdr_len(const kb_header *h, size_t n);
int kb__nats_hdr_set(natsMsg *m, const kb_header *h, size_t n);
/* Headers of a message (keybus's, or another client's other than Kb-* and
 * Nats-*, by name), checked against the limits; -1 with *why when malformed.
 * They point into m and out. */
int kb__nats_hdr_get(kb_transport *t, natsMsg *m, kb_nats_hdrs *out, const char **why);
/* The same for one event of a version 2 frame (the block is checked). */
int kb__nats_hdr_frame(kb_transport *t, const kb_nats_event *ev, kb_nats_hdrs *out,
                       const char **why);
void kb__nats_hdrs_free(kb_nats_hdrs *h);

/* nats_drain.c */
int kb__nats_drain(kb_transport *t, int timeout_ms);
/* A frontier moved: wake kb_drain. Acker thread. */
void kb__nats_drain_wake(kb_transport *t);
/* Async publish outcome: the stream sequence for kb_drain, or the error. */
void kb__nats_pub_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure);

/* nats_consume.c */
int kb__nats_subscribe(kb_transport *t, const char *topic, kb_sink *sink);
void kb__nats_stop(kb_transport *t);

/* nats_ack.c: completion frontier */
int kb__nats_ack(kb_transport *t, const kb_delivery *d);
void kb__nats_release(kb_transport *t, const kb_delivery *d);
int kb__nats_still_owned(kb_transport *t, const kb_delivery *d);
void kb__nats_settle(kb_nats_entry *e, bool done);
void *kb__nats_acker(void *arg);
void kb__nats_ack_pass(kb_transport *t);
kb_nats_claim *kb__nats_claim_new(kb_transport *t, kb_nats_part *p, uint64_t rev);
/* Stop feeding a claim; the lease thread starts a fresh one if it still
 * holds the lease. */
void kb__nats_claim_reset(kb_transport *t, kb_nats_claim *c);
void kb__nats_claim_free_all(kb_nats_part *p);
/* Deliveries of stream sequence sseq so far: this consumer's count plus one
 * per earlier consumer of the partition that delivered it. */
uint32_t kb__nats_attempt(const kb_nats_claim *c, uint64_t sseq, uint64_t delivered);

/* nats_lease.c */
/* Where a consumer of the partition stopped: everything up to it is acked. */
uint64_t kb__nats_floor_of(const jsConsumerInfo *ci);
/* Partition of one of the group's partition consumers, or -1. */
long kb__nats_consumer_part(kb_transport *t, const char *name);
int kb__nats_lease_open(kb_transport *t, char *errstr, size_t errlen);
void *kb__nats_leaser(void *arg);
void kb__nats_lease_release_all(kb_transport *t);
void kb__nats_lease_kick(kb_transport *t);

/* nats_dlq.c */
int kb__nats_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason);
/* Settle an event after its dead letter was tried (rc from dlq_publish). A
 * dead letter the server refused is lost, and the partition moves on: a retry
 * would be refused again and hold the partition for ever (a poison frame).
 * KB_ETIMEDOUT (no answer): the claim is reset and the event comes again,
 * with its attempt count, straight to the dead letters. */
void kb__nats_dlq_settle(kb_transport *t, kb_nats_entry *e, int rc);
/* One event (or an unreadable message) to the dead letters; orig_id is the
 * delivery ID: the stream sequence, ".<n>" for the n-th event of a frame.
 * KB_ETIMEDOUT when the server did not answer, another error when it refused. */
typedef struct kb_nats_dead {
    const char *orig_subject, *orig_id;
    const void *key, *payload;
    size_t key_len, payload_len;
    const kb_header *headers;
    size_t n_headers;
    uint32_t partition, attempts;
    const char *reason;
} kb_nats_dead;
int kb__nats_dlq_publish(kb_transport *t, kb_nats_topic *tp, const kb_nats_dead *d);
int kb__nats_dead_letters(kb_transport *t, const char *topic, const char *after_id, size_t max,
                          kb_dead_letter_fn fn, void *opaque);
int kb__nats_dead_letter_replay(kb_transport *t, const char *topic, const char *id);

/* nats_tally.c */
/* Events beyond one per message stored in partition `only` (all when < 0),
 * given the stream's first and last sequence now. */
int kb__nats_tally(kb_transport *t, const char *topic, const char *stream, uint64_t first,
                   uint64_t last, long only, uint64_t *extra);
void kb__nats_tally_free(kb_transport *t);

/* nats_stats.c */
int kb__nats_stats(kb_transport *t, const char *topic, kb_topic_stats *out);
int kb__nats_partition_stats(kb_transport *t, const char *topic, uint32_t partition,
                             kb_partition_stats *out);

#endif /* KB_TRANSPORTS_NATS_INT_H */
