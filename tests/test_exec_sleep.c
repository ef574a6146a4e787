/* No executor sleeps on a timer while events are queued (issue 24). The
 * test binary interposes the sleeping calls — poll, ppoll, select, pselect,
 * nanosleep, clock_nanosleep, usleep, sleep — including the ones inlined
 * into the library (liburcu's queue sleeps with poll(NULL, 0, 10)), and
 * counts those made on a thread named kb-exec* while events published are
 * not all handled yet. More producers than CPUs keep making lanes ready, so
 * a producer is often preempted in the middle of its ready-queue push.
 * Asserts counts only: no timing. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* RTLD_NEXT, pthread_getname_np */
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/gate.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BURSTS 1500
#else
#define BURSTS 6000
#endif
#define PRODUCERS 4
#define KEYS 64          /* per producer: one event each per burst */
#define PAUSE_US 40      /* between bursts: long enough for lanes to go idle */

enum { S_POLL, S_PPOLL, S_SELECT, S_PSELECT, S_NANOSLEEP, S_CLOCK_NANOSLEEP, S_USLEEP, S_SLEEP,
       S_KINDS };
static const char *const kind_name[S_KINDS] = {"poll", "ppoll", "select", "pselect", "nanosleep",
                                               "clock_nanosleep", "usleep", "sleep"};

static _Atomic uint64_t published, handled;
static _Atomic uint64_t on_exec[S_KINDS];         /* by executors, at any time */
static _Atomic uint64_t while_queued[S_KINDS];    /* by executors, events outstanding */

static int (*real_poll)(struct pollfd *, nfds_t, int);
static int (*real_ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
static int (*real_select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
static int (*real_pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *,
                           const sigset_t *);
static int (*real_nanosleep)(const struct timespec *, struct timespec *);
static int (*real_clock_nanosleep)(clockid_t, int, const struct timespec *, struct timespec *);
static int (*real_usleep)(useconds_t);
static unsigned (*real_sleep)(unsigned);

/* Resolved before main, so no thread races the lookups. */
__attribute__((constructor)) static void resolve_real_calls(void)
{
    real_poll = dlsym(RTLD_NEXT, "poll");
    real_ppoll = dlsym(RTLD_NEXT, "ppoll");
    real_select = dlsym(RTLD_NEXT, "select");
    real_pselect = dlsym(RTLD_NEXT, "pselect");
    real_nanosleep = dlsym(RTLD_NEXT, "nanosleep");
    real_clock_nanosleep = dlsym(RTLD_NEXT, "clock_nanosleep");
    real_usleep = dlsym(RTLD_NEXT, "usleep");
    real_sleep = dlsym(RTLD_NEXT, "sleep");
}

static void note_sleep(int kind)
{
    char name[16] = "";
    if (pthread_getname_np(pthread_self(), name, sizeof name) != 0 ||
        strncmp(name, "kb-exec", 7) != 0)
        return;
    atomic_fetch_add(&on_exec[kind], 1);
    /* `published` counts after kb_publish returned and `handled` inside the
     * handler, so published > handled means at least that many are queued. */
    if (atomic_load(&published) > atomic_load(&handled))
        atomic_fetch_add(&while_queued[kind], 1);
}

int poll(struct pollfd *fds, nfds_t n, int timeout)
{
    note_sleep(S_POLL);
    return real_poll(fds, n, timeout);
}

int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *t, const sigset_t *mask)
{
    note_sleep(S_PPOLL);
    return real_ppoll(fds, n, t, mask);
}

int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *t)
{
    note_sleep(S_SELECT);
    return real_select(n, r, w, e, t);
}

int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *t, const sigset_t *mask)
{
    note_sleep(S_PSELECT);
    return real_pselect(n, r, w, e, t, mask);
}

int nanosleep(const struct timespec *req, struct timespec *rem)
{
    note_sleep(S_NANOSLEEP);
    return real_nanosleep(req, rem);
}

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem)
{
    note_sleep(S_CLOCK_NANOSLEEP);
    return real_clock_nanosleep(clock, flags, req, rem);
}

