/* Message plumbing: the aggregate ID travels in a header (never in the
 * subject), and the $JS.ACK reply subject carries the delivery metadata. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_msg.h"

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64_val(char c)
{
    const char *p = c ? strchr(b64, c) : NULL;
    return p ? (int)(p - b64) : -1;
}

/* Printable ASCII without spaces survives a header unchanged and stays
 * readable for other clients; anything else is base64. */
static bool plain_text(const unsigned char *k, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (k[i] <= 0x20 || k[i] >= 0x7f)
            return false;
    return true;
}

size_t kb__nats_put_u64(char *out, uint64_t v)
{
    char digits[20], *d = digits + sizeof digits;
    do
        *--d = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    size_t n = (size_t)(digits + sizeof digits - d);
    memcpy(out, d, n);
    out[n] = '\0';
    return n;
}

/* The decimal number in s[0..len): false unless all digits, at least one,
 * and within 64 bits. */
static bool dec(const char *s, size_t len, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (d > 9 || v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return len > 0;
}

bool kb__nats_seq_parse(const char *s, uint64_t *out)
{
    size_t n = strspn(s, "0123456789");
    return s[n] == '\0' && dec(s, n, out) && *out != 0;
}

#define KB_NATS_PLAIN_KEY_MAX (4 * 1024 / 3 + 7)   /* longer keys go base64 */

size_t kb__nats_key_hdr_len(const void *key, size_t len)
{
    if (plain_text(key, len) && len <= KB_NATS_PLAIN_KEY_MAX)
        return sizeof KB_NATS_KEY_HDR + 1 + len + 2;   /* "Kb-Key: " key "\r\n" */
    return sizeof KB_NATS_KEY_B64_HDR + 1 + 4 * ((len + 2) / 3) + 2;
}

size_t kb__nats_b64_encode(const void *src, size_t len, char *out)
{
    const unsigned char *k = src;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)k[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)k[i + 1] << 8;
        if (i + 2 < len)
            v |= k[i + 2];
        out[o++] = b64[(v >> 18) & 63];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = i + 1 < len ? b64[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? b64[v & 63] : '=';
    }
    out[o] = '\0';
    return o;
}

long kb__nats_b64_decode(const char *v, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    if (n % 4 != 0)
        return -1;
    for (size_t i = 0; i < n; i += 4) {
        int a = b64_val(v[i]), b = b64_val(v[i + 1]);
        int c = v[i + 2] == '=' ? 0 : b64_val(v[i + 2]);
        int d = v[i + 3] == '=' ? 0 : b64_val(v[i + 3]);
        if (a < 0 || b < 0 || c < 0 || d < 0 || (v[i + 2] == '=' && v[i + 3] != '=') ||
            ((v[i + 2] == '=' || v[i + 3] == '=') && i + 4 != n))
            return -1;
        uint32_t x = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
        size_t bytes = v[i + 2] == '=' ? 1 : v[i + 3] == '=' ? 2 : 3;
        if (o + bytes > cap)
            return -2;
        buf[o++] = (char)(x >> 16);
        if (bytes > 1)
            buf[o++] = (char)(x >> 8);
        if (bytes > 2)
            buf[o++] = (char)x;
    }
    return (long)o;
}

int kb__nats_set_key(natsMsg *m, const void *key, size_t len)
{
    char buf[KB_NATS_PLAIN_KEY_MAX + 1], *out = buf;
    size_t need = 4 * ((len + 2) / 3) + 1;
    if (plain_text(key, len) && len <= KB_NATS_PLAIN_KEY_MAX) {
        memcpy(buf, key, len);
        buf[len] = '\0';
        return natsMsgHeader_Set(m, KB_NATS_KEY_HDR, buf) == NATS_OK ? KB_OK : KB_ENOMEM;
    }
    if (need > sizeof buf && (out = malloc(need)) == NULL)
        return KB_ENOMEM;
    kb__nats_b64_encode(key, len, out);
    natsStatus s = natsMsgHeader_Set(m, KB_NATS_KEY_B64_HDR, out);
    if (out != buf)
        free(out);
    return s == NATS_OK ? KB_OK : KB_ENOMEM;
}

