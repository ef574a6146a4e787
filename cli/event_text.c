/* An event as `keybus consume` prints it, one line of text or JSON; `peek`
 * prints what it sees the same way, so the two outputs compare line by
 * line. */
#include <stdio.h>
#include <string.h>

#include "text.h"

/* The event's partition as text: the key's, or `none` without partitions. */
static const char *partition(uint32_t partitions, const kb_event *ev, char buf[16],
                             const char *none)
{
    if (partitions == 0)
        return none;
    snprintf(buf, 16, "%u", kb_partition_of(ev->key, ev->key_len, partitions));
    return buf;
}

static void print_text(uint32_t partitions, const kb_event *ev)
{
    char buf[16];
    kb_cli_escape(stdout, ev->key, ev->key_len);
    fputc('\t', stdout);
    kb_cli_escape(stdout, ev->payload, ev->payload_len);
    printf("\tpartition=%s", partition(partitions, ev, buf, "-"));
    fputs("\tid=", stdout);
    kb_cli_escape(stdout, ev->id, strlen(ev->id));
    printf("\tattempt=%u", ev->attempt);
    kb_cli_text_headers(stdout, ev->headers, ev->n_headers);
    fputc('\n', stdout);
}

static void print_json(uint32_t partitions, const kb_event *ev)
{
    fputs("{\"topic\":", stdout);
    kb_cli_json_string(stdout, ev->topic, strlen(ev->topic));
    fputc(',', stdout);
    kb_cli_json_bytes(stdout, "key", ev->key, ev->key_len);
    fputc(',', stdout);
    kb_cli_json_bytes(stdout, "payload", ev->payload, ev->payload_len);
    char buf[16];
    printf(",\"partition\":%s", partition(partitions, ev, buf, "null"));
    fputs(",\"id\":", stdout);
    kb_cli_json_string(stdout, ev->id, strlen(ev->id));
    printf(",\"attempt\":%u,", ev->attempt);
    kb_cli_json_headers(stdout, ev->headers, ev->n_headers);
    fputs("}\n", stdout);
}

void kb_cli_event_print(const kb_event *ev, uint32_t partitions, bool json)
{
    (json ? print_json : print_text)(partitions, ev);
}
