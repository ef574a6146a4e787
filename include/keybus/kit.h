/*
 * The consumer-group kit: the parts every partitioned transport needs, written
 * once (docs/transports.md, "The consumer-group kit"). A transport may use any
 * of the three on its own:
 *
 *   kb_kit_queue    the settled-prefix pending queue and committed offset of
 *                   one partition: deliveries pushed in log order, settled in
 *                   any order; the committed offset only passes a prefix of
 *                   settled events.
 *   kb_kit_members  membership and leases over a few broker callbacks: a fair
 *                   share per live member (rendezvous ranking, bounded at
 *                   ceil(partitions / members)), hand-over only once the
 *                   partition's queue is idle, a generation per lease for
 *                   still_owned, kb_bus_lease_changed. It owns no thread: the
 *                   transport calls kb_kit_members_tick from its own, so a
 *                   blocking client fits.
 *   kb_kit_backlog  a bounded publish backlog: tickets, flush by ticket,
 *                   publish waiting for room up to pool.enqueue_timeout_ms
 *                   then KB_EFULL, resends with backoff, and exactly one
 *                   delivery report per accepted event (a frame of several
 *                   events is sent and resent whole, and reports each).
 *   kb_kit_drain    kb_drain's wait: the transport's flush, then the broker
 *                   asked until the group settled what this process wrote,
 *                   woken early by this process's own settling.
 *
 * Handles are opaque, made by *_new and freed by *_free. Errors are KB_E*
 * codes with kb_last_error saying why, as in <keybus/transport.h>.
 *
 * The config structs (kb_kit_members_conf, kb_kit_backlog_conf,
 * kb_kit_drain_conf) start with
 * `size`: the caller sets it to sizeof the struct it was built with. A later
 * kit may add fields at their end (kb_kit_broker is the last member of
 * kb_kit_members_conf, so its new callbacks come there too) and reads the
 * ones past an older caller's `size` as zero: not set.
 */
#ifndef KEYBUS_KIT_H
#define KEYBUS_KIT_H

#include <keybus/transport.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * The pending queue of one partition.
 *
 * Each delivery handed to a sink gets an entry, pushed in log order; its
 * pointer is the delivery's cookie. ack and dead_letter settle it, release
 * gives it back; the committed offset is the `end` of the last entry of the
 * settled prefix, so a restart from it repeats events (at least once) but
 * never skips one.
 *
 * Who frees an entry: the queue, always. A settled entry is freed when the
 * prefix passes it; a released one stays (it blocks the prefix: the next
 * owner delivers it again) and is freed by kb_kit_queue_restart or
 * kb_kit_queue_free. The transport never frees a cookie of the kit.
 * ------------------------------------------------------------------------- */
typedef struct kb_kit_queue kb_kit_queue;
typedef struct kb_kit_pending kb_kit_pending;

/* A queue for `partition`, starting at `committed`; the caller owns it
 * (kb_kit_queue_free). `moved` (may be NULL, borrowed until free) is notified
 * whenever the committed offset moves (what kb_drain waits on). NULL on out
 * of memory. Thread: any (the transport's topic_open, say). */
KB_EXPORT kb_kit_queue *kb_kit_queue_new(uint32_t partition, uint64_t committed,
                                         kb_signal *moved);
/* Free the queue and every entry still in it (released or never settled).
 * Thread: one, once no delivery of it can come back (close, after the
 * executors stopped). */
KB_EXPORT void kb_kit_queue_free(kb_kit_queue *q);

/* Append a delivery whose log position just past it is `end` (greater than
 * every `end` pushed before); *out is the cookie to hand to the sink.
 * `generation` is the lease generation it was read under
 * (kb_kit_members_generation; 0 without a lease manager).
 * KB_OK or KB_ENOMEM. Thread: the one feeder of the partition. With a
 * lease manager the feeder is the thread that ticks it: the tick marks a
 * partition leaving, then reads kb_kit_queue_outstanding to hand it over,
 * with nothing ordering that against a push from another thread. */
KB_EXPORT int kb_kit_queue_push(kb_kit_queue *q, uint64_t end, uint64_t generation,
                                kb_kit_pending **out);
/* Take back the entry pushed last, which the sink refused (it is read again
 * later); it is freed. Thread: the feeder. */
