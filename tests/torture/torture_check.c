/* The checker of keybus-torture: reads a run's history (torture.h) and
 * counts what was lost, what was handled out of order, what came again, and
 * how long each partition went without a handled event while the producer
 * was producing. Definitions (docs/testing.md, "Torture"):
 *   - accepted: kb_publish returned KB_OK; a key's accepted events are
 *     seq 1..A (the producer retries a refused event before the next one);
 *   - lost: accepted, never handled, less the key's failed delivery reports;
 *   - handled events of a key are taken in monotonic-clock order over every
 *     process; an event handled before is a duplicate (a redelivery re-runs
 *     a suffix of the key's events); one never handled before whose seq is
 *     below the highest seq already handled of its key is an order violation;
 *   - a partition's pause: the longest gap between two handled events of its
 *     keys that began while the producer was producing (the window's start
 *     counts as one), however long it lasted; one that never closed (events
 *     of the partition never handled) lasts to the end of the run. */
#include <glob.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>

#include "torture.h"

typedef struct rec {
    int64_t mono;
    uint32_t key, seq, attempt, proc;
} rec;

typedef struct history {
    rec *r;
    size_t n, cap;
    uint32_t procs;
    uint32_t *accepted;          /* per key: highest accepted seq */
    uint64_t *reports_ok, *reports_failed;
    uint64_t publish_refused;    /* kb_publish results other than KB_OK */
    int64_t ws, we;              /* the producing window */
    int64_t drained;             /* when kb_drain returned; 0: not recorded */
    int flush_rc, drain_rc;
    uint64_t steps[KB_T_HEAL + 1];
    uint64_t departures;
    uint64_t crashes;            /* consumers that ended unasked, or by a signal */
    uint64_t sanitizer;          /* sanitizer reports in the consumers' stderr */
} history;

static int by_key_time(const void *a, const void *b)
{
    const rec *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->mono != y->mono)
        return x->mono < y->mono ? -1 : 1;
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int read_producer(const char *dir, const kb_torture_params *p, history *h)
{
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/producer.log", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int have_window = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        long long t, a, b;
        unsigned key, seq;
        int rc, r2, got;
        if (sscanf(line, "P %lld %u %u %d", &t, &key, &seq, &rc) == 4 && key < p->keys) {
            if (rc != KB_OK)
                h->publish_refused++;
            else if (seq > h->accepted[key])
                h->accepted[key] = seq;
        } else if (sscanf(line, "D %lld %u %d", &t, &key, &rc) == 3 && key < p->keys) {
            if (rc == KB_OK)
                h->reports_ok[key]++;
            else
                h->reports_failed[key]++;
        } else if ((got = sscanf(line, "W %lld %lld %d %d %lld", &a, &b, &rc, &r2, &t)) >= 4) {
            h->ws = a;
            h->we = b;
            h->flush_rc = rc;
            h->drain_rc = r2;
            h->drained = got == 5 ? t : 0;
            have_window = 1;
        }
    }
    fclose(f);
    return have_window ? 0 : -1;
}

static void read_nemesis(const char *dir, history *h)
{
    char path[4200], line[512], what[64];
    snprintf(path, sizeof path, "%s/nemesis.log", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    while (fgets(line, sizeof line, f) != NULL) {
        long long t;
        int target;
        unsigned dep;
        if (line[0] == 'X')
            h->crashes++;
        if (sscanf(line, "N %lld %63s %d %u", &t, what, &target, &dep) != 4)
            continue;
        for (int op = 0; op <= KB_T_HEAL; op++)
            if (strcmp(what, kb_torture_op_name(op)) == 0)
                h->steps[op]++;
        h->departures += dep;
    }
    fclose(f);
}

/* A sanitizer's report in a consumer's stderr (its exit status can look like
 * kb_close's own 1). */
static void read_stderr(const char *dir, history *h)
{
    char pattern[4200], line[1024];
    snprintf(pattern, sizeof pattern, "%s/c*.err", dir);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0)
        return;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        FILE *f = fopen(g.gl_pathv[i], "r");
        while (f != NULL && fgets(line, sizeof line, f) != NULL)
            if (strstr(line, "Sanitizer") != NULL || strstr(line, "runtime error:") != NULL) {
                fprintf(stderr, "torture: %s: %s", g.gl_pathv[i], line);
                h->sanitizer++;
                break;
            }
        if (f != NULL)
            fclose(f);
    }
    globfree(&g);
}

