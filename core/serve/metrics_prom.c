/* The Prometheus text exposition (format 0.0.4) of a metrics snapshot: one
 * family per figure, each with # HELP and # TYPE, a sample per topic (and
 * per partition), label values escaped. Names and meanings: docs/metrics.md. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "serve.h"

/* Which topics a family has samples for. */
enum scope {
    ALL,      /* every topic the bus knows */
    POOL,     /* topics subscribed in this process */
    BROKER,   /* topics on a broker (partitions > 0) */
};

struct family {
    const char *name, *type, *help;
    enum scope scope;
    size_t offset;            /* in kb_topic_stats */
    size_t size;              /* 4 or 8 */
};

#define FIELD(f) offsetof(kb_topic_stats, f), sizeof(((kb_topic_stats *)0)->f)

static const struct family topic_families[] = {
    {"keybus_events_published_total", "counter",
     "Events accepted by kb_publish in this process.", ALL, FIELD(published)},
    {"keybus_events_received_total", "counter",
     "Events that entered this process's pool of the topic.", POOL, FIELD(received)},
    {"keybus_events_handled_total", "counter", "Handler runs that returned KB_HANDLED.", POOL,
     FIELD(handled)},
    {"keybus_events_retried_total", "counter", "Handler runs that asked for a retry.", POOL,
     FIELD(retried)},
    {"keybus_events_dead_lettered_total", "counter",
     "Events given up on: KB_DEAD or retry.max_attempts.", POOL, FIELD(dead_lettered)},
    {"keybus_events_rejected_total", "counter",
     "Enqueues refused with KB_EFULL after pool.enqueue_timeout_ms.", POOL, FIELD(rejected)},
    {"keybus_dead_letters_lost_total", "counter",
     "Dead letters that could not be stored (each one logged).", POOL,
     FIELD(dead_letters_lost)},
    {"keybus_broker_trimmed_total", "counter",
     "Entries found deleted by the broker's retention before they were handled.", BROKER,
     FIELD(broker_trimmed)},
    {"keybus_queue_depth", "gauge", "Events queued in this process's lanes now.", POOL,
     FIELD(depth)},
    {"keybus_queue_max_depth", "gauge", "Deepest any lane has been.", POOL, FIELD(max_depth)},
    {"keybus_lanes", "gauge", "Lanes of the topic's pool (pool.workers).", POOL, FIELD(lanes)},
    {"keybus_lanes_allocated", "gauge", "Lanes that hold a ring (allocated on first use).",
     POOL, FIELD(lanes_allocated)},
    {"keybus_lane_memory_bytes", "gauge", "Lane table plus allocated lanes and rings.", POOL,
     FIELD(lane_memory_bytes)},
    {"keybus_events_set_aside", "gauge",
     "Events set aside now behind their aggregate's retry (retry.scope = key).", POOL,
     FIELD(set_aside)},
    {"keybus_aggregates_waiting", "gauge",
     "Aggregates waiting for a retry now (retry.scope = key).", POOL,
     FIELD(aggregates_waiting)},
    {"keybus_partitions", "gauge", "Broker partitions of the topic.", BROKER,
     FIELD(partitions)},
    {"keybus_partitions_owned", "gauge", "Partitions this process consumes now.", BROKER,
     FIELD(partitions_owned)},
    {"keybus_broker_length", "gauge", "Events stored by the broker over all partitions.",
     BROKER, FIELD(broker_length)},
    {"keybus_broker_pending", "gauge",
     "Delivered but not acknowledged (events on redis://, messages on nats://).", BROKER,
     FIELD(broker_pending)},
    {"keybus_broker_lag", "gauge",
     "Not yet delivered to the group (events on redis://, messages on nats://).", BROKER,
     FIELD(broker_lag)},
    {"keybus_broker_frames", "gauge",
     "NATS: JetStream messages holding the stored events (frames pack several); 0 elsewhere.",
     BROKER, FIELD(broker_frames)},
    {"keybus_dead_letters", "gauge", "Dead letters stored now.", ALL, FIELD(dlq_length)},
};

struct part_family {
    const char *name, *type, *help;
    bool lanes;               /* a lane counter: only when pool.workers % partitions == 0 */
    size_t offset;            /* in kb_metrics_part */
};

#define PART(f) offsetof(kb_metrics_part, f)

