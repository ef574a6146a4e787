/* A topic's setup on the server: its name in kb:topics and its partition
 * count in kb:{topic}:meta (checked by publishers and subscribers), and the
 * consumer group on each partition stream. */
#include <stdio.h>
#include <string.h>

#include "redis_int.h"

int kb__redis_stored_count(kb_transport *t, kb_transport_topic *tt, const redisReply *r)
{
    if (r->type == REDIS_REPLY_NIL) {
        kb_errf(NULL, 0, "redis: topic %s unknown on %s", tt->name, t->where);
        return KB_ENOTFOUND;
    }
    if (r->type != REDIS_REPLY_STRING) {
        kb_errf(NULL, 0, "redis: %s: unexpected reply for partitions (%s)", tt->meta,
                r->type == REDIS_REPLY_ERROR ? r->str : "not a string");
        return KB_ETRANSPORT;
    }
    char parts[16];
    snprintf(parts, sizeof parts, "%u", t->partitions);
    if (strcmp(r->str, parts) != 0) {
        kb_errf(NULL, 0, "redis: topic %s has partitions=%s in %s on %s but this process "
                "is configured with partitions=%u; use the stored count", tt->name, r->str,
                tt->meta, t->where, t->partitions);
        return KB_EINVAL;
    }
    return KB_OK;
}

/* Register the topic and its partition count, or refuse a different count:
 * two processes hashing keys modulo different counts would break per-key order. */
int kb__redis_check_meta(kb_transport *t, kb_transport_topic *tt)
{
    const char *topic = tt->name, *meta = tt->meta;
    char parts[16];
    snprintf(parts, sizeof parts, "%u", t->partitions);
    pthread_mutex_lock(&t->ctl_lock);
    redisContext *c = kb__redis_conn_get(&t->ctl, NULL, 0);
    int rc = KB_ETRANSPORT;
    if (c != NULL) {
        redisAppendCommand(c, "SADD kb:topics %s", topic);
        redisAppendCommand(c, "HSETNX %s partitions %s", meta, parts);
        redisAppendCommand(c, "HGET %s partitions", meta);
        redisReply *r[3] = {NULL, NULL, NULL};
        int got = 0;
        while (got < 3 && redisGetReply(c, (void **)&r[got]) == REDIS_OK)
            got++;
        if (got < 3) {
            kb_errf(NULL, 0, "redis: metadata of topic %s on %s: %s", topic, t->where, c->errstr);
            kb__redis_conn_fail(&t->ctl, c->errstr);
        } else if ((rc = kb__redis_stored_count(t, tt, r[2])) == KB_EINVAL) {
            kb_log(t->bus, KB_LOG_ERROR, "%s", kb_last_error());
        } else if (rc == KB_ENOTFOUND) {
            rc = KB_ETRANSPORT;   /* HSETNX just wrote it: the server is not answering as Redis */
        }
        for (int i = 0; i < got; i++)
            kb__redis_reply_free(r[i]);
    } else {
        kb_errf(NULL, 0, "redis: %s is unreachable for topic %s metadata", t->where, topic);
    }
    pthread_mutex_unlock(&t->ctl_lock);
    return rc;
}

int kb__redis_topic_known(kb_transport *t, kb_transport_topic *tt)
{
    if (atomic_load(&tt->subscribed) || atomic_load(&tt->published) > 0)
        return KB_OK;
    const char *argv[] = {"HGET", tt->meta, "partitions"};
    pthread_mutex_lock(&t->ctl_lock);
    redisReply *r = kb__redis_cmd(&t->ctl, 3, argv, NULL);
    pthread_mutex_unlock(&t->ctl_lock);
    if (r == NULL) {
        kb_errf(NULL, 0, "redis: %s is unreachable", t->where);
        return KB_ETRANSPORT;
    }
    int rc = kb__redis_stored_count(t, tt, r);
    kb__redis_reply_free(r);
    return rc;
}

bool kb__redis_group_gone(const char *err)
{
    return strstr(err, "NOGROUP") != NULL || strstr(err, "UNBLOCKED") != NULL;
}

int kb__redis_create_groups(kb_redis_conn *k, kb_transport_topic *tt, const char *start,
                            char *errstr, size_t errlen)
{
    kb_transport *t = tt->t;
    redisContext *c = kb__redis_conn_get(k, errstr, errlen);
    if (c == NULL)
        return KB_ETRANSPORT;
    for (uint32_t i = 0; i < tt->nparts; i++)
        redisAppendCommand(c, "XGROUP CREATE %s %s %s MKSTREAM", tt->parts[i].stream, t->group,
                           start);
    int rc = KB_OK;
    for (uint32_t i = 0; i < tt->nparts; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            kb_errf(errstr, errlen, "XGROUP CREATE on %s: %s", t->where, c->errstr);
            kb__redis_conn_fail(k, c->errstr);
            return KB_ETRANSPORT;
        }
        if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "BUSYGROUP", 9) != 0 && rc == KB_OK) {
            kb_errf(errstr, errlen, "XGROUP CREATE %s %s: %s", tt->parts[i].stream, t->group,
                     r->str);
            rc = KB_ETRANSPORT;
        }
        kb__redis_reply_free(r);
    }
    return rc;
}
