/* The NATS transport's state (per bus, per topic, per partition and claim)
 * and its wire constants: types only, read by every layer. Functions are
 * declared by each file's own header. */
#ifndef KB_TRANSPORTS_NATS_TYPES_H
#define KB_TRANSPORTS_NATS_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <nats/nats.h>

#include <keybus/kit.h>
#include <keybus/pool.h>
#include <keybus/transport.h>


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
#define KB_NATS_PARTS_DESC "keybus partitions="  /* the count, in the stream's Description */
#define KB_NATS_MARKS 16                  /* earlier deliveries remembered per claim */

/* One delivered message (one event, or a frame of several) waiting for its
 * handlers. The natsMsg keeps the $JS.ACK reply subject that AckAll needs. */
typedef struct kb_nats_entry {
    natsMsg *msg;
    struct kb_nats_claim *claim;
    uint64_t sseq;
    uint32_t part;                 /* its partition (a wide claim's dead letter: none) */
    /* its newest delivery sequence (feeder): the server ignores an AckAll
     * whose delivery sequence is below one it already took */
    _Atomic uint64_t dseq;
    int64_t since_ns;              /* delivered at, for in-progress acks */
    _Atomic uint32_t pending;      /* its events the bus is not finished with */
    _Atomic uint32_t released;     /* one of them was released unhandled */
    _Atomic uint32_t done;         /* every event handled or dead-lettered: may be acked */
    _Atomic bool runs;             /* it has a run record (nats_runs.c): deleted at its ack */
    /* acked only once this claim has handled up to its sseq: the entry's
     * partition moved between a wide claim and its own claim in this
     * process, and the other one handles it (nats_lease.c, "Split") */
    struct kb_nats_claim *after;
    /* of a partition that moved out of this wide claim before its split
     * ended (nats_lease.c, "Early move"), past the move's cut: another
     * process handles it, so it is done here but never acked, and the wide
     * consumer's floor stays below it */
    bool moved;
} kb_nats_entry;

/* One ownership period of one partition: its own consumer, named after the
 * lease revision, so acks from an earlier owner never reach it. A wide claim
 * covers every partition of a topic with one consumer (this process held all
 * of them at once); its `part` is partition 0, which pulls for it. Both ack
 * their finished prefix with one AckAll. */
