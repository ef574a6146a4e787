/* The server's size limit on one command argument (proto-max-bulk-len): read
 * at kb_open, checked at publish, and named when the server drops the
 * publishing connection over an argument it will not take. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

/* Redis refuses to lower proto-max-bulk-len below this: smaller arguments can
 * never be why a connection was dropped. */
#define BULK_FLOOR (1024 * 1024)

/* CONFIG GET proto-max-bulk-len on the control connection (caller holds
 * ctl_lock): the limit, 0 when CONFIG is refused (ACL, renamed command), -1
 * when the server is unreachable or answers nothing for now (BUSY, LOADING);
 * `why` then says which. */
static int64_t ask_bulk_max(kb_transport *t, char *why, size_t len)
{
    const char *argv[] = {"CONFIG", "GET", "proto-max-bulk-len"};
    redisReply *r = kb__redis_cmd(&t->ctl, 3, argv, NULL);
    int64_t v = 0;
    if (r == NULL) {
        snprintf(why, len, "%s unreachable", t->where);
        v = -1;
    } else if (r->type == REDIS_REPLY_ERROR && kb__redis_transient(r)) {
        snprintf(why, len, "%s", r->str);   /* BUSY, LOADING: it says nothing of CONFIG */
        v = -1;
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(why, len, "%s", r->str);
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
               r->element[1]->type != REDIS_REPLY_STRING) {
        snprintf(why, len, "unexpected reply");
    } else {
        v = strtoll(r->element[1]->str, NULL, 10);
    }
    kb__redis_reply_free(r);
    return v;
}

/* At kb_open, before any other thread runs. */
void kb__redis_limit_read(kb_transport *t)
{
    char why[400];
    pthread_mutex_lock(&t->ctl_lock);
    int64_t v = ask_bulk_max(t, why, sizeof why);
    pthread_mutex_unlock(&t->ctl_lock);
    if (v > 0) {
        t->bulk_max = v;
        t->bulk_known = true;
        return;
    }
    t->bulk_max = KB_REDIS_BULK_DEFAULT;
    t->bulk_known = false;
    kb_log(t->bus, KB_LOG_DEBUG, "redis: CONFIG GET proto-max-bulk-len on %s refused (%s); assuming the "
           "server default of %d bytes per key or payload", t->where, why, KB_REDIS_BULK_DEFAULT);
}

/* Caller holds pub_lock. */
int kb__redis_limit_check(kb_transport *t, const char *topic, const kb_msg *m)
{
    int64_t max = t->bulk_max;
    size_t big = m->key_len > m->payload_len ? m->key_len : m->payload_len;
    if ((int64_t)big <= max)
        return KB_OK;
    kb_errf(NULL, 0, "kb_publish %s: %s of %zu bytes exceeds the Redis server's "
             "proto-max-bulk-len (%lld bytes%s on %s)", topic,
             m->key_len > m->payload_len ? "key" : "payload", big, (long long)max,
             t->bulk_known ? "" : ", assumed: CONFIG GET refused", t->where);
    return KB_ETOOBIG;
}

/* Redis answers an argument over its limit with "Protocol error: invalid bulk
 * length" and closes at once, so the client mostly sees only a reset: say
 * what the cause was (lock order: ctl_lock, then pub_lock, never both). */
size_t kb__redis_limit_explain(kb_transport *t, size_t big, char *out, size_t len)
{
    out[0] = '\0';
    if (big <= BULK_FLOOR)
        return SIZE_MAX;
    char why[400];
    pthread_mutex_lock(&t->ctl_lock);
    int64_t v = ask_bulk_max(t, why, sizeof why);
    pthread_mutex_unlock(&t->ctl_lock);
    if (v < 0)
        return SIZE_MAX;   /* down: nothing known, nothing refused */
    if (v > 0) {
        pthread_mutex_lock(&t->pub_lock);
        t->bulk_max = v;   /* it may have changed since kb_open */
        t->bulk_known = true;
        pthread_mutex_unlock(&t->pub_lock);
        if ((int64_t)big > v)
            snprintf(out, len, "the server closed the connection after a %zu-byte argument, "
                     "over its proto-max-bulk-len (%lld bytes); ", big, (long long)v);
        return (size_t)v;
    }
    snprintf(out, len, "the server closed the connection after a %zu-byte argument, "
             "probably over its proto-max-bulk-len (CONFIG GET refused: %s); ", big, why);
    return BULK_FLOOR;
}
