/* Broker figures: XLEN, XINFO GROUPS (pending, lag, consumers) and the last
 * generated ID per partition, the DLQ length and the lease holder. Each call
 * costs one pipelined round trip. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

static uint64_t int_of(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer > 0 ? (uint64_t)r->integer : 0;
}

/* The stream's last-generated-id, ID-only (XINFO STREAM also carries the
 * first and last entries whole); an error reply when there is no stream. */
const char kb__redis_last_id_lua[] =
    "local s=redis.call('xinfo','stream',KEYS[1]) "
    "for i=1,#s,2 do if s[i]=='last-generated-id' then return s[i+1] end end "
    "return false";

/* Our group's figures from an XINFO GROUPS reply. Lag is the entries not yet
 * delivered to the group: all of them before the group exists, none once it
 * has delivered the stream's last ID; else the server's figure (or, when it
 * has none after deletions, length - entries-read), never over the length. */
kb_redis_group_info kb__redis_group_figures(const kb_transport *t, const redisReply *groups,
                                            uint64_t length, const redisReply *last_id)
{
    return kb__redis_row_figures(kb__redis_group_row(t, groups), length, last_id);
}

kb_redis_group_info kb__redis_row_figures(const redisReply *row, uint64_t length,
                                          const redisReply *last_id)
{
    kb_redis_group_info g = {0, length, 0};
    if (row == NULL)
        return g;
    g.pending = int_of(kb__redis_map_get(row, "pending"));
    g.consumers = int_of(kb__redis_map_get(row, "consumers"));
    const redisReply *delivered = kb__redis_field(row, "last-delivered-id");
    const redisReply *lag = kb__redis_map_get(row, "lag");
    const redisReply *read = kb__redis_map_get(row, "entries-read");
    if (delivered != NULL && last_id != NULL && last_id->type == REDIS_REPLY_STRING &&
        kb__redis_id_cmp(delivered->str, last_id->str) >= 0)
        g.lag = 0;
    else if (lag != NULL && lag->type == REDIS_REPLY_INTEGER)
        g.lag = int_of(lag);
    else if (read != NULL && read->type == REDIS_REPLY_INTEGER)
        g.lag = length > int_of(read) ? length - int_of(read) : 0;
    if (g.lag > length)
        g.lag = length;
    return g;
}

int kb__redis_stats_run(kb_transport *t, redisContext *c, redisReply **r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (redisGetReply(c, (void **)&r[i]) != REDIS_OK) {
            kb_errf(NULL, 0, "redis: stats from %s: %s", t->where, c->errstr);
            kb__redis_conn_fail(&t->stats, c->errstr);
            for (size_t j = 0; j < i; j++)
                kb__redis_reply_free(r[j]);
            return KB_ETRANSPORT;
        }
    return KB_OK;
}

int kb__redis_stats(kb_transport *t, kb_transport_topic *tt, kb_topic_stats *out)
{
    const char *topic = tt->name;
    out->published = atomic_load_explicit(&tt->published, memory_order_relaxed);
    out->broker_trimmed = atomic_load(&tt->trimmed);
    out->partitions = t->partitions;
    bool subscribed = atomic_load(&tt->subscribed);
    for (uint32_t i = 0; subscribed && i < tt->nparts; i++)
        out->partitions_owned += kb__redis_part_live(&tt->parts[i]);

    size_t n = 2 + 3 * (size_t)t->partitions;
    redisReply **r = calloc(n, sizeof *r);
    if (r == NULL)
        return KB_ENOMEM;
    pthread_mutex_lock(&t->stats_lock);
    redisContext *c = kb__redis_conn_get(&t->stats, NULL, 0);
    int rc = KB_ETRANSPORT;
    if (c != NULL) {
        redisAppendCommand(c, "HGET %s partitions", tt->meta);
        redisAppendCommand(c, "XLEN kb:{%s}:dlq", topic);
        for (uint32_t i = 0; i < t->partitions; i++) {
            redisAppendCommand(c, "XLEN kb:{%s}:p:%u", topic, i);
            redisAppendCommand(c, "XINFO GROUPS kb:{%s}:p:%u", topic, i);
            redisAppendCommand(c, "EVAL %s 1 kb:{%s}:p:%u", kb__redis_last_id_lua, topic, i);
        }
        rc = kb__redis_stats_run(t, c, r, n);
    }
    pthread_mutex_unlock(&t->stats_lock);
    if (rc == KB_OK) {
        /* a topic published or subscribed here was checked then */
        if (!subscribed && out->published == 0)
            rc = kb__redis_stored_count(t, tt, r[0]);
        out->dlq_length = int_of(r[1]);
        for (uint32_t i = 0; i < t->partitions; i++) {
            uint64_t len = int_of(r[2 + 3 * i]);
            kb_redis_group_info g = kb__redis_group_figures(t, r[3 + 3 * i], len, r[4 + 3 * i]);
            out->broker_length += len;
            out->broker_pending += g.pending;
            out->broker_lag += g.lag;
        }
        for (size_t i = 0; i < n; i++)
            kb__redis_reply_free(r[i]);
    }
    free(r);
    return rc;
}

int kb__redis_partition_stats(kb_transport *t, kb_transport_topic *tt, uint32_t partition,
                              kb_partition_stats *out)
{
    const char *topic = tt->name;
    if (partition >= t->partitions) {
        kb_errf(NULL, 0, "redis: partition %u out of range (partitions=%u)", partition,
                 t->partitions);
        return KB_ENOTFOUND;
    }
    out->partition = partition;
    int known = kb__redis_topic_known(t, tt);
    if (known != KB_OK)
        return known;
    redisReply *r[4] = {NULL, NULL, NULL, NULL};
    pthread_mutex_lock(&t->stats_lock);
    redisContext *c = kb__redis_conn_get(&t->stats, NULL, 0);
    int rc = KB_ETRANSPORT;
    if (c != NULL) {
        redisAppendCommand(c, "XLEN kb:{%s}:p:%u", topic, partition);
        redisAppendCommand(c, "XINFO GROUPS kb:{%s}:p:%u", topic, partition);
        redisAppendCommand(c, "GET kb:{%s}:lease:%u", topic, partition);
        redisAppendCommand(c, "EVAL %s 1 kb:{%s}:p:%u", kb__redis_last_id_lua, topic, partition);
        rc = kb__redis_stats_run(t, c, r, 4);
    }
    pthread_mutex_unlock(&t->stats_lock);
    if (rc != KB_OK)
        return rc;
    out->length = int_of(r[0]);
    kb_redis_group_info g = kb__redis_group_figures(t, r[1], out->length, r[3]);
    out->pending = g.pending;
    out->lag = g.lag;
    out->consumers = (uint32_t)g.consumers;
    if (r[2]->type == REDIS_REPLY_STRING) {
        size_t len = strcspn(r[2]->str, "#");   /* token = consumer#nonce */
        if (len >= sizeof out->owner)
            len = sizeof out->owner - 1;
        memcpy(out->owner, r[2]->str, len);
        out->owner[len] = '\0';
    }
    for (int i = 0; i < 4; i++)
        kb__redis_reply_free(r[i]);
    return KB_OK;
}
