/* The publish backlog: items (an event or a frame of events) in ticket
 * order, a bounded count of events, one report per event. An item stays
 * linked until its reports have run, so `floor` (every ticket below it is
 * reported) only passes an event after its report: a flush that returns has
 * seen the reports of everything up to its ticket. */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kit_int.h"

struct entry {
    kb_kit_item it;               /* first: kb_kit_item * is the entry */
    struct entry *prev, *next;
    int in_flight;                /* taken by the sender, not done yet */
    int waiting;                  /* back from the sender for a resend (no part) */
    struct part *part;            /* with one_in_flight_per_partition, else NULL */
    struct entry *queued;         /* the next queued in its part */
    int64_t due;                  /* not before (a backoff) */
    size_t bytes;                 /* data_bytes(data) with a byte bound, else 0 */
    kb_kit_key *keys;             /* it.events copies when reports are wanted, else NULL
                                     (in the room past the entry) */
    size_t room;                  /* bytes past the entry for the keys */
};

/* An entry done with is kept for the next add (under the lock, as a spare)
 * rather than freed: a publisher and a sender on two threads otherwise
 * malloc on one and free on the other for every item, which cost more than
 * the rest of the item. Spares have SPARE_ROOM bytes for keys (one event's
 * key up to 48 bytes, or a small frame's); an item needing more has an
 * entry of its own, freed when done. At most SPARES_MAX are kept: about a
 * few batches of a sender's, and the memory of a burst goes back. */
#define SPARE_ROOM 64
#define SPARES_MAX 256

/* With one_in_flight_per_partition, each partition's items not in flight
 * (to send, or back for a resend) queue in ticket order in its part, and
 * the parts that may send (an item queued, none in flight) are `ready`, in
 * the order of their first items' tickets: a take walks the ready parts,
 * never the items of a partition in flight (a publisher can fill the
 * backlog far ahead of one item per partition per round trip, and a walk
 * over them per take cost more than the sends). A part is made at its
 * partition's first add, found by a hash (the buckets double as the parts
 * reach their number), and kept until the backlog is freed. */
#define PARTS_MIN 64
struct part {
    uint32_t partition;
    int busy;                     /* its item in flight */
    struct entry *head, *tail;    /* queued, chained by entry.queued */
    struct part *chain;           /* its bucket's next */
    struct part *prev, *next;     /* in `ready` */
};
struct kb_kit_backlog {
    kb_kit_backlog_conf c;
    pthread_mutex_t lock;
    struct entry *head, *tail;    /* ticket order */
    /* Every entry before it is in flight or waiting: a take with none
     * waiting starts here, not at the head, so a sender with many events in
     * flight (a publish window) does not walk them all on every take. */
    struct entry *fresh;
    size_t waiting;               /* entries waiting to be sent again */
    /* (fresh and waiting stay NULL and 0 with one_in_flight_per_partition:
     * each part's queue keeps its order there) */
    uint64_t next_ticket;         /* under lock */
    _Atomic uint64_t last_ticket; /* the last one given out */
    _Atomic uint64_t floor;       /* every ticket below it is reported */
    _Atomic size_t count;
    _Atomic size_t bytes;         /* of the items held, with a byte bound */
    _Atomic int closed;
    kb_signal *room;              /* count fell, or closed: publishers look again */
    kb_signal *reported;          /* floor moved: flushes look again */
    kb_signal *wake;              /* an item to send, one done, or closed: the sender */
    struct part **parts;          /* with one_in_flight_per_partition: by partition */
    size_t buckets, nparts;       /* of parts: a power of two; parts made */
    struct part *ready, *ready_tail;
    struct entry *spare;          /* entries to reuse, chained by next */
    size_t spares;
    /* Publishers waiting for room and flushes waiting for reports register
     * under the lock, so an item done wakes `room` or `reported` only when
     * one waits and its wait can end: once per wait, not once per item (a
     * waiter not yet back from its wake-up would cost a futex call per
     * item done). Each wake-up bumps the generation, and every waiter
     * comes back to register again: none sleeps past a change unseen. */
    size_t room_waiters;
    int room_woken;               /* woken since the last registration */
    _Atomic uint32_t room_gen;
    size_t flush_waiters;
    uint64_t flush_low;           /* no waiter's ticket is below it (UINT64_MAX: none) */
    _Atomic uint32_t flush_gen;
};

/* The earlier releases' fields sit where they were: an older caller's conf
 * reads the same up to its own size. */
