#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include "bus.h"

static void set_all(kb_conf *c, const char *const *kv)
{
    char err[256];
    for (size_t i = 0; kv != NULL && kv[i] != NULL; i += 2)
        if (kb_conf_set(c, kv[i], kv[i + 1], err, sizeof err) != KB_OK)
            fail_msg("kb_conf_set %s: %s", kv[i], err);
}

kb_conf *kb_test_conf(const char *url, const char *const *base, const char *const *extra)
{
    kb_conf *c = kb_conf_new();
    if (c == NULL)
        fail_msg("kb_conf_new: out of memory");
    const char *const transport[] = {"transport", url, NULL};
    set_all(c, transport);
    set_all(c, base);
    set_all(c, extra);
    return c;
}

kb_bus *kb_test_open_conf(kb_conf *c)
{
    char err[256];
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL)
        fail_msg("kb_open: %s", err);
    return b;
}

kb_bus *kb_test_open(const char *url, const char *const *base, const char *const *extra)
{
    return kb_test_open_conf(kb_test_conf(url, base, extra));
}

uint32_t kb_test_owned(kb_bus *b, const char *topic)
{
    kb_topic_stats st;
    memset(&st, 0, sizeof st);
    return kb_stats(b, topic, &st) == KB_OK ? st.partitions_owned : 0;
}
