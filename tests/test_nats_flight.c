/* nats:// finds a publish nats.c hands back by its message (nats_flight.c):
 * random puts and takes checked against a plain array, through growth and
 * removals that shift probes back; and two threads at once on disjoint
 * messages (as a sender and nats.c's ack thread are). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include <keybus/keybus.h>

#include "../transports/nats/nats_flight.h"

#define MSGS 5000

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;   /* xorshift64 */
    return *x;
}

/* Message i: an address of its own in `base` (what the table keys on). */
static const void *msg_at(const char *base, size_t i)
{
    return base + 16 * i;
}

static void matches_a_plain_array(void **state)
{
    (void)state;
    static char base[16 * MSGS];
    static void *model[MSGS];   /* what is put under message i, NULL: nothing */
    kb_nats_flight *f = kb__nats_flight_new();
    assert_non_null(f);
    uint64_t x = 0x9e3779b97f4a7c15u;
    size_t held = 0, most = 0;
    for (int op = 0; op < 200000; op++) {
        size_t i = next_rand(&x) % MSGS;
        /* fill up early (growth), then churn around half full */
        int put = model[i] == NULL && (op < 20000 || next_rand(&x) % 2 == 0);
        if (put) {
            void *pub = (void *)(uintptr_t)(op + 1);
            assert_int_equal(kb__nats_flight_put(f, msg_at(base, i), pub), KB_OK);
            model[i] = pub;
            held++;
        } else {
            assert_ptr_equal(kb__nats_flight_take(f, msg_at(base, i)), model[i]);
            held -= model[i] != NULL;
            model[i] = NULL;
        }
        most = held > most ? held : most;
    }
    assert_true(most > 1024);   /* it grew past its first size (512 held in 1,024 slots) */
    for (size_t i = 0; i < MSGS; i++) {
        assert_ptr_equal(kb__nats_flight_take(f, msg_at(base, i)), model[i]);
        assert_null(kb__nats_flight_take(f, msg_at(base, i)));   /* taken once */
    }
    kb__nats_flight_free(f);
}

struct side {
    kb_nats_flight *f;
    const char *base;
    int wrong;
};

static void *churn(void *arg)
{
    struct side *s = arg;
    for (int round = 0; round < 20; round++) {
        for (size_t i = 0; i < MSGS; i++)
            if (kb__nats_flight_put(s->f, msg_at(s->base, i), (void *)(s->base + i)) != KB_OK)
                s->wrong++;
        for (size_t i = 0; i < MSGS; i++)
            if (kb__nats_flight_take(s->f, msg_at(s->base, i)) != (void *)(s->base + i))
                s->wrong++;
    }
    return NULL;
}

static void two_threads_at_once(void **state)
{
    (void)state;
    static char a[16 * MSGS], b[16 * MSGS];
    kb_nats_flight *f = kb__nats_flight_new();
    assert_non_null(f);
    struct side sa = {f, a, 0}, sb = {f, b, 0};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, churn, &sa), 0);
    assert_int_equal(pthread_create(&tb, NULL, churn, &sb), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(sa.wrong + sb.wrong, 0);
    assert_null(kb__nats_flight_take(f, msg_at(a, 0)));
    kb__nats_flight_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matches_a_plain_array),
        cmocka_unit_test(two_threads_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
