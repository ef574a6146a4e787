/* The command table: adding a command is one row here (and its function). */
#include <string.h>

#include "command.h"
#include "help.h"

const struct kb_cli_command kb_cli_commands[] = {
    {"conf-doc", "", "print the configuration reference (docs/CONFIGURATION.md, Markdown)",
     "Every key of the core and of the transports built in or loaded with\n"
     "transport.plugins: type, default, range and meaning.\n",
     kb_cli_conf_doc},
    {"conf", "", "print the effective configuration, secrets masked",
     "One `key = value` line per key, KEYBUS_* variables applied (unless\n"
     "conf.env is false); secrets as ***, URLs without their userinfo.\n",
     kb_cli_conf},
    {"publish", "TOPIC KEY [PAYLOAD]", "publish one event and flush it",
     "The payload is empty when left out. Exit 4 on mem://, where a new\n"
     "process has no subscriber.\n",
     kb_cli_publish},
    {"stats", "TOPIC [--json | --text]", "the topic's counters and broker figures",
     "--json (the default): one JSON line (docs/formats.md). --text: one\n"
     "`name value` line per figure. Pending and lag are those of the group\n"
     "the `group` key names (-X group=G), which the output names. Reads only:\n"
     "nothing is created on the broker; exit 4 when the topic does not exist\n"
     "there.\n",
     kb_cli_stats},
    {"partitions", "TOPIC [--json]", "one row per broker partition",
     "Length, pending, lag, redelivered, consumers and the lease owner of\n"
     "each partition for the group the `group` key names (-X group=G; the\n"
     "output names it), as a table; --json: one JSON object per partition and\n"
     "line. Exit 4 on mem:// (no partitions) or for a topic the broker does\n"
     "not have.\n",
     kb_cli_partitions},
    {"metrics", "[TOPIC]...", "print the Prometheus text of the bus once",
     "The exposition of kb_metrics_write (docs/metrics.md) for the TOPICs\n"
     "named, or without one for every topic the broker stores (as `topics`\n"
     "lists them; on mem:// none). Exit 4 for a TOPIC the broker does not\n"
     "have.\n",
     kb_cli_metrics},
    {"top", "TOPIC...", "a live view: rates, depth and lag, once a second",
     "Per topic: stored events, arrivals and completions per second, pending,\n"
     "lag (of the group the `group` key names, shown at the top) and dead\n"
     "letters. Plain text (redrawn in place on a terminal);\n"
     "q or SIGINT/SIGTERM ends it.\n",
     kb_cli_top},
    {"peek", "TOPIC [-g GROUP] [-n N] [--json]", "the next events a group would be handed",
     "The next N (1..10000, default 10) events the group (-g, else the\n"
     "`group` key) would be handed: its pending entries first, then those\n"
     "not yet delivered; for a group that does not exist, what a new group\n"
     "would get (said on stderr). Printed as consume prints them (--json: one\n"
     "object per line). Reads only: acknowledges, claims and creates\n"
     "nothing. Exit 4 on mem:// or for a topic the broker does not have.\n",
     kb_cli_peek},
    {"groups", "TOPIC [--json]", "the topic's consumer groups",
     "One row per group: partitions it exists on, leases its consumers hold,\n"
     "pending, lag and the consumers' names; --json: one object per group and\n"
     "line. Exit 4 on mem:// or for a topic the broker does not have.\n",
     kb_cli_groups},
    {"group-delete", "TOPIC GROUP [--force]", "remove a consumer group from the broker",
     "Removes the group's position, pending entries and consumers (the\n"
     "events stay). Refused (exit 1) while one of its consumers holds a\n"
     "partition's lease, unless --force. Exit 4 on mem://, or when the topic\n"
     "or the group does not exist.\n",
     kb_cli_group_delete},
    {"topics", "[--json]", "every topic the broker stores",
     "One row per topic: its partitions, entries stored and consumer groups;\n"
     "--json: one object per topic and line. Exit 4 on mem://.\n",
     kb_cli_topics},
    {"dlq-list", "TOPIC [MAX] [--json]", "dead letters, oldest first (MAX 1..1000000, default 100)",
     "Text: one tab-separated line per dead letter. --json: one object per\n"
     "line with headers, time and reason (docs/formats.md). Exit 4 when the\n"
     "topic does not exist.\n",
     kb_cli_dlq_list},
    {"dlq-replay", "TOPIC ID", "publish a dead letter again and remove it from the store",
     "Says on stdout what it replayed: the ID, key, partition and reason.\n"
     "Exit 4 when there is no such dead letter.\n",
     kb_cli_dlq_replay},
    {"dlq-delete", "TOPIC ID", "remove one dead letter without replaying it",
     "Exit 4 when there is no such dead letter.\n", kb_cli_dlq_delete},
    {"dlq-purge", "TOPIC", "remove every dead letter of the topic",
     "Prints how many were removed. Exit 4 when the topic does not exist.\n",
     kb_cli_dlq_purge},
    {"produce", "TOPIC [-K DELIM] [--timeout-ms MS]", "publish stdin's KEY<TAB>PAYLOAD lines",
     "One event per line: the key before the first delimiter (a tab, or -K),\n"
     "the payload after it. Stops at EOF or SIGINT/SIGTERM, flushes within\n"
     "--timeout-ms (default 10000) and prints the count on stderr.\n",
     kb_cli_stream_main},
    {"consume", "TOPIC [-g GROUP] [-n COUNT] [--json] [--timeout-ms MS]",
     "print events as they are handled",
     "One line per event with its headers (--json: one object per line, like\n"
     "kcat -J). -n COUNT prints and acknowledges exactly COUNT events and\n"
     "leaves the rest unacknowledged for the group. Stops on SIGINT/SIGTERM,\n"
     "drains and closes within --timeout-ms (default 10000). On mem:// a new\n"
     "process has nothing to consume: it says so and exits 1.\n",
     kb_cli_stream_main},
    {"help", "[COMMAND]", "the usage text, or one command's help", "", kb_cli_help},
    {NULL, NULL, NULL, NULL, NULL},
};

const struct kb_cli_command *kb_cli_command_find(const char *name)
{
    for (const struct kb_cli_command *c = kb_cli_commands; c->name != NULL; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

int kb_cli_help(int argc, char **argv)
{
    if (argc > 2)
        return kb_cli_usage_error("help", "wrong number of arguments");
    if (argc == 1) {
        kb_cli_write_usage(stdout);
        return KB_CLI_EXIT_OK;
    }
    const struct kb_cli_command *cmd = kb_cli_command_find(argv[1]);
    if (cmd == NULL)
        return kb_cli_usage_error("help", "unknown command");
    return kb_cli_write_help(stdout, cmd);
}
