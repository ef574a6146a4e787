/* libFuzzer target: the Redis entry reader (kb__redis_entry_read, which
 * kb__redis_deliver runs on every entry XREADGROUP and XAUTOCLAIM return) on
 * the replies hiredis's own reader makes of any bytes, and the dead-letter
 * packing of what it refuses (kb__redis_dead_pack_raw) or of an event a
 * handler dead-letters (kb__redis_dead_pack). The replies are built by the
 * transport's own reply objects (redis_reply.c). Every array in a reply is tried
 * as an entry, so the shapes of both commands' replies are covered.
 * Input: one byte of partition layout, then RESP. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "redis_reader.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ATTEMPTS 5
/* Small limits, so that fields over them (copied or not: a string over the
 * cap is kept as its length alone) come up often. */
static const kb_redis_limits lim = {.key = 24, .payload = 200, .headers = 4,
                                    .header_bytes = 96, .cap = 256, .entry = 400};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_reader_init();
    return 0;
}

/* A dead letter packs how many of the entry's own fields follow (as text:
 * they stand in for an entry trimmed meanwhile), those fields, then
 * partition, orig_id, attempts and reason: count, then per string u32
 * length + bytes. */
static void check_packed(char *dead)
{
    if (dead == NULL)
        return;   /* out of memory */
    uint32_t n;
    memcpy(&n, dead, 4);
    if (n < 9 || (n - 1) % 2 != 0)
        abort();
    free(dead);
}

static void check_event(const kb_redis_entry *en, uint32_t part, uint32_t nparts)
{
    if (en->key->len == 0 || kb_fnv1a32(en->key->str, en->key->len) % nparts != part ||
        en->attempt == 0 || en->attempt > MAX_ATTEMPTS || en->key->len > lim.key ||
        en->payload->len > lim.payload || en->ref ||
        kb_headers_check(en->headers, en->n_headers, lim.headers, lim.header_bytes,
                         "fuzz") != KB_OK)
        abort();
    kb_delivery dl = {.topic = "fuzz", .key = en->key->str, .key_len = en->key->len,
                      .payload = en->payload->str, .payload_len = en->payload->len,
                      .partition = part, .attempt = en->attempt, .id = en->id,
                      .headers = en->headers, .n_headers = en->n_headers};
    check_packed(kb__redis_dead_pack(&dl, "handler said dead"));
}

static void try_entry(const redisReply *e, uint32_t part, uint32_t nparts, uint32_t attempt,
                      int depth)
{
    if (e->type != REDIS_REPLY_ARRAY)
        return;
    kb_redis_entry en;
    switch (kb__redis_entry_read(e, part, nparts, attempt, MAX_ATTEMPTS, &lim, &en)) {
    case KB_REDIS_ENTRY_EVENT:
        check_event(&en, part, nparts);
        break;
    case KB_REDIS_ENTRY_DEAD:
        if (en.why[0] == '\0')
            abort();   /* a dead letter says why */
        check_packed(kb__redis_dead_pack_raw(en.fields, en.ref, part, en.id, en.attempt, en.why));
        break;
    default:
        break;
    }
    for (size_t i = 0; depth < 8 && i < e->elements; i++)
        try_entry(e->element[i], part, nparts, attempt, depth + 1);
}

static void try_reply(const redisReply *reply, uint32_t part, uint32_t nparts, uint32_t attempt)
{
    try_entry(reply, part, nparts, attempt, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_entries(data, size, &lim, try_reply);
    return 0;
}
