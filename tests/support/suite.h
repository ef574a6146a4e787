/* Test binaries run once per transport (argv[1] = mem | redis | nats): the
 * broker they need, and their cmocka group named after it. */
#ifndef KB_TEST_SUITE_H
#define KB_TEST_SUITE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "server.h"

/* Start the broker `kind` names unless it is "mem" and copy its URL into
 * url (left as it is for mem). 0, or -1 (said on stderr) when the server
 * cannot start. */
int kb_test_broker_for(const char *kind, kb_test_server *s, char *url, size_t url_len);

/* Run `tests` as the group "<name>/<kind>", then stop the broker if one was
 * started; the number of failures. */
int kb_test_run_group(const char *name, const char *kind, const struct CMUnitTest *tests,
                      size_t n, kb_test_server *s);

/* The JetStream stream keybus makes for `topic` (docs/transports-nats.md,
 * Layout): KB_<topic, '.' as '_'>_<fnv1a32(topic) as 8 hex>. */
void kb_test_nats_stream(const char *topic, char *buf, size_t len);

#endif /* KB_TEST_SUITE_H */