static int read_consumers(const char *dir, const kb_torture_params *p, history *h)
{
    char pattern[4200], line[512], name[128];
    snprintf(pattern, sizeof pattern, "%s/c*.log", dir);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0)
        return 0;   /* nothing handled at all: everything accepted is lost */
    for (size_t i = 0; i < g.gl_pathc; i++) {
        FILE *f = fopen(g.gl_pathv[i], "r");
        if (f == NULL)
            continue;
        while (fgets(line, sizeof line, f) != NULL) {
            long long t, wall;
            int pid;
            unsigned key, seq, attempt;
            if (sscanf(line, "H %lld %lld %127s %d %u %u %u", &t, &wall, name, &pid, &key, &seq,
                       &attempt) != 7 || key >= p->keys)
                continue;   /* a line cut by kill -9 mid-write: its event comes again */
            if (h->n == h->cap) {
                size_t cap = h->cap ? h->cap * 2 : 65536;
                rec *r = realloc(h->r, cap * sizeof *r);
                if (r == NULL) {
                    fclose(f);
                    globfree(&g);
                    return -1;
                }
                h->r = r;
                h->cap = cap;
            }
            h->r[h->n++] = (rec){t, key, seq, attempt, (uint32_t)i};
        }
        fclose(f);
    }
    h->procs = (uint32_t)g.gl_pathc;
    globfree(&g);
    return 0;
}

/* The most events one process handled within one second of the run. */
static uint64_t peak_rate(const history *h)
{
    if (h->n == 0)
        return 0;
    int64_t lo = h->r[0].mono, hi = h->r[0].mono;
    for (size_t i = 0; i < h->n; i++) {
        lo = h->r[i].mono < lo ? h->r[i].mono : lo;
        hi = h->r[i].mono > hi ? h->r[i].mono : hi;
    }
    size_t secs = (size_t)((hi - lo) / 1000000000) + 1;
    uint32_t *count = calloc(secs * h->procs, sizeof *count);
    if (count == NULL)
        return 0;
    uint64_t peak = 0;
    for (size_t i = 0; i < h->n; i++) {
        uint32_t *c = &count[h->r[i].proc * secs + (size_t)((h->r[i].mono - lo) / 1000000000)];
        if (++*c > peak)
            peak = *c;
    }
    free(count);
    return peak;
}

static uint32_t next_pow2(uint32_t v)
{
    uint32_t r = 1;
    while (r < v)
        r <<= 1;
    return r;
}

