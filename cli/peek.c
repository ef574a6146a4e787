/* keybus peek TOPIC [-g GROUP] [-n N] [--json]: the next N events the group
 * would be handed, printed as consume prints them, read without touching
 * anything on the broker (kb_peek). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "stream.h"
#include "text.h"

#define PEEK_DEFAULT 10

struct peek_args {
    const char *topic, *group;   /* group NULL: the `group` key */
    unsigned long count;
    bool json;
};

struct printer {
    uint32_t partitions;
    bool json;
    unsigned long printed;
};

/* The command's arguments (argv[0] is its name): KB_CLI_EXIT_OK, or the
 * usage error said. */
static int peek_args(int argc, char **argv, struct peek_args *a)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = argv[0];
    a->count = PEEK_DEFAULT;
    optind = 0;   /* glibc: start over, permuting (options may follow TOPIC) */
    opterr = 0;   /* the option itself is never echoed: it may hold a secret */
    int opt;
    while ((opt = getopt_long(argc, argv, ":g:n:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'g':
            a->group = optarg;
            break;
        case 'n':
            if ((a->count = kb_cli_count(optarg, KB_PEEK_MAX)) == 0)
                return kb_cli_usage_error(cmd, "-n wants a decimal count in 1..%d", KB_PEEK_MAX);
            break;
        case 'j':
            a->json = true;
            break;
        case ':':
            return kb_cli_usage_error(cmd, "-%c is missing its argument", optopt);
        default:
            return kb_cli_usage_error(cmd, "unknown option");
        }
    }
    if (argc - optind != 1)
        return kb_cli_usage_error(cmd, "wants exactly one TOPIC");
    a->topic = argv[optind];
    char why[512];
    if (kb_topic_name_check(a->topic, why, sizeof why) != KB_OK)
        return kb_cli_usage_error(cmd, "%s", why);
    return KB_CLI_EXIT_OK;
}

static int print_one(const kb_event *ev, void *opaque)
{
    struct printer *p = opaque;
    kb_cli_event_print(ev, p->partitions, p->json);
    p->printed++;
    return ferror(stdout) ? 1 : 0;
}

/* Peek on an open bus whose `group` key is `group`. */
static int peek_run(kb_bus *b, const struct peek_args *a, const char *group)
{
    /* groups first: on mem:// it says a broker is needed, and for a topic
     * the broker does not store, not found */
    bool exists;
    int rc = kb_cli_group_find(b, a->topic, group, &exists);
    if (rc != KB_OK)
        return rc;
    if (!exists) {
        fputs("keybus peek: group ", stderr);
        kb_cli_escape(stderr, group, strlen(group));
        fputs(" does not exist on topic ", stderr);
        kb_cli_escape(stderr, a->topic, strlen(a->topic));
        fputs(": showing what a new group would get\n", stderr);
    }
    kb_topic_stats s;
    if ((rc = kb_stats(b, a->topic, &s)) != KB_OK)
        return rc;
    struct printer p = {.partitions = s.partitions, .json = a->json};
    rc = kb_peek(b, a->topic, NULL, a->count, print_one, &p);
    if (rc == KB_OK && (fflush(stdout) != 0 || ferror(stdout))) {
        kb_cli_errf("writing to stdout failed");
        rc = KB_ETRANSPORT;
    }
    return rc;
}

int kb_cli_peek(int argc, char **argv)
{
    struct peek_args a = {0};
    int status = peek_args(argc, argv, &a);
    kb_conf *c = status == KB_CLI_EXIT_OK ? kb_cli_conf_make(&status) : NULL;
    if (c == NULL)
        return status;
    char err[512];
    if (a.group != NULL && kb_conf_set(c, "group", a.group, err, sizeof err) != KB_OK) {
        kb_conf_destroy(c);
        return kb_cli_usage_error(argv[0], "-g: %s", err);
    }
    char group[256];
    kb_bus *b = kb_cli_open_conf_group(argv[0], c, group, sizeof group, &status);
    if (b == NULL)
        return status;
    int rc = peek_run(b, &a, group);
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], rc));
}
