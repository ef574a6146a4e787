/* keybus conf-doc, keybus conf: the configuration, read without a bus. */
#include <stdio.h>
#include <string.h>

#include "command.h"
#include "text.h"

int kb_cli_conf_doc(int argc, char **argv)
{
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 0, 0, false);
    kb_conf *c = status == KB_CLI_EXIT_OK ? kb_cli_conf_make(&status) : NULL;
    if (c == NULL)
        return status;
    kb_conf_write_reference(stdout);   /* transport.plugins loaded by the conf included */
    kb_conf_destroy(c);
    return KB_CLI_EXIT_OK;
}

static void print_conf_line(const char *key, const char *value, void *opaque)
{
    (void)opaque;
    printf("%s = ", key);
    kb_cli_escape(stdout, value, strlen(value));
    fputc('\n', stdout);
}

int kb_cli_conf(int argc, char **argv)
{
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 0, 0, false);
    kb_conf *c = status == KB_CLI_EXIT_OK ? kb_cli_conf_make(&status) : NULL;
    if (c == NULL)
        return status;
    char env[16] = "true", err[512];
    kb_conf_get(c, "conf.env", env, sizeof env);
    if (strcmp(env, "true") == 0 && kb_conf_apply_env(c, err, sizeof err) != KB_OK) {
        fprintf(stderr, "keybus: %s\n", err);
        status = KB_CLI_EXIT_USAGE;
    } else {
        kb_conf_each(c, print_conf_line, NULL);
    }
    kb_conf_destroy(c);
    return status;
}
