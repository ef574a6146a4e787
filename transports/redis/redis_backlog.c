/* The backlog: accepted publishes as the XADD commands the sender writes,
 * kept until the server confirmed each, so a lost connection loses nothing
 * (they are written again). Bytes in a list of chunks, records in a ring;
 * all under pub_lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

#define CHUNK (256 * 1024)   /* a chunk, unless one record needs more */

static void chunk_done(kb_redis_backlog *bl, kb_redis_chunk *c);

/* Room for `need` more bytes at the end of the newest chunk: a chunk is
 * added (a spare one when it fits) when they do not fit there. An empty
 * newest chunk (the backlog emptied) that is too small is retired first: a
 * chunk of no bytes left before the new one would never be popped past. */
static bool bytes_reserve(kb_redis_backlog *bl, size_t need)
{
    if (bl->newest != NULL && bl->newest->cap - bl->newest->len >= need)
        return true;
    if (bl->newest != NULL && bl->newest->len == 0) {   /* then n == 0: it is the only one */
        chunk_done(bl, bl->newest);
        bl->oldest = bl->newest = bl->sending = NULL;
    }
    kb_redis_chunk *c = bl->spare;
    if (c != NULL && c->cap >= need) {
        bl->spare = c->next;
        bl->spares--;
    } else {
        size_t cap = need > CHUNK ? need : CHUNK;
        if ((c = malloc(sizeof *c + cap)) == NULL)
            return false;
        c->cap = cap;
    }
    c->next = NULL;
    c->len = 0;
    if (bl->newest == NULL) {
        bl->oldest = bl->sending = c;
        bl->head = bl->sent = 0;
    } else {
        bl->newest->next = c;
    }
    bl->newest = c;
    return true;
}

/* An emptied chunk: kept for reuse when it has the usual size and the
 * spares hold less than the bound's worth (spare_max chunks). */
static void chunk_done(kb_redis_backlog *bl, kb_redis_chunk *c)
{
    if (c->cap != CHUNK || bl->spares >= bl->spare_max) {
        free(c);
        return;
    }
    c->next = bl->spare;
    bl->spare = c;
    bl->spares++;
}

void kb__redis_backlog_init(kb_redis_backlog *bl, size_t bound)
{
    memset(bl, 0, sizeof *bl);
    bl->spare_max = bound / CHUNK;
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
    kb__redis_cmd_put(bl->newest->buf + bl->newest->len, argc, argv, lens);
    bl->newest->len += need;
    bl->held += need;
    bl->rec[(bl->first + bl->n++) % bl->rcap] = (kb_redis_pubrec){p, need, big, p != NULL, false};
    return true;
}

bool kb__redis_backlog_copy(kb_redis_backlog *bl, const kb_redis_pubrec *r, const char *bytes)
{
    if (!rec_reserve(bl) || !bytes_reserve(bl, r->len))
        return false;
    memcpy(bl->newest->buf + bl->newest->len, bytes, r->len);
    bl->newest->len += r->len;
    bl->held += r->len;
    bl->rec[(bl->first + bl->n++) % bl->rcap] = *r;
    return true;
}

kb_redis_pubrec kb__redis_backlog_pop(kb_redis_backlog *bl)
{
    kb_redis_pubrec r = bl->rec[bl->first];
    bl->first = (bl->first + 1) % bl->rcap;
    bl->n--;
    bl->held -= r.len;
    bl->head += r.len;
    if (bl->n == 0) {   /* empty: start over at the newest chunk's start */
        while (bl->oldest != bl->newest) {
            kb_redis_chunk *c = bl->oldest;
            bl->oldest = c->next;
            chunk_done(bl, c);
        }
        bl->newest->len = bl->head = bl->sent = 0;
        bl->sending = bl->newest;
    } else if (bl->head == bl->oldest->len) {   /* n > 0: a newer chunk holds the rest */
        kb_redis_chunk *c = bl->oldest;
        bl->oldest = c->next;
        bl->head = 0;
        if (bl->sending == c) {
            bl->sending = bl->oldest;
            bl->sent = 0;
        }
        chunk_done(bl, c);
    }
    return r;
}

const char *kb__redis_backlog_unsent(kb_redis_backlog *bl, size_t *len)
{
    *len = 0;
    if (bl->sending == NULL)
        return NULL;
    if (bl->sent == bl->sending->len && bl->sending->next != NULL) {
        bl->sending = bl->sending->next;
        bl->sent = 0;
    }
    *len = bl->sending->len - bl->sent;
    return bl->sending->buf + bl->sent;
}

void kb__redis_backlog_wrote(kb_redis_backlog *bl, size_t n)
{
    bl->sent += n;
}