KB_EXPORT void kb_kit_queue_cancel(kb_kit_queue *q, kb_kit_pending *pe);

/* Acked or dead-lettered: the entry is settled; the committed offset moves
 * over the settled prefix. Returns 1 when it moved, else 0. Each entry is
 * settled or released once. Thread: any (executors, in any order). */
KB_EXPORT int kb_kit_settle(kb_kit_pending *pe);
/* Given back unhandled (the release hook, a lease lost): the entry stays
 * unsettled and stops the committed offset; the queue frees it later. A
 * released entry at the head holds the committed offset where it is for as
 * long as the partition is kept (nothing behind it is committed): only
 * kb_kit_queue_restart, after the partition is taken again, moves past it.
 * Thread: any. */
KB_EXPORT void kb_kit_release(kb_kit_pending *pe);

/* The entry's partition, position and lease generation. Thread: any, while
 * the entry is the caller's (before settle or release). */
KB_EXPORT uint32_t kb_kit_pending_partition(const kb_kit_pending *pe);
KB_EXPORT uint64_t kb_kit_pending_end(const kb_kit_pending *pe);
KB_EXPORT uint64_t kb_kit_pending_generation(const kb_kit_pending *pe);

/* The committed offset: the end of the settled prefix. Thread: any. */
KB_EXPORT uint64_t kb_kit_queue_committed(const kb_kit_queue *q);
/* Entries handed out and neither settled nor released. 0: idle, nothing of
 * the partition is with the bus, so its lease may be handed over. Thread: any. */
KB_EXPORT size_t kb_kit_queue_outstanding(const kb_kit_queue *q);
/* Start again at `committed` (the partition taken, perhaps after another
 * owner): frees the released entries. KB_OK, or KB_EINVAL while deliveries
 * are outstanding (they must come back first). Thread: the feeder's — with
 * a lease manager the tick's, from try_take or gained (the lease manager
 * takes a partition only once it is idle, so there it returns KB_OK). */
KB_EXPORT int kb_kit_queue_restart(kb_kit_queue *q, uint64_t committed);

/* ---------------------------------------------------------------------------
 * Membership and leases.
 *
 * Every tick the manager lists the live members, computes this member's fair
 * share — each partition goes, in order, to the highest-ranked member
 * (kb_rendezvous_owner) that has fewer than ceil(partitions / members)
 * already, so every process computes the same assignment from the same
 * member set, and a member joining or leaving moves few partitions — then:
 * renews what it holds; tries to take what is its share and free; marks what
 * is no longer its share as leaving (read no more) and gives it back once
 * its queue is idle (hand-over once settled, so per-key order holds across
 * processes). A leaving partition stays leaving even when the member set
 * changes back: it is handed back once idle and taken again by the next
 * tick, with a new generation and `gained`. A partition whose queue still
 * has deliveries outstanding from an earlier lease is not taken again until
 * they came back. A renewal whose answer comes at or after the lease's
 * deadline (judged by the clock read once the answers are in, not by the
 * tick's `now`) is a lapse, handled as a loss: the partition is dropped
 * (`lost`, kb_bus_lease_changed 0) and taken again by the normal path, once
 * idle, with a new generation (`gained`).
 * ------------------------------------------------------------------------- */
typedef struct kb_kit_members kb_kit_members;

/* One lease request of a tick, for kb_kit_broker.round: the kit owns the
 * array, the transport indexes it, so its layout is fixed for good. */
typedef struct kb_kit_lease_op {
    uint32_t partition;
    int take;      /* 1: take it (as try_take), 0: renew it (as renew) */
    int result;    /* set by round: what try_take or renew would return */
} kb_kit_lease_op;

/* The broker's side, called only from kb_kit_members_tick and
 * kb_kit_members_leave, on the caller's thread (so they may block). Copied
 * by kb_kit_members_new; `opaque` is borrowed until kb_kit_members_free. */
