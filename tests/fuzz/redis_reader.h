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

#endif /* KB_FUZZ_REDIS_READER_H */