_Static_assert(offsetof(kb_kit_backlog_conf, free_data) ==
                   offsetof(struct kb__kit_backlog_conf_v1, free_data) &&
               offsetof(kb_kit_backlog_conf, backoff_ms) ==
                   offsetof(struct kb__kit_backlog_conf_v1, backoff_ms) &&
               offsetof(kb_kit_backlog_conf, one_in_flight_per_partition) ==
                   offsetof(struct kb__kit_backlog_conf_v2, one_in_flight_per_partition) &&
               offsetof(kb_kit_backlog_conf, event_id) ==
                   offsetof(struct kb__kit_backlog_conf_v2, event_id),
               "kb_kit_backlog_conf moved a field of an earlier release");
/* kb_kit_backlog_new copies an older conf up to the first field it lacks:
 * never past the caller's own struct. */
_Static_assert(offsetof(kb_kit_backlog_conf, one_in_flight_per_partition) <=
                       sizeof(struct kb__kit_backlog_conf_v1) &&
                   offsetof(kb_kit_backlog_conf, capacity_bytes) <=
                       sizeof(struct kb__kit_backlog_conf_v2),
               "an older kb_kit_backlog_conf is copied past its end");

kb_kit_backlog *kb_kit_backlog_new(const kb_kit_backlog_conf *c)
{
    if (c->size != sizeof *c && c->size != sizeof(struct kb__kit_backlog_conf_v1) &&
        c->size != sizeof(struct kb__kit_backlog_conf_v2)) {
        kb_errf(NULL, 0, "kit: kb_kit_backlog_conf.size is %zu, this kit's is %zu (set it to "
                "sizeof the struct)", c->size, sizeof *c);
        return NULL;
    }
    if (c->bus == NULL || c->capacity == 0 || c->max_attempts == 0) {
        kb_errf(NULL, 0, "kit: a backlog needs a bus, a capacity and max_attempts > 0");
        return NULL;
    }
    if (c->size == sizeof *c && c->capacity_bytes > 0 && c->data_bytes == NULL) {
        kb_errf(NULL, 0, "kit: a backlog with capacity_bytes needs data_bytes");
        return NULL;
    }
    kb_kit_backlog *b = calloc(1, sizeof *b);
    if (b != NULL) {
        /* an older caller's: the fields past it stay 0. Its own fields only,
         * not its tail padding, which overlaps the next field where int64_t
         * is aligned to 8 on a 32-bit target */
        size_t n = c->size == sizeof *c ? sizeof *c
                   : c->size == sizeof(struct kb__kit_backlog_conf_v2)
                       ? offsetof(kb_kit_backlog_conf, capacity_bytes)
                       : offsetof(kb_kit_backlog_conf, one_in_flight_per_partition);
        memcpy(&b->c, c, n);
        b->room = kb_signal_new();
        b->reported = kb_signal_new();
        b->wake = kb_signal_new();
    }
    if (b == NULL || b->room == NULL || b->reported == NULL || b->wake == NULL) {
        if (b != NULL) {
            kb_signal_free(b->room);
            kb_signal_free(b->reported);
            kb_signal_free(b->wake);
            free(b);
        }
        kb_errf(NULL, 0, "kit: out of memory for a backlog");
        return NULL;
    }
    /* held for a few dozen instructions by a publisher and the sender at
     * once: a short spin before sleeping saves a futex call on each side */
    pthread_mutexattr_t spin;
    pthread_mutexattr_init(&spin);
    pthread_mutexattr_settype(&spin, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&b->lock, &spin);
    pthread_mutexattr_destroy(&spin);
    b->next_ticket = 1;
    atomic_init(&b->floor, 1);
    b->flush_low = UINT64_MAX;
    return b;
}

