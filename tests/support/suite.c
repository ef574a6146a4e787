/* One broker per test binary, started by kind (suite.h). */
#include <stdio.h>
#include <string.h>

#include <keybus/pool.h>

#include "suite.h"

void kb_test_nats_stream(const char *topic, char *buf, size_t len)
{
    int n = snprintf(buf, len, "KB_%s", topic);
    for (int i = 3; i < n && (size_t)i < len; i++)
        if (buf[i] == '.')
            buf[i] = '_';
    size_t o = strlen(buf);
    snprintf(buf + o, len - o, "_%08x", kb_fnv1a32(topic, strlen(topic)));
}

int kb_test_broker_for(const char *kind, kb_test_server *s, char *url, size_t url_len)
{
    if (strcmp(kind, "mem") == 0)
        return 0;
    if (kb_test_server_start(s, kind, NULL) != 0) {
        fprintf(stderr, "cannot start %s server\n", kind);
        return -1;
    }
    snprintf(url, url_len, "%s", s->url);
    return 0;
}

int kb_test_run_group(const char *name, const char *kind, const struct CMUnitTest *tests,
                      size_t n, kb_test_server *s)
{
    char group[64];
    snprintf(group, sizeof group, "%s/%s", name, kind);
    int failed = _cmocka_run_group_tests(group, tests, n, NULL, NULL);
    if (s->pid > 0)
        kb_test_server_stop(s);
    return failed;
}
