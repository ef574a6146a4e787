/* libFuzzer target: a STREAM.MSG.GET answer as the NATS feeder reads it
 * (kb__nats_stored_read: the lost deliveries read again, and the bridge's
 * reads while a consumer has no leader). Whatever the server, or something
 * answering in its place, sent: never a message of a subject the read did
 * not ask for or below the sequence it asked from, and the message's reply
 * is the ack subject of the delivery it stands for. Input: a byte choosing
 * the filter (one subject, or the topic's wildcard), u16 `from`, u16 `dseq`,
 * then the answer's text. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../transports/nats/nats_msg.h"
#include "../../transports/nats/nats_refill.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (nats_Open(-1) != NATS_OK)   /* nats.c keeps its error stack per thread */
        abort();
    return 0;
}

static bool taken(const char *filter, const char *subject)
{
    size_t fl = strlen(filter), sl = strlen(subject);
    if (filter[fl - 1] != '*')
        return strcmp(filter, subject) == 0;
    return sl > fl - 1 && strncmp(subject, filter, fl - 1) == 0 &&
           strchr(subject + fl - 1, '.') == NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5)
        return 0;
    const char *filter = data[0] & 1 ? "kb.orders.*" : "kb.orders.3";
    uint64_t from = (uint64_t)data[1] << 8 | data[2];
    uint64_t dseq = (uint64_t)data[3] << 8 | data[4];
    char *text = malloc(size - 5 + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data + 5, size - 5);
    text[size - 5] = '\0';
    natsMsg *m = NULL;
    uint64_t seq = 0;
    int r = kb__nats_stored_read(text, "KB_orders", filter, from, "g_3_7", dseq, &m, &seq);
    if (r < -1 || r > 1 || (r != 1 && m != NULL) || (r == 1 && m == NULL))
        abort();
    if (r == 1) {
        kb_nats_meta meta;
        if (seq < from || seq == 0 || seq == UINT64_MAX || !taken(filter, natsMsg_GetSubject(m)) ||
            kb__nats_parse_ack(natsMsg_GetReply(m), &meta) != 0 || meta.sseq != seq ||
            meta.dseq != dseq || strcmp(meta.consumer, "g_3_7") != 0 ||
            natsMsg_GetDataLength(m) < 0)
            abort();
        const char **keys = NULL;
        int n = 0;
        if (natsMsgHeader_Keys(m, &keys, &n) == NATS_OK)
            free((void *)keys);
        natsMsg_Destroy(m);
    }
    free(text);
    return 0;
}