void kb_kit_backlog_free(kb_kit_backlog *b)
{
    if (b == NULL)
        return;
    for (struct entry *e = b->head, *next; e != NULL; e = next) {
        next = e->next;
        if (b->c.free_data != NULL)
            b->c.free_data(e->it.data);
        free(e);   /* the keys with it */
    }
    for (struct entry *e = b->spare, *next; e != NULL; e = next) {
        next = e->next;
        free(e);
    }
    for (size_t i = 0; i < b->buckets; i++)
        for (struct part *p = b->parts[i], *next; p != NULL; p = next) {
            next = p->chain;
            free(p);
        }
    free(b->parts);
    kb_signal_free(b->room);
    kb_signal_free(b->reported);
    kb_signal_free(b->wake);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

struct room_wait {
    kb_kit_backlog *b;
    uint32_t events;
    size_t bytes;
    uint32_t gen;   /* room_gen when it registered */
};

/* Room for the events, and for the bytes: an item over capacity_bytes fits
 * once the backlog holds no bytes (else no bound could ever take it). */
static int room_for(kb_kit_backlog *b, uint32_t events, size_t bytes)
{
    size_t held = b->c.capacity_bytes > 0 ? atomic_load(&b->bytes) : 0;
    return atomic_load(&b->count) + events <= b->c.capacity &&
           (held == 0 || held + bytes <= b->c.capacity_bytes);
}

static int has_room(void *arg)
{
    struct room_wait *w = arg;
    return atomic_load(&w->b->closed) || room_for(w->b, w->events, w->bytes) ||
           atomic_load(&w->b->room_gen) != w->gen;
}

/* The room for the keys' table and copies, or 0 when no report will read
 * them. */
static size_t key_room(kb_kit_backlog *b, const kb_kit_key *keys, uint32_t events)
{
    if (!kb_bus_delivery_wanted(b->c.bus))
        return 0;
    size_t room = events * sizeof(kb_kit_key);
    for (uint32_t i = 0; i < events; i++)
        room += keys[i].key_len;
    return room;
}

/* An entry with `room` bytes for keys, NULL on out of memory. */
static struct entry *entry_alloc(size_t room)
{
    struct entry *e = malloc(sizeof *e + room);
    if (e != NULL)
        e->room = room;
    return e;
}

/* A spare, or NULL when none is kept. Caller holds the lock. */
static struct entry *spare_take(kb_kit_backlog *b)
{
    struct entry *e = b->spare;
    if (e != NULL) {
        b->spare = e->next;
        b->spares--;
    }
    return e;
}

/* e, unlinked, kept as a spare (1) or not (0: the caller frees it). Caller
 * holds the lock. */
static int spare_keep(kb_kit_backlog *b, struct entry *e)
{
    if (e->room != SPARE_ROOM || b->spares == SPARES_MAX)
        return 0;
    e->next = b->spare;
    b->spare = e;
    b->spares++;
    return 1;
}

/* e (room for `room` key bytes) made the item of `events` events, with
 * copies of their keys when room > 0. */
static void entry_fill(struct entry *e, void *data, const char *topic, uint32_t partition,
                       const kb_kit_key *keys, uint32_t events, size_t room, size_t bytes)
{
    int keep = room > 0;   /* only a report reads them */
    size_t table = keep ? events * sizeof(kb_kit_key) : 0;
    size_t own = e->room;   /* may be more than room: a spare's */
    *e = (struct entry){.it = {.data = data, .partition = partition, .topic = topic,
                               .events = events},
                        .bytes = bytes, .keys = keep ? (kb_kit_key *)(e + 1) : NULL,
                        .room = own};
    char *copy = (char *)(e + 1) + table;
    for (uint32_t i = 0; keep && i < events; i++) {
        if (keys[i].key_len > 0)
            memcpy(copy, keys[i].key, keys[i].key_len);
        e->keys[i] = (kb_kit_key){keys[i].key_len > 0 ? copy : NULL, keys[i].key_len};
        copy += keys[i].key_len;
    }
    if (keep && events == 1)
        e->it.key = e->keys[0].key, e->it.key_len = e->keys[0].key_len;
}

static struct part **part_bucket(struct part **parts, size_t buckets, uint32_t partition)
{
    return &parts[kb_mix64(partition) & (buckets - 1)];
}

/* The part of `partition`, made at its first add (the buckets double once
 * there are as many parts); NULL on out of memory. Caller holds the lock. */
static struct part *part_of(kb_kit_backlog *b, uint32_t partition)
{
    struct part *p = NULL;
    if (b->buckets > 0)
        for (p = *part_bucket(b->parts, b->buckets, partition); p != NULL; p = p->chain)
            if (p->partition == partition)
                return p;
    if (b->nparts == b->buckets) {
        size_t n = b->buckets > 0 ? 2 * b->buckets : PARTS_MIN;
        struct part **more = calloc(n, sizeof *more);
        if (more == NULL)
            return NULL;
        for (size_t i = 0; i < b->buckets; i++)
            for (struct part *q = b->parts[i], *next; q != NULL; q = next) {
                next = q->chain;
                struct part **at = part_bucket(more, n, q->partition);
                q->chain = *at;
                *at = q;
            }
        free(b->parts);
        b->parts = more;
        b->buckets = n;
    }
    if ((p = calloc(1, sizeof *p)) == NULL)
        return NULL;
    p->partition = partition;
    struct part **at = part_bucket(b->parts, b->buckets, partition);
    p->chain = *at;
    *at = p;
    b->nparts++;
    return p;
}

/* p into `ready` by its first item's ticket, looked for from the end: a
 * partition's next item is most often among the newest (a done, fail_all),
 * so few ready partitions are passed; a resend of an old item passes at
 * most every ready one. Caller holds the lock. */
static void ready_put(kb_kit_backlog *b, struct part *p)
{
    struct part *prev = b->ready_tail;   /* the last with an earlier ticket; NULL: none */
    while (prev != NULL && prev->head->it.ticket > p->head->it.ticket)
        prev = prev->prev;
    struct part *next = prev != NULL ? prev->next : b->ready;
    p->prev = prev;
    p->next = next;
    if (prev != NULL)
        prev->next = p;
    else
        b->ready = p;
    if (next != NULL)
        next->prev = p;
    else
        b->ready_tail = p;
}

static void ready_drop(kb_kit_backlog *b, struct part *p)
{
    *(p->prev != NULL ? &p->prev->next : &b->ready) = p->next;
    *(p->next != NULL ? &p->next->prev : &b->ready_tail) = p->prev;
}

/* e, not in flight, queued in its part: last (added) or first (back for a
 * resend: older than the rest, and its part no longer busy). Caller holds
 * the lock. */
static void queue_put(kb_kit_backlog *b, struct entry *e, int first)
{
    struct part *p = e->part;
    int was_ready = p->head != NULL && !p->busy;   /* never for `first`: e was in flight */
    if (first) {
        e->queued = p->head;
        p->head = e;
        p->busy = 0;
    } else {
        e->queued = NULL;
        if (p->tail != NULL)
            p->tail->queued = e;
        else
            p->head = e;
    }
    if (e->queued == NULL)
        p->tail = e;
    if (!p->busy && !was_ready)
        ready_put(b, p);
}

/* e out of its part's queue: taken (its first: the part is busy, out of
 * `ready`), or reported while not in flight (closed). Caller holds the
 * lock. */
static void queue_drop(kb_kit_backlog *b, struct entry *e, int taken)
{
    struct part *p = e->part;
    struct entry **at = &p->head, *before = NULL;
    while (*at != e) {
        before = *at;
        at = &(*at)->queued;
    }
    if (!p->busy)
        ready_drop(b, p);
    *at = e->queued;
    if (p->tail == e)
        p->tail = before;
    p->busy = p->busy || taken;
    if (!p->busy && p->head != NULL)
        ready_put(b, p);
}

/* e's part has nothing in flight any more (e reported): it may send its
 * next. Caller holds the lock. */
static void part_free(kb_kit_backlog *b, struct entry *e)
{
    e->part->busy = 0;
    if (e->part->head != NULL)
        ready_put(b, e->part);
}

int kb_kit_backlog_add(kb_kit_backlog *b, void *data, const char *topic, uint32_t partition,
                       const void *key, size_t key_len, uint64_t *ticket)
{
    kb_kit_key k = {key, key_len};
    return kb_kit_backlog_add_frame(b, data, topic, partition, &k, 1, ticket);
}

int kb_kit_backlog_add_frame(kb_kit_backlog *b, void *data, const char *topic,
                             uint32_t partition, const kb_kit_key *keys, uint32_t events,
                             uint64_t *ticket)
{
    if (events == 0 || events > b->c.capacity) {
        kb_errf(NULL, 0, "kit: topic %s: a frame of %u events in a publish backlog of %zu",
                topic, events, b->c.capacity);
        return KB_EINVAL;
    }
    size_t room = key_room(b, keys, events);
    size_t bytes = b->c.capacity_bytes > 0 ? b->c.data_bytes(data) : 0;
    /* one over a spare's room is made here; a spare is taken under the lock
     * with the room for the events, so an add holds the lock once */
    struct entry *e = room > SPARE_ROOM ? entry_alloc(room) : NULL;
    if (room > SPARE_ROOM && e == NULL) {
        kb_errf(NULL, 0, "kit: out of memory for an event of topic %s", topic);
        return KB_ENOMEM;
    }
    struct room_wait w = {b, events, bytes, 0};
    int64_t deadline = 0;   /* read the clock only when there is a wait */
    int closed;
    pthread_mutex_lock(&b->lock);
    for (;;) {
        closed = atomic_load(&b->closed);
        if (!closed && room_for(b, events, bytes)) {
            if (e == NULL && (e = spare_take(b)) == NULL) {
                pthread_mutex_unlock(&b->lock);   /* none kept: malloc unlocked, look again */
                if ((e = entry_alloc(SPARE_ROOM)) == NULL) {
                    kb_errf(NULL, 0, "kit: out of memory for an event of topic %s", topic);
                    return KB_ENOMEM;
                }
                pthread_mutex_lock(&b->lock);
                continue;
            }
            struct part *part = NULL;
            if (b->c.one_in_flight_per_partition && (part = part_of(b, partition)) == NULL) {
                int kept = spare_keep(b, e);
                pthread_mutex_unlock(&b->lock);
                if (!kept)
                    free(e);
                kb_errf(NULL, 0, "kit: out of memory for an event of topic %s", topic);
                return KB_ENOMEM;
            }
            entry_fill(e, data, topic, partition, keys, events, room, bytes);
            e->it.ticket = b->next_ticket;
            b->next_ticket += events;
            e->prev = b->tail;
            if (b->tail != NULL)
                b->tail->next = e;
            else
                b->head = e;
            b->tail = e;
            if (part != NULL) {
                e->part = part;
                queue_put(b, e, 0);
            } else if (b->fresh == NULL) {
                b->fresh = e;
            }
            atomic_fetch_add(&b->count, events);
            if (bytes > 0)
                atomic_fetch_add(&b->bytes, bytes);
            uint64_t last = b->next_ticket - 1;   /* read e no more: it may be sent and
                                                     done once the lock is released */
            atomic_store(&b->last_ticket, last);
            pthread_mutex_unlock(&b->lock);
            if (ticket != NULL)
                *ticket = last;
            kb_signal_notify(b->wake);
            return KB_OK;
        }
        if (!closed && deadline == 0)
            deadline = kb_deadline_ns(b->c.timeout_ms);
        if (closed || kb_now_ns() >= deadline)
            break;
        b->room_waiters++;
        b->room_woken = 0;
        w.gen = atomic_load(&b->room_gen);
        pthread_mutex_unlock(&b->lock);
        kb_signal_wait(b->room, has_room, &w, deadline);   /* the loop looks again */
        pthread_mutex_lock(&b->lock);
        b->room_waiters--;
    }
    pthread_mutex_unlock(&b->lock);
    free(e);   /* NULL, or one made for this add: never linked */
    if (!closed && b->c.capacity_bytes > 0)
        kb_errf(NULL, 0, "kit: topic %s: the publish backlog held %zu events, %zu bytes "
                "(of %zu events, %zu bytes) for %d ms", topic, atomic_load(&b->count),
                atomic_load(&b->bytes), b->c.capacity, b->c.capacity_bytes, b->c.timeout_ms);
    else if (!closed)
        kb_errf(NULL, 0, "kit: topic %s: the publish backlog held %zu events for %d ms",
                topic, b->c.capacity, b->c.timeout_ms);
    else
        kb_errf(NULL, 0, "kit: topic %s: the publish backlog is closed", topic);
    return closed ? KB_ECLOSED : KB_EFULL;
}

/* Partitions with an event to resend that is not due (its backoff, or an
 * earlier event of its partition in flight), seen so far in one scan: their
 * later events wait too, so they are not stored before it. Past HELD_MAX of
 * them the scan stops (later events wait a little). */
#define HELD_MAX 64
struct held {
    uint32_t p[HELD_MAX];
    size_t n;
};

static int held_back(const struct held *h, uint32_t partition)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->p[i] == partition)
            return 1;
    return 0;
}

