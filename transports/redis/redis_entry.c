/* One stream entry as XREADGROUP / XAUTOCLAIM hand it over ([id, fields]),
 * read into an event or the reason it goes to the dead letters. Pure: no
 * server, no pool, so tests/fuzz/fuzz_redis_entry.c runs this very code on
 * replies hiredis's reader made from any bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

static int dead(kb_redis_entry *out, uint32_t attempts)
{
    out->attempt = attempts;
    return KB_REDIS_ENTRY_DEAD;
}

/* The limit a field of this name is held to, for the reason. */
static const char *limit_of(const redisReply *name, const kb_redis_limits *lim, size_t *max)
{
    bool str = name != NULL && name->type == REDIS_REPLY_STRING;
    if (str && name->len == 1 && name->str[0] == 'k')
        return *max = lim->key, "limits.max_key_bytes";
    if (str && name->len == 1 && name->str[0] == 'd')
        return *max = lim->payload, "limits.max_payload_bytes";
    if (str && strncmp(name->str, KB_REDIS_HEADER_PREFIX, sizeof KB_REDIS_HEADER_PREFIX - 1) == 0)
        return *max = lim->header_bytes, "limits.max_header_bytes";
    return *max = lim->cap, "the largest of limits.max_payload_bytes, max_key_bytes and "
                            "max_header_bytes";
}

/* Another client's entry with a field over its limit: dead-lettered as a
 * reference (copying it would exceed the limit), never handed to a handler.
 * A field the reply did not copy (KB_REDIS_REPLY_OVER) or a key or payload
 * over its limit. */
static bool over_limits(const kb_redis_entry *en, const kb_redis_limits *lim, char *why,
                        size_t len)
{
    const redisReply *f = en->fields;
    for (size_t i = 0; f->type == REDIS_REPLY_ARRAY && i < f->elements; i++) {
        const redisReply *v = f->element[i];
        const redisReply *name = i % 2 == 1 ? f->element[i - 1] : NULL;
        size_t max, size = v->type == KB_REDIS_REPLY_OVER ? (size_t)v->integer
                           : v->type == REDIS_REPLY_STRING ? v->len : 0;
        const char *rule = limit_of(name, lim, &max);
        if (v->type != KB_REDIS_REPLY_OVER && (name == NULL || name->type != REDIS_REPLY_STRING ||
                                               name->len != 1 || size <= max))
            continue;   /* header bytes are summed by kb_headers_check */
        bool named = name != NULL && name->type == REDIS_REPLY_STRING;
        if (size <= max)   /* not copied for the entry's total */
            snprintf(why, len, "limits: the entry's fields are over %zu bytes "
                     "(limits.max_key_bytes + max_payload_bytes + max_header_bytes + 64 KiB) "
                     "at %s \"%.40s\"; not copied: the entry stays in its stream under its ID",
                     lim->entry, named ? "field" : "a field name", named ? name->str : "");
        else
            snprintf(why, len, "%s: %s \"%.40s\" of %zu bytes is over the limit (%zu); not "
                     "copied: the entry stays in its stream under its ID", rule,
                     named ? "field" : "a field name", named ? name->str : "", size, max);
        return true;
    }
    return false;
}

