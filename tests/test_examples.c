/* The README's example (examples/hello.c) prints the same on every
 * transport: `test_examples mem|redis|nats` runs it as a child process with
 * KEYBUS_TRANSPORT pointing at a real server the harness started. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "support/suite.h"

static const char *kind = "mem";
static char url[160] = "mem://";

/* Run the example; its stdout in out, its exit status returned. */
static int run_example(char *out, size_t outlen)
{
    setenv("KEYBUS_TRANSPORT", url, 1);
    FILE *p = popen(KB_EXAMPLE_HELLO, "r");
    unsetenv("KEYBUS_TRANSPORT");
    if (p == NULL)
        return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void hello_prints_the_same_everywhere(void **state)
{
    (void)state;
    char out[512];
    for (int run = 0; run < 2; run++) {   /* the second run finds the first's stream */
        int rc = run_example(out, sizeof out);
        if (rc != 0 || strcmp(out, "handled 3 events of order-123 in order\n") != 0)
            fail_msg("%s run %d: exit %d, output \"%s\"", url, run + 1, rc, out);
    }
}

/* A call that fails is said on stderr, with kb_last_error(), and the exit
 * status is 1: here kb_publish refuses the key (limits.max_key_bytes). */
static void hello_says_why_it_fails(void **state)
{
    (void)state;
    char out[512];
    setenv("KEYBUS_LIMITS_MAX_KEY_BYTES", "4", 1);
    setenv("KEYBUS_TRANSPORT", url, 1);
    FILE *p = popen(KB_EXAMPLE_HELLO " 2>&1", "r");
    unsetenv("KEYBUS_TRANSPORT");
    unsetenv("KEYBUS_LIMITS_MAX_KEY_BYTES");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 ||
        strstr(out, "limits.max_key_bytes") == NULL || strstr(out, "handled") != NULL)
        fail_msg("%s: status %d, output \"%s\"", url, status, out);
}

int main(int argc, char **argv)
{
    static kb_test_server server;
    if (argc > 1)
        kind = argv[1];
    if (kb_test_broker_for(kind, &server, url, sizeof url) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hello_prints_the_same_everywhere),
        cmocka_unit_test(hello_says_why_it_fails),
    };
    return kb_test_run_group("examples", kind, tests, 2, &server);
}
