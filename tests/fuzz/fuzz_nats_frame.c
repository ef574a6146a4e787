/* libFuzzer target: a delivered NATS message read as the feeder
 * (nats_consume.c) and the dead-letter listing read it: Kb-Batch frames
 * (kb__nats_frame_open / _next, versions 1 and 2, kb__nats_hdr_frame per
 * event), or one event's key (Kb-Key / Kb-Bin-Key, kb__nats_get_key) and
 * headers (Kb-Headers or another client's, kb__nats_hdr_get); also its
 * $JS.ACK reply subject (kb__nats_parse_ack). The message is made by
 * natsMsg_create, the constructor nats.c's parser calls for an HMSG, from a
 * raw header block, so nats.c lifts the headers exactly as it does for a
 * delivery. What reads back is written again (kb_frame_event_put,
 * kb__nats_set_key, kb__nats_hdr_set) and must read back the same. The
 * message is also read as a dead letter (kb__nats_dead_letter_of).
 * Input: u16 header block length, u8 reply length, the reply subject, the
 * header block ("NATS/1.0\r\n..."), the body. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../transports/nats/nats_dlq.h"
#include "../../transports/nats/nats_frame.h"
#include "../../transports/nats/nats_hdr.h"
#include "../../transports/nats/nats_msg.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* nats.c's message constructor for a delivery (src/msg.c; exported, not in
 * nats.h): hdrLen bytes of buf are the header block, the rest the body. */
natsStatus natsMsg_create(natsMsg **newMsg, const char *subject, int subjLen, const char *reply,
                          int replyLen, const char *buf, int bufLen, int hdrLen);
/* natsMsg_Destroy hands a message to nats.c's GC thread, which frees it
 * later: libFuzzer would see a leak in every input and run a full leak check
 * each time (100 times slower). This is what that thread calls. */
void natsMsg_free(void *object);

#define KEY_CAP 65536   /* the feeder's and the dead-letter listing's */

static kb_transport t;   /* only its limits are read: the defaults */
static char key[KEY_CAP];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (nats_Open(-1) != NATS_OK)   /* nats.c keeps its error stack per thread */
        abort();
    t.max_headers = 16;
    t.max_header_bytes = 4096;
    t.partitions = 8;
    return 0;
}

static void same_headers(const kb_header *a, size_t na, const kb_header *b, size_t nb)
{
    if (na != nb)
        abort();
    for (size_t i = 0; i < na; i++)
        if (strcmp(a[i].name, b[i].name) != 0 || a[i].value_len != b[i].value_len ||
            memcmp(a[i].value, b[i].value, a[i].value_len) != 0)
            abort();
}

/* A frame: every event it announces, then nothing left; each entry written
 * again is the bytes it was read from. */
static void frame(natsMsg *m, const char *count, kb_nats_hdrs *h)
{
    kb_nats_frame f;
    const char *why = NULL;
    if (kb__nats_frame_open(m, count, &f, &why) != 0) {
        if (why == NULL)
            abort();
        return;
    }
    uint32_t events = f.left;
    if (events < 2 || events != kb__nats_events_in(m))
        abort();
    for (uint32_t i = 0; i < events; i++) {
        const char *at = f.p;
        kb_frame_event ev;
        if (!kb__nats_frame_next(&f, &ev))
            abort();   /* frame_open counted it */
        if (kb__nats_hdr_frame(&t, &ev, h, &why) != 0)
            continue;   /* dead-lettered, the next event goes on */
        kb_msg msg = {ev.key, ev.key_len, ev.payload, ev.payload_len, 0, h->h, h->n};
        size_t n = kb_frame_event_size(&msg, f.version == 2);
        char *again = malloc(n);
        if (again == NULL)
            abort();
        kb_frame_event_put(again, &msg, f.version == 2);
        if (n != (size_t)(f.p - at) || memcmp(again, at, n) != 0)
            abort();
        free(again);
    }
    if (f.p != f.end)
        abort();
}

/* One event: its key and headers, as a message keybus writes them. */
static void single(natsMsg *m, kb_nats_hdrs *h)
{
    const char *why = NULL;
    int klen = kb__nats_get_key(m, key, sizeof key, &why);
    if (klen < 0 || kb__nats_hdr_get(&t, m, h, &why) != 0) {
        if (why == NULL)
            abort();
        return;
    }
    natsMsg *w = NULL;
    kb_nats_hdrs back = {0};
    char *key2 = malloc(KEY_CAP);
    if (key2 == NULL || natsMsg_Create(&w, "kb.fuzz.0", NULL, NULL, 0) != NATS_OK)
        abort();
    if (kb__nats_set_key(w, key, (size_t)klen) != KB_OK || kb__nats_hdr_set(w, h->h, h->n) != KB_OK)
        abort();
    if (kb__nats_get_key(w, key2, KEY_CAP, &why) != klen || memcmp(key, key2, (size_t)klen) != 0 ||
        kb__nats_hdr_get(&t, w, &back, &why) != 0)
        abort();
    same_headers(h->h, h->n, back.h, back.n);
    kb__nats_hdrs_free(&back);
    natsMsg_free(w);
    free(key2);
}

/* The same message read back as a dead letter (the listing): anyone may
 * publish on that subject, so its Kb-* headers come out range-checked. */
static void dead_letter(natsMsg *m, kb_nats_hdrs *h)
{
    kb__nats_hdrs_free(h);
    memset(h, 0, sizeof *h);
    kb_dead_letter dl = kb__nats_dead_letter_of(&t, m, "1", key, h);
    if (dl.partition >= t.partitions || dl.key_len > KEY_CAP || dl.n_headers > KB_MAX_HEADERS ||
        dl.reason == NULL || dl.original_id == NULL)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    size_t hlen = (size_t)data[0] | (size_t)data[1] << 8, rlen = data[2];
    data += 3, size -= 3;
    if (rlen > size)
        rlen = size;
    const char *reply = (const char *)data;
    data += rlen, size -= rlen;
    if (hlen > size)
        hlen = size;
    natsMsg *m = NULL;
    if (natsMsg_create(&m, "kb.fuzz.0", 9, reply, (int)rlen, (const char *)data, (int)size,
                       (int)hlen) != NATS_OK)
        return 0;
    kb_nats_meta meta;
    kb__nats_parse_ack(natsMsg_GetReply(m), &meta);
    kb_nats_hdrs *h = calloc(1, sizeof *h);
    if (h == NULL)
        abort();
    const char *count = NULL;
    if (natsMsgHeader_Get(m, KB_NATS_BATCH_HDR, &count) == NATS_OK && count != NULL)
        frame(m, count, h);
    else
        single(m, h);
    dead_letter(m, h);
    kb__nats_hdrs_free(h);
    free(h);
    natsMsg_free(m);
    return 0;
}
