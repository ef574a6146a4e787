/* Overload (issue 11): publishers at several times the handlers' speed for a
 * bounded time. Every kb_publish either succeeds or returns KB_EFULL after
 * about pool.enqueue_timeout_ms; nothing accepted is lost or reordered; the
 * resident set stays flat. Threads record, the main thread asserts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/gate.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RUN_SECONDS 15     /* sanitizers are 3-10x slower: the shape, not the minute */
#else
#define RUN_SECONDS 60
#endif
#define RSS_EARLY_SECONDS 10
#define KEYS 100

#define PUBLISHERS 2
#define TIMEOUT_MS 50

struct handled {
    _Atomic uint64_t count;
    _Atomic uint64_t violations;      /* an event out of per-key order */
    uint32_t next[PUBLISHERS][KEYS];  /* per aggregate: the sequence expected next */
};

struct publisher {
    kb_topic *topic;
    int id;
    _Atomic int *stop;
    uint64_t accepted, full, other_errors;
    double slowest_full_ms, fastest_full_ms, slowest_ok_ms;
    uint32_t seq[KEYS];               /* per key: accepted so far */
};

/* A handler about 20 µs per event: the publishers outrun it many times over. */
static int slow_handler(const kb_event *ev, void *opaque)
{
    struct handled *h = opaque;
    unsigned key, pub;
    uint32_t seq;
    if (sscanf(ev->payload, "%u %u %u", &pub, &key, &seq) != 3 || key >= KEYS ||
        pub >= PUBLISHERS) {
        atomic_fetch_add(&h->violations, 1);
        return KB_HANDLED;
    }
    /* an aggregate ("p<pub>-k<key>") is numbered by its one publisher and
     * handled on one lane: it must arrive as 0, 1, 2, ... */
    if (h->next[pub][key] != seq)
        atomic_fetch_add(&h->violations, 1);
    h->next[pub][key] = seq + 1;
    int64_t until = (int64_t)(kb_test_now_ms() * 1e3) + 20;
    while ((int64_t)(kb_test_now_ms() * 1e3) < until)
        ;
    atomic_fetch_add(&h->count, 1);
    return KB_HANDLED;
}

static void *publish_flat_out(void *arg)
{
    struct publisher *p = arg;
    p->fastest_full_ms = 1e9;
    for (unsigned i = 0; !atomic_load(p->stop); i++) {
        unsigned key = i % KEYS;
        char k[32], payload[48];
        int kl = snprintf(k, sizeof k, "p%d-k%u", p->id, key);
        int pl = snprintf(payload, sizeof payload, "%d %u %u", p->id, key, p->seq[key]) + 1;
        double t0 = kb_test_now_ms();
        int rc = kb_publish_to(p->topic, k, (size_t)kl, payload, (size_t)pl);
        double took = kb_test_now_ms() - t0;
        if (rc == KB_OK) {
            p->seq[key]++;
            p->accepted++;
            if (took > p->slowest_ok_ms)
                p->slowest_ok_ms = took;
        } else if (rc == KB_EFULL) {
            p->full++;
            if (took > p->slowest_full_ms)
                p->slowest_full_ms = took;
            if (took < p->fastest_full_ms)
                p->fastest_full_ms = took;
        } else {
            p->other_errors++;
        }
    }
    return NULL;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return kib;
}

static void overload_is_refused_in_time_and_loses_nothing(void **state)
{
    (void)state;
    static const char *const settings[] = {
        "pool.threads", "1", "pool.queue_capacity", "64",
        "pool.enqueue_timeout_ms", "50", NULL};
    kb_bus *b = kb_test_open("mem://", settings, NULL);
    static struct handled h;
    kb_assert_ok(kb_subscribe(b, "orders", slow_handler, &h));
    kb_topic *t = kb_topic_get(b, "orders", NULL, 0);
    assert_non_null(t);

    _Atomic int stop = 0;
    struct publisher pubs[PUBLISHERS];
    pthread_t th[PUBLISHERS];
    for (int i = 0; i < PUBLISHERS; i++) {
        memset(&pubs[i], 0, sizeof pubs[i]);
        pubs[i] = (struct publisher){.topic = t, .id = i, .stop = &stop};
        pthread_create(&th[i], NULL, publish_flat_out, &pubs[i]);
    }
    double start = kb_test_now_ms();
    long rss_early = -1, rss_peak = 0;
    for (int s = 1; s <= RUN_SECONDS; s++) {
        struct timespec one = {1, 0};
        nanosleep(&one, NULL);   /* the run's length, not a wait for a state */
        long rss = rss_kib();
        if (rss > rss_peak)
            rss_peak = rss;
        if (s == RSS_EARLY_SECONDS || (s == RUN_SECONDS && rss_early < 0))
            rss_early = rss_peak;
        if (s % 10 == 0)
            fprintf(stderr, "overload: %d/%d s, handled %llu, rss %ld KiB\n", s, RUN_SECONDS,
                    (unsigned long long)atomic_load(&h.count), rss);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < PUBLISHERS; i++)
        pthread_join(th[i], NULL);
    double elapsed_s = (kb_test_now_ms() - start) / 1e3;
    kb_assert_ok(kb_flush(b, 60000));

    uint64_t accepted = 0, full = 0;
    for (int i = 0; i < PUBLISHERS; i++) {
        accepted += pubs[i].accepted;
        full += pubs[i].full;
        assert_int_equal(pubs[i].other_errors, 0);
        /* KB_EFULL only after waiting about the timeout (wide slack above) */
        if (pubs[i].full > 0) {
            assert_true(pubs[i].fastest_full_ms >= TIMEOUT_MS * 0.8);
            assert_true(pubs[i].slowest_full_ms < TIMEOUT_MS + 5000.0);
        }
        assert_true(pubs[i].slowest_ok_ms < TIMEOUT_MS + 5000.0);
    }
    fprintf(stderr,
            "overload: %.0f s, accepted %llu (%.0f/s), refused KB_EFULL %llu, "
            "peak rss %ld KiB at %d s, %ld KiB at %d s\n",
            elapsed_s, (unsigned long long)accepted, accepted / elapsed_s,
            (unsigned long long)full, rss_early, RSS_EARLY_SECONDS, rss_peak, RUN_SECONDS);
    assert_true(full > 0);                                    /* it was overloaded */
    assert_int_equal(atomic_load(&h.count), accepted);        /* nothing accepted lost */
    assert_int_equal(atomic_load(&h.violations), 0);          /* per-key order */
    assert_true(rss_peak < rss_early + 64 * 1024);            /* flat: bounded lanes */
    kb_assert_ok(kb_close(b, 10000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(overload_is_refused_in_time_and_loses_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
