/* Flat [name, value, ...] replies (stream entry fields, XINFO rows), and
 * event headers as entry fields: header `name` is the field "h.<name>", after
 * k, d and a, in publish order, so other clients read and write them with
 * plain XADD / XRANGE (docs/headers.md). */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "redis_int.h"

#define PREFIX_LEN (sizeof KB_REDIS_HEADER_PREFIX - 1)

const redisReply *kb__redis_map_get(const redisReply *m, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 0; m != NULL && m->type == REDIS_REPLY_ARRAY && i + 1 < m->elements; i += 2) {
        const redisReply *f = m->element[i];
        if (f->type == REDIS_REPLY_STRING && f->len == len && memcmp(f->str, name, len) == 0)
            return m->element[i + 1];
    }
    return NULL;
}

const redisReply *kb__redis_field(const redisReply *fields, const char *name)
{
    const redisReply *v = kb__redis_map_get(fields, name);
    return v != NULL && v->type == REDIS_REPLY_STRING ? v : NULL;
}

const redisReply *kb__redis_group_row_of(const redisReply *groups, const char *group)
{
    for (size_t i = 0; groups->type == REDIS_REPLY_ARRAY && i < groups->elements; i++) {
        const redisReply *name = kb__redis_field(groups->element[i], "name");
        if (name != NULL && strcmp(name->str, group) == 0)
            return groups->element[i];
    }
    return NULL;   /* an error reply: no stream yet */
}

const redisReply *kb__redis_group_row(const kb_transport *t, const redisReply *groups)
{
    return kb__redis_group_row_of(groups, t->group);
}

/* Another consumer has entries pending in this partition: `x` is the summary
 * form of XPENDING ([count, min, max, [[consumer, count]...]]). */
bool kb__redis_foreign_pending(const kb_transport *t, const redisReply *x)
{
    if (x->type != REDIS_REPLY_ARRAY || x->elements < 4 || x->element[3]->type != REDIS_REPLY_ARRAY)
        return false;
    const redisReply *cs = x->element[3];
    for (size_t i = 0; i < cs->elements; i++) {
        const redisReply *c = cs->element[i];
        if (c->type == REDIS_REPLY_ARRAY && c->elements >= 2 &&
            c->element[0]->type == REDIS_REPLY_STRING && strcmp(c->element[0]->str, t->consumer) != 0)
            return true;
    }
    return false;
}

/* Element j of the MGET array `m` holds our token: else the lease is lost. */
bool kb__redis_lease_ours(const kb_transport *t, const redisReply *m, size_t j)
{
    if (j >= m->elements)
        return false;
    const redisReply *y = m->element[j];
    return y->type == REDIS_REPLY_STRING && y->len == strlen(t->token) &&
           memcmp(y->str, t->token, y->len) == 0;
}

/* The decimal number at *s (0 when none; saturated past 64 bits), *s moved
 * after it. By hand, as is the comparison below: strtoull cost the sender
 * ~900 instructions per XADD reply (kb__redis_note_last), more than the rest
 * of its work on it. */
static unsigned long long id_number(const char **s)
{
    unsigned long long v = 0;
    for (; **s >= '0' && **s <= '9'; (*s)++) {
        unsigned d = (unsigned)(**s - '0');
        bool over = v > ULLONG_MAX / 10 || (v == ULLONG_MAX / 10 && d > ULLONG_MAX % 10);
        v = over ? ULLONG_MAX : v * 10 + d;
    }
    return v;
}

/* Digits of a number written as the server writes it: no leading zero, at
 * most 19 digits (so it fits 64 bits); 0 when s is not one. */
static size_t plain_digits(const char *s)
{
    size_t n = 0;
    while (s[n] >= '0' && s[n] <= '9')
        n++;
    return n == 0 || n > 19 || (s[0] == '0' && n > 1) ? 0 : n;
}

uint32_t kb__redis_number_below(const redisReply *v, uint32_t limit, uint32_t dflt)
{
    if (v == NULL || v->len == 0 || v->len > 10)
        return dflt;
    uint64_t n = 0;
    for (size_t i = 0; i < v->len; i++) {
        if (v->str[i] < '0' || v->str[i] > '9')
            return dflt;
        n = n * 10 + (uint64_t)(v->str[i] - '0');
    }
    return n < limit ? (uint32_t)n : dflt;
}

