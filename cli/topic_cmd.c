/* keybus publish, stats, partitions: one topic, one short-lived bus. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "command.h"
#include "metrics_cmd.h"
#include "text.h"

int kb_cli_publish(int argc, char **argv)
{
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 2, 3, true);
    kb_bus *b = status == KB_CLI_EXIT_OK ? kb_cli_open(argv[0], &status) : NULL;
    if (b == NULL)
        return status;
    const char *payload = argc == 4 ? argv[3] : "";
    int rc = kb_publish(b, argv[1], argv[2], strlen(argv[2]), payload, strlen(payload));
    if (rc == KB_OK)
        rc = kb_flush(b, 5000);
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], rc));
}

static void stats_json(const char *topic, const char *group, const kb_topic_stats *s)
{
    fputs("{\"topic\":", stdout);
    kb_cli_json_string(stdout, topic, strlen(topic));
    fputs(",\"group\":", stdout);
    kb_cli_json_string(stdout, group, strlen(group));
    printf(",\"published\":%" PRIu64 ",\"partitions\":%" PRIu32 ",\"broker_length\":%" PRIu64
           ",\"broker_pending\":%" PRIu64 ",\"broker_lag\":%" PRIu64 ",\"dlq_length\":%" PRIu64
           "}\n",
           s->published, s->partitions, s->broker_length, s->broker_pending, s->broker_lag,
           s->dlq_length);
}

static void stats_text(const char *topic, const char *group, const kb_topic_stats *s)
{
    fputs("topic ", stdout);
    kb_cli_escape(stdout, topic, strlen(topic));
    fputs("\ngroup ", stdout);
    kb_cli_escape(stdout, group, strlen(group));
    printf("\npublished %" PRIu64 "\npartitions %" PRIu32 "\npartitions_owned %" PRIu32
           "\nbroker_length %" PRIu64 "\nbroker_pending %" PRIu64 "\nbroker_lag %" PRIu64
           "\ndlq_length %" PRIu64 "\n",
           s->published, s->partitions, s->partitions_owned, s->broker_length,
           s->broker_pending, s->broker_lag, s->dlq_length);
}

int kb_cli_stats(int argc, char **argv)
{
    static const char *const flags[] = {"--json", "--text"};
    bool set[2] = {false, false};
    int status = KB_CLI_EXIT_OK;
    if ((argc = kb_cli_flags(argv[0], argc, argv, flags, 2, set)) < 0)
        return KB_CLI_EXIT_USAGE;
    if (set[0] && set[1])
        return kb_cli_usage_error(argv[0], "--json and --text exclude each other");
    status = kb_cli_check_args(argv[0], argc, argv, 1, 1, 1, true);
    char group[256];
    kb_bus *b = status == KB_CLI_EXIT_OK ? kb_cli_open_group(argv[0], group, sizeof group, &status)
                                         : NULL;
    if (b == NULL)
        return status;
    kb_topic_stats s;
    int rc = kb_stats(b, argv[1], &s);
    if (rc == KB_OK)
        rc = kb_cli_group_check(b, argv[1], group);
    if (rc == KB_OK)
        (set[1] ? stats_text : stats_json)(argv[1], group, &s);
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], rc));
}

static void partition_json(const char *topic, const char *group, const kb_partition_stats *p)
{
    fputs("{\"topic\":", stdout);
    kb_cli_json_string(stdout, topic, strlen(topic));
    fputs(",\"group\":", stdout);
    kb_cli_json_string(stdout, group, strlen(group));
    printf(",\"partition\":%" PRIu32 ",\"length\":%" PRIu64 ",\"pending\":%" PRIu64
           ",\"lag\":%" PRIu64 ",\"redelivered\":%" PRIu64 ",\"consumers\":%" PRIu32
           ",\"owner\":",
           p->partition, p->length, p->pending, p->lag, p->redelivered, p->consumers);
    kb_cli_json_string(stdout, p->owner, strlen(p->owner));
    fputs("}\n", stdout);
}

static void partition_row(const kb_partition_stats *p)
{
    printf("%9" PRIu32 " %12" PRIu64 " %10" PRIu64 " %10" PRIu64 " %11" PRIu64 " %9" PRIu32
           "  ",
           p->partition, p->length, p->pending, p->lag, p->redelivered, p->consumers);
    kb_cli_escape(stdout, p->owner[0] ? p->owner : "-", p->owner[0] ? strlen(p->owner) : 1);
    fputc('\n', stdout);
}

int kb_cli_partitions(int argc, char **argv)
{
    static const char *const flags[] = {"--json"};
    bool json = false;
    if ((argc = kb_cli_flags(argv[0], argc, argv, flags, 1, &json)) < 0)
        return KB_CLI_EXIT_USAGE;
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 1, 1, true);
    char group[256];
    kb_bus *b = status == KB_CLI_EXIT_OK ? kb_cli_open_group(argv[0], group, sizeof group, &status)
                                         : NULL;
    if (b == NULL)
        return status;
    kb_topic_stats s;
    int rc = kb_stats(b, argv[1], &s);
    if (rc == KB_OK && s.partitions == 0) {
        kb_cli_errf("topic %s: the transport has no partitions", argv[1]);
        rc = KB_ENOTFOUND;
    }
    if (rc == KB_OK)
        rc = kb_cli_group_check(b, argv[1], group);
    if (rc == KB_OK && !json) {
        fputs("topic ", stdout);
        kb_cli_escape(stdout, argv[1], strlen(argv[1]));
        fputs("  group ", stdout);
        kb_cli_escape(stdout, group, strlen(group));
        printf("\npartition       length    pending        lag redelivered consumers  owner\n");
    }
    for (uint32_t i = 0; rc == KB_OK && i < s.partitions; i++) {
        kb_partition_stats p;
        if ((rc = kb_partition_stats_get(b, argv[1], i, &p)) == KB_OK)
            json ? partition_json(argv[1], group, &p) : partition_row(&p);
    }
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], rc));
}

int kb_cli_metrics(int argc, char **argv)
{
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 0, argc, false);
    kb_bus *b = status == KB_CLI_EXIT_OK ? kb_cli_open(argv[0], &status) : NULL;
    if (b == NULL)
        return status;
    int rc = kb_cli_metrics_print(b, argc - 1, argv + 1);
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], rc));
}
