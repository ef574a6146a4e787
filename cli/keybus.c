/* keybus: command-line companion of the library.
 *   keybus [-c FILE] [-X key=value]... conf-doc     print docs/CONFIGURATION.md
 *   keybus [-c FILE] [-X key=value]... conf         the effective configuration, secrets masked
 *   keybus [-c FILE] [-X key=value]... publish TOPIC KEY [PAYLOAD]
 *   keybus [-c FILE] [-X key=value]... stats TOPIC
 *   keybus [-c FILE] [-X key=value]... dlq-list TOPIC [MAX]
 *   keybus [-c FILE] [-X key=value]... dlq-replay TOPIC ID
 *   keybus [-c FILE] [-X key=value]... produce TOPIC [-K DELIM] [--timeout-ms MS]
 *   keybus [-c FILE] [-X key=value]... consume TOPIC [-g GROUP] [-n COUNT] [--json]
 *                                              [--timeout-ms MS]
 * Arguments are checked before the bus opens: usage and exit 2 for bad ones,
 * exit 1 for an error of the library (its class and reason on stderr), 3 when
 * produce's or consume's drain missed its deadline, 4 when the library said
 * KB_ENOTFOUND (cli/command.h). Text
 * output escapes control characters (cli/text.h); JSON output is exact. */
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>

#include "cli/command.h"
#include "cli/stream.h"
#include "cli/text.h"
#include "core/conf_int.h"

#define DLQ_LIST_MAX 1000000

static void usage(FILE *out)
{
    fprintf(out,
            "usage: keybus [-c FILE] [-X key=value]... COMMAND [ARGS]\n"
            "       keybus -h | --help\n"
            "commands:\n"
            "  conf-doc                   print the configuration reference (Markdown)\n"
            "  conf                       print the effective configuration (secrets masked)\n"
            "  publish TOPIC KEY [PAYLOAD]\n"
            "  stats TOPIC                one JSON line\n"
            "  dlq-list TOPIC [MAX]       dead letters, one line each (MAX 1..%d, default 100)\n"
            "  dlq-replay TOPIC ID\n"
            "  produce TOPIC [-K DELIM] [--timeout-ms MS]\n"
            "                             publish stdin's KEY<TAB>PAYLOAD lines (-K: another\n"
            "                             delimiter); prints the count at the end\n"
            "  consume TOPIC [-g GROUP] [-n COUNT] [--json] [--timeout-ms MS]\n"
            "                             print events as they are handled, until COUNT or\n"
            "                             SIGINT/SIGTERM; --json: one object per line\n"
            "produce and consume stop on SIGINT/SIGTERM, drain and close within\n"
            "--timeout-ms (default %d); exit 0 on a clean drain, 1 on an error, 2 on bad\n"
            "arguments, 3 when the deadline cut the drain short. publish, stats, dlq-list\n"
            "and dlq-replay exit 4 when the topic or dead letter does not exist.\n"
            "Text output escapes control characters as \\n, \\t, \\r, \\\\ and \\xNN.\n",
            DLQ_LIST_MAX, KB_CLI_TIMEOUT_MS);
}

enum cmd { CMD_CONF_DOC, CMD_CONF, CMD_PUBLISH, CMD_STATS, CMD_DLQ_LIST, CMD_DLQ_REPLAY };

static const struct command {
    const char *name;
    int min_args, max_args;   /* after the command's name */
} commands[] = {
    [CMD_CONF_DOC] = {"conf-doc", 0, 0}, [CMD_CONF] = {"conf", 0, 0},
    [CMD_PUBLISH] = {"publish", 2, 3},   [CMD_STATS] = {"stats", 1, 1},
    [CMD_DLQ_LIST] = {"dlq-list", 1, 2}, [CMD_DLQ_REPLAY] = {"dlq-replay", 2, 2},
};

static int print_dead_letter(const kb_dead_letter *dl, void *opaque)
{
    (void)opaque;
    kb_cli_escape(stdout, dl->id, strlen(dl->id));
    printf("\tpartition=%u\toriginal=", dl->partition);
    kb_cli_escape(stdout, dl->original_id, strlen(dl->original_id));
    printf("\tattempts=%u\treason=", dl->attempts);
    kb_cli_escape(stdout, dl->reason, strlen(dl->reason));
    fputs("\tkey=", stdout);
    kb_cli_escape(stdout, dl->key, dl->key_len);
    printf("\tbytes=%zu\tpayload=", dl->payload_len);
    kb_cli_escape(stdout, dl->payload, dl->payload_len);
    fputc('\n', stdout);
    return 0;
}

