/* Per-key progress of a claim's handlers, and its record in the runs bucket:
 * key <stream>.done.<consumer>, one line "<key hash> <partition> <stream
 * seq> <event index>" per key. A key is found by its 64-bit FNV-1a hash in
 * an open-addressed table of a fixed size; a key that finds no free slot
 * within a few probes is not tracked (its events come again, as before).
 * Slots are never emptied, and only the executor running a key's event
 * writes that key's position (per-key order: one at a time).
 *
 * A released event (declined, fenced, or never delivered) stays unacked and
 * comes again, but its key goes on: a later event of the key may raise the
 * position past it. So the claim keeps the key's lowest released position
 * (the claim's, for an event whose key it cannot track or does not know),
 * and neither its record nor its own skips reach that far. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nats_names.h"
#include "nats_progress.h"

#define IDX_BITS 13        /* an event's index in its frame: <= KB_NATS_BATCH_MAX */
#define PROBES 8
#define LINE_BYTES 64      /* a record line, at most (16 + 10 + 20 + 4 digits, blanks, newline) */

typedef struct slot {
    _Atomic uint64_t hash;     /* the key's; 0: free */
    _Atomic uint64_t pos;      /* stream seq << IDX_BITS | index; 0: none yet */
    _Atomic uint64_t released; /* the key's lowest released position; 0: none */
    _Atomic uint32_t part;
} slot;

struct kb_nats_progress {
    uint32_t slots;            /* a power of two */
    /* a position moved since the acker's last write: set by a note only when
     * clear, so executors share its cache line read-only between writes */
    _Atomic bool dirty;
    _Atomic uint64_t released_min; /* lowest released position of an untracked key or
                                    * of none; UINT64_MAX: none */
    /* the final record is written (the lease thread, at a hand-over): the
     * acker writes no more; `writing` keeps the two from overlapping */
    _Atomic bool final;
    _Atomic bool writing;
    bool final_tried;          /* once per claim: a failed put is not tried again */
    int64_t written_ns;        /* acker */
    uint64_t inherited_to;     /* highest stream seq taken from earlier records */
    slot slot[];
};

static uint64_t key_hash(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h != 0 ? h : 1;
}

/* The key's slot, taking a free one when `add`; NULL when it has none. */
static slot *find(struct kb_nats_progress *g, uint64_t h, bool add)
{
    for (uint32_t i = 0; i < PROBES; i++) {
        slot *s = &g->slot[(h + i) & (g->slots - 1)];
        uint64_t have = atomic_load_explicit(&s->hash, memory_order_acquire);
        if (have == h)
            return s;
        if (have == 0) {
            if (!add)
                return NULL;
            uint64_t free_slot = 0;
            if (atomic_compare_exchange_strong(&s->hash, &free_slot, h) || free_slot == h)
                return s;
        }
    }
    return NULL;
}

/* Raise a slot's position (one writer per key at a time; the lease thread
 * fills slots before any executor sees the claim). */
static void raise_to(slot *s, uint64_t pos, uint32_t part)
{
    if (atomic_load_explicit(&s->pos, memory_order_relaxed) >= pos)
        return;
    atomic_store_explicit(&s->part, part, memory_order_relaxed);
    atomic_store_explicit(&s->pos, pos, memory_order_release);
}

/* An event's position: its stream sequence and its index in the frame (the
 * delivery ID's ".<i>"; 0 for a plain message). UINT64_MAX when the index
 * does not fit. */
static uint64_t position(uint64_t sseq, const char *id)
{
    const char *dot = strchr(id, '.');
    uint64_t idx = dot != NULL ? strtoull(dot + 1, NULL, 10) : 0;
    return idx < (1u << IDX_BITS) ? sseq << IDX_BITS | idx : UINT64_MAX;
}

/* The slot's position as far as a record or a skip may vouch for it: below
 * every released event of its key and of keys not tracked. */