static const struct part_family part_families[] = {
    {"keybus_partition_events_received_total", "counter",
     "Events of the partition that entered this process's pool.", true, PART(received)},
    {"keybus_partition_events_handled_total", "counter",
     "Handler runs on events of the partition that returned KB_HANDLED.", true, PART(handled)},
    {"keybus_partition_events_retried_total", "counter",
     "Handler runs on events of the partition that asked for a retry.", true, PART(retried)},
    {"keybus_partition_events_dead_lettered_total", "counter",
     "Events of the partition given up on in this process.", true, PART(dead_lettered)},
    {"keybus_partition_length", "gauge", "Events the broker stores in the partition.", false,
     PART(ps.length)},
    {"keybus_partition_pending", "gauge", "Delivered, not acknowledged, in the partition.",
     false, PART(ps.pending)},
    {"keybus_partition_lag", "gauge", "Not yet delivered to the group, in the partition.",
     false, PART(ps.lag)},
    {"keybus_partition_redelivered_total", "counter",
     "Messages the broker redelivered (nats://; 0 on redis://).", false, PART(ps.redelivered)},
};

static bool has_scope(const kb_metrics_topic *t, enum scope scope)
{
    if (scope == POOL)
        return t->pool;
    bool stats = t->rc == KB_OK;
    return scope == BROKER ? stats && t->s.partitions > 0 : stats || t->pool;
}

static uint64_t field(const void *base, size_t offset, size_t size)
{
    const char *p = (const char *)base + offset;
    return size == sizeof(uint32_t) ? *(const uint32_t *)p : *(const uint64_t *)p;
}

/* A label value: backslash, double quote and newline escaped, as the text
 * format requires (topic names cannot hold them today; names may grow). */
static void label_value(FILE *f, const char *v)
{
    for (; *v != '\0'; v++) {
        if (*v == '\\' || *v == '"')
            fputc('\\', f);
        if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
}

static void header(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* `name` and the topic label, left open for more labels. */
static void topic_label(FILE *f, const char *name, const char *suffix, const kb_metrics_topic *t)
{
    fprintf(f, "%s%s{topic=\"", name, suffix);
    label_value(f, t->name);
    fputc('"', f);
}

static void histogram(FILE *f, const kb_metrics_snap *s, const char *name, const char *help,
                      size_t offset)
{
    bool any = false;
    for (size_t i = 0; i < s->n; i++)
        any |= s->t[i].hist && s->t[i].pool;
    if (!any)
        return;
    header(f, name, "histogram", help);
    for (size_t i = 0; i < s->n; i++) {
        const kb_metrics_topic *t = &s->t[i];
        if (!t->hist || !t->pool)
            continue;
        const kb_hist_snap *h = (const kb_hist_snap *)((const char *)t + offset);
        uint64_t cumulative = 0;
        for (unsigned b = 0; b <= KB_HIST_BOUNDS; b++) {
            cumulative += h->bucket[b];
            topic_label(f, name, "_bucket", t);
            fprintf(f, ",le=\"%s\"} %" PRIu64 "\n",
                    b < KB_HIST_BOUNDS ? kb__hist_bound_text[b] : "+Inf", cumulative);
        }
        topic_label(f, name, "_sum", t);
        fprintf(f, "} %.9f\n", (double)h->sum_ns / 1e9);
        topic_label(f, name, "_count", t);
        fprintf(f, "} %" PRIu64 "\n", cumulative);
    }
}

static void histograms(FILE *f, const kb_metrics_snap *s)
{
    histogram(f, s, "keybus_publish_to_handle_seconds",
              "From kb_publish (mem://) or receipt from the broker to the handler's start, "
              "first runs only.",
              offsetof(kb_metrics_topic, latency));
    histogram(f, s, "keybus_handler_duration_seconds", "Handler run time.",
              offsetof(kb_metrics_topic, duration));
}

char *kb__metrics_prom(const kb_metrics_snap *s, size_t *len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    if (f == NULL)
        return NULL;
    for (size_t k = 0; k < sizeof topic_families / sizeof *topic_families; k++) {
        const struct family *fam = &topic_families[k];
        bool headed = false;
        for (size_t i = 0; i < s->n; i++) {
            const kb_metrics_topic *t = &s->t[i];
            if (!has_scope(t, fam->scope))
                continue;
            if (!headed)
                header(f, fam->name, fam->type, fam->help);
            headed = true;
            topic_label(f, fam->name, "", t);
            fprintf(f, "} %" PRIu64 "\n", field(&t->s, fam->offset, fam->size));
        }
    }
    histograms(f, s);
    for (size_t k = 0; k < sizeof part_families / sizeof *part_families; k++) {
        const struct part_family *fam = &part_families[k];
        bool headed = false;
        for (size_t i = 0; i < s->n; i++) {
            const kb_metrics_topic *t = &s->t[i];
            for (uint32_t p = 0; p < t->n_parts; p++) {
                const kb_metrics_part *part = &t->parts[p];
                if (fam->lanes ? !part->lanes : part->rc != KB_OK)
                    continue;
                if (!headed)
                    header(f, fam->name, fam->type, fam->help);
                headed = true;
                topic_label(f, fam->name, "", t);
                fprintf(f, ",partition=\"%" PRIu32 "\"} %" PRIu64 "\n", p,
                        field(part, fam->offset, sizeof(uint64_t)));
            }
        }
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