int kb__nats_get_key(natsMsg *m, char *buf, size_t cap, const char **why)
{
    const char *v = NULL;
    if (natsMsgHeader_Get(m, KB_NATS_KEY_HDR, &v) == NATS_OK && v != NULL) {
        size_t len = strlen(v);
        if (len == 0 || len > cap) {
            *why = len ? "Kb-Key header too long" : "empty Kb-Key header";
            return -1;
        }
        memcpy(buf, v, len);
        return (int)len;
    }
    if (natsMsgHeader_Get(m, KB_NATS_KEY_B64_HDR, &v) != NATS_OK || v == NULL) {
        *why = "no Kb-Key header: not written by keybus";
        return -1;
    }
    long o = kb__nats_b64_decode(v, strlen(v), buf, cap);
    if (o < 0) {
        *why = o == -2 ? "Kb-Bin-Key header too long" : "malformed Kb-Bin-Key header";
        return -1;
    }
    if (o == 0) {
        *why = "empty key";
        return -1;
    }
    return (int)o;
}

/* $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending> (v1), or
 * $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>.<token>
 * (v2). Parsed by hand for speed: it runs once per message on the
 * feeder, and natsMsg_GetMetaData allocates a jsMsgMetaData (and its strings)
 * each time. Numbers by dec(): strtoull took over half the instructions.
 * tests/test_nats_ackparse.c pins it against natsMsg_GetMetaData. */
int kb__nats_parse_ack(const char *reply, kb_nats_meta *out)
{
    if (reply == NULL || strncmp(reply, "$JS.ACK.", 8) != 0)
        return -1;
    const char *tok[16];
    size_t len[16];
    int n = 0;
    for (const char *p = reply + 8; *p && n < 16;) {
        const char *dot = strchr(p, '.');
        tok[n] = p;
        len[n] = dot ? (size_t)(dot - p) : strlen(p);
        n++;
        if (dot == NULL)
            break;
        p = dot + 1;
    }
    int c = n == 7 ? 1 : n >= 9 ? 3 : -1;
    if (c < 0 || len[c] >= sizeof out->consumer ||
        !dec(tok[c + 1], len[c + 1], &out->delivered) ||
        !dec(tok[c + 2], len[c + 2], &out->sseq) || !dec(tok[c + 3], len[c + 3], &out->dseq))
        return -1;
    memcpy(out->consumer, tok[c], len[c]);
    out->consumer[len[c]] = '\0';
    return out->sseq ? 0 : -1;
}

bool kb__nats_ack_subject(char *subj, size_t cap, const char *stream, const char *consumer,
                          uint64_t sseq, uint64_t dseq)
{
    int n = snprintf(subj, cap, "$JS.ACK.%s.%s.1.%llu.%llu.0.0", stream, consumer,
                     (unsigned long long)sseq, (unsigned long long)dseq);
    return n > 0 && (size_t)n < cap;
}

const char *kb__nats_json_str(const char *d, const char *name, size_t *len)
{
    char pat[16];
    snprintf(pat, sizeof pat, "\"%s\":\"", name);
    const char *v = strstr(d, pat), *end = v != NULL ? strchr(v + strlen(pat), '"') : NULL;
    if (end == NULL)
        return NULL;
    v += strlen(pat);
    *len = (size_t)(end - v);
    return v;
}

/* A copy of a publish (subject, every header, body) we may send again. */
natsMsg *kb__nats_msg_clone(natsMsg *m)
{
    natsMsg *c = NULL;
    if (natsMsg_Create(&c, natsMsg_GetSubject(m), NULL, natsMsg_GetData(m),
                       natsMsg_GetDataLength(m)) != NATS_OK)
        return NULL;
    const char **keys = NULL;
    int nk = 0;
    natsStatus s = natsMsgHeader_Keys(m, &keys, &nk);
    if (s == NATS_NOT_FOUND)
        return c;
    for (int i = 0; s == NATS_OK && i < nk; i++) {
        const char **vals = NULL;
        int nv = 0;
        s = natsMsgHeader_Values(m, keys[i], &vals, &nv);
        for (int j = 0; s == NATS_OK && j < nv; j++)
            s = natsMsgHeader_Add(c, keys[i], vals[j]);
        free((void *)vals);
    }
    free((void *)keys);
    if (s != NATS_OK) {
        natsMsg_Destroy(c);
        return NULL;
    }
    return c;
}