int kb__redis_entry_read(const redisReply *e, uint32_t part, uint32_t nparts, uint32_t attempt,
                         uint32_t max_attempts, const kb_redis_limits *lim, kb_redis_entry *out)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 || e->element[0]->type != REDIS_REPLY_STRING)
        return KB_REDIS_ENTRY_NONE;   /* not an entry at all: nothing to ack */
    out->id = e->element[0]->str;
    out->fields = e->element[1];
    out->n_headers = 0;
    out->ref = false;
    out->why[0] = '\0';
    if ((out->ref = over_limits(out, lim, out->why, sizeof out->why)))
        return dead(out, attempt);
    const redisReply *k = kb__redis_field(out->fields, "k"), *d = kb__redis_field(out->fields, "d"),
                     *a = kb__redis_field(out->fields, "a");
    if (k == NULL || k->len == 0 || d == NULL) {
        snprintf(out->why, sizeof out->why, "%s",
                 k == NULL || k->len == 0 ? "malformed: no key field \"k\""
                                          : "malformed: no payload field \"d\"");
        return dead(out, attempt);
    }
    out->key = k;
    out->payload = d;
    /* written by another client: kept whole in the DLQ, with the rule it broke */
    if (kb__redis_headers_of(out->fields, out->headers, &out->n_headers, out->why,
                             sizeof out->why) != KB_OK)
        return dead(out, attempt);
    if (kb_headers_check(out->headers, out->n_headers, lim->headers, lim->header_bytes,
                         "header fields over the limits") != KB_OK) {
        snprintf(out->why, sizeof out->why, "%s", kb_last_error());
        return dead(out, attempt);
    }
    uint32_t home = kb_partition_of(k->str, k->len, nparts);
    if (home != part) {
        /* XADDed by another client into the wrong stream: handling it here would
         * race the key's real partition, perhaps owned by another process */
        snprintf(out->why, sizeof out->why,
                 "partition is another one: the key hashes to partition %u", home);
        return dead(out, attempt);
    }
    if (a != NULL) {
        /* anyone may write `a`: it raises the count at most to the last run
         * allowed, so only runs recorded by keybus can dead-letter an entry */
        unsigned long n = strtoul(a->str, NULL, 10);
        if (n > attempt)
            attempt = n < max_attempts ? (uint32_t)n : max_attempts > attempt ? max_attempts : attempt;
    }
    if (attempt > max_attempts) {
        /* Handlers began it that often without an ack: likely one that kills
         * the process. Stop the crash loop here. */
        snprintf(out->why, sizeof out->why,
                 "retry.max_attempts reached: %u handler runs without an ack", attempt - 1);
        return dead(out, attempt - 1);
    }
    out->attempt = attempt;
    return KB_REDIS_ENTRY_EVENT;
}

int kb__redis_event_read(const kb_frame_event *ev, uint32_t part, uint32_t nparts,
                         uint32_t attempt, uint32_t max_attempts, const kb_redis_limits *lim,
                         kb_redis_event *out)
{
    out->n_headers = 0;
    out->attempt = attempt;
    out->why[0] = '\0';
    int nh = kb_frame_event_headers(ev, out->headers, lim->headers, out->names);
    if (ev->key_len == 0 || ev->key_len > lim->key || ev->payload_len > lim->payload) {
        snprintf(out->why, sizeof out->why, "%s", ev->key_len == 0 ? "malformed: an empty key"
                 : ev->key_len > lim->key ? "limits.max_key_bytes: the key is over the limit"
                 : "limits.max_payload_bytes: the payload is over the limit");
        return KB_REDIS_ENTRY_DEAD;
    }
    if (nh < 0) {
        snprintf(out->why, sizeof out->why, "headers: %u are over limits.max_headers (%zu), or a "
                 "name's length is out of the rules", ev->n_headers, lim->headers);
        return KB_REDIS_ENTRY_DEAD;
    }
    out->n_headers = (size_t)nh;
    if (kb_headers_check(out->headers, out->n_headers, lim->headers, lim->header_bytes,
                         "header fields over the limits") != KB_OK) {
        snprintf(out->why, sizeof out->why, "%s", kb_last_error());
        out->n_headers = 0;
        return KB_REDIS_ENTRY_DEAD;
    }
    uint32_t home = kb_partition_of(ev->key, ev->key_len, nparts);
    if (home != part) {
        snprintf(out->why, sizeof out->why,
                 "partition is another one: the key hashes to partition %u", home);
        return KB_REDIS_ENTRY_DEAD;
    }
    if (attempt > max_attempts) {
        snprintf(out->why, sizeof out->why,
                 "retry.max_attempts reached: %u handler runs without an ack", attempt - 1);
        out->attempt = attempt - 1;
        return KB_REDIS_ENTRY_DEAD;
    }
    return KB_REDIS_ENTRY_EVENT;
}
