/* Broker data held to the limits (docs/limits.md): entries another client
 * XADDs past limits.max_payload_bytes / max_key_bytes / the header limits, or
 * with fields that add up past them, are dead-lettered as references (ID,
 * size, reason naming the limit), never handed to a handler, and reading
 * them costs one field's bytes at a time, not the reply's: three 30-60 MB
 * entries, peak RSS measured. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "support/bus.h"
#include "support/check.h"
#include "support/server.h"

#define MB (1024 * 1024)

/* What reading the oversized entries may add to the peak RSS. ThreadSanitizer
 * keeps shadow memory beside every byte touched (measured +255 MB where the
 * plain build adds 94 MB); copying the entries whole would still pass it. */
#if defined(__SANITIZE_THREAD__)
#define RSS_SLACK_KB (600 * 1024)
#else
#define RSS_SLACK_KB (200 * 1024)
#endif

static kb_test_server server;

static redisContext *raw(void)
{
    redisContext *c = redisConnect("127.0.0.1", server.port);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    return c;
}

/* kB of a line "name: N kB" of /proc/self/status. */
static long status_kb(const char *name)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(name);
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, name, n) == 0 && line[n] == ':')
            v = atol(line + n + 1);
    if (f != NULL)
        fclose(f);
    return v;
}

/* The peak RSS (VmHWM) starts again from the RSS now. */
static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    assert_non_null(f);
    fputs("5", f);
    fclose(f);
}

typedef struct seen {
    _Atomic int calls;
    _Atomic size_t largest;       /* payload bytes */
    _Atomic size_t longest_key;
} seen;

static int handler(const kb_event *ev, void *opaque)
{
    seen *s = opaque;
    atomic_fetch_add(&s->calls, 1);
    size_t n = ev->payload_len, k = ev->key_len;
    if (n > atomic_load(&s->largest))
        atomic_store(&s->largest, n);
    if (k > atomic_load(&s->longest_key))
        atomic_store(&s->longest_key, k);
    return KB_HANDLED;
}

typedef struct listed {
    int n, refs;
    char reasons[8][300];
} listed;

static int list_one(const kb_dead_letter *dl, void *opaque)
{
    listed *l = opaque;
    if (l->n < 8)
        snprintf(l->reasons[l->n], sizeof l->reasons[0], "%s", dl->reason);
    l->n++;
    l->refs += dl->payload_len == 0 && dl->key_len == 0;
    return 0;
}

static char first_id[64];

static int first_of(const kb_dead_letter *dl, void *opaque)
{
    (void)opaque;
    if (first_id[0] == '\0')
        snprintf(first_id, sizeof first_id, "%s", dl->id);
    return 0;
}

