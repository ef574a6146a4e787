/* The frame layout (docs/formats.md, "Redis frames"): several events of one
 * partition in one stream entry with the fields
 *     f = "1" (the layout's version), n = <events>, b = <body>
 * where the body holds, per event in publish order (integers little endian):
 *     u32 key length | key | u32 payload length | payload |
 *     u16 header count | per header: u8 name length | name | u32 value length | value
 * The events are the SDK's (kb_frame_event_read, shared with nats://); this
 * file reads the entry around them. Pure (no server, no lock). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

bool kb__redis_is_frame(const redisReply *fields)
{
    return kb__redis_field(fields, "k") == NULL && kb__redis_field(fields, "f") != NULL;
}

int kb__redis_frame_open(const redisReply *fields, kb_redis_frame *f, char *why, size_t len)
{
    const redisReply *v = kb__redis_field(fields, "f"), *n = kb__redis_field(fields, "n"),
                     *b = kb__redis_field(fields, "b");
    if (v == NULL || v->len != 1 || v->str[0] != '1') {
        snprintf(why, len, "malformed frame: unknown version in field \"f\" (1 is known)");
        return -1;
    }
    uint32_t count = kb__redis_number_below(n, KB_REDIS_BATCH_MAX + 1, 0);
    if (count == 0 || b == NULL) {
        snprintf(why, len, "malformed frame: field \"n\" is not a count of 1..%d, or no field \"b\"",
                 KB_REDIS_BATCH_MAX);
        return -1;
    }
    kb_redis_frame probe = {b->str, b->str + b->len, count};
    *f = probe;
    kb_frame_event ev;
    while (kb__redis_frame_next(&probe, &ev))
        ;
    if (probe.left != 0 || probe.p != probe.end) {
        snprintf(why, len, "malformed frame: the lengths in field \"b\" do not add up to %u events",
                 count);
        return -1;
    }
    return 0;
}
