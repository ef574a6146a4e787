/* "Keep it true": the examples README.md and docs/ mark runnable run on the
 * transport argv[1] names (a broker the harness starts) and print what the
 * page shows beside them (tests/doctest.py; docs/testing.md). */
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

static void marked_examples_print_what_the_docs_show(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "python3 %s/tests/doctest.py %s %s %s %s '%s'", KB_SOURCE_DIR,
             KB_SOURCE_DIR, KB_LIB_DIR, KB_BIN_DIR, kind, url);
    int rc = system(cmd);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
}

int main(int argc, char **argv)
{
    kind = argc > 1 ? argv[1] : "mem";
    kb_test_server server = {0};
    if (kb_test_broker_for(kind, &server, url, sizeof url) != 0)
        return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(marked_examples_print_what_the_docs_show)};
    return kb_test_run_group("doctest", kind, tests, 1, &server);
}