static uint64_t vouched(const struct kb_nats_progress *g, const slot *s)
{
    uint64_t pos = atomic_load_explicit(&s->pos, memory_order_acquire);
    uint64_t cap = atomic_load_explicit(&g->released_min, memory_order_acquire);
    uint64_t own = atomic_load_explicit(&s->released, memory_order_acquire);
    if (own != 0 && own < cap)
        cap = own;
    return pos < cap ? pos : cap - 1;
}

/* Lower *at to pos (0 counts as none). */
static void lower_to(_Atomic uint64_t *at, uint64_t pos)
{
    uint64_t have = atomic_load(at);
    while ((have == 0 || pos < have) && !atomic_compare_exchange_weak(at, &have, pos))
        ;
}

bool kb__nats_progress_ready(kb_nats_claim *c)
{
    if (atomic_load_explicit(&c->progress, memory_order_acquire) != NULL)
        return true;
    uint32_t n = c->wide ? KB_NATS_PROGRESS_WIDE : KB_NATS_PROGRESS_PART;
    struct kb_nats_progress *g = calloc(1, sizeof *g + n * sizeof g->slot[0]);
    if (g == NULL)
        return false;
    g->slots = n;
    atomic_init(&g->released_min, UINT64_MAX);
    atomic_store_explicit(&c->progress, g, memory_order_release);
    return true;
}

void kb__nats_progress_note(const kb_nats_entry *e, const kb_delivery *d)
{
    struct kb_nats_progress *g = atomic_load_explicit(&e->claim->progress, memory_order_acquire);
    if (g == NULL || d->key == NULL)
        return;
    uint64_t pos = position(e->sseq, d->id);
    slot *s = find(g, key_hash(d->key, d->key_len), true);
    if (s == NULL || pos == UINT64_MAX)
        return;
    raise_to(s, pos, d->partition);
    /* The position's store before the flag's load: else the acker may clear
     * the flag, read the old position, and this note never be written. */
    atomic_thread_fence(memory_order_seq_cst);
    if (!atomic_load_explicit(&g->dirty, memory_order_relaxed))
        atomic_store_explicit(&g->dirty, true, memory_order_release);
}

void kb__nats_progress_released(kb_nats_claim *c, uint64_t sseq, const char *id,
                                const void *key, size_t key_len)
{
    struct kb_nats_progress *g = atomic_load_explicit(&c->progress, memory_order_acquire);
    if (g == NULL)
        return;
    uint64_t pos = position(sseq, id);
    if (pos == UINT64_MAX)
        pos = sseq << IDX_BITS;   /* the whole message */
    /* a slot taken now: a later event of the key finds the same one */
    slot *s = key != NULL ? find(g, key_hash(key, key_len), true) : NULL;
    lower_to(s != NULL ? &s->released : &g->released_min, pos);
}

bool kb__nats_progress_covers(const kb_nats_claim *c, const void *key, size_t key_len,
                              uint64_t sseq, uint32_t idx)
{
    struct kb_nats_progress *g = atomic_load_explicit(&c->progress, memory_order_acquire);
    if (g == NULL || sseq > g->inherited_to)
        return false;
    const slot *s = find(g, key_hash(key, key_len), false);
    return s != NULL && vouched(g, s) >= (sseq << IDX_BITS | idx);
}

/* The runs bucket as the lease thread reads it: a round's wait per call
 * when that handle could be made. */
static kvStore *round_kv(const kb_transport *t)
{
    return t->runs_kv_round != NULL ? t->runs_kv_round : t->runs_kv;
}

static void record_key(const char *stream, const char *consumer, char *out, size_t len)
{
    snprintf(out, len, "%s.done.%s", stream, consumer);
}

/* The record's text, "final" first when `final` (what does not fit is
 * left out: it only skips less); malloc'ed, its length in *len. */