typedef struct kb_kit_broker {
    void *opaque;
    /* Take partition p's lease for this member (or keep it, when this member
     * holds it already, e.g. after a lapse): 1 taken (the transport sets its
     * read position, e.g. kb_kit_queue_restart at the group's committed
     * offset: p is idle), 0 another member holds it, < 0 an error (tried
     * again next tick). */
    int (*try_take)(void *opaque, uint32_t p);
    /* Keep partition p's lease: 1 still ours, 0 lost, < 0 no answer (kept
     * until its deadline, then lost). An answer that comes at or after the
     * deadline is a lapse: lost. NULL: a lease is never lost while held
     * (a flock). */
    int (*renew)(void *opaque, uint32_t p);
    /* Optional: a tick's takes and renewals in one go (a pipeline: one round
     * trip), in place of try_take and renew: fill ops[i].result for each. */
    void (*round)(void *opaque, kb_kit_lease_op *ops, size_t n);
    /* Hand partition p's lease back (store the committed offset first): its
     * deliveries are all back, or the member is leaving. KB_OK, or a KB_E*
     * code: still held, tried again next tick (at leave: dropped anyway). */
    int (*give_back)(void *opaque, uint32_t p);
    /* Optional: partition p was taken and has a new generation (p is idle:
     * no delivery of an earlier lease is out), so the transport reads it
     * again from its start (kb_kit_queue_restart returns KB_OK here). */
    void (*gained)(void *opaque, uint32_t p);
    /* Optional: partition p was lost (renew said 0, its deadline passed, or
     * the renewal's answer came only after it: a lapse). Deliveries of it may
     * still be out; it is taken again only once they came back. */
    void (*lost)(void *opaque, uint32_t p);
    /* Optional: 1 when none of p's deliveries is with the bus. NULL: the
     * partition's queue is asked (kb_kit_queue_outstanding). */
    int (*idle)(void *opaque, uint32_t p);
    /* The live members' names, this one included, into *out (an empty set
     * on entry; the manager frees it). KB_OK or a KB_E* code (the tick then
     * changes no share). */
    int (*members)(void *opaque, kb_names *out);
    /* Optional: the clock the tick's `now` comes from, read once a tick's
     * answers are in to judge lapses. NULL: kb_now_ns. */
    int64_t (*now)(void *opaque);
} kb_kit_broker;

/* Copied by kb_kit_members_new; what it points to is borrowed until
 * kb_kit_members_free unless it says otherwise. */
typedef struct kb_kit_members_conf {
    size_t size;                 /* first: sizeof(kb_kit_members_conf), set by the caller */
    kb_bus *bus;                 /* kb_bus_lease_changed (borrowed until free); NULL: not
                                    called */
    const char *me;              /* this member's name as `members` lists it (copied) */
    uint32_t partitions;
    kb_kit_queue *const *queues; /* queues[p] per partition: asked whether idle (the array
                                    and the queues borrowed until free); NULL with
                                    broker.idle */
    const char *const *names;    /* names[p]: the partition's broker name for
                                    kb_bus_lease_changed (borrowed until free); NULL: not
                                    called */
    int64_t lease_ns;            /* how long a take or renew holds the lease, from the
                                    tick's `now`, margin already taken off; 0: until
                                    given back (renew may be NULL) */
    kb_kit_broker broker;        /* last: a later kit adds callbacks at its end */
} kb_kit_members_conf;

/* A lease manager holding no lease; the caller owns it (kb_kit_members_free).
 * NULL on out of memory or a bad conf (a `size` this kit does not know among
 * them; kb_last_error says which). Thread: any, before the first tick. */
KB_EXPORT kb_kit_members *kb_kit_members_new(const kb_kit_members_conf *c);
/* Free it; call kb_kit_members_leave first to give the leases back. Thread:
 * the tick's, once no other call on it runs (executors asking still_owned
 * have stopped). */
KB_EXPORT void kb_kit_members_free(kb_kit_members *m);

/* One round at time `now` (kb_now_ns(), or broker.now's clock): members,
 * renewals, takes, hand-overs. Returns the partitions held afterwards.
 * Thread: one (the transport's), never concurrently with itself or leave. */
KB_EXPORT uint32_t kb_kit_members_tick(kb_kit_members *m, int64_t now);
/* Give back every partition held, settled or not (close: the executors have
 * stopped, what is unsettled is delivered again by the next owner). Thread:
 * as tick. */
KB_EXPORT void kb_kit_members_leave(kb_kit_members *m);

