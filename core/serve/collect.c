/* Collecting metrics: the snapshot of every topic's figures that each
 * exposition is built from, read through the bus's calls inside its gate,
 * and kb_metrics_write. */
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* Lane counters per partition: lane and partition come from the low bits of
 * one hash, so with pool.workers a multiple of partitions lane i only ever
 * holds events of partition i % partitions. */
static void partition_lanes(kb_pool *pool, kb_metrics_topic *mt)
{
    kb_pool_stats ps;
    kb_pool_stats_get(pool, &ps);
    if (ps.lanes % mt->n_parts != 0)
        return;
    for (uint32_t i = 0; i < mt->n_parts; i++)
        mt->parts[i].lanes = true;
    for (uint32_t lane = 0; lane < ps.lanes; lane++) {
        kb_lane_stats ls;
        if (kb_pool_lane_stats(pool, lane, &ls) != KB_OK || !ls.allocated)
            continue;
        kb_metrics_part *p = &mt->parts[lane % mt->n_parts];
        p->received += ls.submitted;
        p->handled += ls.handled;
        p->retried += ls.retried;
        p->dead_lettered += ls.dead;
    }
}

static int collect_topic(kb_bus *b, struct kb_topic *t, bool partitions, kb_metrics_topic *mt)
{
    kb_topic_view v;
    kb__topic_view(t, &v);
    if ((mt->name = strdup(v.name)) == NULL)
        return KB_ENOMEM;
    mt->rc = kb__topic_stats(b, t, &mt->s);
    if (mt->rc == KB_ECLOSED)
        return KB_ECLOSED;
    kb_pool *pool = v.pool;
    mt->pool = pool != NULL;
    mt->hist = v.hist;
    mt->latency = v.latency;
    mt->duration = v.duration;
    if (!partitions || mt->rc != KB_OK || mt->s.partitions == 0)
        return KB_OK;
    mt->parts = calloc(mt->s.partitions, sizeof *mt->parts);
    if (mt->parts == NULL)
        return KB_ENOMEM;
    mt->n_parts = mt->s.partitions;
    for (uint32_t i = 0; i < mt->n_parts; i++) {
        mt->parts[i].rc = kb__topic_partition_stats(b, t, i, &mt->parts[i].ps);
        if (mt->parts[i].rc == KB_ECLOSED)
            return KB_ECLOSED;
    }
    if (pool != NULL)
        partition_lanes(pool, mt);
    return KB_OK;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const kb_metrics_topic *)a)->name, ((const kb_metrics_topic *)b)->name);
}

int kb__metrics_collect(kb_bus *b, bool partitions, kb_metrics_snap *out)
{
    memset(out, 0, sizeof *out);
    if (!kb__bus_enter(b, "kb_metrics_write"))
        return KB_ECLOSED;
    struct kb_topic **all;
    size_t n;
    int rc = kb__bus_topics(b, &all, &n);
    if (rc == KB_OK && n > 0 && (out->t = calloc(n, sizeof *out->t)) == NULL)
        rc = KB_ENOMEM;
    for (size_t i = 0; rc == KB_OK && i < n; i++) {
        out->n++;
        rc = collect_topic(b, all[i], partitions, &out->t[i]);
    }
    free(all);
    kb__bus_leave(b);
    if (rc == KB_OK && out->n > 1)
        qsort(out->t, out->n, sizeof *out->t, by_name);
    if (rc == KB_ENOMEM)
        kb_errf(NULL, 0, "kb_metrics_write: out of memory");
    return rc;
}

void kb__metrics_snap_free(kb_metrics_snap *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->t[i].name);
        free(s->t[i].parts);
    }
    free(s->t);
    memset(s, 0, sizeof *s);
}

int kb_metrics_write(kb_bus *b, char *buf, size_t len, size_t *needed)
{
    if (b == NULL || (buf == NULL && len > 0)) {
        kb_errf(NULL, 0, "kb_metrics_write: %s is NULL", b == NULL ? "bus" : "buf");
        return KB_EINVAL;
    }
    kb_metrics_snap s;
    int rc = kb__metrics_collect(b, true, &s);
    size_t size = 0;
    char *text = rc == KB_OK ? kb__metrics_prom(&s, &size) : NULL;
    kb__metrics_snap_free(&s);
    if (rc != KB_OK)
        return rc;
    if (text == NULL) {
        kb_errf(NULL, 0, "kb_metrics_write: out of memory");
        return KB_ENOMEM;
    }
    if (needed != NULL)
        *needed = size + 1;
    if (len < size + 1) {
        free(text);
        kb_errf(NULL, 0, "kb_metrics_write: %zu bytes needed, the buffer has %zu", size + 1,
                len);
        return KB_ETOOBIG;
    }
    memcpy(buf, text, size + 1);
    free(text);
    return KB_OK;
}