/* 0 when the scan must stop: too many partitions held back to remember. */
static int hold_back(struct held *h, uint32_t partition)
{
    if (held_back(h, partition))
        return 1;
    if (h->n == HELD_MAX)
        return 0;
    h->p[h->n++] = partition;
    return 1;
}

/* Partitions with an event in flight, seen so far in one scan, as bits of
 * partition % BUSY_BITS: a resend sent while an earlier event of its
 * partition is in flight could be stored before it (if that one fails and is
 * resent too). Only a set bit costs a walk back, which tells partitions that
 * share the bit apart. */
#define BUSY_BITS 1024
struct busy {
    uint64_t w[BUSY_BITS / 64];
};

static void mark_busy(struct busy *s, uint32_t partition)
{
    s->w[partition % BUSY_BITS / 64] |= UINT64_C(1) << (partition % 64);
}

/* A waiting entry with an earlier one of its partition in flight: not due
 * until that one is done (pipelined mode: no part). */
static int behind_in_flight(const struct busy *s, const struct entry *e)
{
    uint32_t p = e->it.partition;
    if (!e->waiting || !((s->w[p % BUSY_BITS / 64] >> (p % 64)) & 1))
        return 0;
    for (const struct entry *x = e->prev; x != NULL; x = x->prev)
        if (x->in_flight && x->it.partition == p)
            return 1;
    return 0;
}