bool kb__redis_backlog_due(const kb_redis_backlog *bl)
{
    return bl->n > 0 && (bl->sending != bl->oldest || bl->sent > bl->head);
}

void kb__redis_backlog_rewind(kb_redis_backlog *bl)
{
    bl->sending = bl->oldest;
    bl->sent = bl->head;
}

size_t kb__redis_backlog_written(const kb_redis_backlog *bl)
{
    const kb_redis_chunk *c = bl->oldest;
    size_t at = bl->head, i = 0;
    for (; i < bl->n; i++) {
        size_t len = bl->rec[(bl->first + i) % bl->rcap].len;
        while (at == c->len && c != bl->sending) {   /* chunks before sending went whole */
            c = c->next;
            at = 0;
        }
        if (c == bl->sending && at + len > bl->sent)
            break;
        at += len;
    }
    return i;
}

const char *kb__redis_backlog_oldest(const kb_redis_backlog *bl)
{
    return bl->oldest->buf + bl->head;
}

/* In place: a kept record moves towards the oldest end, never past one not
 * read yet (the write point trails the read point in the same chunk, and
 * an earlier chunk was read whole), so dropping needs no memory. */
uint64_t kb__redis_backlog_drop_over(kb_redis_backlog *bl, size_t max,
                                     bool (*drop)(void *arg, const kb_redis_pubrec *r,
                                                  const char *bytes),
                                     void *arg)
{
    if (bl->n == 0)
        return 0;
    kb_redis_chunk *c = bl->oldest, *w = bl->oldest;
    size_t at = bl->head, wat = bl->head, n = bl->n, kept = 0;
    uint64_t dropped = 0;
    for (size_t i = 0; i < n; i++) {
        kb_redis_pubrec r = bl->rec[(bl->first + i) % bl->rcap];
        while (at == c->len) {   /* the record is in a newer chunk */
            c = c->next;
            at = 0;
        }
        if (r.big > max && (drop == NULL || drop(arg, &r, c->buf + at))) {
            dropped += r.events;
            bl->held -= r.len;
        } else {
            while (w != c && w->cap - wat < r.len) {   /* w was read whole: reuse what follows */
                w->len = wat;
                w = w->next;
                wat = 0;
            }
            memmove(w->buf + wat, c->buf + at, r.len);
            wat += r.len;
            bl->rec[(bl->first + kept++) % bl->rcap] = r;   /* never ahead of i */
        }
        at += r.len;
    }
    w->len = wat;
    while (w->next != NULL) {   /* emptied */
        kb_redis_chunk *done = w->next;
        w->next = done->next;
        chunk_done(bl, done);
    }
    bl->newest = w;
    bl->n = kept;
    if (kept == 0)   /* w is the oldest: start over at its start */
        w->len = bl->head = 0;
    /* chunks w passed that kept no record go: a chunk of none would stop
     * the sender's walk and pop's (the oldest one's records start at head) */
    for (kb_redis_chunk **l = &bl->oldest; *l != w;) {
        kb_redis_chunk *o = *l;
        if (o->len > (l == &bl->oldest ? bl->head : 0)) {
            l = &o->next;
            continue;
        }
        *l = o->next;
        if (l == &bl->oldest)
            bl->head = 0;
        chunk_done(bl, o);
    }
    /* only after a lost connection: everything is written again */
    bl->sending = bl->oldest;
    bl->sent = bl->head;
    return dropped;
}

void kb__redis_backlog_each(const kb_redis_backlog *bl,
                            void (*fn)(void *arg, const kb_redis_pubrec *r, const char *bytes),
                            void *arg)
{
    const kb_redis_chunk *c = bl->oldest;
    size_t at = bl->head;
    for (size_t i = 0; i < bl->n; i++) {
        const kb_redis_pubrec *r = &bl->rec[(bl->first + i) % bl->rcap];
        while (at == c->len) {   /* the record is in a newer chunk */
            c = c->next;
            at = 0;
        }
        fn(arg, r, c->buf + at);
        at += r->len;
    }
}

uint64_t kb__redis_backlog_events(const kb_redis_backlog *bl)
{
    uint64_t n = 0;
    for (size_t i = 0; i < bl->n; i++) {
        const kb_redis_pubrec *r = &bl->rec[(bl->first + i) % bl->rcap];
        n += r->p != NULL ? r->events : 0;
    }
    return n;
}

void kb__redis_backlog_free(kb_redis_backlog *bl)
{
    for (kb_redis_chunk *lists[2] = {bl->oldest, bl->spare}, **l = lists; l < lists + 2; l++)
        while (*l != NULL) {
            kb_redis_chunk *c = *l;
            *l = c->next;
            free(c);
        }
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
