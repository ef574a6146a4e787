/* Test harness: a bus on a URL with settings, failing the test with kb_open's
 * or kb_conf_set's text when it cannot be had. */
#ifndef KB_TEST_BUS_H
#define KB_TEST_BUS_H

#include <keybus/keybus.h>

/* Open a bus on `url` with `base`, then `extra` applied: each NULL or a
 * NULL-terminated list of key, value pairs. Main thread only (it asserts). */
kb_bus *kb_test_open(const char *url, const char *const *base, const char *const *extra);

/* kb_test_open in two steps, for settings only a function sets (callbacks):
 * the configuration kb_test_open would open, then the bus on it (kb_open
 * takes `c`). Main thread only (they assert). */
kb_conf *kb_test_conf(const char *url, const char *const *base, const char *const *extra);
kb_bus *kb_test_open_conf(kb_conf *c);

/* The partitions of `topic` this bus holds now (kb_stats' partitions_owned;
 * 0 when kb_stats fails). Any thread. */
uint32_t kb_test_owned(kb_bus *b, const char *topic);

#endif /* KB_TEST_BUS_H */