int kb_torture_check(const char *dir, const kb_torture_params *p, int json, FILE *out,
                     kb_torture_result *res)
{
    history h = {0};
    h.accepted = calloc(p->keys, sizeof *h.accepted);
    h.reports_ok = calloc(p->keys, sizeof *h.reports_ok);
    h.reports_failed = calloc(p->keys, sizeof *h.reports_failed);
    int64_t *pause = calloc(p->partitions, sizeof *pause), *pause_at = calloc(p->partitions, sizeof *pause_at);
    int status = 2;
    if (h.accepted == NULL || h.reports_ok == NULL || h.reports_failed == NULL || pause == NULL ||
        pause_at == NULL)
        goto out;
    if (read_producer(dir, p, &h) != 0) {
        fprintf(stderr, "torture: %s/producer.log is missing or has no window line\n", dir);
        goto out;
    }
    read_nemesis(dir, &h);
    read_stderr(dir, &h);
    if (read_consumers(dir, p, &h) != 0)
        goto out;
    qsort(h.r, h.n, sizeof *h.r, by_key_time);

    uint32_t *part_of = malloc(p->keys * sizeof *part_of);
    uint64_t *part_unhandled = calloc(p->partitions, sizeof *part_unhandled);
    if (part_of == NULL || part_unhandled == NULL) {
        free(part_of);
        free(part_unhandled);
        goto out;
    }
    for (uint32_t k = 0; k < p->keys; k++) {
        char key[32];
        int len = snprintf(key, sizeof key, "agg-%u", k);   /* kb_tracker_publish's keys */
        part_of[k] = kb_partition_of(key, (size_t)len, p->partitions);
    }
    uint64_t accepted = 0, lost = 0, unhandled = 0, failed = 0, ok_reports = 0, dups = 0,
             dups_first_attempt = 0, order = 0, phantom = 0, distinct = 0;
    char lost_ex[512] = "", order_ex[512] = "";
    size_t lo_len = 0, or_len = 0;
    for (uint32_t k = 0, i = 0; k < p->keys; k++) {
        uint32_t a = h.accepted[k], max = 0;
        unsigned char *seen = calloc((size_t)a + 1, 1);
        if (seen == NULL) {
            free(part_of);
            free(part_unhandled);
            goto out;
        }
        accepted += a;
        failed += h.reports_failed[k];
        ok_reports += h.reports_ok[k];
        for (; i < h.n && h.r[i].key == k; i++) {
            const rec *r = &h.r[i];
            if (r->seq == 0 || r->seq > a) {
                phantom++;
            } else if (seen[r->seq]) {
                dups++;
                dups_first_attempt += r->attempt == 1;
            } else {
                seen[r->seq] = 1;
                distinct++;
                if (r->seq < max) {
                    if (order++ < 5 && or_len < sizeof order_ex - 64)
                        or_len += (size_t)snprintf(order_ex + or_len, sizeof order_ex - or_len,
                                                   " agg-%u:%u after %u;", k, r->seq, max);
                } else {
                    max = r->seq;
                }
            }
        }
        uint64_t miss = 0;
        for (uint32_t s = 1; s <= a; s++)
            if (!seen[s]) {
                if (miss++ < 3 && unhandled < 5 && lo_len < sizeof lost_ex - 64)
                    lo_len += (size_t)snprintf(lost_ex + lo_len, sizeof lost_ex - lo_len,
                                               " agg-%u:%u;", k, s);
            }
        unhandled += miss;
        part_unhandled[part_of[k]] += miss;
        lost += miss > h.reports_failed[k] ? miss - h.reports_failed[k] : 0;
        free(seen);
    }

    /* pauses: each partition's handled times, the window's start as the first */
    int64_t *t = malloc((h.n + 1) * sizeof *t), end = h.drained;
    if (t == NULL) {
        free(part_of);
        free(part_unhandled);
        goto out;
    }
    for (size_t i = 0; i < h.n; i++)
        end = h.r[i].mono > end ? h.r[i].mono : end;
    int64_t worst = 0;
    uint32_t worst_p = 0;
    for (uint32_t part = 0; part < p->partitions; part++) {
        size_t n = 0;
        for (size_t i = 0; i < h.n; i++)
            if (part_of[h.r[i].key] == part)
                t[n++] = h.r[i].mono;
        qsort(t, n, sizeof *t, cmp_i64);
        int64_t prev = h.ws;
        for (size_t i = 0; i < n && prev < h.we; i++) {
            if (t[i] <= prev)
                continue;
            if (t[i] - prev > pause[part]) {
                pause[part] = t[i] - prev;
                pause_at[part] = prev - h.ws;
            }
            prev = t[i];
        }
        /* never handled again: the gap lasts to the end of the run */
        if (part_unhandled[part] > 0 && prev < h.we && end - prev > pause[part]) {
            pause[part] = end - prev;
            pause_at[part] = prev - h.ws;
        }
        if (pause[part] > worst) {
            worst = pause[part];
            worst_p = part;
        }
    }
    free(t);
    free(part_of);
    free(part_unhandled);

    /* docs/transports-nats.md, "Replay after a takeover": per departure at most
     * min(partitions x R x B, H x T + U) handled again */
    int nats = strcmp(p->broker, "nats") == 0;
    uint64_t rate = peak_rate(&h), bound = 0;
    if (nats) {
        uint64_t first = (uint64_t)p->partitions * next_pow2(p->max_ack_pending) * p->publish_batch;
        uint64_t second = rate * (10 + p->ack_interval_ms + p->rtt_ms) / 1000 + 1 +
                          (p->keys > 256 ? p->keys : 0);
        bound = h.departures * (first < second ? first : second);
    }
    int64_t worst_ms = worst / 1000000;
    int pass = lost == 0 && order == 0 && phantom == 0 && h.crashes == 0 && h.sanitizer == 0 &&
               worst_ms <= p->max_pause_ms;
    double window_s = (double)(h.we - h.ws) / 1e9;
    /* from the producer's last publish to kb_drain's return (-1: not recorded) */
    long long drain_ms = h.drained > 0 ? (long long)((h.drained - h.we) / 1000000) : -1;

    if (json) {
        fprintf(out, "{\"broker\": \"%s\", \"seed\": %" PRIu64 ", \"partitions\": %u, \"keys\": %u, "
                     "\"window_s\": %.1f, \"processes\": %u, \"accepted\": %" PRIu64
                     ", \"publish_refused\": %" PRIu64 ", \"reports_ok\": %" PRIu64
                     ", \"reports_failed\": %" PRIu64 ", \"handled\": %zu, \"distinct\": %" PRIu64
                     ", \"lost\": %" PRIu64 ", \"unhandled\": %" PRIu64 ", \"phantom\": %" PRIu64
                     ", \"order_violations\": %" PRIu64 ", \"duplicates\": %" PRIu64
                     ", \"duplicates_attempt_1\": %" PRIu64 ", \"departures\": %" PRIu64
                     ", \"crashes\": %" PRIu64 ", \"sanitizer_reports\": %" PRIu64 ", ",
                p->broker, p->seed, p->partitions, p->keys, window_s, h.procs, accepted,
                h.publish_refused, ok_reports, failed, h.n, distinct, lost, unhandled, phantom,
                order, dups, dups_first_attempt, h.departures, h.crashes, h.sanitizer);
        if (nats)
            fprintf(out, "\"duplicate_bound\": %" PRIu64 ", ", bound);
        else
            fprintf(out, "\"duplicate_bound\": null, ");
        fprintf(out, "\"peak_rate\": %" PRIu64 ", \"flush_rc\": %d, \"drain_rc\": %d, "
                     "\"drain_ms\": %lld, \"max_pause_ms\": %lld, \"max_pause_partition\": %u, \"max_pause_from_s\": %.1f, "
                     "\"max_pause_bound_ms\": %lld, \"pauses_ms\": [",
                rate, h.flush_rc, h.drain_rc, drain_ms, (long long)worst_ms, worst_p,
                (double)pause_at[worst_p] / 1e9, (long long)p->max_pause_ms);
        for (uint32_t part = 0; part < p->partitions; part++)
            fprintf(out, "%s%lld", part ? ", " : "", (long long)(pause[part] / 1000000));
        fprintf(out, "], \"nemesis\": {");
        for (int op = 0; op <= KB_T_HEAL; op++)
            fprintf(out, "%s\"%s\": %" PRIu64, op ? ", " : "", kb_torture_op_name(op), h.steps[op]);
        fprintf(out, "}, \"pass\": %s}\n", pass ? "true" : "false");
    } else {
        fprintf(out, "history: %" PRIu64 " accepted (%" PRIu64 " publishes refused and retried, "
                     "%" PRIu64 " delivery reports ok, %" PRIu64 " failed), %zu handled by %u processes, "
                     "%" PRIu64 " distinct\n",
                accepted, h.publish_refused, ok_reports, failed, h.n, h.procs, distinct);
        fprintf(out, "nemesis:");
        for (int op = 0; op <= KB_T_HEAL; op++)
            fprintf(out, " %s %" PRIu64, kb_torture_op_name(op), h.steps[op]);
        fprintf(out, "\nlost: %" PRIu64 " (%" PRIu64 " accepted never handled)%s%s\n", lost,
                unhandled, lo_len ? ", e.g." : "", lost_ex);
        fprintf(out, "kb_flush %s; kb_drain %s, %lld ms after the last publish\n",
                kb_strerror(h.flush_rc), kb_strerror(h.drain_rc), drain_ms);
        if (unhandled > 0 && h.drain_rc != KB_OK)
            fprintf(out, "      kb_drain did not finish (%s): they may be held up, not gone\n",
                    kb_strerror(h.drain_rc));
        fprintf(out, "order violations: %" PRIu64 "%s%s\n", order, or_len ? ", e.g." : "", order_ex);
        if (phantom)
            fprintf(out, "handled but never accepted: %" PRIu64 "\n", phantom);
        if (h.crashes + h.sanitizer > 0)
            fprintf(out, "consumer crashes: %" PRIu64 " (X lines of nemesis.log), sanitizer reports: %" PRIu64
                         "\n", h.crashes, h.sanitizer);
        if (nats)
            fprintf(out, "duplicates: %" PRIu64 " (%" PRIu64 " with attempt 1), documented bound %" PRIu64
                         " (%" PRIu64 " departures, peak %" PRIu64 " events/s per process)%s\n",
                    dups, dups_first_attempt, bound, h.departures, rate,
                    dups > bound ? "  ** OVER THE BOUND **" : "");
        else
            fprintf(out, "duplicates: %" PRIu64 " (%" PRIu64 " with attempt 1); redis:// documents "
                         "at-least-once, no numeric bound\n", dups, dups_first_attempt);
        fprintf(out, "pause per partition (ms, producing window %.1f s):", window_s);
        for (uint32_t part = 0; part < p->partitions; part++)
            fprintf(out, " p%u=%lld", part, (long long)(pause[part] / 1000000));
        fprintf(out, "\n*** MAX PAUSE %lld ms (partition %u, from +%.1f s of the window; bound %lld ms) ***\n",
                (long long)worst_ms, worst_p, (double)pause_at[worst_p] / 1e9,
                (long long)p->max_pause_ms);
    }
    fprintf(json ? stderr : out,
            "torture %s seed=%" PRIu64 ": %s lost=%" PRIu64 " order=%" PRIu64 " dups=%" PRIu64
            " max_pause_ms=%lld drain_ms=%lld accepted=%" PRIu64 " handled=%zu\n",
            p->broker, p->seed, pass ? "PASS" : "FAIL", lost, order, dups, (long long)worst_ms,
            drain_ms, accepted, h.n);
    if (res != NULL)
        *res = (kb_torture_result){accepted, h.n, distinct, lost, unhandled, phantom, order, dups,
                                   bound, h.crashes + h.sanitizer, worst_ms};
    status = pass ? 0 : 1;
out:
    free(h.r);
    free(h.accepted);
    free(h.reports_ok);
    free(h.reports_failed);
    free(pause);
    free(pause_at);
    return status;
}

