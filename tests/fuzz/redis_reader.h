/* The reply objects of the Redis fuzz targets: the transport's own
 * (redis_reply.c, strings over the limits kept as their length) with arrays over
 * MAX_ELEMENTS refused. An array's element pointers are allocated for
 * whatever length a server announces (hiredis 0.14 has no maxelements yet): a
 * fuzzer's "*999999999" is an allocation of gigabytes, which the sanitizer
 * reports, not a bug of ours. Longer arrays are refused here as out of
 * memory, the answer the reader gives when that allocation fails. */
#ifndef KB_FUZZ_REDIS_READER_H
#define KB_FUZZ_REDIS_READER_H

#include <stdint.h>
#include <stdlib.h>

#include "../../transports/redis/redis_int.h"

#define MAX_ELEMENTS 4096

static redisReplyObjectFunctions capped;
static void *(*hiredis_array)(const redisReadTask *, int);

static void *create_array(const redisReadTask *task, int elements)
{
    return elements < 0 || elements > MAX_ELEMENTS ? NULL : hiredis_array(task, elements);
}

/* Once, from LLVMFuzzerInitialize. */
static void fuzz_reader_init(void)
{
    redisReader *r = redisReaderCreate();
    if (r == NULL)
        abort();
    kb__redis_reply_use(r, NULL);
    capped = *r->fn;
    hiredis_array = capped.createArray;
    capped.createArray = create_array;
    redisReaderFree(r);
}

/* A reader for one input: the capped objects, strings over `lim` not
 * copied (`lim` outlives it). */
static redisReader *fuzz_reader_new(const kb_redis_limits *lim)
{
    redisReader *r = redisReaderCreateWithFunctions(&capped);
    if (r != NULL)
        r->privdata = (void *)(uintptr_t)lim;
    return r;
}

/* The entry targets' input: one byte of partition layout (partitions 1 + its
 * low 3 bits, the partition its next 3 bits modulo that, attempt 1 + its top
 * 2 bits: a sweep's redelivery above 1), then RESP; each reply the reader
 * makes of it goes to `fn`. */
typedef void fuzz_entry_fn(const redisReply *reply, uint32_t part, uint32_t nparts,
                           uint32_t attempt);
static inline void fuzz_entries(const uint8_t *data, size_t size, const kb_redis_limits *lim,
                                fuzz_entry_fn *fn)
{
    if (size < 1)
        return;
    uint32_t nparts = 1u + (data[0] & 7u), part = (uint32_t)(data[0] >> 3) % nparts;
    uint32_t attempt = 1u + (data[0] >> 6);
    redisReader *r = fuzz_reader_new(lim);
    if (r == NULL)
        return;
    if (redisReaderFeed(r, (const char *)data + 1, size - 1) == REDIS_OK) {
        void *reply = NULL;
        while (redisReaderGetReply(r, &reply) == REDIS_OK && reply != NULL) {
            fn(reply, part, nparts, attempt);
            kb__redis_reply_free(reply);
            reply = NULL;
        }
    }
    redisReaderFree(r);
}

#endif /* KB_FUZZ_REDIS_READER_H */
