/* Handler runs on the server (docs/transports-nats.md, "Attempts are handler
 * runs"): the runs KV bucket, the run_begins hook, the feeder's read, and the
 * crash journal adopted at open. */
#ifndef KB_TRANSPORTS_NATS_RUNS_H
#define KB_TRANSPORTS_NATS_RUNS_H

#include "nats_types.h"

/* At the first subscribe, before the feeder starts (a bus that only publishes
 * or reads creates nothing): the bucket <nats.lease_bucket>_runs, then the
 * bus's crash journal (dead processes' journals adopted first). Once bound,
 * later calls return KB_OK. Under sub_lock. */
int kb__nats_runs_open(kb_transport *t, char *errstr, size_t errlen);
/* At close, after every thread that reads or writes records stopped. */
void kb__nats_runs_close(kb_transport *t);
/* The run_begins hook: record run d->attempt of d before its handler starts. */
void kb__nats_run_begins(kb_transport *t, const kb_delivery *d);
/* Acker: entry e is acked, so its message's run record goes (a delete marker
 * behind the ack on the consumer's connection, sent without waiting for the
 * answer). */
void kb__nats_runs_forget(kb_transport *t, const kb_nats_entry *e);
/* Feeder: the attempt of event `id` of message `sseq`, which the server
 * delivered before (`delivered`: kb__nats_attempt's count): its recorded
 * runs + 1, or `delivered` when the records cannot be read. One KV read per
 * message (the events of a frame share it). */
/* NULL when `value` is a well-formed record of message `sseq` (lines
 * "<sseq>[.<index>] <runs>\n", index 1..KB_NATS_BATCH_MAX, runs of 1 to 8
 * digits), else why not: such a record is not taken (the attempt comes from
 * the delivery count, as for one unread). Pure: tests/fuzz/fuzz_nats_kv.c. */
const char *kb__nats_runs_check(const char *value, uint64_t sseq);
uint32_t kb__nats_runs_attempt(kb_transport *t, const kb_nats_topic *tp, uint64_t sseq,
                               const char *id, uint32_t delivered);

#endif /* KB_TRANSPORTS_NATS_RUNS_H */
