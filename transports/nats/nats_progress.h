/* Per key, how far a claim's handlers got ("every event of key K up to
 * stream sequence S, event I of its frame, is handled"), recorded on the
 * acker's tick in the runs bucket, so that the next owner of a partition
 * settles those events without a handler although the departing process's
 * ack floor is below them (docs/transports-nats.md, "Replay after a
 * takeover"). Per-key order makes one position per key the whole truth. */
#ifndef KB_TRANSPORTS_NATS_PROGRESS_H
#define KB_TRANSPORTS_NATS_PROGRESS_H

#include "nats_types.h"

#define KB_NATS_PROGRESS_WIDE 1024     /* keys tracked by a wide claim */
#define KB_NATS_PROGRESS_PART 256      /* keys tracked by a partition's claim */
#define KB_NATS_PROGRESS_MS 10         /* a claim's record is written at most this often */
#define KB_NATS_PROGRESS_FINAL "final" /* a finished claim's record starts with this line */

/* The claim's table, made when absent: by the feeder before its first
 * delivery, or by the lease thread before the claim is published. False
 * when out of memory (nothing is recorded then: more comes again, never
 * less). */
bool kb__nats_progress_ready(kb_nats_claim *c);
/* Executor, before the entry settles: event d of entry e is handled. */
void kb__nats_progress_note(const kb_nats_entry *e, const kb_delivery *d);
/* Executor or feeder: event `id` of message sseq, of key `key` (NULL:
 * unknown, or the message's later events too), is released unhandled (it
 * comes again): no record or skip of this claim for that key (NULL: for any
 * key) reaches it. */
void kb__nats_progress_released(kb_nats_claim *c, uint64_t sseq, const char *id,
                                const void *key, size_t key_len);
/* Feeder: did an earlier consumer's handlers finish event `idx` (0: a plain
 * message) of message sseq, of key `key`? */
bool kb__nats_progress_covers(const kb_nats_claim *c, const void *key, size_t key_len,
                              uint64_t sseq, uint32_t idx);
/* Acker: the claim's record, when it changed and is KB_NATS_PROGRESS_MS
 * old (`last`, at close: when it changed); sent without waiting (a lost one
 * only means more comes again). */
void kb__nats_progress_write(kb_transport *t, kb_nats_claim *c, int64_t now, bool last);
/* Lease thread at a hand-over, or kb_close's after it, once claim c is
 * finished (its ring freed, or its feeder gone and every entry settled):
 * its record written and stored, starting with the line "final": no event
 * its consumer delivered has runs recorded that only this consumer's mark
 * would lead the next owner to (what it released had not run before).
 * So the next owner drops this consumer's delivery mark, and the events
 * above the record come again as first deliveries, without a runs read
 * and record each. False (nothing final) when an event was released after
 * a run or a delivery before (its runs may be counted under this consumer's
 * mark only), or the record could not be stored within a round (tried once
 * per claim; a failure stops finals for a lease TTL). */
bool kb__nats_progress_final(kb_transport *t, kb_nats_claim *c);
/* Lease thread, before c is published: take in the record of consumer
 * `earlier` (the keys of c's partitions): only its well-formed lines within
 * `delivered`, the highest stream sequence the server delivered to `earlier`
 * (from its consumer info, read once by the caller); others are logged and
 * ignored. True when the record is final (kb__nats_progress_final). */
bool kb__nats_progress_inherit(kb_transport *t, kb_nats_claim *c, const char *earlier,
                               uint64_t delivered);
/* Lease thread, before the leases of partitions that moved out of wide
 * claim w early go (nats_lease.c): their cuts, stored in the runs bucket
 * (tried once per batch; false when not stored: the next owners then count
 * the wide consumer's deliveries past a cut as attempts, which costs them a
 * runs read and record each, never an event). */
bool kb__nats_progress_moved_store(kb_transport *t, const kb_nats_claim *w);
/* Lease thread, preparing a claim of partition n: the cut at which n moved
 * out of wide consumer `wide` early, when its record names one. */
bool kb__nats_progress_moved_cut(kb_transport *t, const kb_nats_topic *tp, const char *wide,
                                 uint32_t n, uint64_t *cut);
/* One line of a record ("<key hash, 16 hex> <partition> <stream seq> <event
 * index>", no newline), parsed strictly: NULL, or why it is refused (out of
 * form, a partition of `partitions` or more, a sequence past `max_sseq`).
 * Pure: tests/fuzz/fuzz_nats_kv.c runs it. */
typedef struct kb_nats_progress_line {
    uint64_t hash, sseq, idx;
    uint32_t part;
} kb_nats_progress_line;
const char *kb__nats_progress_parse(const char *line, size_t len, uint32_t partitions,
                                    uint64_t max_sseq, kb_nats_progress_line *out);
/* For readers of records (a peek): the hash a line names a key by, and the
 * runs-bucket key of consumer `consumer`'s record. */
uint64_t kb__nats_progress_key_hash(const void *key, size_t len);
void kb__nats_progress_record_key(const char *stream, const char *consumer, char *out,
                                  size_t len);
/* Lease thread: consumer `name` of `stream` is deleted, and so its record. */
void kb__nats_progress_forget(kb_transport *t, const char *stream, const char *name);
/* Close, with the claim. */
void kb__nats_progress_free(kb_nats_claim *c);

#endif /* KB_TRANSPORTS_NATS_PROGRESS_H */
