/* Event headers (kb_header) on NATS messages and in frames; the layout is in
 * docs/headers.md. On a message each header is a NATS header of the same
 * name, and Kb-Headers lists the names in publish order (NATS headers have
 * none). nats.c 3.4.1 trims blanks around a value and misreads an empty one
 * (it takes the next header line as its value), so such values travel
 * base64 in Kb-Headers itself ("name=<base64>") instead. So does a name that
 * begins another name on the message: nats.c 3.4.1 answers a lookup of
 * "x-request" with the values of "x-requestid" (their hashes collide, found
 * by tests/fuzz/fuzz_nats_frame.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "nats_hdr.h"
#include "nats_msg.h"

/* Header i's name begins a longer one: another of h, or one of keybus's
 * (Kb-*) and NATS's (Nats-*). */
static bool begins_another(const kb_header *h, size_t n, size_t i)
{
    size_t len = strlen(h[i].name);
    if ((len < 3 && strncmp(h[i].name, "Kb-", len) == 0) ||
        (len < 5 && strncmp(h[i].name, "Nats-", len) == 0))
        return true;
    for (size_t j = 0; j < n; j++)
        if (strncmp(h[j].name, h[i].name, len) == 0 && h[j].name[len] != '\0')
            return true;
    return false;
}

/* Header i can be a NATS header of its own (else it is coded in Kb-Headers). */
static bool verbatim(const kb_header *h, size_t n, size_t i)
{
    const char *v = h[i].value;
    size_t vl = h[i].value_len;
    return vl > 0 && v[0] != ' ' && v[0] != '\t' && v[vl - 1] != ' ' && v[vl - 1] != '\t' &&
           !begins_another(h, n, i);
}

size_t kb__nats_hdr_len(const kb_header *h, size_t n)
{
    if (n == 0)
        return 0;
    size_t len = sizeof KB_NATS_HDRS_HDR + 1 + 2 + (n - 1);   /* "Kb-Headers: " ... CRLF */
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(h[i].name);
        if (verbatim(h, n, i))
            len += nl + nl + 2 + h[i].value_len + 2;   /* list entry, "name: value" CRLF */
        else
            len += nl + 1 + 4 * ((h[i].value_len + 2) / 3);
    }
    return len;
}

int kb__nats_hdr_set(natsMsg *m, const kb_header *h, size_t n)
{
    if (n == 0)
        return KB_OK;
    size_t cap = kb__nats_hdr_len(h, n) + 1;
    char *list = malloc(cap), *val = NULL;
    size_t o = 0, vcap = 0;
    natsStatus s = list != NULL ? NATS_OK : NATS_NO_MEMORY;
    for (size_t i = 0; s == NATS_OK && i < n; i++) {
        size_t nl = strlen(h[i].name);
        if (i > 0)
            list[o++] = ',';
        memcpy(list + o, h[i].name, nl);
        o += nl;
        if (!verbatim(h, n, i)) {
            list[o++] = '=';
            o += kb__nats_b64_encode(h[i].value, h[i].value_len, list + o);
            continue;
        }
        void *grown = val;
        if (kb_vec_reserve(&grown, &vcap, h[i].value_len + 1, 1) != KB_OK) {
            s = NATS_NO_MEMORY;
            break;
        }
        val = grown;
        memcpy(val, h[i].value, h[i].value_len);
        val[h[i].value_len] = '\0';
        s = natsMsgHeader_Add(m, h[i].name, val);
    }
    if (s == NATS_OK) {
        list[o] = '\0';
        s = natsMsgHeader_Set(m, KB_NATS_HDRS_HDR, list);
    }
    free(list);
    free(val);
    return s == NATS_OK ? KB_OK : KB_ENOMEM;
}

/* Check what was read against the bus's limits; *why names the problem. */
static int check(const kb_transport *t, kb_nats_hdrs *out, const char **why)
{
    if (kb_headers_check(out->h, out->n, t->max_headers, t->max_header_bytes, "headers") ==
        KB_OK)
        return 0;
    *why = kb_last_error();
    return -1;
}

