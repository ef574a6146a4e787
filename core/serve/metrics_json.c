/* The JSON documents of a metrics snapshot, built with cJSON (escaping is
 * the library's): the stats feed (docs/formats.md, "Stats feed";
 * docs/schemas/stats-feed.json) and GET /partitions. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <time.h>

#include "serve.h"

/* cJSON numbers are doubles: counters are exact up to 2^53. */
static bool add_number(cJSON *o, const char *name, double v)
{
    return cJSON_AddNumberToObject(o, name, v) != NULL;
}

static bool add_hist(cJSON *o, const char *name, const kb_hist_snap *h)
{
    cJSON *j = cJSON_AddObjectToObject(o, name);
    if (j == NULL || !add_number(j, "count", (double)h->count) ||
        !add_number(j, "sum_seconds", (double)h->sum_ns / 1e9))
        return false;
    cJSON *buckets = cJSON_AddArrayToObject(j, "buckets");
    if (buckets == NULL)
        return false;
    uint64_t cumulative = 0;
    for (unsigned i = 0; i < KB_HIST_BOUNDS; i++) {
        cumulative += h->bucket[i];
        cJSON *b = cJSON_CreateObject();
        if (b == NULL || !cJSON_AddItemToArray(buckets, b) ||
            !add_number(b, "le_seconds", (double)kb__hist_bound_ns[i] / 1e9) ||
            !add_number(b, "count", (double)cumulative))
            return false;
    }
    return true;
}

static bool add_partition(cJSON *list, const kb_metrics_part *p, uint32_t index)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || !cJSON_AddItemToArray(list, o) || !add_number(o, "partition", index))
        return false;
    if (p->rc != KB_OK) {
        if (cJSON_AddStringToObject(o, "error", kb_strerror(p->rc)) == NULL)
            return false;
    } else if (!add_number(o, "length", (double)p->ps.length) ||
               !add_number(o, "pending", (double)p->ps.pending) ||
               !add_number(o, "lag", (double)p->ps.lag) ||
               !add_number(o, "redelivered", (double)p->ps.redelivered) ||
               !add_number(o, "consumers", p->ps.consumers) ||
               cJSON_AddStringToObject(o, "owner", p->ps.owner) == NULL) {
        return false;
    }
    return !p->lanes || (add_number(o, "received", (double)p->received) &&
                         add_number(o, "handled", (double)p->handled) &&
                         add_number(o, "retried", (double)p->retried) &&
                         add_number(o, "dead_lettered", (double)p->dead_lettered));
}

static bool add_partitions(cJSON *o, const char *name, const kb_metrics_topic *t)
{
    cJSON *list = cJSON_AddArrayToObject(o, name);
    for (uint32_t i = 0; list != NULL && i < t->n_parts; i++)
        if (!add_partition(list, &t->parts[i], i))
            return false;
    return list != NULL;
}

static bool add_topic(cJSON *topics, const kb_metrics_topic *t)
{
    const kb_topic_stats *s = &t->s;
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || !cJSON_AddItemToArray(topics, o) ||
        cJSON_AddStringToObject(o, "topic", t->name) == NULL ||
        cJSON_AddBoolToObject(o, "subscribed", t->pool) == NULL ||
        (t->rc != KB_OK && cJSON_AddStringToObject(o, "error", kb_strerror(t->rc)) == NULL))
        return false;
    const struct {
        const char *name;
        double v;
    } figures[] = {
        {"published", (double)s->published},
        {"received", (double)s->received},
        {"handled", (double)s->handled},
        {"retried", (double)s->retried},
        {"dead_lettered", (double)s->dead_lettered},
        {"rejected", (double)s->rejected},
        {"dead_letters_lost", (double)s->dead_letters_lost},
        {"broker_trimmed", (double)s->broker_trimmed},
        {"depth", (double)s->depth},
        {"max_depth", (double)s->max_depth},
        {"lanes", s->lanes},
        {"lanes_allocated", s->lanes_allocated},
        {"lane_memory_bytes", (double)s->lane_memory_bytes},
        {"set_aside", (double)s->set_aside},
        {"aggregates_waiting", (double)s->aggregates_waiting},
        {"partitions", s->partitions},
        {"partitions_owned", s->partitions_owned},
        {"broker_length", (double)s->broker_length},
        {"broker_pending", (double)s->broker_pending},
        {"broker_lag", (double)s->broker_lag},
        {"broker_frames", (double)s->broker_frames},
        {"dlq_length", (double)s->dlq_length},
    };
    for (size_t i = 0; i < sizeof figures / sizeof *figures; i++)
        if (!add_number(o, figures[i].name, figures[i].v))
            return false;
    if (t->hist && (!add_hist(o, "publish_to_handle_seconds", &t->latency) ||
                    !add_hist(o, "handler_duration_seconds", &t->duration)))
        return false;
    return add_partitions(o, "partition_stats", t);
}

static char *print(cJSON *doc, bool ok)
{
    char *text = ok ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    return text;
}

char *kb__metrics_json(const kb_serve_conf *c, const kb_metrics_snap *s)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    cJSON *doc = cJSON_CreateObject();
    if (doc == NULL)
        return NULL;
    cJSON *topics = NULL;
    bool ok = cJSON_AddStringToObject(doc, "version", KB_VERSION_STRING) != NULL &&
              cJSON_AddStringToObject(doc, "transport", c->scheme) != NULL &&
              cJSON_AddStringToObject(doc, "consumer", c->consumer) != NULL &&
              add_number(doc, "time_ms", (double)now.tv_sec * 1e3 + now.tv_nsec / 1000000) &&
              add_number(doc, "interval_ms", (double)c->stats_interval_ms) &&
              (topics = cJSON_AddArrayToObject(doc, "topics")) != NULL;
    for (size_t i = 0; ok && i < s->n; i++)
        ok = add_topic(topics, &s->t[i]);
    return print(doc, ok);
}

char *kb__metrics_partitions_json(const kb_metrics_snap *s)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON *topics = doc != NULL ? cJSON_AddArrayToObject(doc, "topics") : NULL;
    bool ok = topics != NULL;
    for (size_t i = 0; ok && i < s->n; i++) {
        const kb_metrics_topic *t = &s->t[i];
        if (t->n_parts == 0)
            continue;
        cJSON *o = cJSON_CreateObject();
        ok = o != NULL && cJSON_AddItemToArray(topics, o) &&
             cJSON_AddStringToObject(o, "topic", t->name) != NULL &&
             add_partitions(o, "partitions", t);
    }
    if (doc == NULL)
        return NULL;
    return print(doc, ok);
}
