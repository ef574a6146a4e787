/* libFuzzer target: the lease bucket's replies as the lease thread reads
 * them (kb__nats_kv_reply): a put's ack or refusal, and a read of a lease
 * or member key ($JS.API.STREAM.MSG.GET: the stored value and headers in
 * base64 inside JetStream's JSON), which decides whether a lease is free
 * (a delete marker's KV-Operation header), ours (the value is this
 * process's name) and put by this very bus (its Kb-Bus header). Anyone who
 * can write the bucket chooses the value and headers; anyone who can
 * publish to the inbox, the whole reply.
 * Input: u8 mode, then for mode 0 the raw reply, read as a put's and as a
 * read's answer; for mode 1 a stored message as the server sends it, built
 * here: u32 sequence, u8 value length, the value, then header names and
 * values split at NUL bytes; its answer is known exactly. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transports/nats/nats_kv.h"
#include "../../transports/nats/nats_msg.h"
#include "fuzz_buf.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* nats.c's message constructor and its GC thread's free (see fuzz_nats_frame.c). */
natsStatus natsMsg_create(natsMsg **newMsg, const char *subject, int subjLen, const char *reply,
                          int replyLen, const char *buf, int bufLen, int hdrLen);
void natsMsg_free(void *object);

#define SUBJECT "_INBOX.fuzz.1.0"
#define HDRS_CAP 1023   /* kb__nats_kv_reply decodes the headers into 1 KiB */

static kb_transport t;   /* only id and bus_id are read */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (nats_Open(-1) != NATS_OK)
        abort();
    strcpy(t.id, "c1-host-4242");
    strcpy(t.bus_id, "b7f3a9e1");
    return 0;
}

static kb_nats_kv_op answer(const char *body, size_t len, bool get)
{
    kb_nats_kv_ops ops = {NULL, 0, 0, 0};
    natsMsg *m = NULL;
    if (kb__nats_kv_add(&ops, get ? "l.s.g.0" : "m.c1", NULL, 0, get) == NULL ||
        natsMsg_create(&m, SUBJECT, (int)strlen(SUBJECT), NULL, 0, body, (int)len, 0) != NATS_OK)
        abort();
    kb__nats_kv_reply(&t, &ops.v[0], m);
    natsMsg_free(m);
    kb_nats_kv_op k = ops.v[0];
    free(ops.v);
    /* every answer is one of these, and only a stored read is ours */
    if ((k.s != NATS_OK && k.s != NATS_ERR && k.s != NATS_NOT_FOUND &&
         k.s != NATS_NO_RESPONDERS) ||
        (k.s == NATS_NO_RESPONDERS) != (len == 0) || (!get && k.s == NATS_NOT_FOUND) ||
        (k.ours && (!get || k.s != NATS_OK)) || (k.this_bus && !k.ours))
        abort();
    return k;
}

static void raw(const uint8_t *data, size_t size)
{
    answer((const char *)data, size, false);
    kb_nats_kv_op k = answer((const char *)data, size, true);
    const char *nul = memchr(data, '\0', size);
    size_t text = nul != NULL ? (size_t)(nul - (const char *)data) : size;
    if (k.ours && memmem(data, text, "\"data\":\"", 8) == NULL)
        abort();   /* the name was read from the reply's data */
}

static void put_b64(fuzz_buf *b, const void *s, size_t n)
{
    char *enc = malloc(4 * ((n + 2) / 3) + 1);
    if (enc == NULL)
        abort();
    fuzz_put(b, enc, kb__nats_b64_encode(s, n, enc));
    free(enc);
}

/* A header line nats.c would write: a name of visible bytes without ':', a
 * value without CR, LF or NUL. */
static bool header_ok(const char *name, const char *value)
{
    for (const char *c = name; *c != '\0'; c++)
        if (*c <= ' ' || *c == ':' || *c == 0x7f)
            return false;
    return name[0] != '\0' && strpbrk(value, "\r\n") == NULL;
}

static void stored(const uint8_t *data, size_t size)
{
    if (size < 5)
        return;
    uint32_t seq = (uint32_t)data[0] << 24 | (uint32_t)data[1] << 16 | (uint32_t)data[2] << 8 |
                   data[3];
    size_t vlen = data[4] < size - 5 ? data[4] : size - 5;
    const char *value = (const char *)data + 5;
    size_t rest = size - 5 - vlen;
    char *h = malloc(rest + 2);
    if (h == NULL)
        abort();
    memcpy(h, value + vlen, rest);
    h[rest] = h[rest + 1] = '\0';
    fuzz_buf block = {0};
    bool deleted = false, bus = false;
    for (char *name = h; name < h + rest;) {
        char *v = name + strlen(name) + 1;
        if (v > h + rest)
            v = h + rest;   /* its NUL: an empty value */
        if (header_ok(name, v)) {
            if (block.n == 0)
                fuzz_put(&block, "NATS/1.0\r\n", 10);
            fuzz_put(&block, name, strlen(name));
            fuzz_put(&block, ": ", 2);
            fuzz_put(&block, v, strlen(v));
            fuzz_put(&block, "\r\n", 2);
            deleted |= strcmp(name, "KV-Operation") == 0;
            bus |= strcmp(name, "Kb-Bus") == 0 && strcmp(v, t.bus_id) == 0;
        }
        name = v + strlen(v) + 1;
    }
    if (block.n > 0)
        fuzz_put(&block, "\r\n", 2);
    /* nats-server's StoredMsg: hdrs and data left out when empty */
    fuzz_buf r = {0};
    char num[24];
    static const char head[] = "{\"type\":\"io.nats.jetstream.api.v1.stream_msg_get_response\","
                               "\"message\":{\"subject\":\"$KV.keybus_leases.l.s.g.0\",\"seq\":";
    fuzz_put(&r, head, sizeof head - 1);
    int numlen = snprintf(num, sizeof num, "%" PRIu32, seq);
    fuzz_put(&r, num, (size_t)numlen);
    if (block.n > 0) {
        fuzz_put(&r, ",\"hdrs\":\"", 9);
        put_b64(&r, block.p, block.n);
        fuzz_put(&r, "\"", 1);
    }
    if (vlen > 0) {
        fuzz_put(&r, ",\"data\":\"", 9);
        put_b64(&r, value, vlen);
        fuzz_put(&r, "\"", 1);
    }
    static const char tail[] = ",\"time\":\"2026-11-28T16:00:00.123456789Z\"}}";
    fuzz_put(&r, tail, sizeof tail - 1);
    kb_nats_kv_op k = answer(r.p, r.n, true);
    bool ours = !deleted && vlen == strlen(t.id) && memcmp(value, t.id, vlen) == 0;
    if (block.n <= HDRS_CAP &&
        (k.s != (deleted ? NATS_NOT_FOUND : NATS_OK) || k.rev != seq || k.ours != ours ||
         k.this_bus != (ours && bus)))
        abort();
    /* the same message as a put's ack: stored, at that sequence */
    k = answer(r.p, r.n, false);
    if (k.s != NATS_OK || k.rev != seq)
        abort();
    free(r.p), free(block.p), free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] & 1)
        stored(data + 1, size - 1);
    else
        raw(data + 1, size - 1);
    return 0;
}
