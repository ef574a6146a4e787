/* file://DIR, the example transport: shared state of its files.
 *
 * On disk, per topic, under DIR/<topic>/:
 *   p<N>.log              partition N's events, append-only (file_log.c)
 *   dlq.log               dead letters, append-only; a replay marks its entry
 *   <group>.p<N>.lock     partition N's lease: flock'ed by the consumer owning it
 *   <group>.p<N>.offset   how far the group has settled partition N (8 bytes)
 *   <group>.members/      one flock'ed file per live consumer (file_lease.c)
 *
 * Layers, top to bottom (a file only calls the ones below it):
 *   file.c                        the ops table, open/close, topic_open
 *   file_dlq.c                    dead letters (replays through file_publish.c)
 *   file_publish.c file_consume.c file_stats.c
 *   file_lease.c   file_settle.c   (over the kit: <keybus/kit.h>)
 *   file_log.c                    record format, append and read
 *   <keybus/transport.h>          the SDK */
#ifndef KB_FILE_INT_H
#define KB_FILE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <keybus/kit.h>

/* One partition of a topic. Its pending queue and lease come from the
 * consumer-group kit (<keybus/kit.h>): the cookie of a delivery is its
 * kb_kit_pending entry. */
struct kb__file_part {
    uint32_t index;
    int log_fd;                     /* O_APPEND: one write() per record */
    int offset_fd;                  /* the group's committed offset */
    _Atomic int dirty;              /* appended since the last fsync */
    _Atomic uint64_t published_end; /* end of this process's last append: kb_drain waits for it */
    kb_kit_queue *queue;            /* deliveries in log order; the settled prefix */

    /* Consumer side. lease_fd, stalled and read_off belong to the reader
     * thread (and to close, after the reader stopped). */
    int lease_fd;                   /* -1: not owned */
    int stalled;                    /* a damaged record: read no further */
    uint64_t read_off;              /* next record to deliver */
    _Atomic int owned;              /* lease_fd >= 0, for other threads */
    uint64_t committed_written;     /* what offset_fd holds (reader thread) */
};

struct kb_transport_topic {
    kb_transport_topic *_Atomic next;  /* t->topics: prepended, never removed before close */
    kb_transport *t;
    char *name;
    char *dir;                         /* DIR/<topic> */
    uint32_t partitions;
    uint32_t stored_partitions;        /* DIR/<topic>/partitions: the topic's count */
    struct kb__file_part *parts;
    _Atomic uint64_t published;
    kb_sink *_Atomic sink;             /* set by subscribe: the reader feeds it */
    pthread_mutex_t dlq_lock;          /* with flock on dlq_fd: one replay at a time */
    int dlq_fd;                        /* O_APPEND: new dead letters */
    int dlq_mark_fd;                   /* the same file, to mark replays in place */
    /* membership (file_lease.c), reader thread */
    _Atomic int member_fd;             /* -1 until subscribe; kb_partition_stats_get reads it */
    char *member_path;
    kb_kit_members *members;           /* the kit's lease manager, from subscribe on */
    kb_kit_queue **queues;             /* parts[i].queue again: the manager asks them */
};

struct kb_transport {
    kb_bus *bus;
    char *dir;
    char *group, *consumer;
    uint32_t partitions;
    int poll_ms;
    int fsync_on_flush;
    kb_transport_topic *_Atomic topics;
    pthread_mutex_t topics_lock;       /* topic_open and subscribe */
    kb_signal *wake;                   /* an append here, or stop: the reader looks again */
    _Atomic uint64_t appends;
    _Atomic int tick_now;              /* a new subscription: keep the leases at once */
    kb_signal *settled;                /* a committed offset moved: kb_drain looks again */
    kb_thread *reader;
    _Atomic int stopping;
};

/* file_log.c: records. A record is a kb__file_rec head, then key, payload,
 * packed headers and (dead letters) the reason. */
#define KB_FILE_MAGIC 0x3146424bu   /* "KBF1" */
struct kb__file_rec {
    uint32_t magic;
    uint32_t replayed;      /* dead letters: set in place by a replay */
    uint32_t key_len, payload_len, headers_len, n_headers;
    uint32_t reason_len, attempts, partition, pad;
    int64_t  time_ms;       /* dead letters: when */
    uint64_t original;      /* dead letters: the event's offset in its partition log */
};

/* A record read back; the pointers point into the reader's buffer. */
struct kb__file_read {
    struct kb__file_rec head;
    uint64_t offset, end;
    const char *key, *payload, *reason;
    kb_header headers[KB_MAX_HEADERS];
};

struct kb__file_buf {
    char *data;
    size_t cap;
};

int kb__file_append(int fd, const struct kb__file_rec *head, const kb_msg *m,
                    const char *reason, uint64_t *end);
/* KB_OK with *r filled, KB_ENOTFOUND at the end of the log (or before a
 * record still being written), KB_EINVAL on a damaged record. */
int kb__file_read_at(int fd, uint64_t offset, struct kb__file_buf *buf, struct kb__file_read *r);
uint64_t kb__file_unix_ms(void);

/* file_settle.c: the committed offset on disk (the queue is the kit's). */
int  kb__file_commit_write(struct kb__file_part *p);
uint64_t kb__file_committed(struct kb__file_part *p);

/* file_lease.c: membership and the flocks under the kit's lease manager
 * (reader thread and close). */
int  kb__file_member_join(kb_transport_topic *tt, char *errstr, size_t errlen);
void kb__file_member_leave(kb_transport_topic *tt);
uint32_t kb__file_members(kb_transport_topic *tt);
/* "" or the consumer holding partition p's lease, into out. */
void kb__file_lease_owner(kb_transport_topic *tt, uint32_t p, char *out, size_t outlen);

/* KB_OK, or KB_EINVAL naming both counts when the topic was made with
 * another partition count: a key would hash to another log (publish and
 * subscribe check it). */
static inline int kb__file_count_check(const kb_transport_topic *tt)
{
    if (tt->stored_partitions == tt->partitions)
        return KB_OK;
    kb_errf(NULL, 0, "file: topic %s has partitions=%u in %s/partitions but this process is "
            "configured with partitions=%u; use the stored count", tt->name,
            tt->stored_partitions, tt->dir, tt->partitions);
    return KB_EINVAL;
}

/* file_publish.c */
int kb__file_publish(kb_transport *t, kb_transport_topic *tt, const kb_msg *m);
int kb__file_flush(kb_transport *t, int timeout_ms);
int kb__file_drain(kb_transport *t, int timeout_ms);

/* file_consume.c */
int  kb__file_subscribe(kb_transport *t, kb_transport_topic *tt, kb_sink *sink);
int  kb__file_ack(kb_transport *t, const kb_delivery *d);
void kb__file_stop(kb_transport *t);

/* file_dlq.c */
int kb__file_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason);
int kb__file_dead_letters(kb_transport *t, kb_transport_topic *tt, const char *after_id,
                          size_t max, kb_dead_letter_fn fn, void *opaque);
int kb__file_dead_letter_replay(kb_transport *t, kb_transport_topic *tt, const char *id);

/* file_stats.c */
int kb__file_stats(kb_transport *t, kb_transport_topic *tt, kb_topic_stats *out);
int kb__file_partition_stats(kb_transport *t, kb_transport_topic *tt, uint32_t partition,
                             kb_partition_stats *out);

#endif /* KB_FILE_INT_H */