/* Move `fresh` over the entries in flight: all before it are. Caller holds
 * the lock. */
static struct entry *skip_in_flight(kb_kit_backlog *b)
{
    while (b->fresh != NULL && b->fresh->in_flight)
        b->fresh = b->fresh->next;
    return b->fresh;
}

static void take_one(kb_kit_backlog *b, struct entry *e, kb_kit_item **out, size_t *n)
{
    if (e->part != NULL)
        queue_drop(b, e, 1);
    e->in_flight = 1;
    e->it.attempts++;
    out[(*n)++] = &e->it;
}

/* take with one_in_flight_per_partition: the first item of each ready
 * part, oldest first, but a resend still in its backoff. Caller holds the
 * lock. */
static size_t take_ready(kb_kit_backlog *b, kb_kit_item **out, size_t max, int64_t now)
{
    size_t n = 0;
    for (struct part *p = b->ready, *next; p != NULL && n < max; p = next) {
        next = p->next;   /* a take moves p out of `ready` */
        struct entry *e = p->head;
        if (e->due > now)
            continue;
        take_one(b, e, out, &n);
    }
    return n;
}

size_t kb_kit_backlog_take(kb_kit_backlog *b, kb_kit_item **out, size_t max, int64_t now)
{
    size_t n = 0;
    struct entry *e;
    pthread_mutex_lock(&b->lock);
    if (b->c.one_in_flight_per_partition) {
        n = take_ready(b, out, max, now);
        pthread_mutex_unlock(&b->lock);
        return n;
    }
    if (b->waiting == 0) {
        /* nothing held back: every idle entry from `fresh` on is due */
        for (e = skip_in_flight(b); e != NULL && n < max; e = e->next)
            if (!e->in_flight)
                take_one(b, e, out, &n);
        b->fresh = e;
        pthread_mutex_unlock(&b->lock);
        return n;
    }
    struct held h = {.n = 0};
    struct busy s = {{0}};
    struct entry *idle = NULL;   /* the first one passed over behind a waiting one */
    for (e = b->head; e != NULL && n < max; e = e->next) {
        uint32_t p = e->it.partition;
        if (e->in_flight) {
            mark_busy(&s, p);
            continue;
        }
        if (e->due > now || held_back(&h, p) || behind_in_flight(&s, e)) {
            if (!hold_back(&h, p))
                break;
            if (idle == NULL && !e->waiting)
                idle = e;
            continue;
        }
        if (e->waiting) {
            e->waiting = 0;
            b->waiting--;
        }
        take_one(b, e, out, &n);
        mark_busy(&s, p);
    }
    b->fresh = idle != NULL ? idle : e;
    pthread_mutex_unlock(&b->lock);
    return n;
}