static void foreign_entries_over_the_limits_are_references(void **state)
{
    (void)state;
    char topic[64];
    snprintf(topic, sizeof topic, "rl.big.%d", (int)getpid());
    redisContext *c = raw();
    /* three entries of 30, 45 and 60 MB, each in its key's own partition */
    size_t sizes[] = {30 * MB, 45 * MB, 60 * MB};
    char *big = malloc(60 * MB);
    assert_non_null(big);
    memset(big, 'x', 60 * MB);
    for (int i = 0; i < 3; i++) {
        char key[16], stream[160];
        int kl = snprintf(key, sizeof key, "big-%d", i);
        snprintf(stream, sizeof stream, "kb:{%s}:p:%u", topic,
                 kb_fnv1a32(key, (size_t)kl) % 8);
        redisReply *r = redisCommand(c, "XADD %s * k %b d %b", stream, key, (size_t)kl, big,
                                     sizes[i]);
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        freeReplyObject(r);
    }
    free(big);
    /* and a key over limits.max_key_bytes (1,024): a reference too */
    char longkey[2048];
    memset(longkey, 'k', sizeof longkey);
    char stream[160];
    snprintf(stream, sizeof stream, "kb:{%s}:p:%u", topic,
             kb_fnv1a32(longkey, sizeof longkey) % 8);
    freeReplyObject(redisCommand(c, "XADD %s * k %b d small", stream, longkey, sizeof longkey));
    /* and 100 fields of 60 KB, each under every limit, 6 MB together */
    const char *argv[203];
    size_t lens[203];
    char names[100][8], *chunk = malloc(60000);
    assert_non_null(chunk);
    memset(chunk, 'f', 60000);
    snprintf(stream, sizeof stream, "kb:{%s}:p:%u", topic, kb_fnv1a32("many", 4) % 8);
    argv[0] = "XADD", lens[0] = 4;
    argv[1] = stream, lens[1] = strlen(stream);
    argv[2] = "*", lens[2] = 1;
    for (int i = 0; i < 100; i++) {
        snprintf(names[i], sizeof names[i], "x%d", i);
        argv[3 + 2 * i] = names[i], lens[3 + 2 * i] = strlen(names[i]);
        argv[4 + 2 * i] = chunk, lens[4 + 2 * i] = 60000;
    }
    argv[3] = "k", lens[3] = 1, argv[4] = "many", lens[4] = 4;   /* the key first */
    argv[5] = "d", lens[5] = 1;
    freeReplyObject(redisCommandArgv(c, 203, argv, lens));
    free(chunk);
    redisFree(c);

    kb_bus *b = kb_test_open(server.url, (const char *const[]){"consumer", "rl-big", NULL}, NULL);
    seen s = {0};
    long before = status_kb("VmRSS");
    reset_peak();
    kb_assert_ok(kb_subscribe(b, topic, handler, &s));
    /* later events of the same keys and others are handled */
    for (int i = 0; i < 40; i++) {
        char key[16];
        int kl = snprintf(key, sizeof key, i < 3 ? "big-%d" : "agg-%d", i);
        kb_assert_ok(kb_publish(b, topic, key, (size_t)kl, "later", 5));
    }
    kb_assert_ok(kb_drain(b, 60000));
    long peak = status_kb("VmHWM");
    print_message("RSS before subscribing %ld kB, peak while reading 135 MB of oversized "
                  "entries %ld kB (+%ld kB)\n", before, peak, peak - before);
    assert_int_equal(atomic_load(&s.calls), 40);   /* none of the five */
    assert_true(atomic_load(&s.largest) <= 5);
    assert_true(atomic_load(&s.longest_key) <= 1024);
    /* whole, the three took 555 MB more (issue 40); one field at a time in
     * hiredis's read buffer is 60 MB: wide slack, far below three copies */
    assert_true(peak - before < RSS_SLACK_KB);

    listed l = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 100, list_one, &l));
    assert_int_equal(l.n, 5);
    assert_int_equal(l.refs, 5);
    int payload = 0, key = 0, fields = 0;
    for (int i = 0; i < l.n; i++) {
        fields += strstr(l.reasons[i], "the entry's fields are over") != NULL;
        payload += strstr(l.reasons[i], "limits.max_payload_bytes:") != NULL;
        key += strstr(l.reasons[i], "limits.max_key_bytes:") != NULL;
    }
    assert_int_equal(payload, 3);
    assert_int_equal(key, 1);
    assert_int_equal(fields, 1);
    /* a reference holds nothing to replay: refused, naming why */
    first_id[0] = '\0';
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 1, first_of, NULL));
    assert_int_equal(kb_dead_letter_replay(b, topic, first_id), KB_EINVAL);
    assert_non_null(strstr(kb_last_error(), "reference"));
    kb_assert_ok(kb_close(b, 30000));
}

/* Header fields over limits.max_headers / max_header_bytes (as configured,
 * not only the ceilings) are dead letters that name the limit. */
static void header_fields_over_the_limits_are_dead_letters(void **state)
{
    (void)state;
    char topic[64], stream[160];
    snprintf(topic, sizeof topic, "rl.hdr.%d", (int)getpid());
    snprintf(stream, sizeof stream, "kb:{%s}:p:%u", topic, kb_fnv1a32("h-1", 3) % 8);
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "XADD %s * k h-1 d one h.a 1 h.b 2 h.c 3", stream));
    char value[600];
    memset(value, 'v', sizeof value);
    freeReplyObject(redisCommand(c, "XADD %s * k h-1 d two h.a %b", stream, value, sizeof value));
    freeReplyObject(redisCommand(c, "XADD %s * k h-1 d three h.a ok", stream));
    redisFree(c);
    kb_bus *b = kb_test_open(server.url, (const char *const[]){"consumer", "rl-hdr",
                             "limits.max_headers", "2", "limits.max_header_bytes", "512", NULL},
                             NULL);
    seen s = {0};
    kb_assert_ok(kb_subscribe(b, topic, handler, &s));
    for (int i = 0; i < 200 && atomic_load(&s.calls) < 1; i++)
        usleep(50000);
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(atomic_load(&s.calls), 1);
    listed l = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 100, list_one, &l));
    assert_int_equal(l.n, 2);
    assert_non_null(strstr(l.reasons[0], "limits.max_headers"));
    assert_non_null(strstr(l.reasons[1], "limits.max_header_bytes"));
    kb_assert_ok(kb_close(b, 30000));
}

static int setup(void **state)
{
    (void)state;
    return kb_test_server_start(&server, "redis", NULL);
}

static int teardown(void **state)
{
    (void)state;
    kb_test_server_stop(&server);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(foreign_entries_over_the_limits_are_references),
        cmocka_unit_test(header_fields_over_the_limits_are_dead_letters),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