int kb_torture_params_write(const char *dir, const kb_torture_params *p)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/run.conf", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "broker %s\npartitions %u\nkeys %u\nmax_ack_pending %u\npublish_batch %u\n"
               "ack_interval_ms %u\nrtt_ms %u\nmax_pause_ms %lld\nseed %" PRIu64 "\n",
            p->broker, p->partitions, p->keys, p->max_ack_pending, p->publish_batch,
            p->ack_interval_ms, p->rtt_ms, (long long)p->max_pause_ms, p->seed);
    return fclose(f) == 0 ? 0 : -1;
}

int kb_torture_params_read(const char *dir, kb_torture_params *p)
{
    char path[4200], line[256], k[64], v[128];
    snprintf(path, sizeof path, "%s/run.conf", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "%63s %127s", k, v) != 2)
            continue;
        unsigned long long n = strtoull(v, NULL, 10);
        if (strcmp(k, "broker") == 0)
            snprintf(p->broker, sizeof p->broker, "%.15s", v);
        else if (strcmp(k, "partitions") == 0)
            p->partitions = (uint32_t)n;
        else if (strcmp(k, "keys") == 0)
            p->keys = (uint32_t)n;
        else if (strcmp(k, "max_ack_pending") == 0)
            p->max_ack_pending = (uint32_t)n;
        else if (strcmp(k, "publish_batch") == 0)
            p->publish_batch = (uint32_t)n;
        else if (strcmp(k, "ack_interval_ms") == 0)
            p->ack_interval_ms = (uint32_t)n;
        else if (strcmp(k, "rtt_ms") == 0)
            p->rtt_ms = (uint32_t)n;
        else if (strcmp(k, "max_pause_ms") == 0 && p->max_pause_ms == 0)
            p->max_pause_ms = (int64_t)n;   /* --max-pause-ms given with --check wins */
        else if (strcmp(k, "seed") == 0)
            p->seed = n;
    }
    fclose(f);
    return p->partitions > 0 && p->keys > 0 ? 0 : -1;
}