/* The first waiting item of each partition decides: a later one is due no
 * sooner (it waits behind it). One behind an item in flight has no due time
 * yet: only the kb_kit_backlog_done of that one can make it due. */
int64_t kb_kit_backlog_next_due(kb_kit_backlog *b)
{
    int64_t due = INT64_MAX;
    struct held h = {.n = 0};
    struct busy s = {{0}};
    pthread_mutex_lock(&b->lock);
    if (b->c.one_in_flight_per_partition) {   /* each ready part's first item decides */
        for (struct part *p = b->ready; p != NULL && due != 0; p = p->next)
            if (p->head->due < due)
                due = p->head->due;
        pthread_mutex_unlock(&b->lock);
        return due;
    }
    if (b->waiting == 0) {
        for (struct entry *e = skip_in_flight(b); e != NULL && due != 0; e = e->next)
            if (!e->in_flight)
                due = 0;
        pthread_mutex_unlock(&b->lock);
        return due;
    }
    for (struct entry *e = b->head; e != NULL; e = e->next) {
        uint32_t p = e->it.partition;
        if (e->in_flight) {
            mark_busy(&s, p);
            continue;
        }
        if (held_back(&h, p))
            continue;
        if (!behind_in_flight(&s, e) && e->due < due)
            due = e->due;
        if (e->waiting && !hold_back(&h, p))
            break;
    }
    pthread_mutex_unlock(&b->lock);
    return due;
}

