/* Test harness for forged broker data (test_redis_forged, test_nats_forged):
 * the bus's log captured, and the check every transport shares of a dead
 * letter another client forged. */
#ifndef KB_TEST_FORGED_H
#define KB_TEST_FORGED_H

#include <stdatomic.h>
#include <stdbool.h>

#include <keybus/keybus.h>

/* Capture the log of buses opened on `c` (one buffer for the process). */
void kb_test_log_capture(kb_conf *c);
/* Some captured line holds `text`. Thread: any. */
bool kb_test_logged(const char *text);

/* The first dead letter of `topic` (key `key`, forged with partition 999 and
 * an attempt count past 32 bits, 8 partitions) lists range-checked: the
 * key's partition, 0 attempts; its replay is handled (`*calls` becomes 1)
 * and logs the partition it went to. Main thread only (it asserts). */
void kb_test_forged_dead_letter_replays(kb_bus *b, const char *topic, const char *key,
                                        _Atomic int *calls);

#endif /* KB_TEST_FORGED_H */
