/* Reply objects for every connection of the transport: one reply (a whole
 * XREADGROUP answer of thousands of entries, say) lives in a few memory
 * blocks it owns, carved in order, instead of hiredis's two allocations per
 * element. The reader thread spent about half its time in malloc and free
 * building and dropping those objects. The objects are plain redisReply
 * structs, so every reader of a reply is unchanged; only the free differs:
 * kb__redis_reply_free, never freeReplyObject. Strings past the limits are
 * not copied (KB_REDIS_REPLY_OVER), so what another client wrote bounds
 * nothing but hiredis's read buffer. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

#define ALIGN 16
#define ROOM 4096                  /* the first block of an array, past its top object */
#define BLOCK (64 * 1024)          /* every further block, unless one object needs more */
#define CACHED_MAX 32              /* blocks a thread keeps for its next replies */
#define SMALL 256                  /* the block of a small reply: an XADD's ID, a GET's value */
#define SMALL_CACHED_MAX 256       /* the sender frees up to 256 at a time */

/* A block of a reply's memory; the first one holds the reply's top object. */
typedef struct block {
    struct block *prev;            /* the block filled before this one */
    size_t used, cap;              /* bytes of `mem` */
    _Alignas(ALIGN) unsigned char mem[];
} block;

/* The top object of a reply, found from its redisReply by its offset. */
typedef struct top {
    block *last;                   /* the block being filled */
    redisReply r;
} top;

