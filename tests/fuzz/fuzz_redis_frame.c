/* libFuzzer target: the Redis frame reader (kb__redis_frame_open, then
 * kb__redis_frame_next and kb__redis_event_read per event, as the reader runs
 * them on every frame entry XREADGROUP and XAUTOCLAIM return) on the replies
 * hiredis's own reader makes of any bytes. Every array in a reply is tried as
 * an entry's fields, so frames another client wrote with any count, body and
 * lengths are covered. An event read must lie inside its body, be of the
 * partition and within the limits, or be a dead letter that says why.
 * Input: one byte of partition layout, then RESP. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "redis_reader.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ATTEMPTS 5
/* Small limits, so that events over them come up often. */
static const kb_redis_limits lim = {.key = 24, .payload = 200, .headers = 4,
                                    .header_bytes = 96, .cap = 4096, .entry = 8192};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_reader_init();
    return 0;
}

static void check_event(const kb_frame_event *ev, const redisReply *body, uint32_t part,
                        uint32_t nparts, uint32_t attempt)
{
    const char *lo = body->str, *hi = body->str + body->len;
    if (ev->key < lo || ev->key + ev->key_len > hi || ev->payload < lo ||
        ev->payload + ev->payload_len > hi)
        abort();   /* an event outside its frame's body */
    kb_redis_event out;
    switch (kb__redis_event_read(ev, part, nparts, attempt, MAX_ATTEMPTS, &lim, &out)) {
    case KB_REDIS_ENTRY_EVENT:
        if (ev->key_len == 0 || ev->key_len > lim.key || ev->payload_len > lim.payload ||
            kb_fnv1a32(ev->key, ev->key_len) % nparts != part || out.attempt == 0 ||
            out.attempt > MAX_ATTEMPTS ||
            kb_headers_check(out.headers, out.n_headers, lim.headers, lim.header_bytes,
                             "fuzz") != KB_OK)
            abort();
        break;
    case KB_REDIS_ENTRY_DEAD:
        if (out.why[0] == '\0')
            abort();   /* a dead letter says why */
        break;
    default:
        abort();
    }
}

static void try_fields(const redisReply *e, uint32_t part, uint32_t nparts, uint32_t attempt,
                       int depth)
{
    if (e->type != REDIS_REPLY_ARRAY)
        return;
    if (kb__redis_is_frame(e)) {
        kb_redis_frame f;
        char why[200] = "";
        if (kb__redis_frame_open(e, &f, why, sizeof why) == 0) {
            const redisReply *body = kb__redis_field(e, "b");
            uint32_t events = f.left, seen = 0;
            kb_frame_event ev;
            while (kb__redis_frame_next(&f, &ev)) {
                check_event(&ev, body, part, nparts, attempt);
                seen++;
            }
            if (seen != events)
                abort();   /* an opened frame holds exactly its count */
        } else if (why[0] == '\0') {
            abort();   /* a refused frame says why */
        }
    }
    for (size_t i = 0; depth < 8 && i < e->elements; i++)
        try_fields(e->element[i], part, nparts, attempt, depth + 1);
}

static void try_reply(const redisReply *reply, uint32_t part, uint32_t nparts, uint32_t attempt)
{
    try_fields(reply, part, nparts, attempt, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_entries(data, size, &lim, try_reply);
    return 0;
}