static char *record_text(kb_transport *t, struct kb_nats_progress *g, bool final, size_t *len)
{
    size_t room = atomic_load(&t->max_payload) / 2, cap = (size_t)g->slots * LINE_BYTES + 8;
    if (cap > room)
        cap = room;
    char *buf = malloc(cap);
    if (buf == NULL)
        return NULL;
    size_t used = final ? (size_t)snprintf(buf, cap, "%s\n", KB_NATS_PROGRESS_FINAL) : 0;
    for (uint32_t i = 0; i < g->slots && used + LINE_BYTES <= cap; i++) {
        slot *s = &g->slot[i];
        uint64_t h = atomic_load_explicit(&s->hash, memory_order_acquire);
        uint64_t pos = vouched(g, s);
        if (h == 0 || pos == 0)
            continue;
        used += (size_t)snprintf(buf + used, cap - used, "%016llx %u %llu %llu\n",
                                 (unsigned long long)h,
                                 atomic_load_explicit(&s->part, memory_order_relaxed),
                                 (unsigned long long)(pos >> IDX_BITS),
                                 (unsigned long long)(pos & ((1u << IDX_BITS) - 1)));
    }
    *len = used;
    return buf;
}

void kb__nats_progress_write(kb_transport *t, kb_nats_claim *c, int64_t now, bool last)
{
    struct kb_nats_progress *g = atomic_load_explicit(&c->progress, memory_order_acquire);
    if (g == NULL || (!last && now - g->written_ns < KB_NATS_PROGRESS_MS * 1000000LL) ||
        atomic_exchange(&g->writing, true))
        return;
    if (!atomic_load(&g->final) && atomic_exchange_explicit(&g->dirty, false, memory_order_seq_cst)) {
        size_t used = 0;
        char *buf = record_text(t, g, false, &used), key[3 * KB_NATS_NAME],
             subj[sizeof key + sizeof t->bucket + 16];
        record_key(c->part->topic->stream, c->consumer, key, sizeof key);
        snprintf(subj, sizeof subj, "$KV.%s_runs.%s", t->bucket, key);
        if (buf != NULL && natsConnection_Publish(t->nc, subj, buf, (int)used) == NATS_OK)
            g->written_ns = now;
        else
            atomic_store(&g->dirty, true);   /* reconnecting, or no memory: next tick */
        free(buf);
    }
    atomic_store(&g->writing, false);
}

bool kb__nats_progress_final(kb_transport *t, kb_nats_claim *c)
{
    /* finished: freed by the acker, or (at close) the feeder gone and every
     * entry settled: nothing runs or can start */
    bool finished = atomic_load(&c->freed) ||
                    (atomic_load(&c->feeder_left) && atomic_load(&c->settled) == atomic_load(&c->tail));
    /* only through the handle that waits a round (nats.c's own waits 5 s) */
    if (!finished || atomic_load(&c->released_ran) || t->runs_kv_round == NULL ||
        kb_now_ns() < t->finals_off_until_ns || !kb__nats_progress_ready(c))
        return false;
    struct kb_nats_progress *g = atomic_load_explicit(&c->progress, memory_order_acquire);
    if (g->final_tried)
        return atomic_load(&g->final);
    g->final_tried = true;
    /* the acker's write in progress (a publish, microseconds) goes first: on
     * the same connection and subject, it is stored before this one */
    while (atomic_exchange(&g->writing, true))
        sched_yield();
    size_t used = 0;
    char *buf = record_text(t, g, true, &used), key[3 * KB_NATS_NAME];
    record_key(c->part->topic->stream, c->consumer, key, sizeof key);
    uint64_t rev = 0;
    bool stored = buf != NULL && kvStore_Put(&rev, t->runs_kv_round, key, buf, (int)used) == NATS_OK;
    free(buf);
    if (!stored)   /* the bucket does not answer: no more finals for a lease's time */
        t->finals_off_until_ns = kb_now_ns() + t->lease_ttl_ms * 1000000;
    /* not stored: the acker goes on, and the next owner keeps the mark */
    atomic_store(&g->final, stored);
    atomic_store(&g->writing, false);
    return stored;
}

/* Digits at *p in `base`, at most `max`, no sign or blank; *p moved past. */
static bool digits(const char **p, const char *end, unsigned base, uint64_t max, uint64_t *out)
{
    const char *q = *p;
    uint64_t v = 0;
    for (; q < end; q++) {
        unsigned d = *q >= '0' && *q <= '9' ? (unsigned)(*q - '0')
                     : base == 16 && *q >= 'a' && *q <= 'f' ? (unsigned)(*q - 'a' + 10)
                                                            : base;
        if (d >= base || v > (max - d) / base)
            break;
        v = v * base + d;
    }
    if (q == *p || (q < end && *q != ' ' && *q != '\n') ||
        (base == 10 && **p == '0' && q - *p > 1))   /* as written: no leading zero */
        return false;
    *p = q;
    *out = v;
    return true;
}

