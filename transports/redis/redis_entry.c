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

int kb__redis_entry_read(const redisReply *e, uint32_t part, uint32_t nparts, uint32_t attempt,
                         uint32_t max_attempts, kb_redis_entry *out)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 || e->element[0]->type != REDIS_REPLY_STRING)
        return KB_REDIS_ENTRY_NONE;   /* not an entry at all: nothing to ack */
    out->id = e->element[0]->str;
    out->fields = e->element[1];
    out->n_headers = 0;
    out->why[0] = '\0';
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
    uint32_t home = kb_partition_of(k->str, k->len, nparts);
    if (home != part) {
        /* XADDed by another client into the wrong stream: handling it here would
         * race the key's real partition, perhaps owned by another process */
        snprintf(out->why, sizeof out->why,
                 "partition is another one: the key hashes to partition %u", home);
        return dead(out, attempt);
    }
    if (a != NULL) {
        unsigned long n = strtoul(a->str, NULL, 10);
        if (n > attempt && n < 1000000)
            attempt = (uint32_t)n;
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
