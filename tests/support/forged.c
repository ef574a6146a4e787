#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "forged.h"

static struct {
    pthread_mutex_t mu;
    char text[8192];
} logged = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void on_log(int level, const char *msg, void *opaque)
{
    (void)level, (void)opaque;
    pthread_mutex_lock(&logged.mu);
    size_t n = strlen(logged.text);
    snprintf(logged.text + n, sizeof logged.text - n, "%s\n", msg);
    pthread_mutex_unlock(&logged.mu);
}

void kb_test_log_capture(kb_conf *c)
{
    kb_conf_set_log(c, on_log, NULL);
}

bool kb_test_logged(const char *text)
{
    pthread_mutex_lock(&logged.mu);
    bool yes = strstr(logged.text, text) != NULL;
    pthread_mutex_unlock(&logged.mu);
    return yes;
}

typedef struct one {
    char id[64];
    uint32_t partition, attempts;
} one;

static int first(const kb_dead_letter *dl, void *opaque)
{
    one *o = opaque;
    snprintf(o->id, sizeof o->id, "%s", dl->id);
    o->partition = dl->partition;
    o->attempts = dl->attempts;
    return 1;
}

void kb_test_forged_dead_letter_replays(kb_bus *b, const char *topic, const char *key,
                                        _Atomic int *calls)
{
    one o = {0};
    kb_assert_ok(kb_dead_letters(b, topic, NULL, 1, first, &o));
    uint32_t home = kb_partition_of(key, strlen(key), 8);
    assert_int_equal(o.partition, home);
    assert_int_equal(o.attempts, 0);
    kb_assert_ok(kb_dead_letter_replay(b, topic, o.id));
    kb_assert_ok(kb_drain(b, 30000));
    assert_int_equal(atomic_load(calls), 1);
    char said[64];
    snprintf(said, sizeof said, "replayed to partition %u", home);
    assert_true(kb_test_logged(said));
}