static int add(kb_nats_hdrs *out, const char *name, size_t nl, const char *value, size_t vl,
               const char **why)
{
    if (out->n == KB_MAX_HEADERS || nl == 0 || nl > KB_MAX_HEADER_NAME) {
        *why = out->n == KB_MAX_HEADERS ? "more than 64 headers" : "header name of 0 or over 64 bytes";
        return -1;
    }
    if (memchr(name, '\0', nl) != NULL) {   /* a frame's: the name would be cut there */
        *why = "header name with a NUL byte";
        return -1;
    }
    memcpy(out->names[out->n], name, nl);
    out->names[out->n][nl] = '\0';
    out->h[out->n] = (kb_header){out->names[out->n], value, vl};
    out->n++;
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Another client's message: its headers other than Kb-* and Nats-*, by name. */
static int read_foreign(natsMsg *m, kb_nats_hdrs *out, const char **why)
{
    const char **keys = NULL;
    int nk = 0;
    if (natsMsgHeader_Keys(m, &keys, &nk) != NATS_OK)
        return 0;   /* no headers */
    int foreign = 0;   /* usually none: keybus's own messages carry only Kb-* and Nats-* */
    for (int i = 0; i < nk; i++)
        if (strncasecmp(keys[i], "kb-", 3) != 0 && strncasecmp(keys[i], "nats-", 5) != 0)
            keys[foreign++] = keys[i];
    if (foreign > 1)
        qsort(keys, (size_t)foreign, sizeof *keys, by_name);
    int rc = 0;
    for (int i = 0; rc == 0 && i < foreign; i++) {
        const char **vals = NULL;
        int nv = 0;
        if (natsMsgHeader_Values(m, keys[i], &vals, &nv) != NATS_OK)
            continue;
        for (int j = 0; rc == 0 && j < nv; j++)
            rc = add(out, keys[i], strlen(keys[i]), vals[j], strlen(vals[j]), why);
        free((void *)vals);
    }
    free((void *)keys);
    return rc;
}

/* The n-th value (0-based) of header `name`, or NULL. */
static const char *nth_value(natsMsg *m, const char *name, int nth)
{
    const char **vals = NULL;
    int nv = 0;
    if (natsMsgHeader_Values(m, name, &vals, &nv) != NATS_OK)
        return NULL;
    const char *v = nth < nv ? vals[nth] : NULL;
    free((void *)vals);
    return v;
}

int kb__nats_hdr_get(const kb_transport *t, natsMsg *m, kb_nats_hdrs *out, const char **why)
{
    out->n = 0;
    const char *list = NULL;
    if (natsMsgHeader_Get(m, KB_NATS_HDRS_HDR, &list) != NATS_OK || list == NULL)
        return read_foreign(m, out, why) == 0 ? check(t, out, why) : -1;
    /* base64 values decode into out->vals; offsets until it stops growing */
    size_t used = 0, offs[KB_MAX_HEADERS] = {0};
    bool coded[KB_MAX_HEADERS] = {0};
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ','), *eq;
        size_t len = end ? (size_t)(end - p) : strlen(p);
        eq = memchr(p, '=', len);
        size_t nl = eq ? (size_t)(eq - p) : len;
        if (eq != NULL) {
            size_t cl = len - nl - 1, need = used + cl / 4 * 3 + 1;
            void *grown = out->vals;
            if (kb_vec_reserve(&grown, &out->cap, need, 1) != KB_OK) {
                *why = "out of memory reading headers";
                return -1;
            }
            out->vals = grown;
            long dl = kb__nats_b64_decode(eq + 1, cl, out->vals + used, out->cap - used);
            if (dl < 0 || add(out, p, nl, NULL, (size_t)dl, why) != 0) {
                *why = dl < 0 ? "malformed Kb-Headers (bad base64 value)" : *why;
                return -1;
            }
            offs[out->n - 1] = used;
            coded[out->n - 1] = true;
            used += (size_t)dl;
        } else {
            char name[KB_MAX_HEADER_NAME + 1];
            if (nl == 0 || nl > KB_MAX_HEADER_NAME) {
                *why = "malformed Kb-Headers (header name of 0 or over 64 bytes)";
                return -1;
            }
            memcpy(name, p, nl);
            name[nl] = '\0';
            int nth = 0;   /* earlier list entries of this name take the earlier values */
            for (size_t i = 0; i < out->n; i++)
                nth += !coded[i] && strcmp(out->names[i], name) == 0;
            const char *v = nth_value(m, name, nth);
            if (v == NULL) {
                *why = "malformed Kb-Headers (names a header the message does not have)";
                return -1;
            }
            if (add(out, p, nl, v, strlen(v), why) != 0)
                return -1;
        }
        p = end ? end + 1 : p + len;
    }
    for (size_t i = 0; i < out->n; i++)
        if (coded[i])
            out->h[i].value = out->vals + offs[i];
    return check(t, out, why);
}

int kb__nats_hdr_frame(const kb_transport *t, const kb_frame_event *ev, kb_nats_hdrs *out,
                       const char **why)
{
    out->n = 0;
    const unsigned char *p = (const unsigned char *)ev->header_block;
    for (uint32_t i = 0; i < ev->n_headers; i++) {
        size_t nl = p[0];
        const char *name = (const char *)p + 1;
        uint32_t vl = (uint32_t)p[1 + nl] | (uint32_t)p[2 + nl] << 8 | (uint32_t)p[3 + nl] << 16 |
                      (uint32_t)p[4 + nl] << 24;
        if (add(out, name, nl, (const char *)p + 5 + nl, vl, why) != 0)
            return -1;
        p += 5 + nl + vl;
    }
    return check(t, out, why);
}

void kb__nats_hdrs_free(kb_nats_hdrs *h)
{
    free(h->vals);
    h->vals = NULL;
    h->cap = 0;
}