int kb__redis_id_cmp(const char *a, const char *b)
{
    /* IDs as the server writes them order by length, then bytes */
    size_t am = plain_digits(a), bm = plain_digits(b);
    size_t as = am && a[am] == '-' ? plain_digits(a + am + 1) : 0;
    size_t bs = bm && b[bm] == '-' ? plain_digits(b + bm + 1) : 0;
    if (as && bs && a[am + 1 + as] == '\0' && b[bm + 1 + bs] == '\0') {
        int c = am != bm ? (am < bm ? -1 : 1) : memcmp(a, b, am);
        if (c == 0)
            c = as != bs ? (as < bs ? -1 : 1) : memcmp(a + am + 1, b + bm + 1, as);
        return c < 0 ? -1 : c > 0;
    }
    unsigned long long an = id_number(&a), aq = *a == '-' ? (a++, id_number(&a)) : 0;
    unsigned long long bn = id_number(&b), bq = *b == '-' ? (b++, id_number(&b)) : 0;
    if (an != bn)
        return an < bn ? -1 : 1;
    return aq < bq ? -1 : aq > bq;
}

/* 1 to 20 decimal digits whose value fits 64 bits; *end after them. */
static bool id_part(const char *s, const char **end)
{
    size_t n = 0;
    unsigned long long v = 0;
    for (; s[n] >= '0' && s[n] <= '9'; n++) {
        unsigned d = (unsigned)(s[n] - '0');
        if (n == 20 || v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *end = s + n;
    return n > 0;
}

bool kb__redis_id_valid(const char *id)
{
    const char *p;
    return id_part(id, &p) && *p == '-' && id_part(p + 1, &p) && *p == '\0';
}

bool kb__redis_id_after(const char *id, char *out, size_t n)
{
    if (!kb__redis_id_valid(id))
        return false;
    unsigned long long ms = id_number(&id);
    id++;
    unsigned long long seq = id_number(&id);
    if (seq == ULLONG_MAX && ms == ULLONG_MAX)
        return false;
    if (seq == ULLONG_MAX)
        ms++;
    seq = seq == ULLONG_MAX ? 0 : seq + 1;
    int len = snprintf(out, n, "%llu-%llu", ms, seq);
    return len > 0 && (size_t)len < n;
}

size_t kb__redis_headers_args(const kb_header *h, size_t n, char *names, const char **argv,
                              size_t *lens)
{
    for (size_t i = 0; i < n; i++) {
        char *f = names + i * KB_REDIS_HEADER_FIELD_MAX;
        int len = snprintf(f, KB_REDIS_HEADER_FIELD_MAX, "%s%s", KB_REDIS_HEADER_PREFIX,
                           h[i].name);
        argv[2 * i] = f;
        lens[2 * i] = (size_t)len;
        argv[2 * i + 1] = h[i].value_len > 0 ? h[i].value : "";
        lens[2 * i + 1] = h[i].value_len;
    }
    return 2 * n;
}

int kb__redis_headers_of(const redisReply *fields, kb_header *out, size_t *n, char *why,
                         size_t whylen)
{
    *n = 0;
    for (size_t i = 0; fields != NULL && fields->type == REDIS_REPLY_ARRAY &&
                       i + 1 < fields->elements; i += 2) {
        const redisReply *f = fields->element[i], *v = fields->element[i + 1];
        if (f->type != REDIS_REPLY_STRING || f->len < PREFIX_LEN ||
            memcmp(f->str, KB_REDIS_HEADER_PREFIX, PREFIX_LEN) != 0)
            continue;
        if (*n == KB_MAX_HEADERS) {
            kb_errf(why, whylen, "malformed header fields: more than %d", KB_MAX_HEADERS);
            return KB_ETOOBIG;
        }
        if (strlen(f->str) != f->len) {   /* the name would be cut at the NUL */
            kb_errf(why, whylen, "malformed header field %zu: its name has a NUL byte", *n);
            return KB_EINVAL;
        }
        bool str = v->type == REDIS_REPLY_STRING;
        out[(*n)++] = (kb_header){f->str + PREFIX_LEN, str ? v->str : "", str ? v->len : 0};
    }
    int rc = kb_headers_check(out, *n, KB_MAX_HEADERS, KB_REDIS_HEADER_BYTES,
                               "malformed header fields");
    if (rc != KB_OK && why != NULL)
        snprintf(why, whylen, "%s", kb_last_error());
    return rc;
}
