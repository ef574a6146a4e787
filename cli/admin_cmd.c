/* keybus groups, group-delete, topics: what a broker stores, listed, and a
 * consumer group removed. Broker-only: on mem:// the library's "needs a
 * broker" is exit 4, as for partitions. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "command.h"
#include "text.h"

/* `names` as a JSON array of strings. */
static void json_names(char *const *names, size_t n)
{
    fputc('[', stdout);
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            fputc(',', stdout);
        kb_cli_json_string(stdout, names[i], strlen(names[i]));
    }
    fputc(']', stdout);
}

/* `names` comma-separated and escaped, `-` for none. */
static void text_names(char *const *names, size_t n)
{
    if (n == 0)
        fputc('-', stdout);
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            fputc(',', stdout);
        kb_cli_escape(stdout, names[i], strlen(names[i]));
    }
}

/* The name padded to `width` columns (escaped bytes count as written). */
static void text_name(const char *name, int width)
{
    size_t len = strlen(name);
    kb_cli_escape(stdout, name, len);
    printf("%*s", len < (size_t)width ? width - (int)len : 0, "");
}

/* stdout failed (a closed pipe, a full disk): an error, said once. */
static int output_checked(int rc)
{
    if (rc == KB_OK && (fflush(stdout) != 0 || ferror(stdout))) {
        kb_cli_errf("writing to stdout failed");
        return KB_ETRANSPORT;
    }
    return rc;
}

static void group_json(const char *topic, const kb_group_info *g)
{
    fputs("{\"topic\":", stdout);
    kb_cli_json_string(stdout, topic, strlen(topic));
    fputs(",\"group\":", stdout);
    kb_cli_json_string(stdout, g->name, strlen(g->name));
    printf(",\"partitions\":%" PRIu32 ",\"leases\":%" PRIu32 ",\"pending\":%" PRIu64
           ",\"lag\":%" PRIu64 ",\"consumers\":",
           g->partitions, g->leases, g->pending, g->lag);
    json_names(g->consumers, g->n_consumers);
    fputs("}\n", stdout);
}

static void group_row(const kb_group_info *g)
{
    text_name(g->name, 24);
    printf(" %10" PRIu32 " %6" PRIu32 " %10" PRIu64 " %10" PRIu64 "  ", g->partitions, g->leases,
           g->pending, g->lag);
    text_names(g->consumers, g->n_consumers);
    fputc('\n', stdout);
}

int kb_cli_groups(int argc, char **argv)
{
    static const char *const flags[] = {"--json"};
    bool json = false;
    if ((argc = kb_cli_flags(argv[0], argc, argv, flags, 1, &json)) < 0)
        return KB_CLI_EXIT_USAGE;
    if (argc != 2)
        return kb_cli_usage_error(argv[0], "wants exactly one TOPIC");
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 1, 1, true);
    kb_bus *b = status == KB_CLI_EXIT_OK ? kb_cli_open(argv[0], &status) : NULL;
    if (b == NULL)
        return status;
    kb_group_info *g;
    size_t n;
    int rc = kb_groups(b, argv[1], &g, &n);
    if (rc == KB_OK && !json) {
        fputs("topic ", stdout);
        kb_cli_escape(stdout, argv[1], strlen(argv[1]));
        printf("\n%-24s %10s %6s %10s %10s  %s\n", "group", "partitions", "leases", "pending",
               "lag", "consumers");
    }
    for (size_t i = 0; rc == KB_OK && i < n; i++)
        json ? group_json(argv[1], &g[i]) : group_row(&g[i]);
    if (rc == KB_OK)
        kb_groups_free(g, n);
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], output_checked(rc)));
}

int kb_cli_group_delete(int argc, char **argv)
{
    static const char *const flags[] = {"--force"};
    bool force = false;
    if ((argc = kb_cli_flags(argv[0], argc, argv, flags, 1, &force)) < 0)
        return KB_CLI_EXIT_USAGE;
    if (argc != 3)
        return kb_cli_usage_error(argv[0], "wants TOPIC and GROUP");
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 2, 2, true);
    /* the group as the `group` key takes it, before any connection */
    kb_conf *c = status == KB_CLI_EXIT_OK ? kb_cli_conf_make(&status) : NULL;
    if (c == NULL)
        return status;
    char err[512];
    if (kb_conf_set(c, "group", argv[2], err, sizeof err) != KB_OK) {
        kb_conf_destroy(c);
        return kb_cli_usage_error(argv[0], "GROUP: %s", err);
    }
    kb_bus *b = kb_cli_open_conf(argv[0], c, &status);
    if (b == NULL)
        return status;
    int rc = kb_group_delete(b, argv[1], argv[2], force ? KB_GROUP_DELETE_F_FORCE : 0);
    if (rc == KB_OK) {
        fputs("deleted group ", stdout);
        kb_cli_escape(stdout, argv[2], strlen(argv[2]));
        fputs(" of topic ", stdout);
        kb_cli_escape(stdout, argv[1], strlen(argv[1]));
        fputc('\n', stdout);
    }
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], output_checked(rc)));
}

static void topic_json(const kb_topic_info *t)
{
    fputs("{\"topic\":", stdout);
    kb_cli_json_string(stdout, t->name, strlen(t->name));
    printf(",\"partitions\":%" PRIu32 ",\"length\":%" PRIu64 ",\"groups\":", t->partitions,
           t->length);
    json_names(t->groups, t->n_groups);
    fputs("}\n", stdout);
}

static void topic_row(const kb_topic_info *t)
{
    text_name(t->name, 32);
    printf(" %10" PRIu32 " %12" PRIu64 "  ", t->partitions, t->length);
    text_names(t->groups, t->n_groups);
    fputc('\n', stdout);
}

int kb_cli_topics(int argc, char **argv)
{
    static const char *const flags[] = {"--json"};
    bool json = false;
    if ((argc = kb_cli_flags(argv[0], argc, argv, flags, 1, &json)) < 0)
        return KB_CLI_EXIT_USAGE;
    if (argc != 1)
        return kb_cli_usage_error(argv[0], "takes no arguments (only --json)");
    int status = KB_CLI_EXIT_OK;
    kb_bus *b = status == KB_CLI_EXIT_OK ? kb_cli_open(argv[0], &status) : NULL;
    if (b == NULL)
        return status;
    kb_topic_info *t;
    size_t n;
    int rc = kb_topics(b, &t, &n);
    if (rc == KB_OK && !json)
        printf("%-32s %10s %12s  %s\n", "topic", "partitions", "length", "groups");
    for (size_t i = 0; rc == KB_OK && i < n; i++)
        json ? topic_json(&t[i]) : topic_row(&t[i]);
    if (rc == KB_OK)
        kb_topics_free(t, n);
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], output_checked(rc)));
}