/* Partition p's lease generation: a number that changes every time this
 * member takes it (a lapse is a loss, then a take), 0 while not held. Stamp
 * it on each delivery (kb_kit_queue_push). Thread: any. */
KB_EXPORT uint64_t kb_kit_members_generation(const kb_kit_members *m, uint32_t p);
/* still_owned: 1 when partition p is still held under `generation` and its
 * deadline has not passed at `now`, else 0. Thread: any. */
KB_EXPORT int kb_kit_members_still_owned(const kb_kit_members *m, uint32_t p,
                                         uint64_t generation, int64_t now);
/* 1 when p is held and not being handed over: the feeder reads it (on the
 * tick's thread, see kb_kit_queue_push). Thread: any. */
KB_EXPORT int kb_kit_members_reading(const kb_kit_members *m, uint32_t p);
/* Partitions held now; live members seen at the last tick. Thread: any. */
KB_EXPORT uint32_t kb_kit_members_held(const kb_kit_members *m);
KB_EXPORT uint32_t kb_kit_members_live(const kb_kit_members *m);

/* The fair share alone, for a transport that keeps its own lease code
 * (nats:// does): mine[p] = 1 for each partition p < `partitions` that the
 * rule above gives to `me` among members[0..n) (any order, `me` among
 * them), else 0; n == 0: every partition 1 (nobody listed yet: ours to
 * try). `salt` spreads topics: 0 ranks partition p by its number, as
 * kb_kit_members does; another value (a topic's hash) is mixed into each
 * number, so that the member ranked first differs from topic to topic.
 * `mine` (`partitions` bytes) and the names are the caller's. Out of memory
 * it gives plain rendezvous (unbounded). Thread: any (no state). */
KB_EXPORT void kb_kit_share(const char *const *members, size_t n, const char *me,
                            uint32_t partitions, uint32_t salt, unsigned char *mine);

/* ---------------------------------------------------------------------------
 * The publish backlog.
 *
 * publish adds an event and returns (no round trip); a sender thread of the
 * transport takes batches, sends them and says how each went. Each event gets
 * a ticket (1, 2, ...); flush waits until every event up to a ticket has its
 * report. Exactly one report per event added: kb_bus_delivery_report when
 * stored, kb_bus_publish_failed when it failed for good (attempts used up,
 * refused, or given up by kb_kit_backlog_fail_all at close).
 *
 * An item is what the sender sends as one broker message: one event
 * (kb_kit_backlog_add) or a frame of several (kb_kit_backlog_add_frame). A
 * frame is taken, sent, resent and settled whole, so a broker that drops a
 * copy by its message ID (JetStream's Nats-Msg-Id) stores it once; each of
 * its events still gets its own ticket and its own report.
 *
 * "Partition" is the item's partition as the transport numbers it within
 * one backlog (one backlog per topic, say): items of two topics with the
 * same number in one backlog are held back as one partition.
 * ------------------------------------------------------------------------- */
typedef struct kb_kit_backlog kb_kit_backlog;

/* One item in the backlog: an event, or a frame of `events` events. `data`
 * is the transport's (its encoded entry or frame); the rest is what the
 * reports say. Read-only to the transport, which only holds pointers to it
 * (the kit allocates it, so a later kit may add fields at its end). */
typedef struct kb_kit_item {
    void *data;
    uint64_t ticket;       /* the (first) event's; a frame's events have
                              ticket .. ticket + events - 1 */
    uint32_t partition;
    uint32_t attempts;     /* sends so far */
    const char *topic;     /* borrowed: the topic's name outlives the backlog */
    const void *key;       /* a copy, only when the bus wants reports; NULL in a
                              frame (the kit keeps each event's) */
    size_t key_len;
    uint32_t events;       /* 1, or a frame's count (kb_kit_backlog_add_frame) */
} kb_kit_item;

/* One event's key, for kb_kit_backlog_add_frame: an array the caller
 * allocates, so its layout is fixed for good. */
typedef struct kb_kit_key {
    const void *key;
    size_t key_len;
} kb_kit_key;

