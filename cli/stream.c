/* produce / consume: their arguments, signals, and the bus's life around
 * them. SIGINT and SIGTERM are blocked in every thread before kb_open
 * starts any, and read from a signalfd by the command's own loop: nothing
 * runs in a signal handler. */
#include "stream.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

unsigned long kb_cli_count(const char *s, unsigned long max)
{
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n > 9 || s[n] != '\0')
        return 0;
    unsigned long v = strtoul(s, NULL, 10);
    return v <= max ? v : 0;
}

/* The command's arguments (argv[0] is its name): KB_CLI_EXIT_OK, or the
 * usage error said. */
static int stream_args(int argc, char **argv, struct kb_cli_stream *s)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"timeout-ms", required_argument, NULL, 't'},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0];
    s->consume = strcmp(cmd, "consume") == 0;
    s->delim = "\t";
    s->timeout_ms = KB_CLI_TIMEOUT_MS;
    const char *shorts = s->consume ? ":g:n:" : ":K:";
    optind = 0;   /* glibc: start over, permuting (options may follow TOPIC) */
    opterr = 0;   /* the option itself is never echoed: it may hold a secret */
    int opt;
    while ((opt = getopt_long(argc, argv, shorts, longopts, NULL)) != -1) {
        switch (opt) {
        case 'K':
            s->delim = optarg;
            if (*optarg == '\0')
                return kb_cli_usage_error(cmd, "-K wants a non-empty delimiter");
            break;
        case 'g':
            s->group = optarg;
            break;
        case 'n':
            if ((s->count = kb_cli_count(optarg, 999999999)) == 0)
                return kb_cli_usage_error(cmd, "-n wants a decimal count in 1..999999999");
            break;
        case 'j':
            if (!s->consume)
                return kb_cli_usage_error(cmd, "unknown option");
            s->json = true;
            break;
        case 't':
            if (kb_cli_count(optarg, 86400000) == 0 && strcmp(optarg, "0") != 0)
                return kb_cli_usage_error(cmd, "--timeout-ms wants milliseconds in 0..86400000");
            s->timeout_ms = (int)strtol(optarg, NULL, 10);
            break;
        case ':':
            return kb_cli_usage_error(cmd, "an option is missing its argument");
        default:
            return kb_cli_usage_error(cmd, "unknown option");
        }
    }
    if (argc - optind != 1)
        return kb_cli_usage_error(cmd, "wants exactly one TOPIC");
    s->topic = argv[optind];
    char why[512];
    if (kb_topic_name_check(s->topic, why, sizeof why) != KB_OK)
        return kb_cli_usage_error(cmd, "%s", why);
    return KB_CLI_EXIT_OK;
}

/* The exit status for how the command and kb_close ended. */
static int exit_status(int rc, int closed)
{
    if (rc == KB_OK && closed == KB_OK)
        return KB_CLI_EXIT_OK;
    if ((rc == KB_OK || rc == KB_ETIMEDOUT) && (closed == KB_OK || closed == KB_ETIMEDOUT))
        return KB_CLI_EXIT_DEADLINE;
    return KB_CLI_EXIT_ERROR;
}

/* Run the command on a bus opened from `c` (taken); the exit status. */
static int stream_run(kb_conf *c, const struct kb_cli_stream *s)
{
    const char *cmd = s->consume ? "consume" : "produce";
    char err[512];
    if (s->group != NULL && kb_conf_set(c, "group", s->group, err, sizeof err) != KB_OK) {
        fprintf(stderr, "keybus %s: -g: %s\n", cmd, err);
        kb_conf_destroy(c);
        return KB_CLI_EXIT_USAGE;
    }
    char scheme[32];
    kb_cli_scheme(c, scheme, sizeof scheme);
    if (s->consume && strcmp(scheme, "mem") == 0) {
        fprintf(stderr, "keybus consume: nothing to consume: mem:// keeps events inside the "
                        "process that publishes them, and this one publishes none (use "
                        "redis:// or nats://)\n");
        kb_conf_destroy(c);
        return KB_CLI_EXIT_ERROR;
    }
    /* Blocked before kb_open: its threads inherit the mask, so the signals
     * wait for the signalfd instead of ending the process. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int stop = -1;
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0 ||
        (stop = signalfd(-1, &set, SFD_CLOEXEC)) < 0) {
        perror("keybus: signalfd");
        kb_conf_destroy(c);
        return KB_CLI_EXIT_ERROR;
    }
    int status;
    kb_bus *b = kb_cli_open_conf(cmd, c, &status);
    if (b == NULL) {
        close(stop);
        return status;
    }
    int closed;
    int rc = s->consume ? kb_cli_consume(b, s, stop, &closed) : kb_cli_produce(b, s, stop, &closed);
    if (closed != KB_OK)
        fprintf(stderr, "keybus %s: close: %s: %s\n", cmd, kb_strerror(closed), kb_last_error());
    close(stop);
    return exit_status(rc, closed);
}

int kb_cli_stream_main(int argc, char **argv)
{
    struct kb_cli_stream s = {0};
    int status = stream_args(argc, argv, &s);
    kb_conf *c = status == KB_CLI_EXIT_OK ? kb_cli_conf_make(&status) : NULL;
    return c != NULL ? stream_run(c, &s) : status;
}