const char *kb__nats_progress_parse(const char *line, size_t len, uint32_t partitions,
                                    uint64_t max_sseq, kb_nats_progress_line *out)
{
    const char *p = line, *end = line + len;
    uint64_t part = 0;
    if (len != 16 && (len < 17 || line[16] != ' '))
        return "malformed";
    if (!digits(&p, line + 16, 16, UINT64_MAX, &out->hash) || p != line + 16 || out->hash == 0)
        return "malformed key hash";
    if (p == end || *p++ != ' ' || !digits(&p, end, 10, UINT32_MAX, &part) || p == end ||
        *p++ != ' ' || !digits(&p, end, 10, UINT64_MAX >> IDX_BITS, &out->sseq) || p == end ||
        *p++ != ' ' || !digits(&p, end, 10, (1u << IDX_BITS) - 1, &out->idx) || p != end)
        return "malformed";
    if (part >= partitions)
        return "partition out of range";
    out->part = (uint32_t)part;
    if (out->sseq == 0 || out->sseq > max_sseq)
        return "stream sequence past the last one its consumer was delivered";
    return NULL;
}

/* One line of a record: into the table when its partition is c's; else
 * why it is not taken (NULL: taken, or another partition's). */
static const char *inherit_line(kb_transport *t, kb_nats_claim *c, struct kb_nats_progress *g,
                                const char *line, size_t len, uint64_t max_sseq)
{
    kb_nats_progress_line pl;
    const char *why = kb__nats_progress_parse(line, len, t->partitions, UINT64_MAX, &pl);
    if (why == NULL && !c->wide && pl.part != c->part->n)
        return NULL;   /* another partition's: past `max_sseq` too when its claim goes on */
    if (why == NULL)
        why = kb__nats_progress_parse(line, len, t->partitions, max_sseq, &pl);
    if (why != NULL)
        return why;
    slot *s = find(g, pl.hash, true);
    if (s == NULL)
        return NULL;
    raise_to(s, pl.sseq << IDX_BITS | pl.idx, pl.part);
    if (pl.sseq > g->inherited_to)
        g->inherited_to = pl.sseq;
    atomic_store_explicit(&g->dirty, true, memory_order_relaxed);   /* carried on */
    return NULL;
}

/* A record is another process's word that events were handled: taken only
 * line by line where it is well formed, of this claim's partitions, and
 * within what the server delivered to that consumer (anyone who can write
 * the runs bucket could else have events of a key settled unhandled). What
 * is refused comes again: a duplicate at worst. */
bool kb__nats_progress_inherit(kb_transport *t, kb_nats_claim *c, const char *earlier,
                               uint64_t delivered)
{
    char key[3 * KB_NATS_NAME];
    record_key(c->part->topic->stream, earlier, key, sizeof key);
    kvEntry *e = NULL;
    if (round_kv(t) == NULL || kvStore_Get(&e, round_kv(t), key) != NATS_OK)
        return false;   /* none: its events above the floor come again */
    const char *v = kvEntry_ValueString(e);
    uint64_t max_sseq = delivered;
    const char *why = NULL;
    unsigned refused = 0;
    bool final = false;
    if (v != NULL && kb__nats_progress_ready(c)) {
        struct kb_nats_progress *g = atomic_load(&c->progress);
        for (const char *l = v; *l != '\0';) {
            const char *nl = strchr(l, '\n');
            size_t len = nl != NULL ? (size_t)(nl - l) : strlen(l);
            bool final_line = l == v && len == strlen(KB_NATS_PROGRESS_FINAL) &&
                              memcmp(l, KB_NATS_PROGRESS_FINAL, len) == 0;
            final |= final_line;
            const char *bad = final_line ? NULL : inherit_line(t, c, g, l, len, max_sseq);
            if (bad != NULL && refused++ == 0)
                why = bad;
            l = nl != NULL ? nl + 1 : l + len;
        }
    }
    if (refused > 0)
        kb_log(t->bus, KB_LOG_WARNING, "nats %s: %u lines of progress record %s ignored (first: "
               "%s; %s was delivered up to %llu): their events come again", t->url_safe,
               refused, key, why, earlier, (unsigned long long)max_sseq);
    kvEntry_Destroy(e);
    return final;
}