/* Copied by kb_kit_backlog_new. */
typedef struct kb_kit_backlog_conf {
    size_t size;            /* first: sizeof(kb_kit_backlog_conf), set by the caller */
    kb_bus *bus;            /* reports, kb_bus_random for the backoff (borrowed until
                               free) */
    size_t capacity;        /* events held at most (> 0); a frame counts its events */
    int timeout_ms;         /* how long add waits for room before KB_EFULL:
                               kb_bus_enqueue_timeout_ms(bus) */
    uint32_t max_attempts;  /* sends before an item fails for good (> 0) */
    int64_t backoff_ms, max_backoff_ms;   /* between sends of one item (kb_backoff_ns) */
    void (*free_data)(void *data);        /* frees kb_kit_item.data; NULL: nothing */
    /* The fields below came later: a caller built before them sets a smaller
     * `size`, and they read as 0 (not set). */
    /* Non-zero: at most one item of a partition in flight at a time (taken
     * and not done, or waiting for its resend): none of a partition is
     * stored ahead of an earlier one even when the broker loses some it
     * took (a replicated stream's leader lost). Without it, items of a
     * partition are pipelined. With it, the backlog keeps a little state
     * (about 50 bytes) per partition number it saw until it is freed: pass
     * the topic's partition numbers, never a key's hash. */
    int one_in_flight_per_partition;
    /* Optional: the report ID of event `index` (from 0) of a frame, made from
     * the `id` given to kb_kit_backlog_done, into out (len bytes, at least
     * strlen(id) + 24, NUL-terminated). NULL: every event of a frame is
     * reported with `id` itself. Not called when done's `id` is NULL.
     * Runs in kb_kit_backlog_done, on its thread. */
    void (*event_id)(const char *id, uint32_t index, char *out, size_t len);
    /* Later still (a caller built before them reads them as 0). Non-zero: a
     * second bound, in bytes, for a broker whose cost is its bytes (a
     * client-side write buffer): add waits, as for `capacity`, while the
     * items held and this one would pass it. An item over it alone is taken
     * once the backlog holds no bytes (under a steady flow of others that may
     * not come before timeout_ms: then KB_EFULL, as for any add). It needs
     * data_bytes: an item's bytes, read once in add, on its thread. 0: events
     * alone are counted, data_bytes not called. */
    size_t capacity_bytes;
    size_t (*data_bytes)(const void *data);
} kb_kit_backlog_conf;

/* An empty backlog; the caller owns it (kb_kit_backlog_free). NULL on out of
 * memory or a bad conf (a `size` this kit does not know among them: the
 * current sizeof, or that of a kit before the fields marked later; a
 * capacity_bytes without data_bytes).
 * Thread: any (topic_open, say). */
KB_EXPORT kb_kit_backlog *kb_kit_backlog_new(const kb_kit_backlog_conf *c);
/* Free it and every item left (call kb_kit_backlog_fail_all first: each
 * event still needs its report). Thread: one, once no other call runs. */
KB_EXPORT void kb_kit_backlog_free(kb_kit_backlog *b);

/* Add an event; the backlog owns `data` from KB_OK on. Waits while the
 * backlog is full (its capacity, or its capacity_bytes), up to timeout_ms, then KB_EFULL (data stays the
 * caller's); KB_ECLOSED once closed. *ticket (may be NULL) is the event's.
 * The key is copied (only when the bus wants reports). Thread: any
 * (publish). */
KB_EXPORT int kb_kit_backlog_add(kb_kit_backlog *b, void *data, const char *topic,
                                 uint32_t partition, const void *key, size_t key_len,
                                 uint64_t *ticket);
/* Add a frame: `events` events (1 .. capacity, else KB_EINVAL) sent as one
 * item `data`, keys[i] the key of event i (copied when the bus wants
 * reports; the array stays the caller's; NULL when kb_bus_delivery_wanted
 * says no report is wanted). As kb_kit_backlog_add otherwise:
 * waits until the backlog has room for all of them; *ticket (may be NULL)
 * is the frame's last event's (flush waits for all of them by it). Each
 * event gets its own report when the frame is done, with the frame's result
 * (conf.event_id names each). Thread: any (publish). */
KB_EXPORT int kb_kit_backlog_add_frame(kb_kit_backlog *b, void *data, const char *topic,
                                       uint32_t partition, const kb_kit_key *keys,
                                       uint32_t events, uint64_t *ticket);

