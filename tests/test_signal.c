/* kb_signal (the SDK's wait, the same code as every wait of the core): no
 * wake-up is lost. A waiter that misses one sleeps until its deadline, which
 * for an idle executor is for ever; here each wait has 10 s, far above any
 * scheduling delay, and every one must end because its change came. Two
 * shapes: a ping-pong (each change wakes a thread that is asleep, the path
 * where a missed futex call hangs), and pokers that never stop while one
 * waiter waits for the next change again and again. Bounded: ~1 s each. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>

#include <keybus/transport.h>

#define WAIT_MS 10000
#define RUN_NS 1000000000LL

typedef struct side {
    kb_signal *sig;
    _Atomic uint64_t value;
    uint64_t want;
} side;

static int reached(void *arg)
{
    side *s = arg;
    return atomic_load(&s->value) >= s->want;
}

typedef struct pingpong {
    side a, b;   /* a: the main thread's turn; b: the partner's */
    _Atomic int stop;
    _Atomic uint64_t misses;
} pingpong;

static void *partner(void *arg)
{
    pingpong *p = arg;
    for (uint64_t n = 1; !atomic_load(&p->stop); n++) {
        p->b.want = n;
        if (!kb_signal_wait(p->b.sig, reached, &p->b, kb_deadline_ns(WAIT_MS))) {
            atomic_fetch_add(&p->misses, 1);
            break;
        }
        atomic_store(&p->a.value, n);
        kb_signal_notify(p->a.sig);
    }
    return NULL;
}

static void ping_pong_loses_no_wake_up(void **state)
{
    (void)state;
    pingpong p = {0};
    p.a.sig = kb_signal_new();
    p.b.sig = kb_signal_new();
    assert_non_null(p.a.sig);
    assert_non_null(p.b.sig);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, partner, &p), 0);
    int64_t end = kb_now_ns() + RUN_NS;
    uint64_t rounds = 0, misses = 0;
    while (kb_now_ns() < end) {
        rounds++;
        atomic_store(&p.b.value, rounds);
        kb_signal_notify(p.b.sig);
        p.a.want = rounds;
        if (!kb_signal_wait(p.a.sig, reached, &p.a, kb_deadline_ns(WAIT_MS))) {
            misses++;
            break;
        }
    }
    atomic_store(&p.stop, 1);
    atomic_store(&p.b.value, UINT64_MAX);   /* the partner's last wait ends */
    kb_signal_notify(p.b.sig);
    pthread_join(th, NULL);
    print_message("ping-pong: %llu round trips\n", (unsigned long long)rounds);
    assert_int_equal(misses, 0);
    assert_int_equal(atomic_load(&p.misses), 0);
    assert_true(rounds > 10);
    kb_signal_free(p.a.sig);
    kb_signal_free(p.b.sig);
}

typedef struct storm {
    side s;
    _Atomic int stop;
} storm;

static void *poker(void *arg)
{
    storm *st = arg;
    while (!atomic_load(&st->stop)) {
        atomic_fetch_add(&st->s.value, 1);
        kb_signal_notify(st->s.sig);
        for (volatile int i = 0; i < 500; i++)
            ;   /* pokes spread out: a waiter often finds nothing and sleeps */
    }
    return NULL;
}

static void waiter_among_pokers_loses_no_wake_up(void **state)
{
    (void)state;
    storm st = {0};
    st.s.sig = kb_signal_new();
    assert_non_null(st.s.sig);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, poker, &st), 0);
    int64_t end = kb_now_ns() + RUN_NS;
    uint64_t waits = 0, misses = 0;
    while (kb_now_ns() < end && misses == 0) {
        st.s.want = atomic_load(&st.s.value) + 1;
        misses += kb_signal_wait(st.s.sig, reached, &st.s, kb_deadline_ns(WAIT_MS)) == 0;
        waits++;
    }
    atomic_store(&st.stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    print_message("pokers: %llu waits\n", (unsigned long long)waits);
    assert_int_equal(misses, 0);
    assert_true(waits > 10);
    kb_signal_free(st.s.sig);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ping_pong_loses_no_wake_up),
        cmocka_unit_test(waiter_among_pokers_loses_no_wake_up),
    };
    return cmocka_run_group_tests_name("signal", tests, NULL, NULL);
}