int usleep(useconds_t us)
{
    note_sleep(S_USLEEP);
    return real_usleep(us);
}

unsigned sleep(unsigned s)
{
    note_sleep(S_SLEEP);
    return real_sleep(s);
}

struct order {
    _Atomic uint64_t violations;
    uint32_t next[PRODUCERS][KEYS];   /* the handler's: one executor */
};

static int check_order(const kb_event *ev, void *opaque)
{
    struct order *o = opaque;
    uint32_t p, k, seq;
    if (ev->payload_len != 3 * sizeof(uint32_t)) {
        atomic_fetch_add(&o->violations, 1);
    } else {
        memcpy(&p, ev->payload, 4);
        memcpy(&k, (const char *)ev->payload + 4, 4);
        memcpy(&seq, (const char *)ev->payload + 8, 4);
        if (p >= PRODUCERS || k >= KEYS || o->next[p][k] != seq)
            atomic_fetch_add(&o->violations, 1);
        else
            o->next[p][k] = seq + 1;
    }
    atomic_fetch_add(&handled, 1);
    return KB_HANDLED;
}

struct producer {
    kb_topic *topic;
    uint32_t id;
    uint64_t errors;
};

static void *produce(void *arg)
{
    struct producer *pr = arg;
    for (uint32_t seq = 0; seq < BURSTS; seq++) {
        for (uint32_t k = 0; k < KEYS; k++) {
            char key[24];
            int kl = snprintf(key, sizeof key, "p%u-k%u", pr->id, k);
            uint32_t payload[3] = {pr->id, k, seq};
            if (kb_publish_to(pr->topic, key, (size_t)kl, payload, sizeof payload) == KB_OK)
                atomic_fetch_add(&published, 1);
            else
                pr->errors++;
        }
        /* a gap, so lanes go idle and the next burst makes them ready again */
        double until = kb_test_now_ms() + PAUSE_US / 1000.0;
        while (kb_test_now_ms() < until)
            ;
    }
    return NULL;
}

static void no_executor_sleeps_while_events_are_queued(void **state)
{
    (void)state;
    const char *const settings[] = {"pool.threads", "1", "pool.enqueue_timeout_ms", "60000", NULL};
    kb_bus *b = kb_test_open("mem://", settings, NULL);
    static struct order order;
    kb_assert_ok(kb_subscribe(b, "sleeps", check_order, &order));
    char err[256];
    kb_topic *t = kb_topic_get(b, "sleeps", err, sizeof err);
    assert_non_null(t);

    struct producer pr[PRODUCERS];
    pthread_t th[PRODUCERS];
    for (uint32_t i = 0; i < PRODUCERS; i++) {
        pr[i] = (struct producer){.topic = t, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, produce, &pr[i]), 0);
    }
    for (uint32_t i = 0; i < PRODUCERS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(pr[i].errors, 0);
    }
    kb_assert_ok(kb_flush(b, 60000));

    uint64_t total = 0;
    for (int k = 0; k < S_KINDS; k++) {
        uint64_t q = atomic_load(&while_queued[k]), any = atomic_load(&on_exec[k]);
        if (any > 0)
            printf("# kb-exec called %s %llu times, %llu of them with events queued\n",
                   kind_name[k], (unsigned long long)any, (unsigned long long)q);
        total += q;
    }
    printf("# %llu events published, %llu handled\n", (unsigned long long)atomic_load(&published),
           (unsigned long long)atomic_load(&handled));
    assert_int_equal(atomic_load(&published), (uint64_t)PRODUCERS * KEYS * BURSTS);
    assert_int_equal(atomic_load(&handled), atomic_load(&published));
    assert_int_equal(atomic_load(&order.violations), 0);
    assert_int_equal(total, 0);
    kb_assert_ok(kb_close(b, 10000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_executor_sleeps_while_events_are_queued),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