/* Up to `max` items due at `now`, oldest first, into out[]: they are in
 * flight until kb_kit_backlog_done. Not due: an item to resend while it
 * waits out its backoff, or while an earlier item of its partition is in
 * flight (sent first, it would be stored first if that one failed too); nor
 * any later item of its partition not yet taken, which waits behind it;
 * with one_in_flight_per_partition, no item of a partition that has one in
 * flight. Without that limit, items of its partition already in flight when
 * one failed are not held: they may be stored before its resend. So a
 * transport that needs one key's events in order through failures sets
 * one_in_flight_per_partition (an item taken and not sent is in flight all
 * the same), or resends in order itself.
 * Returns how many. Thread: the sender (one). */
KB_EXPORT size_t kb_kit_backlog_take(kb_kit_backlog *b, kb_kit_item **out, size_t max,
                                     int64_t now);
/* How a taken item went: result KB_OK with the broker's `id` (stored: its
 * report, one per event of a frame; `id` NULL: reported with an empty ID),
 * or a KB_E* code with `error`. `retry`
 * non-zero: send the same item again after the backoff, unless max_attempts
 * are used up; else it failed for good. Each item taken is done once (by
 * this, kb_kit_backlog_done_each or kb_kit_backlog_stored); the item is the
 * kit's again from this call on (a stored one is freed here, or kept for a
 * later add: not to be touched again).
 * Reports run here, with no lock of the backlog held. It notifies the
 * sender's signal (kb_kit_backlog_signal): a done may make an item due.
 * Thread: any (the broker client's acknowledgement thread, say), several at
 * once; never during or after kb_kit_backlog_fail_all. */
KB_EXPORT void kb_kit_backlog_done(kb_kit_backlog *b, kb_kit_item *it, int result, int retry,
                                   const char *id, const char *error);
/* One event's outcome, for kb_kit_backlog_done_each: an array the caller
 * allocates, so its layout is fixed for good. */
typedef struct kb_kit_result {
    int result;           /* KB_OK: stored; else a KB_E* code: failed for good */
    const char *id;       /* the broker's ID when stored; NULL: an empty one */
    const char *error;    /* why it failed; NULL: kb_strerror(result) */
} kb_kit_result;

/* How each event of a taken item went, when they went apart (a frame the
 * transport had to send again as one message per event, some refused):
 * results[i] (it->events of them, borrowed for the call) is event i's
 * report; event_id is not called. The item is done for good, nothing of it
 * resent. Otherwise as kb_kit_backlog_done: each item taken is done once;
 * reports run here with no lock of the backlog held.
 * Thread: as kb_kit_backlog_done. */
KB_EXPORT void kb_kit_backlog_done_each(kb_kit_backlog *b, kb_kit_item *it,
                                        const kb_kit_result *results);
/* Items taken, all stored: items[i] with the broker's ids[i] (NULL: an
 * empty ID), as kb_kit_backlog_done(b, items[i], KB_OK, 0, ids[i], NULL)
 * for each in turn, but under one hold of the backlog's lock and one
 * wake-up of its waiters: for a sender that confirms a pipeline's replies
 * at once, where a lock and a wake-up per item cost more than the item
 * (the arrays are borrowed for the call). Thread: as
 * kb_kit_backlog_done. */
KB_EXPORT void kb_kit_backlog_stored(kb_kit_backlog *b, kb_kit_item *const *items,
                                     const char *const *ids, size_t n);
/* When the next item is due (a backoff ending; now or earlier: one is due),
 * or INT64_MAX when none is due by time alone: how long the sender may
 * sleep. An item behind an earlier one in flight (a resend, or any item
 * under one_in_flight_per_partition) is not due by time: only that one's
 * kb_kit_backlog_done can make it due, and it notifies the signal, so the
 * sender waits on kb_kit_backlog_signal until this time and asks again.
 * Thread: the sender. */
KB_EXPORT int64_t kb_kit_backlog_next_due(kb_kit_backlog *b);

/* The ticket of the last event added (0: none): flush waits for it. Thread: any. */
KB_EXPORT uint64_t kb_kit_backlog_last_ticket(kb_kit_backlog *b);
/* Wait until every event up to `ticket` has its report: KB_OK, or
 * KB_ETIMEDOUT at deadline_ns. Thread: any. */
