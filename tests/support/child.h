/* Consumer processes of the multi-process tests (redis_consumer_proc,
 * runs_proc): one bus, one subscription, until SIGTERM. */
#ifndef KB_TEST_CHILD_H
#define KB_TEST_CHILD_H

#include <keybus/keybus.h>

/* A bus with `kv` (key, value pairs, NULL-terminated), or NULL (said on
 * stderr). */
kb_bus *kb_test_child_open(const char *const *kv);

/* Block SIGTERM, open a bus with `kv` (key, value pairs, NULL-terminated),
 * subscribe `fn` to `topic`, wait for SIGTERM, kb_close. The exit status: 0
 * when kb_close returned KB_OK, 1 when not, 2 (said on stderr) when the bus
 * could not be had. Call before anything starts a thread. */
int kb_test_child_consume(const char *const *kv, const char *topic, kb_handler_fn fn);

#endif /* KB_TEST_CHILD_H */
