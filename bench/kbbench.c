/* keybus-bench: the origin's ordering and throughput scenarios on any
 * transport, with in-process baselines measured in the same run. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "bench.h"

static const char usage[] =
    "usage: keybus-bench [options]\n"
    "  --transport URL       mem:// (default), redis://host:port, nats://host:port\n"
    "  --config FILE         keybus INI configuration (KEYBUS_* env still overrides)\n"
    "  --scenario S          single | multi | mixed | all (default all)\n"
    "  --events N            events per run (default: the origin's sizes, plus --large-events)\n"
    "  --aggregates N        aggregates for multi and mixed (default 100 and 3; single is 1)\n"
    "  --large-events N      also run each scenario at N events when --events is not given\n"
    "                        (default 1M; 0 = origin sizes only)\n"
    "  --payload-bytes N     bytes per event, at least 24 (default 64)\n"
    "  --producers N         publishing threads (default 1)\n"
    "  --threads N           pool.threads, also the mutex baseline's workers (default: CPUs)\n"
    "  --handler-us N        busy-wait per handled event (default 0)\n"
    "  --handler-fail-rate F fraction of events (0..1) whose handler asks for one retry;\n"
    "                        keybus then runs once per retry.scope (key, lane), and p50/p99\n"
    "                        are of the events whose own aggregate was not waiting\n"
    "  --rate N              offered load in events/s, for latency (default: flat out)\n"
    "  --pace spin|sleep     how producers wait for their send times under --rate: spin\n"
    "                        (default) or sleep, leaving the CPU to other threads\n"
    "  --batch N             publish through kb_publish_batch, N events per call (default 1:\n"
    "                        kb_publish_to per event; baselines always publish one by one)\n"
    "  --idle S              pool.idle: adaptive | spin | yield | block (default: configured)\n"
    "  --idle-cpu            after each keybus run, measure CPU over a quiet second\n"
    "  --repeat N            run every point N times, baselines included (default 1), then a\n"
    "                        '# median of N runs' line per row: quote those medians\n"
    "  --sweep events|threads  multi scenario over 10k..--sweep-max events, or 1..2*CPUs threads\n"
    "  --sweep-max N         largest events sweep point (default 10M)\n"
    "  --json FILE           append JSON lines ('-': stdout, the table goes to stderr)\n"
    "  --cdf FILE            append latency CDF blocks for gnuplot\n"
    "  --no-baselines        skip baseline:ring and baseline:mutex (--baselines: on, default),\n"
    "                        and baseline:redis-raw + baseline:redis-xadd / baseline:nats-raw\n"
    "                        (with redis:// or nats://); --baselines=broker: only the\n"
    "                        broker's raw baseline. Under --rate baseline:redis-xadd is left\n"
    "                        out (paced, it would measure the rate, not the server's ceiling)\n"
    "Numbers take k/M suffixes. Exit 1 when a run lost, duplicated or reordered events or failed.\n";

enum { BASE_LOCAL = 1, BASE_BROKER = 2 };   /* ring + mutex; the broker's raw client */

struct cli {
    kb_bus_opts bus;
    int scenarios;              /* bit per kb_scenario */
    uint64_t events, large_events, sweep_max, rate;
    uint32_t aggregates, payload_bytes, producers, handler_us, batch, repeat;
    bool pace_sleep;
    double fail_rate;
    int baselines;              /* BASE_* bits */
    const char *sweep, *json_path, *cdf_path;
    FILE *table, *json, *cdf;
    int failed;
};

static int parse_num(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end == 'k' || *end == 'K')
        v *= 1e3, end++;
    else if (*end == 'M' || *end == 'm')
        v *= 1e6, end++;
    if (errno || end == s || *end != '\0' || v < 0 || v > 1e15)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static void emit(struct cli *c, kb_result *r)
{
    kb_report_row(c->table, r);
    if (c->json)
        kb_report_json(c->json, r);
    if (c->cdf)
        kb_report_cdf(c->cdf, r);
    if (r->error || r->order_violations || r->lost || r->duplicates || r->corrupt)
        c->failed = 1;
}

/* A row's figures, kept over the --repeat runs of a point for its medians. */
/* Rows of one point: baseline:ring, baseline:mutex, keybus, the raw broker
 * baseline, baseline:redis-xadd, and keybus with retry.scope = lane
 * (--handler-fail-rate). */