/* Event i's report: stored (KB_OK, `id`: NULL for an empty one) or failed. */
static void report_one(kb_kit_backlog *b, const struct entry *e, uint32_t i, int result,
                       const char *id, const char *error)
{
    kb_delivery_report r = {
        .topic = e->it.topic, .partition = e->it.partition, .result = result,
        .id = result == KB_OK && id != NULL ? id : "",
        .error = result == KB_OK ? "" : (error != NULL ? error : kb_strerror(result)),
    };
    if (e->keys != NULL)
        r.key = e->keys[i].key, r.key_len = e->keys[i].key_len;
    if (result == KB_OK)
        kb_bus_delivery_report(b->c.bus, &r);
    else
        kb_bus_publish_failed(b->c.bus, &r);
}

/* One report per event of the item (stored ones only when the bus has a
 * delivery callback: without one they would go nowhere). A frame's events
 * are named by event_id when set (room for the index after the broker's
 * ID), else each is reported with the frame's ID; with no ID (NULL) each is
 * reported without one, event_id not called. */
static void report(kb_kit_backlog *b, const struct entry *e, int result, const char *id,
                   const char *error)
{
    if (result == KB_OK && !kb_bus_delivery_wanted(b->c.bus))
        return;   /* no delivery callback: nothing to build per event (a failure still counts) */
    char small[128], *name = NULL;
    size_t room = (id != NULL ? strlen(id) : 0) + 24;
    if (e->it.events > 1 && result == KB_OK && id != NULL && b->c.event_id != NULL &&
        e->keys != NULL)
        name = room <= sizeof small ? small : malloc(room);
    for (uint32_t i = 0; i < e->it.events; i++) {
        if (name != NULL)
            b->c.event_id(id, i, name, room);
        report_one(b, e, i, result, name != NULL ? name : id, error);
    }
    if (name != small)
        free(name);
}

/* Unlink items[0..n), whose reports ran, under one hold of the lock; the
 * floor moves to the oldest one left. Their data is freed first: nothing
 * reads it after the report, and an entry kept as a spare is the next
 * add's once the lock is released. */
static void unlink_reported(kb_kit_backlog *b, kb_kit_item *const *items, size_t n)
{
    for (size_t i = 0; b->c.free_data != NULL && i < n; i++)
        b->c.free_data(items[i]->data);
    struct entry *drop = NULL;   /* not kept: freed once unlocked */
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < n; i++) {
        struct entry *e = (struct entry *)items[i];
        if (b->fresh == e)
            b->fresh = e->next;
        if (e->waiting)
            b->waiting--;
        if (e->part != NULL && e->in_flight)
            part_free(b, e);
        else if (e->part != NULL)
            queue_drop(b, e, 0);
        if (e->prev != NULL)
            e->prev->next = e->next;
        else
            b->head = e->next;
        if (e->next != NULL)
            e->next->prev = e->prev;
        else
            b->tail = e->prev;
        atomic_fetch_sub(&b->count, e->it.events);
        if (e->bytes > 0)
            atomic_fetch_sub(&b->bytes, e->bytes);
        if (!spare_keep(b, e)) {
            e->next = drop;
            drop = e;
        }
    }
    atomic_store(&b->floor, b->head != NULL ? b->head->it.ticket : b->next_ticket);
    int room = b->room_waiters > 0 && !b->room_woken;
    if (room) {
        b->room_woken = 1;
        atomic_fetch_add(&b->room_gen, 1);
    }
    int reported = b->flush_waiters > 0 && atomic_load(&b->floor) > b->flush_low;
    if (reported) {
        b->flush_low = UINT64_MAX;   /* each waiter says its ticket again */
        atomic_fetch_add(&b->flush_gen, 1);
    }
    pthread_mutex_unlock(&b->lock);
    for (struct entry *next; drop != NULL; drop = next) {
        next = drop->next;
        free(drop);   /* the keys with it */
    }
    /* an item held behind these (its partition's limit, or a resend) may
     * be due now, and done may run on a thread other than the sender's */
    kb_signal_notify(b->wake);
    if (room)
        kb_signal_notify(b->room);
    if (reported)
        kb_signal_notify(b->reported);
}

