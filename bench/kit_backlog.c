/* keybus-kit-bench: what the kit's publish backlog costs per item, with no
 * broker, so a transport can weigh it against a backlog of its own. Each
 * event has a 16-byte key and a mem:// bus that wants reports (the key is
 * copied, one report per event: counted, and a run that misses one fails).
 *
 *   keybus-kit-bench [ITEMS [RUNS [MODE]]]   (default 1000000 items, 5 runs,
 *                                             every mode)
 *
 * Modes, one line each: the median ns per item over RUNS, then every run's.
 *   1thread       one thread: add, take, done, item by item
 *   2thread-done  a publisher adds; a sender takes up to 64 and calls done
 *                 for each (capacity 1024: the publisher waits for room)
 *   2thread-stored  the same, the sender confirming each batch at once with
 *                 kb_kit_backlog_stored (a pipeline's replies)
 *   2thread-take1 the sender takes one item at a time and calls done (a
 *                 transport sending each event alone: publish_batch 1)
 * Wall time per item; on a shared machine note the load (uptime) beside it. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <keybus/keybus.h>
#include <keybus/kit.h>

#define BATCH 64
#define CAPACITY 1024
#define RUNS_MAX 64

static const char ID[] = "1700000000000-0";

static _Atomic uint64_t reports;

static void on_report(const kb_delivery_report *r, void *opaque)
{
    (void)r;
    (void)opaque;
    atomic_fetch_add_explicit(&reports, 1, memory_order_relaxed);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static kb_kit_backlog *backlog(kb_bus *bus)
{
    kb_kit_backlog_conf c = {.size = sizeof c, .bus = bus, .capacity = CAPACITY,
                             .timeout_ms = 60000, .max_attempts = 3, .backoff_ms = 1,
                             .max_backoff_ms = 4};
    kb_kit_backlog *b = kb_kit_backlog_new(&c);
    if (b == NULL) {
        fprintf(stderr, "kb_kit_backlog_new: %s\n", kb_last_error());
        exit(1);
    }
    return b;
}

static void key_of(uint64_t i, char key[16])
{
    memset(key, 'k', 16);
    memcpy(key, &i, sizeof i);
}

static void add(kb_kit_backlog *b, uint64_t i)
{
    char key[16];
    key_of(i, key);
    int rc = kb_kit_backlog_add(b, NULL, "orders", (uint32_t)(i % 16), key, sizeof key, NULL);
    if (rc != KB_OK) {
        fprintf(stderr, "kb_kit_backlog_add: %s\n", kb_last_error());
        exit(1);
    }
}

static double one_thread(kb_bus *bus, uint64_t items)
{
    kb_kit_backlog *b = backlog(bus);
    kb_kit_item *it;
    double t0 = now_ns();
    for (uint64_t i = 0; i < items; i++) {
        add(b, i);
        if (kb_kit_backlog_take(b, &it, 1, 0) != 1) {
            fprintf(stderr, "kb_kit_backlog_take: nothing\n");
            exit(1);
        }
        kb_kit_backlog_done(b, it, KB_OK, 0, ID, NULL);
    }
    double t = now_ns() - t0;
    kb_kit_backlog_free(b);
    return t;
}

struct sender {
    kb_kit_backlog *b;
    uint64_t items;
    size_t batch;   /* items taken at most at once */
    int stored;     /* confirm a batch with kb_kit_backlog_stored */
};

static int has_items(void *arg)
{
    return kb_kit_backlog_length(arg) > 0;
}

/* Every item it took is done before it takes again, so a non-empty backlog
 * has one to take. */
static void *send_all(void *arg)
{
    struct sender *s = arg;
    kb_kit_item *out[BATCH];
    const char *ids[BATCH];
    for (size_t i = 0; i < BATCH; i++)
        ids[i] = ID;
    for (uint64_t sent = 0; sent < s->items;) {
        size_t n = kb_kit_backlog_take(s->b, out, s->batch, 0);
        if (n == 0) {
            kb_signal_wait(kb_kit_backlog_signal(s->b), has_items, s->b, kb_deadline_ns(100));
            continue;
        }
        if (s->stored)
            kb_kit_backlog_stored(s->b, out, ids, n);
        else
            for (size_t i = 0; i < n; i++)
                kb_kit_backlog_done(s->b, out[i], KB_OK, 0, ID, NULL);
        sent += n;
    }
    return NULL;
}

static double two_threads(kb_bus *bus, uint64_t items, size_t batch, int stored)
{
    struct sender s = {backlog(bus), items, batch, stored};
    kb_thread *th;
    double t0 = now_ns();
    if (kb_thread_start(&th, "kit-sender", send_all, &s) != KB_OK) {
        fprintf(stderr, "kb_thread_start: %s\n", kb_last_error());
        exit(1);
    }
    for (uint64_t i = 0; i < items; i++)
        add(s.b, i);
    kb_thread_join(th);
    double t = now_ns() - t0;
    kb_kit_backlog_free(s.b);
    return t;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    uint64_t items = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
    int runs = argc > 2 ? atoi(argv[2]) : 5;
    const char *only = argc > 3 ? argv[3] : NULL;
    if (items == 0 || runs < 1 || runs > RUNS_MAX) {
        fprintf(stderr, "usage: keybus-kit-bench [ITEMS [RUNS (1..%d) [MODE]]]\n", RUNS_MAX);
        return 2;
    }
    char err[256];
    kb_conf *c = kb_conf_new();
    if (c == NULL || kb_conf_set(c, "transport", "mem://", err, sizeof err) != KB_OK) {
        fprintf(stderr, "kb_conf_set: %s\n", c == NULL ? "out of memory" : err);
        return 1;
    }
    kb_conf_set_delivery_cb(c, on_report, NULL);
    kb_bus *bus = kb_open(c, err, sizeof err);
    if (bus == NULL) {
        fprintf(stderr, "kb_open: %s\n", err);
        return 1;
    }
    static const char *const modes[] = {"1thread", "2thread-done", "2thread-stored",
                                        "2thread-take1"};
    printf("%-15s %10s  runs (ns/item), %llu items each\n", "mode", "median",
           (unsigned long long)items);
    for (int m = 0; m < 4; m++) {
        if (only != NULL && strcmp(only, modes[m]) != 0)
            continue;
        double ns[RUNS_MAX], sorted[RUNS_MAX];
        for (int r = 0; r < runs; r++) {
            atomic_store(&reports, 0);
            double t = m == 0 ? one_thread(bus, items)
                              : two_threads(bus, items, m == 3 ? 1 : BATCH, m == 2);
            if (atomic_load(&reports) != items) {
                fprintf(stderr, "%s: %llu reports for %llu items\n", modes[m],
                        (unsigned long long)atomic_load(&reports), (unsigned long long)items);
                return 1;
            }
            ns[r] = sorted[r] = t / (double)items;
        }
        qsort(sorted, (size_t)runs, sizeof *sorted, by_value);
        printf("%-15s %10.1f ", modes[m], sorted[runs / 2]);
        for (int r = 0; r < runs; r++)
            printf(" %.1f", ns[r]);
        printf("\n");
    }
    return kb_close(bus, 1000) == KB_OK ? 0 : 1;
}
