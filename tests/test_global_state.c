/* keybus leaves the process's global state alone: the sequence of random()
 * after srandom(seed) is the same whether or not a bus was opened, used and
 * closed in between (transports draw nonces and jitter from kb_bus_random).
 * `test_global_state mem|redis` (nats.c itself seeds and draws rand(), whose
 * state random() shares). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/suite.h"

#define DRAWS 16
#define EVENTS 50

static const char *kind = "mem";
static char url[160] = "mem://";
static atomic_int handled;

static int on_event(const kb_event *ev, void *opaque)
{
    (void)ev;
    (void)opaque;
    atomic_fetch_add(&handled, 1);
    return KB_HANDLED;
}

static void draw(long out[DRAWS])
{
    srandom(20261125);
    for (int i = 0; i < DRAWS; i++)
        out[i] = random();
}

static void random_sequence_survives_a_bus(void **state)
{
    (void)state;
    long before[DRAWS], after[DRAWS];
    draw(before);

    srandom(20261125);
    static const char *const settings[] = {"partitions", "4", NULL};
    kb_bus *b = kb_test_open(url, settings, NULL);
    kb_assert_ok(kb_subscribe(b, "global.state", on_event, NULL));
    for (int i = 0; i < EVENTS; i++) {
        char key[16];
        int n = snprintf(key, sizeof key, "k%d", i % 7);
        kb_assert_ok(kb_publish(b, "global.state", key, (size_t)n, "x", 1));
    }
    kb_assert_ok(kb_drain(b, 30000));
    kb_assert_ok(kb_close(b, 10000));
    assert_int_equal(atomic_load(&handled), EVENTS);
    for (int i = 0; i < DRAWS; i++)
        after[i] = random();

    for (int i = 0; i < DRAWS; i++)
        if (after[i] != before[i])
            fail_msg("%s: random() draw %d after srandom() differs once a bus ran: %ld, "
                     "expected %ld", url, i, after[i], before[i]);
}

int main(int argc, char **argv)
{
    static kb_test_server server;
    if (argc > 1)
        kind = argv[1];
    if (kb_test_broker_for(kind, &server, url, sizeof url) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_sequence_survives_a_bus),
    };
    return kb_test_run_group("global_state", kind, tests, 1, &server);
}
