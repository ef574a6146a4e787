/* libFuzzer target: dead-letter IDs as kb_dead_letter_replay / kb_dead_letters
 * take them, parsed before any broker call: redis (kb__redis_id_valid, and
 * kb__redis_id_cmp, which also orders IDs the server sends), nats
 * (kb__nats_seq_parse, in dlq_id_nats.c: its types clash with redis's) and
 * mem:// (through the public calls on a bus with an empty store). Input: two
 * IDs split at the first NUL byte. Each answer is checked against the ID's
 * shape, worked out with strtoull (fuzz_digits). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>

#ifdef KB_WITH_REDIS
#include "../../transports/redis/redis_int.h"
#endif
#include "dlq_id.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kb_bus *mem_bus;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    kb_conf *c = kb_conf_new();
    char err[256];
    if (c == NULL || kb_conf_set(c, "transport", "mem://", err, sizeof err) != KB_OK ||
        (mem_bus = kb_open(c, err, sizeof err)) == NULL)
        abort();
    return 0;
}

bool fuzz_digits(const char *s, size_t n, uint64_t *v)
{
    if (n == 0 || strspn(s, "0123456789") < n)
        return false;
    char *buf = strndup(s, n);
    if (buf == NULL)
        abort();
    errno = 0;
    *v = strtoull(buf, NULL, 10);
    free(buf);
    return errno == 0;
}

#ifdef KB_WITH_REDIS
/* <ms>-<seq> of a Redis stream ID, each part at most 20 digits (the ID fits
 * KB_REDIS_ID_MAX). */
static bool redis_shape(const char *s, uint64_t *ms, uint64_t *seq)
{
    const char *dash = strchr(s, '-');
    return dash != NULL && dash - s <= 20 && strlen(dash + 1) <= 20 &&
           fuzz_digits(s, (size_t)(dash - s), ms) && fuzz_digits(dash + 1, strlen(dash + 1), seq);
}

static void redis_ids(const char *a, const char *b)
{
    uint64_t am, as, bm, bs;
    bool av = redis_shape(a, &am, &as), bv = redis_shape(b, &bm, &bs);
    if (kb__redis_id_valid(a) != av || kb__redis_id_valid(b) != bv)
        abort();
    int ab = kb__redis_id_cmp(a, b), ba = kb__redis_id_cmp(b, a);
    if (ab < -1 || ab > 1 || ab != -ba || kb__redis_id_cmp(a, a) != 0)
        abort();   /* not an order on any text, even what the server never sends */
    if (av && bv && ab != (am != bm ? (am < bm ? -1 : 1) : (as < bs ? -1 : as > bs)))
        abort();
}
#endif

static int ignore(const kb_dead_letter *dl, void *opaque)
{
    (void)dl, (void)opaque;
    return 0;
}

/* mem:// IDs are decimal numbers; "" lists from the start. Its store is empty. */
static void mem_id(const char *s)
{
    uint64_t v;
    bool shape = s[0] == '\0' || fuzz_digits(s, strlen(s), &v);
    int replay = kb_dead_letter_replay(mem_bus, "fuzz", s);
    int list = kb_dead_letters(mem_bus, "fuzz", s, 10, ignore, NULL);
    if (replay != (shape ? KB_ENOTFOUND : KB_EINVAL) || list != (shape ? KB_OK : KB_EINVAL))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *a = malloc(size + 2);
    if (a == NULL)
        return 0;
    memcpy(a, data, size);
    a[size] = a[size + 1] = '\0';
    const char *b = a + strlen(a) + 1;   /* "" when there is no NUL */
#ifdef KB_WITH_REDIS
    redis_ids(a, b);
#endif
#ifdef KB_WITH_NATS
    fuzz_nats_id(a);
    fuzz_nats_id(b);
#endif
    mem_id(a);
    free(a);
    return 0;
}
