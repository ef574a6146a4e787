/* Stored messages read again from the stream's leader (see nats_refill.h).
 * The reply is JetStream's own JSON: the fields read here (subject, base64
 * headers and body) hold no escapes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_msg.h"
#include "nats_refill.h"

/* Base64 field `name` of d decoded into a new NUL-terminated buffer (*len
 * bytes); a field that is not there at all is empty. NULL when it is there
 * but unreadable (no closing quote, not base64) or out of memory. */
static char *field(const char *d, const char *name, long *len)
{
    char key[24];
    snprintf(key, sizeof key, "\"%s\":", name);
    size_t n = 0;
    const char *v = kb__nats_json_str(d, name, &n);
    if (v == NULL && strstr(d, key) != NULL)
        return NULL;
    char *buf = malloc(n / 4 * 3 + 1);
    *len = v != NULL && buf != NULL ? kb__nats_b64_decode(v, n, buf, n / 4 * 3) : 0;
    if (buf == NULL || *len < 0) {
        free(buf);
        return NULL;
    }
    buf[*len] = '\0';
    return buf;
}

/* s without the blanks (spaces, tabs) at either end, in place. */
static char *trimmed(char *s)
{
    s += strspn(s, " \t");
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

/* The stored header block ("NATS/1.0\r\nName: value\r\n...\r\n\r\n") onto m,
 * names and values trimmed as nats.c reads a delivered message's. */
static natsStatus headers(natsMsg *m, char *block)
{
    char *line = strstr(block, "\r\n");
    while (line != NULL) {
        line += 2;
        char *end = strstr(line, "\r\n"), *colon = strchr(line, ':');
        if (end == NULL || end == line)
            return NATS_OK;   /* the blank line that ends the block */
        *end = '\0';
        if (colon == NULL || colon > end)
            return NATS_PROTOCOL_ERROR;
        *colon = '\0';
        const char *name = trimmed(line);
        if (*name == '\0')
            return NATS_PROTOCOL_ERROR;
        natsStatus s = natsMsgHeader_Add(m, name, trimmed(colon + 1));
        if (s != NATS_OK)
            return s;
        line = end;
    }
    return NATS_OK;
}

/* Is subject s (sl bytes) one `filter` takes: the same, or for "a.b.*" any
 * "a.b.<token>"? */
static bool matches(const char *filter, const char *s, size_t sl)
{
    size_t fl = strlen(filter);
    if (fl >= 2 && strcmp(filter + fl - 2, ".*") == 0)
        return sl > fl - 1 && memcmp(s, filter, fl - 1) == 0 &&
               memchr(s + fl - 1, '.', sl - (fl - 1)) == NULL;
    return sl == fl && memcmp(s, filter, sl) == 0;
}

int kb__nats_stored_read(const char *d, const char *stream, const char *subject, uint64_t from,
                         const char *consumer, uint64_t dseq, natsMsg **out, uint64_t *seq)
{
    *out = NULL;
    if (d == NULL || *d == '\0')
        return -1;   /* a status: no stream leader */
    if (strstr(d, "\"error\"") != NULL)
        return strstr(d, "10037") != NULL ? 0 : -1;   /* "no message found" */
    size_t sl = 0;
    const char *s = kb__nats_json_str(d, "subject", &sl), *q = strstr(d, "\"seq\":");
    char subj[KB_NATS_NAME];
    if (s == NULL || q == NULL || sl >= sizeof subj || !matches(subject, s, sl))
        return -1;
    memcpy(subj, s, sl);
    subj[sl] = '\0';
    errno = 0;
    *seq = q[6] >= '0' && q[6] <= '9' ? strtoull(q + 6, NULL, 10) : 0;
    if (errno == ERANGE || *seq == UINT64_MAX)
        return -1;
    char reply[3 * KB_NATS_NAME];
    if (*seq == 0 || *seq < from || !kb__nats_ack_subject(reply, sizeof reply, stream, consumer, *seq, dseq))
        return -1;
    long bl = 0, hl = 0;
    char *body = field(d, "data", &bl), *hdrs = field(d, "hdrs", &hl);
    natsStatus st = body != NULL && hdrs != NULL
                        ? natsMsg_Create(out, subj, reply, body, (int)bl)
                        : NATS_ERR;
    if (st == NATS_OK && hl > 0 && headers(*out, hdrs) != NATS_OK) {
        natsMsg_Destroy(*out);
        *out = NULL;
        st = NATS_ERR;
    }
    free(body);
    free(hdrs);
    return st == NATS_OK ? 1 : -1;
}

static void ask_body(char *body, size_t cap, const char *subject, uint64_t from)
{
    snprintf(body, cap, "{\"seq\":%llu,\"next_by_subj\":\"%s\"}", (unsigned long long)from,
             subject);
}

static void ask_api(char *api, size_t cap, const char *stream)
{
    snprintf(api, cap, "$JS.API.STREAM.MSG.GET.%s", stream);
}

bool kb__nats_stream_ask(natsConnection *nc, const char *stream, const char *subject,
                         uint64_t from, const char *reply)
{
    char api[2 * KB_NATS_NAME], body[KB_NATS_NAME + 64];
    ask_api(api, sizeof api, stream);
    ask_body(body, sizeof body, subject, from);
    return natsConnection_PublishRequestString(nc, api, reply, body) == NATS_OK;
}

int kb__nats_stream_next(kb_transport *t, const char *stream, const char *subject, uint64_t from,
                         const char *consumer, uint64_t dseq, int wait_ms, natsMsg **out,
                         uint64_t *seq)
{
    char api[2 * KB_NATS_NAME], body[KB_NATS_NAME + 64];
    ask_api(api, sizeof api, stream);
    ask_body(body, sizeof body, subject, from);
    natsMsg *r = NULL;
    *out = NULL;
    if (natsConnection_RequestString(&r, t->nc, api, body, wait_ms) != NATS_OK)
        return -1;
    int rc = kb__nats_stored_read(natsMsg_GetDataLength(r) > 0 ? natsMsg_GetData(r) : NULL,
                                  stream, subject, from, consumer, dseq, out, seq);
    natsMsg_Destroy(r);
    return rc;
}
