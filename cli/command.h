/* The `keybus` commands: one table (commands.c) drives the usage text,
 * dispatch, `keybus help COMMAND` and the man page. Every command runs on
 * the public API only (include/keybus/). */
#ifndef KB_CLI_COMMAND_H
#define KB_CLI_COMMAND_H

#include <stdbool.h>

#include <keybus/keybus.h>

/* Exit statuses of every command (docs/cli.md, "Exit status"). */
enum kb_cli_exit {
    KB_CLI_EXIT_OK = 0,        /* done; produce/consume: input or count done, or a signal */
    KB_CLI_EXIT_ERROR = 1,     /* the library failed (text on stderr); produce: bad lines */
    KB_CLI_EXIT_USAGE = 2,     /* bad arguments or configuration: nothing was connected */
    KB_CLI_EXIT_DEADLINE = 3,  /* the --timeout-ms deadline cut the flush or drain short */
    KB_CLI_EXIT_NOT_FOUND = 4, /* KB_ENOTFOUND: no such topic, dead letter or subscriber */
};

/* A command: argv[0] is its name, the global options (-c, -X) are taken out
 * wherever they stood. Returns the exit status. */
typedef int kb_cli_main_fn(int argc, char **argv);

struct kb_cli_command {
    const char *name;
    const char *synopsis;   /* what follows the name in a usage line */
    const char *summary;    /* one line for `keybus --help` */
    const char *help;       /* `keybus help NAME` and the man page: lines of text */
    kb_cli_main_fn *main;
};

/* The table, ending with a NULL name. */
extern const struct kb_cli_command kb_cli_commands[];

/* The table's entry for `name`, or NULL. */
const struct kb_cli_command *kb_cli_command_find(const char *name);

/* The commands (one file per concern). */
kb_cli_main_fn kb_cli_conf_doc, kb_cli_conf, kb_cli_publish, kb_cli_stats, kb_cli_partitions,
    kb_cli_top, kb_cli_dlq_list, kb_cli_dlq_replay, kb_cli_dlq_delete, kb_cli_dlq_purge,
    kb_cli_stream_main, kb_cli_help, kb_cli_metrics, kb_cli_groups, kb_cli_group_delete,
    kb_cli_topics, kb_cli_peek;

/* An argument error: one line, "keybus CMD: <text> (see: keybus help CMD)",
 * on stderr. Returns KB_CLI_EXIT_USAGE. */
int kb_cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Check argc - first against [min, max] and every TOPIC argument (argv[first]
 * when topic is true) by name: KB_CLI_EXIT_OK, or the usage error said. */
int kb_cli_check_args(const char *cmd, int argc, char **argv, int first, int min, int max,
                      bool topic);

/* Take the flags names[0..n) ("--json") out of argv[1..argc), setting
 * set[i] for each one given; any other word starting with '-' is a usage
 * error. The new argc, or -1 after saying what is wrong. */
int kb_cli_flags(const char *cmd, int argc, char **argv, const char *const *names, size_t n,
                 bool *set);

/* The global options (session.c), kept for kb_cli_conf_make: room for
 * argc of them (false: out of memory), freed at exit. */
bool kb_cli_settings_init(int argc);
void kb_cli_settings_free(void);
/* Keep a copy of `value` (false: out of memory). A secret-bearing -X value
 * (a key named like a secret, a URL with userinfo, no '=' at all) is then
 * overwritten with '*' in place, so /proc/PID/cmdline no longer shows it,
 * and the process stops dumping core (kb_cli_hold_secret). */
bool kb_cli_setting_add(char kind, char *value);
/* Core dumps off (not dumpable, RLIMIT_CORE 0): this process holds a secret. */
void kb_cli_hold_secret(void);
/* -c FILE / -cFILE / -X KV / -XKV at argv[i]: its value (and *used, the
 * words it takes; *kind 'c' or 'X'), or NULL when argv[i] is no global
 * option (*used 0) or its value is missing. */
char *kb_cli_global_option(int argc, char **argv, int i, char *kind, int *used);
/* Take the global options out of argv[first..argc) (up to a `--`, which is
 * dropped), into the settings; the new argc, -1 after a usage error, or -2
 * for -h / --help. */
int kb_cli_take_global_options(int argc, char **argv, int first);

/* The configuration the global options make (-c FILE, -X key=value, in the
 * order given, over the defaults; kb_open adds KEYBUS_* itself). NULL after
 * saying why on stderr, with the exit status in *status. */
kb_conf *kb_cli_conf_make(int *status);

/* kb_open on c (taken: destroyed on failure): NULL after saying why on stderr
 * as "keybus CMD: <class>: <reason>", with *status KB_CLI_EXIT_USAGE for a
 * configuration kb_open refused (KB_EINVAL), else KB_CLI_EXIT_ERROR. */
kb_bus *kb_cli_open_conf(const char *cmd, kb_conf *c, int *status);

/* Turn off the keys that serve a running service, not a command:
 * metrics.listen and stats.interval_ms (docs/cli.md, "A service's
 * configuration file"). kb_cli_open_conf calls it. */
void kb_cli_drop_service_keys(kb_conf *c);

/* kb_cli_conf_make, then kb_cli_open_conf. */
kb_bus *kb_cli_open(const char *cmd, int *status);

/* kb_cli_open, with the consumer group the bus reads for (the `group` key,
 * KEYBUS_GROUP and -X included) into group: what reading commands name. */
kb_bus *kb_cli_open_group(const char *cmd, char *group, size_t len, int *status);

/* kb_cli_open_conf on c (taken), with its `group` key into group, as
 * kb_cli_open_group. */
kb_bus *kb_cli_open_conf_group(const char *cmd, kb_conf *c, char *group, size_t len,
                               int *status);

/* kb_groups of `topic`: *exists when `group` is one of them. KB_OK, or
 * kb_groups's error (KB_ENOTFOUND on mem://, or for a topic not stored). */
int kb_cli_group_find(kb_bus *b, const char *topic, const char *group, bool *exists);

/* KB_OK when consumer group `group` exists on `topic` (or the transport
 * keeps no groups to ask); else KB_ENOTFOUND, with "group G does not exist
 * on topic T" for kb_cli_report: the figures of a group nobody made count
 * every event as lag. Call it after kb_stats found the topic. */
int kb_cli_group_check(kb_bus *b, const char *topic, const char *group);

/* The transport's scheme ("mem", "redis", ...) the configuration (KEYBUS_*
 * included) names, into buf. */
void kb_cli_scheme(kb_conf *c, char *buf, size_t len);

/* The exit status for a library result (KB_ENOTFOUND: not found; any other
 * failure: error), after "keybus CMD: CLASS: text" on stderr. */
int kb_cli_status_of(const char *cmd, int rc);

/* kb_close with a message on failure; `status` when it closed cleanly, else
 * KB_CLI_EXIT_ERROR (a status already failing stays). */
int kb_cli_close(kb_bus *b, const char *cmd, int status);

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

/* The two stream commands, on an open bus they close (kb_close's result in
 * *closed); `stop` is a signalfd for SIGINT and SIGTERM. KB_OK, or the code
 * that ended them (text said by kb_cli_report). They print their final count
 * on stderr. */
int kb_cli_produce(kb_bus *b, const struct kb_cli_stream *s, int stop, int *closed);
int kb_cli_consume(kb_bus *b, const struct kb_cli_stream *s, int stop, int *closed);

#endif /* KB_CLI_COMMAND_H */
