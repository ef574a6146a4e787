/* `keybus produce` and `keybus consume`: long-running commands that stop on
 * SIGINT/SIGTERM, drain what they hold and close within a deadline. */
#ifndef KB_CLI_STREAM_H
#define KB_CLI_STREAM_H

#include "command.h"

/* A strictly decimal number in 1..max, or 0. */
unsigned long kb_cli_count(const char *s, unsigned long max);

#endif /* KB_CLI_STREAM_H */