#define KB_ROWS 6
#define KB_FIGURES 9
struct figures {
    int valid;
    char transport[160];
    double v[KB_FIGURES];
};
static const char *const figure_name[KB_FIGURES] = {"events/s", "cpu_ns/ev", "p50_us", "p99_us",
                                                    "p999_us", "x_ring", "x_mutex", "x_raw",
                                                    "x_xadd"};

static void keep_figures(struct figures *f, const kb_result *r)
{
    f->valid = 1;
    snprintf(f->transport, sizeof f->transport, "%s", r->transport);
    double v[KB_FIGURES] = {r->events_per_s, r->cpu_ns_per_event,
                            kb_hist_quantile(&r->hist, 0.5) / 1e3,
                            kb_hist_quantile(&r->hist, 0.99) / 1e3,
                            kb_hist_quantile(&r->hist, 0.999) / 1e3, r->ratio_ring,
                            r->ratio_mutex, r->ratio_raw, r->ratio_xadd};
    memcpy(f->v, v, sizeof v);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Per row (baselines included), the median of each figure over the repeats:
 * one line each, after the point's runs. */
static void report_medians(struct cli *c, struct figures (*f)[KB_ROWS], uint32_t runs)
{
    double *col = calloc(runs, sizeof *col);
    if (col == NULL)
        return;
    for (int k = 0; k < KB_ROWS; k++) {
        if (!f[0][k].valid)
            continue;
        fprintf(c->table, "# median of %u runs, %s:", runs, f[0][k].transport);
        for (int j = 0; j < KB_FIGURES; j++) {
            uint32_t n = 0;
            for (uint32_t i = 0; i < runs; i++)
                if (f[i][k].valid && f[i][k].v[j] > 0)
                    col[n++] = f[i][k].v[j];
            if (n == 0)
                continue;
            qsort(col, n, sizeof *col, cmp_double);
            double m = n % 2 ? col[n / 2] : (col[n / 2 - 1] + col[n / 2]) / 2;
            fprintf(c->table, " %s %.*f", figure_name[j], j == 0 ? 0 : 2, m);
        }
        fputc('\n', c->table);
    }
    free(col);
}

static void run_once(struct cli *c, kb_scenario s, uint64_t events, uint32_t aggs,
                     uint32_t threads, const char *kind, struct figures kept[KB_ROWS]);

/* One point, --repeat times, then the medians. */
static void run_point(struct cli *c, kb_scenario s, uint64_t events, uint32_t aggs, uint32_t threads,
                      const char *kind)
{
    struct figures (*f)[KB_ROWS] = calloc(c->repeat, sizeof *f);
    if (f == NULL) {
        c->failed = 1;
        return;
    }
    for (uint32_t i = 0; i < c->repeat; i++)
        run_once(c, s, events, aggs, threads, kind, f[i]);
    if (c->repeat > 1)
        report_medians(c, f, c->repeat);
    free(f);
}

/* The baselines, then keybus with its ratios to them. */
static void run_once(struct cli *c, kb_scenario s, uint64_t events, uint32_t aggs,
                     uint32_t threads, const char *kind, struct figures kept[KB_ROWS])
{
    char label[96];
    snprintf(label, sizeof label, "%s/%s/%llu", kb_scenario_name(s), kind,
             (unsigned long long)events);
    kb_plan p = {.scenario = s, .events = events, .aggregates = aggs < events ? aggs : (uint32_t)events,
                 .producers = c->producers, .payload_bytes = c->payload_bytes,
                 .handler_us = c->handler_us, .rate = c->rate, .pace_sleep = c->pace_sleep, .batch = c->batch,
                 .fail_rate = c->fail_rate, .label = label};
    kb_result *r = calloc(KB_ROWS, sizeof *r);
    if (r == NULL) {
        c->failed = 1;
        return;
    }
    kb_bus_opts bus = c->bus;
    bus.threads = threads;
    /* the mutex pool gets as many workers as keybus gets executors */
    kb_idle idle = bus.idle && strcmp(bus.idle, "block") == 0 ? KB_IDLE_BLOCK : KB_IDLE_ADAPTIVE;
    uint32_t workers = threads ? threads : kb_pool_default_threads(idle);
    for (int i = 0; i < KB_ROWS; i++) {
        r[i].kind = kind;
        r[i].idle_cpu_pct = -1;
    }
    if (c->baselines & BASE_LOCAL) {
        kb_run_ring(&p, &r[0]);
        r[0].batch = 1;   /* baselines publish one by one */
        emit(c, &r[0]);
        kb_run_mutex(&p, workers, &r[1]);
        r[1].batch = 1;   /* baselines publish one by one */
        emit(c, &r[1]);
    }
#ifdef KB_BENCH_REDIS
    /* baseline:redis-raw: plain hiredis on the same server (redis:// runs only) */
    if ((c->baselines & BASE_BROKER) && bus.transport && strncmp(bus.transport, "redis://", 8) == 0) {
        kb_run_redis_raw(&p, bus.transport, &r[3]);
        r[3].batch = 1;   /* baselines publish one by one */
        emit(c, &r[3]);
        if (p.rate == 0) {
            kb_run_redis_xadd(&p, bus.transport, &r[4]);
            r[4].batch = 1;
            emit(c, &r[4]);
        }
    }
#endif
#ifdef KB_BENCH_NATS
    /* baseline:nats-raw: plain nats.c on the same server (nats:// runs only) */
    if ((c->baselines & BASE_BROKER) && bus.transport && strncmp(bus.transport, "nats://", 7) == 0) {
        kb_run_nats_raw(&p, bus.transport, &r[3]);
        r[3].batch = 1;   /* baselines publish one by one */
        emit(c, &r[3]);
    }
#endif
    /* with failing handlers: once per retry.scope, key then lane */
    static const int bus_rows[] = {2, 5};
    for (int i = 0; i < (c->fail_rate > 0 ? 2 : 1); i++) {
        kb_result *b = &r[bus_rows[i]];
        if (c->fail_rate > 0)
            bus.retry_scope = i == 0 ? "key" : "lane";
        kb_run_bus(&p, &bus, b);
        b->ratio_ring = r[0].events_per_s > 0 ? b->events_per_s / r[0].events_per_s : 0;
        b->ratio_mutex = r[1].events_per_s > 0 ? b->events_per_s / r[1].events_per_s : 0;
        b->ratio_raw = r[3].events_per_s > 0 ? b->events_per_s / r[3].events_per_s : 0;
        b->ratio_xadd = r[4].events_per_s > 0 ? b->events_per_s / r[4].events_per_s : 0;
        emit(c, b);
    }
    for (int i = 0; i < KB_ROWS; i++)
        if (r[i].transport[0] != '\0')
            keep_figures(&kept[i], &r[i]);
    if (r[2].idle_cpu_pct >= 0)
        fprintf(c->table, "# %s idle=%s: %.2f%% CPU over a quiet second after the run\n", label,
                r[2].idle, r[2].idle_cpu_pct);
    free(r);
}

static uint64_t default_events(kb_scenario s)
{
    static const uint64_t n[] = {10000, 50000, 60};   /* the origin's table */
    return n[s];
}

static uint32_t default_aggs(const struct cli *c, kb_scenario s)
{
    static const uint32_t n[] = {1, 100, 3};
    return s == KB_SC_SINGLE || c->aggregates == 0 ? n[s] : c->aggregates;
}

static void run_all(struct cli *c)
{
    uint32_t cpus = (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
    if (c->sweep && strcmp(c->sweep, "events") == 0) {
        kb_scenario s = c->scenarios == (1 << KB_SC_SINGLE) ? KB_SC_SINGLE
                        : c->scenarios == (1 << KB_SC_MIXED) ? KB_SC_MIXED : KB_SC_MULTI;
        for (uint64_t n = 10000; n <= c->sweep_max; n *= 10)
            run_point(c, s, n, default_aggs(c, s), c->bus.threads, "sweep-events");
        return;
    }
    if (c->sweep) {   /* threads */
        kb_scenario s = c->scenarios == (1 << KB_SC_SINGLE) ? KB_SC_SINGLE : KB_SC_MULTI;
        for (uint32_t t = 1; t <= 2 * cpus; t++)
            run_point(c, s, c->events ? c->events : 1000000, default_aggs(c, s), t, "sweep-threads");
        return;
    }
    for (int s = KB_SC_SINGLE; s <= KB_SC_MIXED; s++) {
        if (!(c->scenarios & (1 << s)))
            continue;
        if (c->events) {
            run_point(c, s, c->events, default_aggs(c, s), c->bus.threads,
                      c->fail_rate > 0 ? "handler-fails" : c->rate ? "fixed-rate" : "custom");
            continue;
        }
        run_point(c, s, default_events(s), default_aggs(c, s), c->bus.threads, "origin");
        if (c->large_events)
            run_point(c, s, c->large_events, default_aggs(c, s), c->bus.threads, "large");
    }
}

static FILE *open_out(const char *path, FILE *dash)
{
    if (path == NULL)
        return NULL;
    if (strcmp(path, "-") == 0)
        return dash;
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        fprintf(stderr, "keybus-bench: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    return f;
}

int main(int argc, char **argv)
{
    struct cli c = {.scenarios = 7, .large_events = 1000000, .sweep_max = 10000000,
                    .payload_bytes = 64, .producers = 1, .baselines = BASE_LOCAL | BASE_BROKER, .repeat = 1};
    enum { O_TRANSPORT = 256, O_CONFIG, O_SCENARIO, O_EVENTS, O_AGGS, O_LARGE, O_PAYLOAD,
           O_PRODUCERS, O_THREADS, O_HANDLER, O_RATE, O_SWEEP, O_SWEEP_MAX, O_JSON, O_CDF,
           O_BASE, O_NOBASE, O_HELP, O_BATCH, O_IDLE, O_IDLE_CPU, O_REPEAT, O_FAIL_RATE, O_PACE };
    static const struct option opts[] = {
        {"transport", 1, 0, O_TRANSPORT}, {"config", 1, 0, O_CONFIG},
        {"scenario", 1, 0, O_SCENARIO},   {"events", 1, 0, O_EVENTS},
        {"aggregates", 1, 0, O_AGGS},     {"large-events", 1, 0, O_LARGE},
        {"payload-bytes", 1, 0, O_PAYLOAD}, {"producers", 1, 0, O_PRODUCERS},
        {"threads", 1, 0, O_THREADS},     {"handler-us", 1, 0, O_HANDLER},
        {"rate", 1, 0, O_RATE},           {"sweep", 1, 0, O_SWEEP},
        {"sweep-max", 1, 0, O_SWEEP_MAX}, {"json", 1, 0, O_JSON},
        {"cdf", 1, 0, O_CDF},             {"baselines", 2, 0, O_BASE},
        {"no-baselines", 0, 0, O_NOBASE}, {"help", 0, 0, O_HELP},
        {"batch", 1, 0, O_BATCH},         {"idle", 1, 0, O_IDLE},
        {"idle-cpu", 0, 0, O_IDLE_CPU},   {"repeat", 1, 0, O_REPEAT},
        {"handler-fail-rate", 1, 0, O_FAIL_RATE}, {"pace", 1, 0, O_PACE},
        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        uint64_t v = 0;
        int numeric = o == O_EVENTS || o == O_AGGS || o == O_LARGE || o == O_PAYLOAD ||
                      o == O_PRODUCERS || o == O_THREADS || o == O_HANDLER || o == O_RATE ||
                      o == O_SWEEP_MAX || o == O_BATCH || o == O_REPEAT;
        if (numeric && (parse_num(optarg, &v) != 0 || (v == 0 && (o == O_EVENTS || o == O_AGGS)) ||
                        (o != O_EVENTS && o != O_LARGE && o != O_RATE &&
                                                        o != O_SWEEP_MAX && v > UINT32_MAX))) {
            fprintf(stderr, "keybus-bench: bad number '%s'\n%s", optarg, usage);
            return 2;
        }
        switch (o) {
        case O_TRANSPORT: c.bus.transport = optarg; break;
        case O_CONFIG: c.bus.config = optarg; break;
        case O_SCENARIO:
            if (strcmp(optarg, "all") == 0)
                c.scenarios = 7;
            else if (strcmp(optarg, "single") == 0)
                c.scenarios = 1 << KB_SC_SINGLE;
            else if (strcmp(optarg, "multi") == 0)
                c.scenarios = 1 << KB_SC_MULTI;
            else if (strcmp(optarg, "mixed") == 0)
                c.scenarios = 1 << KB_SC_MIXED;
            else {
                fprintf(stderr, "keybus-bench: unknown scenario '%s'\n%s", optarg, usage);
                return 2;
            }
            break;
        case O_EVENTS: c.events = v; break;
        case O_AGGS: c.aggregates = (uint32_t)v; break;
        case O_LARGE: c.large_events = v; break;
        case O_PAYLOAD: c.payload_bytes = (uint32_t)v; break;
        case O_PRODUCERS: c.producers = (uint32_t)v; break;
        case O_THREADS: c.bus.threads = (uint32_t)v; break;
        case O_HANDLER: c.handler_us = (uint32_t)v; break;
        case O_RATE: c.rate = v; break;
        case O_SWEEP: c.sweep = optarg; break;
        case O_SWEEP_MAX: c.sweep_max = v; break;
        case O_JSON: c.json_path = optarg; break;
        case O_CDF: c.cdf_path = optarg; break;
        case O_BASE:
            if (optarg != NULL && strcmp(optarg, "broker") != 0) {
                fprintf(stderr, "keybus-bench: --baselines=%s: only 'broker'\n%s", optarg, usage);
                return 2;
            }
            c.baselines = optarg ? BASE_BROKER : BASE_LOCAL | BASE_BROKER;
            break;
        case O_NOBASE: c.baselines = 0; break;
        case O_BATCH: c.batch = (uint32_t)v; break;
        case O_IDLE:
            if (strcmp(optarg, "adaptive") && strcmp(optarg, "spin") && strcmp(optarg, "yield") &&
                strcmp(optarg, "block")) {
                fprintf(stderr, "keybus-bench: unknown idle strategy '%s'\n%s", optarg, usage);
                return 2;
            }
            c.bus.idle = optarg;
            break;
        case O_IDLE_CPU: c.bus.idle_cpu = 1; break;
        case O_PACE:
            if (strcmp(optarg, "spin") != 0 && strcmp(optarg, "sleep") != 0) {
                fprintf(stderr, "keybus-bench: unknown pace '%s'\n%s", optarg, usage);
                return 2;
            }
            c.pace_sleep = strcmp(optarg, "sleep") == 0;
            break;
        case O_REPEAT: c.repeat = v ? (uint32_t)v : 1; break;
        case O_FAIL_RATE: {
            char *end;
            c.fail_rate = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(c.fail_rate >= 0 && c.fail_rate <= 1)) {
                fprintf(stderr, "keybus-bench: --handler-fail-rate '%s' is not in 0..1\n%s", optarg,
                        usage);
                return 2;
            }
            break;
        }
        case 'h': case O_HELP: fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 2;
        }
    }
    if (optind < argc || c.payload_bytes < sizeof(kb_bench_hdr) || c.producers == 0 ||
        (c.sweep && strcmp(c.sweep, "events") != 0 && strcmp(c.sweep, "threads") != 0)) {
        fprintf(stderr, "keybus-bench: bad arguments (payload >= %zu bytes, producers >= 1, "
                "--sweep events|threads)\n%s", sizeof(kb_bench_hdr), usage);
        return 2;
    }
    c.table = c.json_path && strcmp(c.json_path, "-") == 0 ? stderr : stdout;
    c.json = open_out(c.json_path, stdout);
    c.cdf = open_out(c.cdf_path, stdout);

    char cpu[128] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "model name : %127[^\n]", cpu) == 1)
            break;
    if (f)
        fclose(f);
    fprintf(c.table, "# keybus %s, %ld CPUs (%s), payload %u B, %u producer(s), handler %u us%s%s, "
            "batch %u, idle %s\n",
            KB_VERSION_STRING, sysconf(_SC_NPROCESSORS_ONLN), cpu, c.payload_bytes, c.producers,
            c.handler_us, c.rate ? ", fixed rate" : "",
            c.rate && c.pace_sleep ? " (producers sleep to send times)" : "", c.batch > 1 ? c.batch : 1,
            c.bus.idle ? c.bus.idle : "(configured)");
    if (c.fail_rate > 0)
        fprintf(c.table, "# handler fail rate %g: one retry each; keybus rows per retry.scope, "
                "latency of the events whose own aggregate was not waiting\n", c.fail_rate);
    kb_report_header(c.table);
    run_all(&c);
    if (c.json && c.json != stdout)
        fclose(c.json);
    if (c.cdf && c.cdf != stdout)
        fclose(c.cdf);
    fprintf(c.table, "# %s\n", c.failed ? "FAILED: a run lost, duplicated or reordered events, or "
                                          "could not run (see above)"
                                        : "every run: no order violation, loss or duplicate");
    return c.failed ? 1 : 0;
}