void kb_kit_backlog_done(kb_kit_backlog *b, kb_kit_item *it, int result, int retry,
                         const char *id, const char *error)
{
    struct entry *e = (struct entry *)it;
    if (result != KB_OK && retry) {
        uint64_t r = kb_bus_random(b->c.bus);
        pthread_mutex_lock(&b->lock);   /* take wrote attempts, maybe on another thread */
        uint32_t attempts = it->attempts;
        int again = attempts < b->c.max_attempts;
        if (again) {
            e->due = kb_now_ns() + kb_backoff_ns(b->c.backoff_ms, b->c.max_backoff_ms,
                                                 attempts, r);
            e->in_flight = 0;
            if (e->part != NULL) {
                queue_put(b, e, 1);   /* its part's head: take_ready's order */
            } else {
                e->waiting = 1;
                b->waiting++;
            }
        }
        pthread_mutex_unlock(&b->lock);
        if (again) {
            kb_signal_notify(b->wake);   /* the sender's next_due moved */
            return;
        }
    }
    report(b, e, result, id, error);   /* linked, so the floor waits for it */
    unlink_reported(b, &it, 1);
}

void kb_kit_backlog_done_each(kb_kit_backlog *b, kb_kit_item *it, const kb_kit_result *results)
{
    struct entry *e = (struct entry *)it;
    for (uint32_t i = 0; i < it->events; i++)
        report_one(b, e, i, results[i].result, results[i].id, results[i].error);
    unlink_reported(b, &it, 1);
}

void kb_kit_backlog_stored(kb_kit_backlog *b, kb_kit_item *const *items,
                           const char *const *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        report(b, (struct entry *)items[i], KB_OK, ids[i], NULL);
    if (n > 0)
        unlink_reported(b, items, n);
}

uint64_t kb_kit_backlog_last_ticket(kb_kit_backlog *b)
{
    return atomic_load(&b->last_ticket);
}

struct flush_wait {
    kb_kit_backlog *b;
    uint64_t ticket;
    uint32_t gen;   /* flush_gen when it registered */
};

static int flushed(void *arg)
{
    struct flush_wait *w = arg;
    return atomic_load(&w->b->floor) > w->ticket || atomic_load(&w->b->flush_gen) != w->gen;
}

int kb_kit_backlog_flush(kb_kit_backlog *b, uint64_t ticket, int64_t deadline_ns)
{
    while (atomic_load(&b->floor) <= ticket) {
        if (kb_now_ns() >= deadline_ns) {
            kb_errf(NULL, 0, "kit: %zu events not reported by the deadline",
                    kb_kit_backlog_length(b));
            return KB_ETIMEDOUT;
        }
        pthread_mutex_lock(&b->lock);
        b->flush_waiters++;
        if (ticket < b->flush_low)
            b->flush_low = ticket;
        struct flush_wait w = {b, ticket, atomic_load(&b->flush_gen)};
        pthread_mutex_unlock(&b->lock);
        kb_signal_wait(b->reported, flushed, &w, deadline_ns);   /* the loop looks again */
        pthread_mutex_lock(&b->lock);
        if (--b->flush_waiters == 0)
            b->flush_low = UINT64_MAX;
        pthread_mutex_unlock(&b->lock);
    }
    return KB_OK;
}

size_t kb_kit_backlog_length(kb_kit_backlog *b)
{
    return atomic_load(&b->count);
}

kb_signal *kb_kit_backlog_signal(kb_kit_backlog *b)
{
    return b->wake;
}

void kb_kit_backlog_fail_all(kb_kit_backlog *b, int result, const char *why)
{
    atomic_store(&b->closed, 1);
    kb_signal_notify(b->room);   /* publishers waiting for room: closed now */
    kb_signal_notify(b->wake);
    for (;;) {
        pthread_mutex_lock(&b->lock);
        struct entry *e = b->head;
        pthread_mutex_unlock(&b->lock);
        if (e == NULL)
            return;
        report(b, e, result, NULL, why);
        unlink_reported(b, (kb_kit_item *const[]){&e->it}, 1);
    }
}
