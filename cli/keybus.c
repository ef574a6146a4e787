/* keybus: command-line companion of the library.
 *   keybus conf-doc                        print docs/CONFIGURATION.md
 *   keybus [-c FILE] [-X key=value]... publish TOPIC KEY [PAYLOAD]
 *   keybus [-c FILE] [-X key=value]... stats TOPIC
 *   keybus [-c FILE] [-X key=value]... dlq-list TOPIC [MAX]
 *   keybus [-c FILE] [-X key=value]... dlq-replay TOPIC ID */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "core/conf_int.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: keybus conf-doc\n"
            "       keybus [-c FILE] [-X key=value]... publish TOPIC KEY [PAYLOAD]\n"
            "       keybus [-c FILE] [-X key=value]... stats TOPIC\n"
            "       keybus [-c FILE] [-X key=value]... dlq-list TOPIC [MAX]\n"
            "       keybus [-c FILE] [-X key=value]... dlq-replay TOPIC ID\n");
}

static int print_dead_letter(const kb_dead_letter *dl, void *opaque)
{
    (void)opaque;
    printf("%s\tpartition=%u\toriginal=%s\tattempts=%u\treason=%s\tkey=%.*s\tbytes=%zu\n", dl->id,
           dl->partition, dl->original_id, dl->attempts, dl->reason, (int)dl->key_len,
           (const char *)dl->key, dl->payload_len);
    return 0;
}

static int run(kb_bus *b, int argc, char **argv)
{
    const char *cmd = argv[0];
    int rc;
    if (strcmp(cmd, "publish") == 0 && (argc == 3 || argc == 4)) {
        const char *payload = argc == 4 ? argv[3] : "";
        rc = kb_publish(b, argv[1], argv[2], strlen(argv[2]), payload, strlen(payload));
        if (rc == KB_OK)
            rc = kb_flush(b, 5000);
    } else if (strcmp(cmd, "stats") == 0 && argc == 2) {
        kb_topic_stats s;
        rc = kb_stats(b, argv[1], &s);
        if (rc == KB_OK)
            printf("{\"topic\":\"%s\",\"published\":%llu,\"partitions\":%u,\"broker_length\":%llu,"
                   "\"broker_pending\":%llu,\"broker_lag\":%llu,\"dlq_length\":%llu}\n",
                   argv[1], (unsigned long long)s.published, s.partitions,
                   (unsigned long long)s.broker_length, (unsigned long long)s.broker_pending,
                   (unsigned long long)s.broker_lag, (unsigned long long)s.dlq_length);
    } else if (strcmp(cmd, "dlq-list") == 0 && (argc == 2 || argc == 3)) {
        rc = kb_dead_letters(b, argv[1], NULL, argc == 3 ? strtoul(argv[2], NULL, 10) : 100,
                             print_dead_letter, NULL);
    } else if (strcmp(cmd, "dlq-replay") == 0 && argc == 3) {
        rc = kb_dead_letter_replay(b, argv[1], argv[2]);
    } else {
        usage();
        return 2;
    }
    if (rc != KB_OK)
        fprintf(stderr, "keybus %s: %s: %s\n", cmd, kb_strerror(rc), kb_last_error());
    return rc == KB_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "conf-doc") == 0) {
        kb__conf_write_markdown(stdout);
        return 0;
    }
    kb_conf *c = kb_conf_new();
    char err[512];
    int opt;
    while ((opt = getopt(argc, argv, "c:X:h")) != -1) {
        char *eq;
        switch (opt) {
        case 'c':
            if (kb_conf_load(c, optarg, err, sizeof err) != KB_OK) {
                fprintf(stderr, "keybus: %s\n", err);
                return 2;
            }
            break;
        case 'X':
            eq = strchr(optarg, '=');
            if (eq == NULL) {
                fprintf(stderr, "keybus: -X wants key=value, got \"%s\"\n", optarg);
                return 2;
            }
            *eq = '\0';
            if (kb_conf_set(c, optarg, eq + 1, err, sizeof err) != KB_OK) {
                fprintf(stderr, "keybus: %s\n", err);
                return 2;
            }
            break;
        default:
            usage();
            return 2;
        }
    }
    if (optind >= argc) {
        usage();
        return 2;
    }
    kb_bus *b = kb_open(c, err, sizeof err);
    if (b == NULL) {
        fprintf(stderr, "keybus: %s\n", err);
        kb_conf_destroy(c);
        return 1;
    }
    int status = run(b, argc - optind, argv + optind);
    kb_close(b, 5000);
    return status;
}