static void print_conf_line(const char *key, const char *value, void *arg)
{
    (void)arg;
    printf("%s = ", key);
    kb_cli_escape(stdout, value, strlen(value));
    fputc('\n', stdout);
}

static int run(kb_bus *b, enum cmd cmd, char **argv, int argc, unsigned long max)
{
    switch (cmd) {
    case CMD_PUBLISH: {
        const char *payload = argc == 3 ? argv[2] : "";
        int rc = kb_publish(b, argv[0], argv[1], strlen(argv[1]), payload, strlen(payload));
        return rc == KB_OK ? kb_flush(b, 5000) : rc;
    }
    case CMD_STATS: {
        kb_topic_stats s;
        int rc = kb_stats(b, argv[0], &s);
        if (rc != KB_OK)
            return rc;
        fputs("{\"topic\":", stdout);
        kb_cli_json_string(stdout, argv[0], strlen(argv[0]));
        printf(",\"published\":%llu,\"partitions\":%u,\"broker_length\":%llu,"
               "\"broker_pending\":%llu,\"broker_lag\":%llu,\"dlq_length\":%llu}\n",
               (unsigned long long)s.published, s.partitions,
               (unsigned long long)s.broker_length, (unsigned long long)s.broker_pending,
               (unsigned long long)s.broker_lag, (unsigned long long)s.dlq_length);
        return KB_OK;
    }
    case CMD_DLQ_LIST:
        return kb_dead_letters(b, argv[0], NULL, max, print_dead_letter, NULL);
    case CMD_DLQ_REPLAY:
        return kb_dead_letter_replay(b, argv[0], argv[1]);
    case CMD_CONF_DOC:
    case CMD_CONF:
        break;
    }
    return KB_EINVAL;
}

/* -c FILE or -X key=value, applied in the order given. */
struct setting {
    char kind;
    char *arg;
};

/* 0, or the exit status. */
static int configure(kb_conf *c, const struct setting *set, int n)
{
    char err[512];
    for (int i = 0; i < n; i++) {
        int rc;
        if (set[i].kind == 'c') {
            rc = kb_conf_load(c, set[i].arg, err, sizeof err);
        } else {
            char *eq = strchr(set[i].arg, '=');
            if (eq == NULL) {   /* never echoed: "nats.token:secret" is a typo for '=' */
                fprintf(stderr, "keybus: -X wants key=value (option %d has no '=')\n", i + 1);
                return 2;
            }
            *eq = '\0';
            rc = kb_conf_set(c, set[i].arg, eq + 1, err, sizeof err);
        }
        if (rc != KB_OK) {
            fprintf(stderr, "keybus: %s\n", err);
            return rc == KB_ENOMEM ? 1 : 2;
        }
    }
    return 0;
}