typedef struct kb_nats_claim {
    struct kb_nats_part *part;
    bool wide;
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
    /* lease thread: its consumer's creation went unanswered, so the next
     * claim of the revision tries the same name again (the server may have
     * made it late) instead of taking a new revision and a second consumer */
    bool name_free;
    /* monotonic ns when its lease (every partition's, for a wide claim)
     * runs out locally; past it the claim counts as fenced. The lease
     * thread sets it before publishing the claim and after each renewal */
    _Atomic int64_t valid_until_ns;
    _Atomic int freed;             /* ring freed by the acker */
    _Atomic uint64_t acked_to;     /* stream sequence of the last AckAll sent */
    _Atomic uint64_t acked_dseq;   /* ... and its delivery sequence */
    /* stream sequence of the last entry of the handled prefix: above
     * acked_to while its consumer has not delivered what the bridge read */
    _Atomic uint64_t handled_to;
    /* nothing above it is acked: a delivery after it was lost in transit
     * (UINT64_MAX: none) */
    _Atomic uint64_t ack_limit;
    bool ack_failed;               /* acker: an ack could not be sent (reconnecting) */
    /* acker: past a moved entry, where the handled prefix was last seen to
     * end (ring index) and its newest sequence */
    uint64_t moved_scan;
    uint64_t moved_handled;
    /* feeder: the first moved entry's sequence (0: none); read by the lease
     * thread only once the claim is freed (own_finished: after the feeder's
     * feeder_left and the acker's freed, both atomic) */
    uint64_t moved_first;
    /* lease thread: a partition moved out of it early: its split goes on
     * until the partitions that stay took over; how many cuts are recorded */
    bool moved_out;
    uint32_t moved_recorded;
    int64_t last_wpi_ns;           /* acker: last in-progress ack */
    /* set before the claim is published: an earlier consumer acked every
     * sequence up to skip_to that is not in `keep` (its pending set, sorted);
     * those are settled without a handler (nats_probe.c) */
    uint64_t skip_to;
    uint64_t *keep;
    uint32_t nkeep;
    uint64_t marks[KB_NATS_MARKS]; /* highest sequences earlier consumers delivered */
    /* per key, how far its handlers got, here and before (nats_progress.c) */
    _Atomic(struct kb_nats_progress *) progress;
    uint32_t nmarks;
    /* highest stream sequence handed to the sink: the feeder's, read by the
     * lease thread after a reconnect */
    _Atomic uint64_t delivered_hi;
    /* ... and of those the highest its consumer delivered (the rest were
     * read from the stream while it had no leader) */
    _Atomic uint64_t consumer_hi;
    /* ... as it was when the bridge last started (the feeder's; 0: never
     * bridged): equal to it still, the consumer delivered nothing since its
     * pulls went unanswered, and whatever it had sent before was read */
    _Atomic uint64_t bridge_hi;
    /* the floor it started from (set before it is published) */
    uint64_t start_floor;
    /* the start its consumer's creation asked for: a creation asked again
     * under the same name asks for it again (nats_consumers.c, pin_first) */
    jsDeliverPolicy asked_policy;
    uint64_t asked_start;
    /* an event released after a run of it (its runs may be in the runs
     * bucket only): the claim's final record may not drop its mark */
    _Atomic bool released_ran;
    /* feeder only */
    int64_t leaderless_since_ns;   /* pulls answered "no responders" since (0: not) */
    /* the consumer went silent (a pull lost: its leader's node is gone and
     * its group has not elected another), so the partition's messages are
     * read from the stream meanwhile (nats_consume.c, "bridge") */
    bool bridging;
    bool bridge_asked;             /* a read is out, under bridge_serial */
    uint32_t bridge_serial;
    int64_t bridge_next_ns;        /* the next read, not before */
    int64_t bridge_poll_ms;        /* the wait after "no message", doubling */
    bool bridged;                  /* entries read by it since the consumer's last delivery */
    bool lost_again;               /* a pull was lost with nothing come since: the next
                                      lost one starts the bridge */
    bool answered;                 /* its consumer answered a pull (a message or a status) */
    /* set before it is published: its consumer was made without a leader
     * (nats_consumers.c): read around by the bridge until it answers */
    bool born_leaderless;
    /* set before the claim is published: its consumer starts at the stream's
     * end as it was when made, a sequence not known here */
    bool start_unknown;
    uint64_t dseq_hi;              /* the consumer's last delivery sequence seen */
    /* when deliveries were lost and a redelivery showed it (0: no such gap):
     * which messages they were shows at the next first delivery past
     * delivered_hi (nats_consume.c, admit) */
    int64_t gap_open_ns;
    bool pull_open;
    bool pull_got;                 /* a message came since the newest request */
    int pull_left;
    uint32_t pull_serial;
    int64_t pull_expires_ms;       /* grows while the partition is idle */
    int64_t pull_hb_ms;            /* the idle heartbeat the newest request asked for (0: none) */
    int64_t pull_deadline_ns;
    /* the newest request's expiry (from when it was sent): nats-server 2.9
     * before 2.9.16 may end it then without its 408 (nats_consume.c, above
     * heartbeat_ms); while messages come, the next one goes at renew */
    int64_t pull_ends_ns;
    int64_t pull_renew_ns;
    /* Split (nats_lease.c): a partition claim that took its partition over
     * from a live wide claim, `split_from`, without stopping it. The wide claim
     * fed the partition up to stream sequence `cut` (set by the feeder when
     * it first feeds this claim); this claim's deliveries up to the cut are
     * acked once that claim has handled them, the wide claim's later ones
     * once this claim has. Set by the lease thread before the claim is
     * published; read by the feeder and the acker (which sees every claim). */
    _Atomic(struct kb_nats_claim *) split_from;
    _Atomic uint64_t cut;
    _Atomic bool cut_set;
    struct kb_nats_claim *next;    /* older claims of the partition (of the topic: wide) */
} kb_nats_claim;

/* Events of one partition waiting to go out as one message (a frame). */
typedef struct kb_nats_batch {
    pthread_mutex_t mu;            /* serialises the partition's publishes */
    char *buf;                     /* frame body: see nats_batch.c */
    size_t len, cap;
    uint32_t count;
    int64_t first_ns;              /* when the oldest buffered event came */
    int64_t last_send_ns;
    kb_kit_key *keys;              /* a frame's keys for the backlog (it copies them) */
    size_t keys_cap;
    bool v2;                       /* entries carry headers (Kb-Frame: 2) */
    /* nats.replicas > 1: a publish of this partition is out and not yet
     * acked, so the next one waits (nats_batch.c, "one unconfirmed") */
    _Atomic bool unconfirmed;
    /* highest stream sequence the server acked for this partition's
     * publishes from this process (kb_drain's target) */
    _Atomic uint64_t stored_seq;
} kb_nats_batch;

typedef struct kb_transport_topic kb_nats_topic;

