/* keybus dlq-list, dlq-replay, dlq-delete, dlq-purge: a topic's dead letters. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "command.h"
#include "stream.h"   /* kb_cli_count */
#include "text.h"

#define DLQ_LIST_MAX 1000000
#define DLQ_LIST_DEFAULT 100

static int print_text(const kb_dead_letter *dl, void *opaque)
{
    (void)opaque;
    kb_cli_escape(stdout, dl->id, strlen(dl->id));
    printf("\tpartition=%" PRIu32 "\toriginal=", dl->partition);
    kb_cli_escape(stdout, dl->original_id, strlen(dl->original_id));
    printf("\tattempts=%" PRIu32 "\treason=", dl->attempts);
    kb_cli_escape(stdout, dl->reason, strlen(dl->reason));
    fputs("\tkey=", stdout);
    kb_cli_escape(stdout, dl->key, dl->key_len);
    printf("\tbytes=%zu\tpayload=", dl->payload_len);
    kb_cli_escape(stdout, dl->payload, dl->payload_len);
    fputc('\n', stdout);
    return 0;
}

static int print_json(const kb_dead_letter *dl, void *opaque)
{
    const char *topic = opaque;
    fputs("{\"topic\":", stdout);
    kb_cli_json_string(stdout, topic, strlen(topic));
    fputs(",\"id\":", stdout);
    kb_cli_json_string(stdout, dl->id, strlen(dl->id));
    printf(",\"partition\":%" PRIu32 ",\"original_id\":", dl->partition);
    kb_cli_json_string(stdout, dl->original_id, strlen(dl->original_id));
    printf(",\"attempts\":%" PRIu32 ",\"reason\":", dl->attempts);
    kb_cli_json_string(stdout, dl->reason, strlen(dl->reason));
    printf(",\"time_ms\":%" PRId64 ",", dl->time_ms);
    kb_cli_json_bytes(stdout, "key", dl->key, dl->key_len);
    fputc(',', stdout);
    kb_cli_json_bytes(stdout, "payload", dl->payload, dl->payload_len);
    fputc(',', stdout);
    kb_cli_json_headers(stdout, dl->headers, dl->n_headers);
    fputs("}\n", stdout);
    return 0;
}

int kb_cli_dlq_list(int argc, char **argv)
{
    static const char *const flags[] = {"--json"};
    bool json = false;
    if ((argc = kb_cli_flags(argv[0], argc, argv, flags, 1, &json)) < 0)
        return KB_CLI_EXIT_USAGE;
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 1, 2, true);
    if (status != KB_CLI_EXIT_OK)
        return status;
    unsigned long max = DLQ_LIST_DEFAULT;
    if (argc == 3 && (max = kb_cli_count(argv[2], DLQ_LIST_MAX)) == 0)
        return kb_cli_usage_error(argv[0], "MAX must be a decimal number in 1..%d",
                                  DLQ_LIST_MAX);
    kb_bus *b = kb_cli_open(argv[0], &status);
    if (b == NULL)
        return status;
    /* a topic that does not exist is not found, as for stats (on mem://
     * too, where the store would walk none) */
    kb_topic_stats s;
    int rc = kb_stats(b, argv[1], &s);
    if (rc == KB_OK)
        rc = kb_dead_letters(b, argv[1], NULL, max, json ? print_json : print_text, argv[1]);
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], rc));
}

/* What dlq-replay says it replays, found by walking the store. */
struct found {
    const char *id;
    bool seen;
    char key[256], reason[256];
    uint32_t partition, attempts;
};

static int find_id(const kb_dead_letter *dl, void *opaque)
{
    struct found *f = opaque;
    if (strcmp(dl->id, f->id) != 0)
        return 0;
    f->seen = true;
    f->partition = dl->partition;
    f->attempts = dl->attempts;
    snprintf(f->key, sizeof f->key, "%.*s", (int)(dl->key_len < 255 ? dl->key_len : 255),
             (const char *)dl->key);
    snprintf(f->reason, sizeof f->reason, "%s", dl->reason);
    return 1;
}

int kb_cli_dlq_replay(int argc, char **argv)
{
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 2, 2, true);
    kb_bus *b = status == KB_CLI_EXIT_OK ? kb_cli_open(argv[0], &status) : NULL;
    if (b == NULL)
        return status;
    struct found f = {.id = argv[2]};
    kb_dead_letters(b, argv[1], NULL, DLQ_LIST_MAX, find_id, &f);   /* for the report only */
    int rc = kb_dead_letter_replay(b, argv[1], argv[2]);
    if (rc == KB_OK) {
        fputs("replayed ", stdout);
        kb_cli_escape(stdout, argv[2], strlen(argv[2]));
        fputs(" to ", stdout);
        kb_cli_escape(stdout, argv[1], strlen(argv[1]));
        if (f.seen) {
            printf("\tpartition=%" PRIu32 "\tattempts=%" PRIu32 "\treason=", f.partition,
                   f.attempts);
            kb_cli_escape(stdout, f.reason, strlen(f.reason));
            fputs("\tkey=", stdout);
            kb_cli_escape(stdout, f.key, strlen(f.key));
        }
        fputc('\n', stdout);
    }
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], rc));
}

int kb_cli_dlq_delete(int argc, char **argv)
{
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 2, 2, true);
    kb_bus *b = status == KB_CLI_EXIT_OK ? kb_cli_open(argv[0], &status) : NULL;
    if (b == NULL)
        return status;
    int rc = kb_dead_letter_delete(b, argv[1], argv[2]);
    if (rc == KB_OK) {
        fputs("deleted ", stdout);
        kb_cli_escape(stdout, argv[2], strlen(argv[2]));
        fputc('\n', stdout);
    }
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], rc));
}

int kb_cli_dlq_purge(int argc, char **argv)
{
    int status = kb_cli_check_args(argv[0], argc, argv, 1, 1, 1, true);
    kb_bus *b = status == KB_CLI_EXIT_OK ? kb_cli_open(argv[0], &status) : NULL;
    if (b == NULL)
        return status;
    kb_topic_stats s;
    uint64_t removed = 0;
    int rc = kb_stats(b, argv[1], &s);
    if (rc == KB_OK)
        rc = kb_dead_letters_purge(b, argv[1], &removed);
    if (rc == KB_OK || removed > 0)
        printf("purged %" PRIu64 " dead letters\n", removed);
    return kb_cli_close(b, argv[0], kb_cli_status_of(argv[0], rc));
}
