/* `keybus produce` and `keybus consume`: long-running commands that stop on
 * SIGINT/SIGTERM, drain what they hold and close within a deadline. */
#ifndef KB_CLI_STREAM_H
#define KB_CLI_STREAM_H

#include "command.h"

/* A strictly decimal number in 1..max, or 0. */
unsigned long kb_cli_count(const char *s, unsigned long max);

/* Parse the command's arguments (argv[0] is its name); KB_CLI_EXIT_OK, or
 * KB_CLI_EXIT_USAGE after saying what is wrong. */
int kb_cli_stream_args(int argc, char **argv, struct kb_cli_stream *s);

/* Run the command on a bus opened from `c` (taken); the exit status. */
int kb_cli_stream_run(kb_conf *c, const struct kb_cli_stream *s);

#endif /* KB_CLI_STREAM_H */