static size_t round_up(size_t n)
{
    return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

static top *top_of(const redisReply *r)
{
    return (top *)(void *)((char *)r - offsetof(top, r));
}

/* Blocks a thread freed, kept for its next replies, per size: BLOCK (a read
 * of 2,048 entries takes about a megabyte, and fresh memory for each one
 * cost page faults and glibc's trimming) and SMALL (a malloc and a free per
 * XADD reply were a quarter of the sender's instructions; it frees replies
 * 256 at a time, more than glibc's per-thread cache keeps). Freed with the
 * thread. */
typedef struct cache {
    block *head;
    unsigned n;
} cache;

static _Thread_local cache cached[2];   /* [0]: BLOCK, [1]: SMALL */
static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void cache_drop(void *arg)
{
    cache *c = arg;
    for (int i = 0; i < 2; i++)
        while (c[i].head != NULL) {
            block *b = c[i].head;
            c[i].head = b->prev;
            c[i].n--;
            free(b);
        }
}

static void cache_init(void)
{
    (void)pthread_key_create(&cache_key, cache_drop);
}

/* The cache of blocks of `cap` bytes, or NULL: other sizes are not kept. */
static cache *cache_of(size_t cap)
{
    return cap == BLOCK ? &cached[0] : cap == SMALL ? &cached[1] : NULL;
}

static block *block_new(size_t cap)
{
    cache *c = cache_of(cap);
    if (c != NULL && c->head != NULL) {
        block *b = c->head;
        c->head = b->prev;
        c->n--;
        return b;
    }
    return malloc(sizeof(block) + cap);
}

static void block_free(block *b)
{
    cache *c = cache_of(b->cap);
    if (c == NULL || c->n >= (c == &cached[0] ? CACHED_MAX : SMALL_CACHED_MAX)) {
        free(b);
        return;
    }
    if (cached[0].n == 0 && cached[0].head == NULL && cached[1].n == 0 && cached[1].head == NULL) {
        pthread_once(&cache_once, cache_init);
        pthread_setspecific(cache_key, cached);   /* cache_drop at thread exit */
    }
    b->prev = c->head;
    c->head = b;
    c->n++;
}

/* `n` bytes of the reply `t` belongs to; NULL when out of memory. */
static void *carve(top *t, size_t n)
{
    block *b = t->last;
    n = round_up(n);
    if (b->cap - b->used < n) {
        size_t cap = n > BLOCK ? n : BLOCK;
        block *nb = block_new(cap);
        if (nb == NULL)
            return NULL;
        *nb = (block){.prev = b, .used = 0, .cap = cap};
        t->last = b = nb;
    }
    void *p = b->mem + b->used;
    b->used += n;
    return p;
}

/* A new object of `extra` trailing bytes for `task`: the top of a new reply
 * (its first block sized for `extra` and `room` more) or an element of its
 * parent array, linked in there. */
static redisReply *object(const redisReadTask *task, int type, size_t extra, size_t room)
{
    redisReply *r;
    char *mem;
    if (task->parent == NULL) {
        size_t first = round_up(sizeof(top)) + round_up(extra) + room;
        if (first <= SMALL)
            first = SMALL;
        block *b = block_new(first);
        if (b == NULL)
            return NULL;
        *b = (block){.prev = NULL, .used = round_up(sizeof(top)), .cap = first};
        top *t = (top *)(void *)b->mem;
        t->last = b;
        r = &t->r;
        mem = extra > 0 ? carve(t, extra) : NULL;   /* fits: `first` counted it */
    } else {
        const redisReadTask *root = task->parent;
        while (root->parent != NULL)
            root = root->parent;
        r = carve(top_of(root->obj), sizeof *r + extra);
        if (r == NULL)
            return NULL;
        mem = extra > 0 ? (char *)(r + 1) : NULL;
        redisReply *parent = task->parent->obj;
        parent->element[task->idx] = r;
    }
    *r = (redisReply){.type = type, .str = mem};
    return r;
}

/* A string of an entry's fields (element 1 of a 2-element array: [id,
 * fields]) that would take them past `entry` bytes; else counted in the
 * fields array's `integer`, which arrays do not use. Many fields each under
 * the cap must not add up to what one field may not be. */
static bool entry_full(const redisReadTask *task, size_t len, size_t entry)
{
    const redisReadTask *f = task->parent;
    if (f == NULL || f->parent == NULL || f->idx != 1 || f->parent->elements != 2)
        return false;
    redisReply *fields = f->obj;
    size_t used = (size_t)fields->integer;
    if (len > entry - used)
        return true;
    fields->integer = (long long)(used + len);
    return false;
}

/* The reader's privdata is the connection's limits: an entry another client
 * wrote past them (60 MB, say) costs hiredis's read buffer once, while it
 * is parsed, and no copy. */
static void *create_string(const redisReadTask *task, char *str, size_t len)
{
    const kb_redis_limits *lim = task->privdata;
    if (lim != NULL && task->type == REDIS_REPLY_STRING &&
        (len > lim->cap || entry_full(task, len, lim->entry))) {
        redisReply *r = object(task, KB_REDIS_REPLY_OVER, 0, 0);
        if (r != NULL)
            r->integer = (long long)len;
        return r;
    }
    redisReply *r = object(task, task->type, len + 1, 0);
    if (r == NULL)
        return NULL;
    memcpy(r->str, str, len);
    r->str[len] = '\0';
    r->len = len;
    return r;
}

static void *create_array(const redisReadTask *task, int elements)
{
    size_t n = elements > 0 ? (size_t)elements : 0;
    redisReply *r = object(task, REDIS_REPLY_ARRAY, n * sizeof(redisReply *), n > 0 ? ROOM : 0);
    if (r == NULL)
        return NULL;
    r->element = (redisReply **)(void *)r->str;
    r->str = NULL;
    r->elements = n;
    if (n > 0)
        memset(r->element, 0, n * sizeof *r->element);
    return r;
}

static void *create_integer(const redisReadTask *task, long long value)
{
    redisReply *r = object(task, REDIS_REPLY_INTEGER, 0, 0);
    if (r != NULL)
        r->integer = value;
    return r;
}

static void *create_nil(const redisReadTask *task)
{
    return object(task, REDIS_REPLY_NIL, 0, 0);
}

void kb__redis_reply_free(void *reply)
{
    if (reply == NULL)
        return;
    block *b = top_of(reply)->last;
    while (b != NULL) {
        block *prev = b->prev;
        block_free(b);
        b = prev;
    }
}

static redisReplyObjectFunctions reply_functions = {
    create_string, create_array, create_integer, create_nil, kb__redis_reply_free,
};

void kb__redis_reply_use(redisReader *r, const kb_redis_limits *lim)
{
    r->fn = &reply_functions;
    r->privdata = (void *)lim;
}

/* Errors that say "not now" rather than "never": a server still loading its
 * data after a restart, busy with a script, without its replicas, or a
 * replica now (the primary is elsewhere). */
bool kb__redis_transient(const redisReply *r)
{
    static const char *const now[] = {"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN",
                                      "CLUSTERDOWN", "NOREPLICAS", "READONLY"};
    for (size_t i = 0; i < sizeof now / sizeof *now; i++)
        if (strncmp(r->str, now[i], strlen(now[i])) == 0)
            return true;
    return false;
}