typedef struct kb_nats_part {
    kb_nats_topic *topic;
    uint32_t n;
    char subject[KB_NATS_NAME];    /* kb.<topic>.<n> */
    char lease_key[2 * KB_NATS_NAME];
    _Atomic(kb_nats_claim *) claim;   /* current claim, NULL when not owned */
    _Atomic(kb_nats_claim *) claims;  /* every claim, newest first (freed at close) */
    uint64_t lease_rev;            /* lease thread only */
    bool lease_rev_unsure;         /* the last renewal went unanswered: stored or not */
    int64_t lease_until_ns;        /* local lease expiry */
    bool releasing;
    bool wanted;                   /* lease thread: this member's by the fair share */
    /* lease thread: the claim (of it, or a wide one) whose consumer is
     * being made; the times its lease was lost or released (a claim made
     * across one is void) */
    struct kb_nats_claim *creating;
    uint32_t leases_ended;
    /* lease thread: since when an earlier consumer's state could not be
     * read for a claim (0: it could) */
    int64_t unreadable_since_ns;
    kb_nats_claim *feeding;        /* feeder only: the claim it works on */
    /* feeder only: the highest stream sequence of this partition a wide
     * claim (wide_fed_by) fed, and the claim that took the partition over
     * from it at that cut (split_to) */
    kb_nats_claim *wide_fed_by;
    uint64_t wide_fed;
    kb_nats_claim *split_to;
    /* Early move (nats_lease.c): the live wide claim the lease thread moves
     * this partition out of (kept once set); the feeder's answer, for that
     * claim: the cut (the last sequence of the partition it fed, and the
     * claim it is for) or a refusal (an earlier batch's moved entries stop
     * the wide claim's acks below the cut) */
    _Atomic(kb_nats_claim *) moved_from;
    _Atomic uint64_t move_cut;
    _Atomic(kb_nats_claim *) move_cut_for;
    _Atomic(kb_nats_claim *) move_refused_for;
} kb_nats_part;

/* Events beyond one per message (frames), for broker_length (nats_tally.c);
 * under the bus's tally_mu. */
typedef struct kb_nats_tally {
    uint64_t from;                 /* first stream sequence counted */
    uint64_t to;                   /* last stream sequence looked at */
    uint64_t *extra;               /* per partition */
} kb_nats_tally;

/* A topic as the bus hands it to every per-topic hook (topic_open). */
struct kb_transport_topic {
    kb_nats_topic *next;           /* the bus's list, newest first */
    uint32_t index;                /* in the bus's table and in Nats-Msg-Id */
    char *name;
    /* when the watch last saw another member of this topic's group leave */
    _Atomic int64_t member_left_ns;
    char stream[KB_NATS_NAME];
    char dlq_subject[KB_NATS_NAME];
    char (*subjects)[KB_NATS_NAME];  /* kb.<topic>.N, for publishing */
    uint32_t hash;                 /* spreads partition ownership across topics */
    /* the stream exists with our partition count (1) or states another (-1;
     * 0: not looked at yet); created at first publish or subscribe */
    _Atomic int stream_ready;
    _Atomic uint32_t stored_parts; /* the count its Description states */
    _Atomic int stored_replicas;   /* the stream's Replicas */
    kb_nats_batch *batches;        /* per partition */
    /* publishes handed on, frames and single events: the kit's backlog
     * (nats_send.c); send_mu makes one thread at a time its sender */
    kb_kit_backlog *backlog;
    pthread_mutex_t send_mu;
    _Atomic bool pump_again;       /* a pump found send_mu taken: its holder takes again */
    natsStatistics *conn_stats;    /* under send_mu: the connection's reconnects (nats_send.c) */
    /* items done for a resend and not taken again (nats_send.c): while any
     * wait, a publish ack of this topic may make one due, and asks for a
     * pump (pump_wanted) */
    _Atomic int64_t resends;
    _Atomic bool pump_wanted;      /* the acker (or a flush) pumps this topic */
    _Atomic uint64_t published;
    _Atomic uint64_t unowned;      /* deliveries released by still_owned: lease lost */
    _Atomic uint64_t trimmed;      /* messages the stream's limits removed unread (wide claims) */
    _Atomic uint32_t frames_open;  /* partitions with buffered events */
    kb_nats_tally tally;
    /* consuming side: set by subscribe */
    kb_sink *sink;
    kb_nats_part *parts;
    _Atomic(kb_nats_claim *) wide_claims;  /* every wide claim, newest first (freed at close) */
    /* the wide claim partition claims took over from while it went on (a
     * split, nats_lease.c; set by the lease thread), and since when the
     * lease thread waits for the split to finish (0: it does not) */
    _Atomic(kb_nats_claim *) split_wide;
    int64_t split_since_ns;
    /* early moves: bumped by the lease thread once it marked a batch of
     * partitions moved_from; the feeder sets their cuts together when it
     * sees a new value (move_gen_seen, its own), so no entry one of them
     * pushed moved lies below another's cut */
    _Atomic uint32_t move_gen;
    uint32_t move_gen_seen;
    uint32_t sub_id;               /* in the bus's pull reply subjects */
    _Atomic int subscribed;        /* parts and sink are set */
};