static int find_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(commands[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* The command at argv[optind] and its arguments, checked: its index, or -1
 * after saying what is wrong. */
static int check_command(int argc, char **argv, unsigned long *max)
{
    if (optind >= argc) {
        fprintf(stderr, "keybus: no command\n");
        return -1;
    }
    int cmd = find_command(argv[optind]), nargs = argc - optind - 1;
    if (cmd < 0) {
        fprintf(stderr, "keybus: unknown command\n");
        return -1;
    }
    if (nargs < commands[cmd].min_args || nargs > commands[cmd].max_args) {
        fprintf(stderr, "keybus %s: wrong number of arguments\n", commands[cmd].name);
        return -1;
    }
    char why[512];
    if (commands[cmd].min_args > 0 && kb_topic_name_check(argv[optind + 1], why, sizeof why) != KB_OK) {
        fprintf(stderr, "keybus %s: %s\n", commands[cmd].name, why);
        return -1;
    }
    *max = 100;
    if (cmd == CMD_DLQ_LIST && nargs == 2 &&
        (*max = kb_cli_count(argv[optind + 2], DLQ_LIST_MAX)) == 0) {
        fprintf(stderr, "keybus dlq-list: MAX must be a decimal number in 1..%d\n",
                DLQ_LIST_MAX);
        return -1;
    }
    return cmd;
}

/* Run a command that needs a bus; the exit status. */
static int run_on_bus(kb_conf *c, enum cmd cmd, char **args, int nargs, unsigned long max)
{
    char err[512];
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL) {
        fprintf(stderr, "keybus: %s\n", err);
        kb_conf_destroy(c);
        return 1;
    }
    kb_err_clear();
    int rc = run(b, cmd, args, nargs, max);
    if (rc != KB_OK)
        fprintf(stderr, "keybus %s: %s: %s\n", commands[cmd].name, kb_strerror(rc),
                kb_last_error());
    int closed = kb_close(b, 5000);
    if (rc == KB_OK && closed != KB_OK)
        fprintf(stderr, "keybus: close: %s: %s\n", kb_strerror(closed), kb_last_error());
    if (rc == KB_ENOTFOUND)
        return KB_CLI_EXIT_NOT_FOUND;
    return rc == KB_OK && closed == KB_OK ? KB_CLI_EXIT_OK : KB_CLI_EXIT_ERROR;
}

/* produce and consume (argv[0]): their own options, then the bus. */
static int stream_main(int argc, char **argv, const struct setting *set, int nset)
{
    struct kb_cli_stream s = {0};
    if (kb_cli_stream_args(argc, argv, &s) != KB_CLI_EXIT_OK) {
        usage(stderr);
        return KB_CLI_EXIT_USAGE;
    }
    kb_conf *c = kb_conf_new();
    if (c == NULL) {
        fprintf(stderr, "keybus: out of memory\n");
        return KB_CLI_EXIT_ERROR;
    }
    int status = configure(c, set, nset);
    if (status != 0) {
        kb_conf_destroy(c);
        return status;
    }
    return kb_cli_stream_run(c, &s);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    /* A closed pipe (stdout, a broker's socket) is an error to report, not
     * a silent death */
    signal(SIGPIPE, SIG_IGN);
    struct setting *set = calloc((size_t)argc + 1, sizeof *set);
    if (set == NULL)
        return 1;
    int nset = 0, opt, status = 0;
    opterr = 0;   /* getopt would echo an unknown long option, which may hold a secret */
    while (status == 0 && (opt = getopt_long(argc, argv, "+c:X:h", longopts, NULL)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            free(set);
            return 0;
        }
        if (opt == 'c' || opt == 'X') {
            set[nset++] = (struct setting){(char)opt, optarg};
            continue;
        }
        if (optopt == 'c' || optopt == 'X')
            fprintf(stderr, "keybus: -%c needs an argument\n", optopt);
        else
            fprintf(stderr, "keybus: unknown option\n");
        status = 2;
    }
    if (status == 0 && optind < argc &&
        (strcmp(argv[optind], "produce") == 0 || strcmp(argv[optind], "consume") == 0)) {
        status = stream_main(argc - optind, argv + optind, set, nset);
        free(set);
        return status;
    }
    unsigned long max = 0;
    int cmd = status == 0 ? check_command(argc, argv, &max) : -1;
    if (cmd < 0) {
        usage(stderr);
        free(set);
        return 2;
    }
    kb_conf *c = kb_conf_new();
    status = c == NULL ? 1 : configure(c, set, nset);
    free(set);
    if (c == NULL)
        fprintf(stderr, "keybus: out of memory\n");
    if (status != 0) {
        kb_conf_destroy(c);
        return status;
    }
    char err[512];
    switch (cmd) {
    case CMD_CONF_DOC:
        kb__conf_write_markdown(stdout);
        break;
    case CMD_CONF:
        if (kb_conf_bool(c, "conf.env") &&
            kb_conf_apply_env(c, err, sizeof err) != KB_OK) {
            fprintf(stderr, "keybus: %s\n", err);
            status = 2;
        } else {
            kb__conf_each(c, print_conf_line, NULL);
        }
        break;
    default:
        return run_on_bus(c, (enum cmd)cmd, argv + optind + 1, argc - optind - 1, max);
    }
    kb_conf_destroy(c);
    return status;
}