/* Early moves (nats_lease.c): <stream>.moved.<wide consumer>, a line
 * "<partition> <cut>" per partition that moved out of the wide claim before
 * its split ended. What the wide consumer delivered of that partition past
 * the cut never ran (the feeder pushed it "moved", unhandled), so the next
 * owner takes that consumer's delivery mark no higher than the cut. */
static void moved_key(const char *stream, const char *consumer, char *out, size_t len)
{
    snprintf(out, len, "%s.moved.%s", stream, consumer);
}

bool kb__nats_progress_moved_store(kb_transport *t, const kb_nats_claim *w)
{
    kb_nats_topic *tp = w->part->topic;
    size_t cap = (size_t)t->partitions * 32 + 1, used = 0;   /* "%u %llu\n": 32 at most */
    char *buf = t->runs_kv_round != NULL ? malloc(cap) : NULL, key[3 * KB_NATS_NAME];
    if (buf == NULL)
        return false;
    for (uint32_t i = 0; i < t->partitions; i++)
        if (atomic_load(&tp->parts[i].move_cut_for) == w)
            used += (size_t)snprintf(buf + used, cap - used, "%u %llu\n", i,
                                     (unsigned long long)atomic_load(&tp->parts[i].move_cut));
    moved_key(tp->stream, w->consumer, key, sizeof key);
    uint64_t rev = 0;
    bool stored = kvStore_Put(&rev, t->runs_kv_round, key, buf, (int)used) == NATS_OK;
    free(buf);
    return stored;
}

bool kb__nats_progress_moved_cut(kb_transport *t, const kb_nats_topic *tp, const char *wide,
                                 uint32_t n, uint64_t *cut)
{
    char key[3 * KB_NATS_NAME];
    moved_key(tp->stream, wide, key, sizeof key);
    kvEntry *e = NULL;
    if (round_kv(t) == NULL || kvStore_Get(&e, round_kv(t), key) != NATS_OK)
        return false;
    /* a line out of form is passed over: the mark then stays as delivered
     * (the events come again as redeliveries), never lower than it was */
    bool found = false;
    for (const char *l = kvEntry_ValueString(e); l != NULL && *l != '\0' && !found;) {
        const char *nl = strchr(l, '\n'), *end = nl != NULL ? nl : l + strlen(l), *q = l;
        uint64_t part = 0, at = 0;
        if (digits(&q, end, 10, UINT32_MAX, &part) && q < end && *q++ == ' ' &&
            digits(&q, end, 10, UINT64_MAX, &at) && q == end && part == n) {
            *cut = at;
            found = true;
        }
        l = nl != NULL ? nl + 1 : end;
    }
    kvEntry_Destroy(e);
    return found;
}

uint64_t kb__nats_progress_key_hash(const void *key, size_t len)
{
    return key_hash(key, len);
}

void kb__nats_progress_record_key(const char *stream, const char *consumer, char *out,
                                  size_t len)
{
    record_key(stream, consumer, out, len);
}

void kb__nats_progress_forget(kb_transport *t, const char *stream, const char *name)
{
    char key[3 * KB_NATS_NAME];
    record_key(stream, name, key, sizeof key);
    if (round_kv(t) != NULL)
        kvStore_Delete(round_kv(t), key);
    moved_key(stream, name, key, sizeof key);
    if (round_kv(t) != NULL && kb__nats_consumer_wide(t, name))
        kvStore_Delete(round_kv(t), key);
}

void kb__nats_progress_free(kb_nats_claim *c)
{
    free(atomic_load(&c->progress));
    atomic_store(&c->progress, NULL);
}
