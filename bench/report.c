/* The human table (stdout), JSON lines (one per run) and CDF data for plots. */
#include <stdio.h>

#include "bench.h"

void kb_report_header(FILE *out)
{
    fprintf(out, "%-8s %-13s %-28s %10s %6s %3s %3s %5s %9s %12s %9s %8s %8s %8s %7s %14s %9s "
                 "%7s %7s %7s\n",
            "scenario", "kind", "transport", "events", "aggs", "prd", "thr", "batch", "seconds",
            "events/s", "cpu_ns/ev", "p50_us", "p99_us", "p999_us", "rss_MB", "order/lost/dup",
            "x_origin", "x_ring", "x_mutex", "x_raw");
}

static void ratio(FILE *out, double r)
{
    if (r > 0)
        fprintf(out, " %7.2f", r);
    else
        fprintf(out, " %7s", "-");
}

void kb_report_row(FILE *out, const kb_result *r)
{
    char checks[64], transport[sizeof r->transport + sizeof r->retry_scope + 1];
    if (r->retry_scope[0] != '\0')   /* a --handler-fail-rate run: which scope */
        snprintf(transport, sizeof transport, "%s %s", r->transport, r->retry_scope);
    else
        snprintf(transport, sizeof transport, "%s", r->transport);
    snprintf(checks, sizeof checks, "%llu/%llu/%llu%s", (unsigned long long)r->order_violations,
             (unsigned long long)r->lost, (unsigned long long)r->duplicates,
             r->error ? " ERR" : r->corrupt ? " BAD" : "");
    fprintf(out, "%-8s %-13s %-28.28s %10llu %6u %3u %3u %5u %9.4f %12.0f %9.1f %8.2f %8.2f %8.2f "
                 "%7.1f %14s %9.1f",
            r->scenario, r->kind, transport, (unsigned long long)r->events, r->aggregates,
            r->producers, r->threads, r->batch, r->seconds, r->events_per_s, r->cpu_ns_per_event,
            kb_hist_quantile(&r->hist, 0.5) / 1e3, kb_hist_quantile(&r->hist, 0.99) / 1e3,
            kb_hist_quantile(&r->hist, 0.999) / 1e3, r->rss_bytes / 1048576.0, checks,
            r->events_per_s / r->origin_events_per_s);
    ratio(out, r->ratio_ring);
    ratio(out, r->ratio_mutex);
    ratio(out, r->ratio_raw);
    fputc('\n', out);
    fflush(out);
}

static void json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', out);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, out);
    }
    fputc('"', out);
}

static void json_ratio(FILE *out, const char *name, double r)
{
    if (r > 0)
        fprintf(out, ",\"%s\":%.4f", name, r);
    else
        fprintf(out, ",\"%s\":null", name);
}

void kb_report_json(FILE *out, const kb_result *r)
{
    fprintf(out, "{\"scenario\":\"%s\",\"kind\":\"%s\",\"transport\":", r->scenario, r->kind);
    json_str(out, r->transport);
    fprintf(out,
            ",\"events\":%llu,\"aggregates\":%u,\"producers\":%u,\"threads\":%u,"
            "\"payload_bytes\":%u,\"handler_us\":%u,\"rate\":%llu,\"pace\":\"%s\",\"seconds\":%.6f,"
            "\"events_per_s\":%.1f,\"cpu_ns_per_event\":%.1f,\"handled\":%llu,"
            "\"order_violations\":%llu,\"lost\":%llu,"
            "\"duplicates\":%llu,\"corrupt\":%llu,\"publish_retries\":%llu,\"error\":%s,"
            "\"p50_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,\"max_us\":%.3f,\"rss_bytes\":%llu,"
            "\"origin_events_per_s\":%.1f,\"ratio_origin\":%.4f",
            (unsigned long long)r->events, r->aggregates, r->producers, r->threads,
            r->payload_bytes, r->handler_us, (unsigned long long)r->rate,
            r->pace_sleep ? "sleep" : "spin", r->seconds,
            r->events_per_s, r->cpu_ns_per_event, (unsigned long long)r->handled,
            (unsigned long long)r->order_violations, (unsigned long long)r->lost,
            (unsigned long long)r->duplicates, (unsigned long long)r->corrupt,
            (unsigned long long)r->publish_retries, r->error ? "true" : "false",
            kb_hist_quantile(&r->hist, 0.5) / 1e3, kb_hist_quantile(&r->hist, 0.99) / 1e3,
            kb_hist_quantile(&r->hist, 0.999) / 1e3, r->hist.max / 1e3,
            (unsigned long long)r->rss_bytes, r->origin_events_per_s,
            r->events_per_s / r->origin_events_per_s);
    json_ratio(out, "ratio_ring", r->ratio_ring);
    json_ratio(out, "ratio_mutex", r->ratio_mutex);
    json_ratio(out, "ratio_raw", r->ratio_raw);
    json_ratio(out, "ratio_xadd", r->ratio_xadd);
    fprintf(out, ",\"batch\":%u,\"idle\":", r->batch);
    json_str(out, r->idle);
    if (r->idle_cpu_pct >= 0)
        fprintf(out, ",\"idle_cpu_pct\":%.3f", r->idle_cpu_pct);
    else
        fputs(",\"idle_cpu_pct\":null", out);
    if (r->fail_rate > 0) {
        fprintf(out, ",\"fail_rate\":%.6f,\"retry_scope\":", r->fail_rate);
        json_str(out, r->retry_scope);
    }
    fputs("}\n", out);
    fflush(out);
}

/* One gnuplot data block per run (select with `index N`), titled in a comment. */
void kb_report_cdf(FILE *out, const kb_result *r)
{
    fprintf(out, "# %s %s events=%llu rate=%llu\n", r->scenario, r->transport,
            (unsigned long long)r->events, (unsigned long long)r->rate);
    kb_hist_write_cdf(&r->hist, out);
    fputs("\n\n", out);
    fflush(out);
}