/* Topics by index (their Nats-Msg-Id carries it): chunks that never move;
 * the table numbers topics and bounds how many a bus opens. */
#define KB_NATS_TOPIC_CHUNK 1024
#define KB_NATS_TOPIC_CHUNKS 1024   /* at most 1,048,576 topics per bus */

struct kb_transport {
    kb_bus *bus;
    natsConnection *nc;
    /* Pull requests, the inbox and acks: a connection of their own from the
     * first subscribe (feed_opts, made at open), so that they never queue
     * behind the publish window on nc. Set once, read by every thread. */
    natsOptions *feed_opts;
    char *creds_file;              /* nats.creds_file, masked in nats.c's reasons */
    natsConnection *_Atomic feed_nc;
    jsCtx *js;
    jsCtx *js_round;               /* the lease thread's KV reads: a round's wait, not 5 s */
    /* the lease bucket: bound at the first subscribe (or a read of an owner),
     * so a bus that only publishes or reads creates none; under kv_lock */
    kvStore *kv;
    bool kv_ttl_set;                  /* nats.lease_ttl_ms applied to it */
    pthread_mutex_t kv_lock;
    kvStore *runs_kv;              /* handler runs (nats_runs.c) */
    /* final progress records are not tried before this (kb_now_ns): one
     * failed put (the runs bucket without a leader) stops them for a lease's
     * time; lease thread, then close */
    int64_t finals_off_until_ns;
    kvStore *runs_kv_round;        /* the same bucket through js_round (progress records);
                                    * NULL when its lookup failed: runs_kv then */
    struct kb_nats_runs_cache *runs_cache;   /* the feeder's last read of it */
    char url_safe[512];            /* URL without credentials, for messages */
    char id[128];                  /* this process's consumer name */
    char group[129];               /* group (letters, digits, - _ =) */
    bool start_latest;             /* group.start = latest: a new group skips what is stored */
    char bus_id[24];               /* prefix of Nats-Msg-Id */
    char bucket[72];               /* lease KV bucket */
    _Atomic uint64_t msg_seq;
    /* configuration */
    uint32_t partitions;
    jsStorageType storage;
    int64_t ack_wait_ms, lease_ttl_ms, publish_timeout_ms;
    int64_t max_ack_pending, fetch_batch, fetch_expires_ms, ack_interval_ms;
    int64_t dup_window_ms, reconnect_wait_ms, reconnect_max_ms;
    int replicas;                  /* nats.replicas: topic streams, lease bucket */
    bool topic_consumer;           /* nats.topic_consumer = auto: wide claims */
    uint32_t batch_events;         /* nats.publish_batch */
    int64_t publish_max_pending;   /* nats.publish_max_pending */
    _Atomic size_t batch_bytes;    /* frame body limit, below max_payload */
    _Atomic size_t max_payload;    /* the server's, from its INFO (again on reconnect) */
    int64_t linger_ns;             /* nats.publish_linger_us */
    int enqueue_timeout_ms;
    uint32_t max_attempts;         /* retry.max_attempts */
    size_t max_headers, max_header_bytes;   /* limits.*: other clients' headers too */
    size_t max_key_bytes, max_payload_bytes;   /* limits.*: other clients' events too */
    /* topics: append-only list and index table, read without a lock */
    _Atomic(kb_nats_topic *) topics;
    _Atomic(kb_nats_topic **) topic_chunks[KB_NATS_TOPIC_CHUNKS];
    uint32_t ntopics;              /* under topics_lock */
    pthread_mutex_t topics_lock;   /* topic_open, stream creation */
    /* publish recovery: senders hold it shared, a take-back of what nats.c
     * holds unacked exclusive (nats_send.c) */
    pthread_rwlock_t pub_lock;
    struct kb_nats_flight *flight;     /* the publishes nats.c holds, by message */
    _Atomic int64_t pub_out;           /* publishes nats.c holds unacked (nats_send.c) */
    /* the connection's state as a number that grows with each break
     * (nats_send.c, conn_mark), as of the last take-back: no pump sends past
     * a later one before it took back what the connection it saw lost */
    _Atomic uint64_t taken_mark;
    _Atomic int pump_wanted;           /* a topic's is set: the acker (or a flush) pumps */
    /* publish-ack and connection callbacks running; close waits for none
     * once it set pub_cbs_off (after natsConnection_Close), which makes later
     * ones return at once: nats.c does not join their threads */
    _Atomic int pub_cbs_in;
    _Atomic int pub_cbs_off;
    _Atomic uint64_t pub_refused;      /* events the server refused for good, ever */
    _Atomic uint64_t refused_told;     /* pub_refused as kb_flush or kb_drain last saw it */
    _Atomic int64_t pub_moved_ns;      /* last publish ack, or the first publish after none
                                          were out: a stall is measured from it */
    uint64_t stall_in_msgs;            /* acker: messages the connection had read */
    int64_t stall_read_ns;             /* acker: when that count last moved */
    kb_signal *resent;                 /* reconnected, a publish ack done, pump_wanted set:
                                        * flushes look again; a partition's publish
                                        * confirmed (nats.replicas > 1) */
    /* threads */
    _Atomic int stopping;              /* ops->stop: feeders end */
    _Atomic int closing;               /* ops->close: everything ends */
    _Atomic int nc_closed;             /* nats.c ran our closed callback: no more callbacks */
    _Atomic int feed_closed;           /* the same for feed_nc */
    _Atomic int connected;             /* kb_open's background connect succeeded */
    kb_signal *nc_event;               /* nc_closed, feed_closed or connected set */
    _Atomic int published_async;       /* js_PublishAsyncGetPendingList crashes before the
                                          first async publish in nats.c 3.4.1 (NULL map) */
    kb_signal *lease_wake;             /* a claim was fenced, a topic subscribed, close */
    _Atomic int lease_kick;
    /* lease thread: claims whose consumers are being made (nats_lease.c),
     * and how many */
    struct kb_nats_making *making;
    size_t making_n;
    bool making_capped;   /* a round left claims for want of a place */
    _Atomic int leaser_done;           /* the lease thread has left its loop */
    kb_signal *acker_wake;             /* close, pump_wanted: the acker's wait ends early */
    kb_thread *acker, *leaser;
    /* consuming: one feeder thread and one inbox subscription per bus */
    natsSubscription *inbox_sub;
    char inbox[128];
    kb_thread *feeder;
    pthread_mutex_t sub_lock;          /* serialises subscribe */
    _Atomic uint32_t nsubs;            /* topics subscribed (sub_id < nsubs) */
    _Atomic uint32_t reconnects;       /* pull requests open before one are lost */
    uint32_t reconnects_renudged;      /* lease thread: claims' pending asked again */
    _Atomic int renudge_wanted;        /* kb_drain saw a consumer's floor it cannot trust */
    _Atomic int64_t renudge_asked_ns;  /* kb_drain's last such request (monotonic) */
    /* lease thread: pending-set probes' replies (nats_probe.c), on <probe_inbox>.<serial>;
     * destroyed only after the connection is closed (nats.c 3.4.1 could crash
     * delivering to a subscription destroyed meanwhile: nats-io/nats.c#637) */
    natsSubscription *probe_sub;
    char probe_inbox[128];
    uint32_t probe_serial;
    bool probe_open;                   /* its last pull may still deliver */
    /* lease thread: replies to a round's KV puts (nats_lease.c), on
     * <kv_inbox>.<round>.<i>; kept until the connection is closed, as above
     * (a round's late replies come when the bucket's leader is lost) */
    natsSubscription *kv_sub;
    char kv_inbox[128];
    uint32_t kv_round;
    /* renewals a round gave up waiting for, oldest first (sorted by reply
     * subject): an answer that comes later still renews (nats_kv.c) */
    struct kb_nats_late *kv_late;
    size_t kv_late_n, kv_late_cap;
    /* membership as the bucket's subjects show it (nats_watch.c): a core
     * subscription, kept until the connection is closed as above; what it
     * saw of each member key, under watch_mu */
    natsSubscription *watch_sub;
    _Atomic int watch_done;            /* its last callback has returned (nats.c's completion) */
    pthread_mutex_t watch_mu;
    struct kb_nats_seen *watch_seen;   /* sorted by key */
    size_t watch_n, watch_cap;
    /* a claim's frontier moved (the acker): kb_drain and a feeder waiting for
     * ring space wake */
    kb_signal *acked;
    /* broker_length: events counted in frames (nats_tally.c) */
    pthread_mutex_t tally_mu;
};

#endif /* KB_TRANSPORTS_NATS_TYPES_H */
