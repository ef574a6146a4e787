/* baseline:mutex: the scenario through kb_mpool, malloc'ing a copy of each
 * event as a straightforward implementation would. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "bench.h"
#include "mpool.h"

struct rec {
    size_t len;
    unsigned char data[];
};

static void handle(void *item, void *opaque)
{
    (void)opaque;
    struct rec *r = item;
    kb_collect_event(r->data, r->len);
    free(r);
}

static int publish(void *opaque, const void *key, size_t key_len, const void *payload, size_t len)
{
    struct rec *r = malloc(sizeof *r + len);
    if (r == NULL)
        return KB_ENOMEM;
    r->len = len;
    memcpy(r->data, payload, len);
    kb_mpool_submit(opaque, kb_fnv1a32(key, key_len), r);
    return KB_OK;
}

void kb_run_mutex(const kb_plan *p, uint32_t threads, kb_result *r)
{
    snprintf(r->transport, sizeof r->transport, "baseline:mutex");
    r->threads = threads;
    if (kb_collect_begin(p) != 0) {
        r->error = KB_ENOMEM;
        return;
    }
    kb_mpool *pool = kb_mpool_new(threads, 1024, handle, NULL);   /* kb's default lane capacity */
    if (pool == NULL) {
        r->error = KB_ENOMEM;
    } else {
        kb_drive(p, publish, NULL, pool, r);
        kb_mpool_destroy(pool);
    }
    kb_collect_end(p, r);
}
