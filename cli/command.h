/* What `keybus produce` and `keybus consume` are given and how they end:
 * shared by the commands (produce.c, consume.c) and the code that parses
 * their arguments and runs them (stream.c). */
#ifndef KB_CLI_COMMAND_H
#define KB_CLI_COMMAND_H

#include <stdbool.h>

#include <keybus/keybus.h>

/* Exit statuses of both commands (docs/cli.md). */
enum {
    KB_CLI_EXIT_OK = 0,        /* input or count done, or a signal: drained, closed */
    KB_CLI_EXIT_ERROR = 1,     /* the library failed (text on stderr); produce: bad lines */
    KB_CLI_EXIT_USAGE = 2,
    KB_CLI_EXIT_DEADLINE = 3,  /* the --timeout-ms deadline cut the flush or drain short */
    KB_CLI_EXIT_NOT_FOUND = 4, /* publish, stats, dlq-list, dlq-replay: KB_ENOTFOUND */
};

#define KB_CLI_TIMEOUT_MS 10000   /* default --timeout-ms */

struct kb_cli_stream {
    bool consume;
    const char *topic;
    const char *delim;         /* produce -K (default a tab) */
    const char *group;         /* consume -g (NULL: the `group` key) */
    unsigned long count;       /* consume -n (0: until a signal) */
    bool json;                 /* consume --json */
    int timeout_ms;            /* flush and close deadline */
};

/* The two commands, on an open bus they close (kb_close's result in
 * *closed); `stop` is a signalfd for SIGINT and SIGTERM. KB_OK, or the code
 * that ended them (text in kb_last_error). They print their final count on
 * stderr. */
int kb_cli_produce(kb_bus *b, const struct kb_cli_stream *s, int stop, int *closed);
int kb_cli_consume(kb_bus *b, const struct kb_cli_stream *s, int stop, int *closed);

#endif /* KB_CLI_COMMAND_H */