KB_EXPORT int kb_kit_backlog_flush(kb_kit_backlog *b, uint64_t ticket, int64_t deadline_ns);
/* Events added and not yet reported (a frame counts its events). Thread: any. */
KB_EXPORT size_t kb_kit_backlog_length(kb_kit_backlog *b);
/* The sender's wake-up: notified when an item is added or done, or the
 * backlog closes. The backlog owns it: borrowed until kb_kit_backlog_free.
 * Thread: any (the sender waits on it). */
KB_EXPORT kb_signal *kb_kit_backlog_signal(kb_kit_backlog *b);

/* Close: refuse new events (KB_ECLOSED), then report every event left,
 * in flight or not, as failed (`result`, `why`: given up by close). Call it
 * once the sender stopped and no kb_kit_backlog_done can come any more (the
 * broker client's callbacks stopped too: an item in flight is freed here).
 * Thread: close's. */
KB_EXPORT void kb_kit_backlog_fail_all(kb_kit_backlog *b, int result, const char *why);

/* ---------------------------------------------------------------------------
 * kb_drain's wait.
 *
 * Every transport's drain is the same loop around two broker-specific
 * questions: send what is buffered (the transport's kb_flush work), note
 * what this process wrote last per partition, then ask the broker whether
 * the group settled it, until it did or the deadline. Between asks it waits
 * on a signal the transport notifies when this process settles something
 * (its own consumers are then likely the ones the drain waits for) or, for
 * consumers in other processes, on a backoff. kb_close ends it between steps
 * (KB_ECLOSED): it holds kb_close up until the drain returns.
 * ------------------------------------------------------------------------- */

/* Read by kb_kit_drain (copied at its start); what it points to is
 * borrowed for the call. */
typedef struct kb_kit_drain_conf {
    size_t size;        /* first: sizeof(kb_kit_drain_conf), set by the caller */
    void *opaque;       /* passed to every callback */
    /* One slice of the flush: KB_OK once every event published before the
     * drain is stored, KB_ETIMEDOUT when not by until_ns (called again while
     * the deadline allows), else an error that ends the drain. */
    int (*flush)(void *opaque, int64_t until_ns);
    /* Optional: after the flush, note what to wait for (the newest position
     * this process wrote per partition). KB_OK, or a KB_E* code (with
     * kb_errf) that ends the drain. */
    int (*targets)(void *opaque);
    /* Ask the broker: 1 when the group settled every target (none left), 0
     * not yet, also when the broker could not be asked (a restart: the drain
     * goes on until its deadline), or a negative KB_E* code that ends it.
     * Its calls wait no longer than deadline_ns (the drain's), and several
     * calls stop asking once it passed or kb_bus_closing says so. */
    int (*settled)(void *opaque, int64_t deadline_ns);
    /* Optional, together (NULL: timed waits only): a signal notified when
     * this process settles something (borrowed for the call), and the
     * condition waited on: 1 when this process's own settling may have
     * reached the targets since `settled` last asked, so the broker is asked
     * again after confirm_ms without growing the backoff. */
    kb_signal *progress;
    int (*local)(void *opaque);
    int poll_min_ms;    /* the first wait between asks (>= 1) */
    int poll_max_ms;    /* the backoff doubles up to it (>= poll_min_ms) */
    int confirm_ms;     /* after `local` said 1: the broker's view lags ours (>= 0) */
} kb_kit_drain_conf;

/* Run kb_drain's wait with timeout_ms (< 0: none; the flush counts in it) on
 * bus `b`: KB_OK when the group settled everything this process published
 * before the call, KB_ETIMEDOUT at the deadline, KB_ECLOSED once kb_close
 * began (seen between steps: within one wait, poll_max_ms at most), or what
 * a callback returned; KB_EINVAL for a conf this kit does not know (a
 * `size` other than sizeof(kb_kit_drain_conf), a callback missing, a bad
 * bound). Callbacks run on the calling thread. Thread: any (a transport's
 * drain hook). */
KB_EXPORT int kb_kit_drain(kb_bus *b, int timeout_ms, const kb_kit_drain_conf *c);

#ifdef __cplusplus
}
#endif

#endif /* KEYBUS_KIT_H */
