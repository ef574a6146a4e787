/* The backlog: accepted publishes as the XADD commands the sender writes,
 * kept until the server confirmed each, so a lost connection loses nothing
 * (they are written again). Bytes in one buffer, records in a ring; all
 * under pub_lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

/* Room for `need` more bytes: the confirmed prefix is reclaimed first when it
 * is at least as long as what is left to confirm (so a byte is moved at most
 * about once: a small prefix reclaimed from a full buffer would move the whole
 * backlog for every publish), else the buffer grows. */
static bool bytes_reserve(kb_redis_backlog *bl, size_t need)
{
    if (bl->len + need <= bl->cap)
        return true;
    if (bl->head > 0 && bl->head >= bl->len - bl->head) {
        memmove(bl->buf, bl->buf + bl->head, bl->len - bl->head);
        bl->sent -= bl->head;
        bl->len -= bl->head;
        bl->head = 0;
    }
    return kb_vec_reserve((void **)&bl->buf, &bl->cap, bl->len + need, 1) == KB_OK;
}

static bool rec_reserve(kb_redis_backlog *bl)
{
    if (bl->n < bl->rcap)
        return true;
    size_t old = bl->rcap;
    if (kb_vec_reserve((void **)&bl->rec, &bl->rcap, old ? old * 2 : 1024, sizeof *bl->rec) != KB_OK)
        return false;
    if (bl->first + bl->n > old)   /* the wrapped start goes after the old end */
        memcpy(bl->rec + old, bl->rec, (bl->first + bl->n - old) * sizeof *bl->rec);
    return true;
}

static size_t digits(size_t v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* "<prefix><v>\r\n" at out; the bytes written. */
static size_t put_header(char *out, char prefix, size_t v)
{
    size_t n = digits(v);
    out[0] = prefix;
    for (size_t i = n; i > 0; i--, v /= 10)
        out[i] = (char)('0' + v % 10);
    out[n + 1] = '\r';
    out[n + 2] = '\n';
    return n + 3;
}

size_t kb__redis_backlog_cmd_bytes(int argc, const size_t *lens)
{
    size_t need = digits((size_t)argc) + 3;
    for (int i = 0; i < argc; i++)
        need += digits(lens[i]) + 3 + lens[i] + 2;
    return need;
}

char *kb__redis_cmd_put(char *out, int argc, const char **argv, const size_t *lens)
{
    out += put_header(out, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        out += put_header(out, '$', lens[i]);
        if (lens[i] > 0)
            memcpy(out, argv[i], lens[i]);
        out += lens[i];
        *out++ = '\r';
        *out++ = '\n';
    }
    return out;
}

bool kb__redis_backlog_add(kb_redis_backlog *bl, kb_redis_part *p, size_t big, int argc,
                           const char **argv, const size_t *lens)
{
    size_t need = kb__redis_backlog_cmd_bytes(argc, lens);
    if (!rec_reserve(bl) || !bytes_reserve(bl, need))
        return false;
    kb__redis_cmd_put(bl->buf + bl->len, argc, argv, lens);
    bl->len += need;
    bl->rec[(bl->first + bl->n++) % bl->rcap] = (kb_redis_pubrec){p, need, big};
    return true;
}

kb_redis_pubrec kb__redis_backlog_pop(kb_redis_backlog *bl)
{
    kb_redis_pubrec r = bl->rec[bl->first];
    bl->first = (bl->first + 1) % bl->rcap;
    bl->n--;
    bl->head += r.len;
    if (bl->n == 0)   /* empty: start over at the buffer's start */
        bl->head = bl->sent = bl->len = 0;
    return r;
}

uint64_t kb__redis_backlog_drop_over(kb_redis_backlog *bl, size_t max)
{
    size_t from = bl->head, to = bl->head, kept = 0, n = bl->n;
    uint64_t dropped = 0;
    for (size_t i = 0; i < n; i++) {
        kb_redis_pubrec r = bl->rec[(bl->first + i) % bl->rcap];
        if (r.big > max) {
            dropped++;
        } else {
            memmove(bl->buf + to, bl->buf + from, r.len);
            bl->rec[(bl->first + kept++) % bl->rcap] = r;
            to += r.len;
        }
        from += r.len;
    }
    bl->n = kept;
    bl->len = to;
    bl->sent = bl->head;   /* only after a lost connection: everything is written again */
    return dropped;
}

uint64_t kb__redis_backlog_events(const kb_redis_backlog *bl)
{
    uint64_t n = 0;
    for (size_t i = 0; i < bl->n; i++)
        n += bl->rec[(bl->first + i) % bl->rcap].p != NULL;
    return n;
}

void kb__redis_backlog_free(kb_redis_backlog *bl)
{
    free(bl->buf);
    free(bl->rec);
    memset(bl, 0, sizeof *bl);
}

void kb__redis_note_last(kb_redis_part *p, const char *id)
{
    size_t n = strnlen(id, sizeof p->last_id - 1);
    if (p->last_id[0] == '\0' || kb__redis_id_cmp(id, p->last_id) > 0) {
        memcpy(p->last_id, id, n);
        p->last_id[n] = '\0';
    }
}
