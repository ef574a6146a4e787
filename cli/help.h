/* The usage text, `keybus help COMMAND` and the man page keybus.1, all
 * written from the command table and the texts in help.c. */
#ifndef KB_CLI_HELP_H
#define KB_CLI_HELP_H

#include <stdio.h>

#include "command.h"

/* `keybus --help`: the synopsis, every command's line, the exit statuses. */
void kb_cli_write_usage(FILE *out);

/* `keybus help NAME`: its usage line, summary and help. KB_CLI_EXIT_OK. */
int kb_cli_write_help(FILE *out, const struct kb_cli_command *cmd);

/* keybus.1 in man(7) format (`keybus --man`, run by the build). */
void kb_cli_write_man(FILE *out);

#endif /* KB_CLI_HELP_H */
