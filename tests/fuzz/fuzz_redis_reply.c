/* libFuzzer target: the Redis replies other than entries, as hiredis's
 * reader and the transport's reply objects (redis_reply.c, with a small cap
 * per string) make them of any bytes: XINFO GROUPS (kb__redis_group_figures,
 * kb__redis_group_row), the XPENDING summary (kb__redis_foreign_pending),
 * the lease MGET (kb__redis_lease_ours), the sweep script's reply
 * (kb__redis_sweep_reply, kb__redis_sweep_attempt) and dead letters read
 * back (kb__redis_dead_letter_of). Every array of a reply is tried as each.
 * Input: RESP. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "redis_reader.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CAP 256            /* longer strings: KB_REDIS_REPLY_OVER */
static const kb_redis_limits lim = {.key = 64, .payload = 128, .headers = 4,
                                    .header_bytes = 64, .cap = CAP, .entry = 1024};

static kb_transport t;     /* the fields these readers look at */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_reader_init();
    strcpy(t.group, "g");
    strcpy(t.consumer, "c1");
    strcpy(t.token, "c1#0001");
    t.partitions = 8;
    return 0;
}

static void try_reply(const redisReply *x, int depth)
{
    kb_redis_group_info g = kb__redis_group_figures(&t, x, 100, x);
    if (g.lag > 100)
        abort();   /* never over the length */
    (void)kb__redis_foreign_pending(&t, x);
    if (x->type == REDIS_REPLY_ARRAY)
        for (size_t j = 0; j <= x->elements; j++)
            if (kb__redis_lease_ours(&t, x, j) &&
                (x->element[j]->len != strlen(t.token) ||
                 memcmp(x->element[j]->str, t.token, x->element[j]->len) != 0))
                abort();
    kb_redis_swept sw;
    if (kb__redis_sweep_reply(x, &sw)) {
        for (size_t i = 0; sw.ents != NULL && i <= sw.ents->elements; i++)
            if (kb__redis_sweep_attempt(sw.runs, i) == 0)
                abort();   /* attempts start at 1 */
        if (sw.cursor != NULL)
            (void)strlen(sw.cursor);
    }
    if (x->type == REDIS_REPLY_ARRAY && x->elements >= 2 &&
        x->element[0]->type == REDIS_REPLY_STRING) {
        kb_header headers[KB_MAX_HEADERS];
        kb_dead_letter dl = kb__redis_dead_letter_of(&t, x, headers);
        if (dl.partition >= t.partitions)
            abort();   /* range-checked */
        if (dl.n_headers > KB_MAX_HEADERS || strlen(dl.reason) > CAP || strlen(dl.original_id) > CAP)
            abort();
    }
    for (size_t i = 0; depth < 8 && x->type == REDIS_REPLY_ARRAY && i < x->elements; i++)
        try_reply(x->element[i], depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    redisReader *r = fuzz_reader_new(&lim);
    if (r == NULL)
        return 0;
    if (redisReaderFeed(r, (const char *)data, size) == REDIS_OK) {
        void *reply = NULL;
        while (redisReaderGetReply(r, &reply) == REDIS_OK && reply != NULL) {
            try_reply(reply, 0);
            kb__redis_reply_free(reply);
            reply = NULL;
        }
    }
    redisReaderFree(r);
    return 0;
}
