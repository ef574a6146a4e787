/* Frames: up to nats.publish_batch events of one partition in one JetStream
 * message. Body layout, per event in publish order (integers little endian):
 *     u32 key length | key | u32 payload length | payload
 * with the header `Kb-Batch: <events>`; a frame holding an event with headers
 * also has `Kb-Frame: 2`, and then every entry continues with
 *     u16 header count | per header: u8 name length | name | u32 value length | value
 * The events are the SDK's (kb_frame_event_*, shared with redis://); this
 * file reads the message around them; nats_batch.c fills frames. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_frame.h"

int kb__nats_frame_open(natsMsg *m, const char *count, kb_nats_frame *f, const char **why)
{
    char *end = NULL;
    unsigned long n = strtoul(count, &end, 10);
    if (end == count || *end != '\0' || n < 2 || n > KB_NATS_BATCH_MAX) {
        *why = "malformed Kb-Batch header";
        return -1;
    }
    const char *ver = NULL;
    int version = 1;
    if (natsMsgHeader_Get(m, KB_NATS_FRAME_HDR_NAME, &ver) == NATS_OK && ver != NULL) {
        if (strcmp(ver, "2") != 0) {
            *why = "unknown Kb-Frame version";
            return -1;
        }
        version = 2;
    }
    const char *body = natsMsg_GetData(m);
    kb_nats_frame probe = {body, body + natsMsg_GetDataLength(m), (uint32_t)n, version};
    *f = probe;
    kb_frame_event ev;
    while (kb__nats_frame_next(&probe, &ev))
        ;
    if (probe.left != 0 || probe.p != probe.end) {
        *why = "malformed Kb-Batch frame (lengths do not add up)";
        return -1;
    }
    return 0;
}

uint32_t kb__nats_events_in(natsMsg *m)
{
    const char *count = NULL;
    if (natsMsgHeader_Get(m, KB_NATS_BATCH_HDR, &count) != NATS_OK || count == NULL)
        return 1;
    unsigned long n = strtoul(count, NULL, 10);
    return n > 0 && n <= KB_NATS_BATCH_MAX ? (uint32_t)n : 1;
}
