/* libFuzzer target: the NATS KV records another process's word is taken
 * from: a progress record's lines (kb__nats_progress_parse, which a takeover
 * runs on <stream>.done.<consumer> before settling events without a
 * handler) and a handler-run record (kb__nats_runs_check, before its counts
 * are believed). What a line is accepted with is written again in the form
 * the acker writes and must parse back the same. Input: u8 partitions, u16
 * highest delivered sequence, u16 message sequence, then the record. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transports/nats/nats_progress.h"
#include "../../transports/nats/nats_runs.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_line(const char *line, size_t len, uint32_t partitions, uint64_t max_sseq)
{
    kb_nats_progress_line pl;
    if (kb__nats_progress_parse(line, len, partitions, max_sseq, &pl) != NULL)
        return;
    if (pl.hash == 0 || pl.part >= partitions || pl.sseq == 0 || pl.sseq > max_sseq ||
        pl.idx >= 8192)
        abort();
    char again[96];
    int n = snprintf(again, sizeof again, "%016" PRIx64 " %u %" PRIu64 " %" PRIu64, pl.hash,
                     pl.part, pl.sseq, pl.idx);
    kb_nats_progress_line back;
    if (n != (int)len || memcmp(again, line, len) != 0 ||
        kb__nats_progress_parse(again, (size_t)n, partitions, max_sseq, &back) != NULL ||
        back.hash != pl.hash || back.sseq != pl.sseq || back.idx != pl.idx || back.part != pl.part)
        abort();   /* one form only: what is taken is what the acker writes */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5)
        return 0;
    uint32_t partitions = 1u + data[0];
    uint64_t max_sseq = (uint64_t)data[1] << 8 | data[2];
    uint64_t sseq = (uint64_t)data[3] << 8 | data[4];
    char *text = malloc(size - 5 + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data + 5, size - 5);
    text[size - 5] = '\0';
    for (const char *l = text; *l != '\0';) {
        const char *nl = strchr(l, '\n');
        size_t len = nl != NULL ? (size_t)(nl - l) : strlen(l);
        check_line(l, len, partitions, max_sseq);
        l = nl != NULL ? nl + 1 : l + len;
    }
    if (kb__nats_runs_check(text, sseq) == NULL) {
        /* every line names this message */
        char own[24];
        size_t n = (size_t)snprintf(own, sizeof own, "%" PRIu64, sseq);
        for (const char *l = text; *l != '\0'; l = strchr(l, '\n') + 1)
            if (strncmp(l, own, n) != 0 || (l[n] != ' ' && l[n] != '.'))
                abort();
    }
    free(text);
    return 0;
}
