/* The keyed pool: lanes allocated on first use, routing, timed backpressure,
 * flush, statistics and teardown. Executors live in executor.c. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hash.h"
#include "idle.h"
#include "parked.h"
#include "pool_int.h"
#include "probes.h"
#include "ring.h"

/* Lanes one submit call remembers for scheduling at its end; more flush early. */
#define TOUCHED_MAX 32
/* Entries a submit call checks for the lane it is about to remember. */
#define TOUCHED_RECENT 4

void kb_pool_options_init(kb_pool_options *o)
{
    memset(o, 0, sizeof *o);
    o->lanes = 1024;
    o->threads = 0;
    o->capacity = 1000;
    o->max_attempts = 5;
    o->backoff_ms = 10;
    o->max_backoff_ms = 5000;
    o->idle = KB_IDLE_ADAPTIVE;
    o->retry_scope = KB_RETRY_SCOPE_KEY;
}

uint32_t kb__online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1;
}

uint32_t kb_pool_default_threads(kb_idle idle)
{
    /* Three spinning threads on two CPUs take turns in scheduler slices
     * (milliseconds), and a lane waits with its executor: leave the
     * publisher a CPU. */
    uint32_t cpus = kb__online_cpus();
    return idle == KB_IDLE_BLOCK || cpus == 1 ? cpus : cpus - 1;
}

#define KB_MAX_LANES (1u << 20)
#define KB_MAX_CAPACITY (1u << 24)
#define KB_MAX_THREADS 1024u

static int check_options(const kb_pool_options *o, char *errstr, size_t errlen)
{
    if (o->handle == NULL) {
        snprintf(errstr, errlen, "pool: handle callback is NULL");
        return KB_EINVAL;
    }
    if (o->lanes == 0 || o->lanes > KB_MAX_LANES) {
        snprintf(errstr, errlen, "pool: lanes %u out of range 1..%u", o->lanes, KB_MAX_LANES);
        return KB_EINVAL;
    }
    if (o->capacity == 0 || o->capacity > KB_MAX_CAPACITY) {
        snprintf(errstr, errlen, "pool: capacity %u out of range 1..%u", o->capacity,
                 KB_MAX_CAPACITY);
        return KB_EINVAL;
    }
    if (o->threads > KB_MAX_THREADS) {
        snprintf(errstr, errlen, "pool: threads %u out of range 0..%u", o->threads,
                 KB_MAX_THREADS);
        return KB_EINVAL;
    }
    if ((unsigned)o->idle > KB_IDLE_BLOCK) {
        snprintf(errstr, errlen, "pool: idle strategy %d unknown", (int)o->idle);
        return KB_EINVAL;
    }
    if ((unsigned)o->retry_scope > KB_RETRY_SCOPE_LANE) {
        snprintf(errstr, errlen, "pool: retry scope %d unknown", (int)o->retry_scope);
        return KB_EINVAL;
    }
    if (o->max_backoff_ms < o->backoff_ms) {
        snprintf(errstr, errlen, "pool: max_backoff_ms %u is below backoff_ms %u",
                 o->max_backoff_ms, o->backoff_ms);
        return KB_EINVAL;
    }
    return KB_OK;
}

kb_pool *kb__pool_new_on(kb_sched *s, const kb_pool_options *o, char *errstr, size_t errlen)
{
    if (check_options(o, errstr, errlen) != KB_OK)
        return NULL;
    kb_pool *p = calloc(1, sizeof *p);
    if (p != NULL)
        p->lanes = calloc(o->lanes, sizeof *p->lanes);
    if (p == NULL || p->lanes == NULL) {
        free(p);
        snprintf(errstr, errlen, "pool: out of memory for %u lanes", o->lanes);
        return NULL;
    }
    p->o = *o;
    p->lanes_pow2 = (o->lanes & (o->lanes - 1)) == 0;
    /* ck_ring keeps one slot empty: the ring must be larger than capacity. */
    p->ring_size = 2;
    while (p->ring_size <= o->capacity)
        p->ring_size <<= 1;
    p->sched = s;
    p->skip_ok = true;
    return p;
}

kb_pool *kb_pool_new(const kb_pool_options *o, char *errstr, size_t errlen)
{
    if (o == NULL) {
        snprintf(errstr, errlen, "pool: options are NULL");
        return NULL;
    }
    if (check_options(o, errstr, errlen) != KB_OK)
        return NULL;
    kb_sched *s = kb__sched_new(o->threads ? o->threads : kb_pool_default_threads(o->idle),
                                o->idle, errstr, errlen);
    if (s == NULL)
        return NULL;
    kb_pool *p = kb__pool_new_on(s, o, errstr, errlen);
    if (p == NULL) {
        kb__sched_destroy(s);
        return NULL;
    }
    p->own_sched = true;
    p->skip_ok = false;   /* an application's pool: KB_POOL_SKIP is a retry like any */
    return p;
}

static size_t round_to_line(size_t n)
{
    return (n + KB_CACHELINE - 1) & ~(size_t)(KB_CACHELINE - 1);
}

/* One allocation per lane: the lane, then its ring's slots. */
static size_t lane_bytes(const kb_pool *p)
{
    return round_to_line(round_to_line(sizeof(struct kb_lane)) +
                         p->ring_size * sizeof(ck_ring_buffer_t));
}

static struct kb_lane *lane_create(kb_pool *p, uint32_t idx)
{
    size_t head = round_to_line(sizeof(struct kb_lane));
    struct kb_lane *lane = aligned_alloc(KB_CACHELINE, lane_bytes(p));
    if (lane == NULL)
        return NULL;
    memset(lane, 0, head);
    lane->buf = (ck_ring_buffer_t *)((char *)lane + head);
    ck_ring_init(&lane->ring, p->ring_size);
    lane->pool = p;
    lane->index = idx;
    lane->attempt = 1;
    lane->space.hot_pokers = 1;   /* executors poke it after every visit that frees space */
    lane->ex = &p->sched->ex[(uint32_t)(kb_mix64(idx ^ p->o.salt) % p->sched->n)];
    struct kb_lane *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(&p->lanes[idx], &expected, lane,
                                                 memory_order_acq_rel, memory_order_acquire)) {
        free(lane);                 /* another producer created it first */
        return expected;
    }
    atomic_fetch_add_explicit(&p->lanes_allocated, 1, memory_order_relaxed);
    return lane;
}

static inline struct kb_lane *lane_get(kb_pool *p, uint32_t idx)
{
    struct kb_lane *lane = atomic_load_explicit(&p->lanes[idx], memory_order_acquire);
    return lane != NULL ? lane : lane_create(p, idx);
}

/* The lane of a key's hash: hash % lanes, without the division (tens of
 * cycles per event) when lanes is a power of two, as by default. */
static inline uint32_t lane_of(const kb_pool *p, uint32_t hash)
{
    return p->lanes_pow2 ? hash & (p->o.lanes - 1) : hash % p->o.lanes;
}

static inline struct kb_lane *lane_peek(const kb_pool *p, uint32_t idx)
{
    return atomic_load_explicit(&((kb_pool *)p)->lanes[idx], memory_order_acquire);
}

/* A token per live thread (the address of one of its thread-locals). */
static uintptr_t this_thread(void)
{
    static _Thread_local char token;
    return (uintptr_t)&token;
}

/* The owner raises its flag for a push: false when the pool turned shared
 * meanwhile (the flag is down again). Dekker with the thread turning it
 * shared, which sets KB_SHARING, then waits for the flag to go down. */
static inline bool owner_enter(kb_pool *p)
{
    atomic_store_explicit(&p->owner_busy, 1, memory_order_relaxed);
    kb__fence_hot();
    if (atomic_load_explicit(&p->sharing, memory_order_relaxed) == KB_OWNED)
        return true;
    atomic_store_explicit(&p->owner_busy, 0, memory_order_release);
    return false;
}

/* enter_push past its common cases: the first push, another thread's push
 * to an owned pool (which turns it shared), a pool turning shared. */
static kb_push_mode enter_push_slow(kb_pool *p, bool *owning)
{
    uint32_t sharing = atomic_load_explicit(&p->sharing, memory_order_acquire);
    if (sharing == KB_OWNED) {
        uintptr_t me = this_thread(), owner = atomic_load_explicit(&p->owner, memory_order_relaxed);
        if (owner == 0 && atomic_compare_exchange_strong(&p->owner, &owner, me))
            owner = me;
        if (owner == me) {
            if (owner_enter(p)) {
                *owning = true;
                return KB_PUSH_OWNER;
            }
        } else {
            uint32_t owned = KB_OWNED;
            if (atomic_compare_exchange_strong(&p->sharing, &owned, KB_SHARING)) {
                /* The owner either saw KB_SHARING or raised its flag before. */
                kb__fence_rare();
                while (atomic_load_explicit(&p->owner_busy, memory_order_acquire))
                    sched_yield();
                atomic_store_explicit(&p->sharing, KB_SHARED, memory_order_release);
            }
        }
    }
    while (atomic_load_explicit(&p->sharing, memory_order_acquire) != KB_SHARED)
        sched_yield();   /* another producer is turning the pool shared */
    return KB_PUSH_MPSC;
}

/* How this call may push, and whether it holds the owner's flag (to clear).
 * The owner's push and a shared pool's are decided inline. */
static inline kb_push_mode enter_push(kb_pool *p, bool *owning)
{
    *owning = false;
    if (p->o.single_producer)
        return KB_PUSH_SPSC;
    uint32_t sharing = atomic_load_explicit(&p->sharing, memory_order_acquire);
    if (sharing == KB_SHARED)
        return KB_PUSH_MPSC;
    if (sharing == KB_OWNED &&
        atomic_load_explicit(&p->owner, memory_order_relaxed) == this_thread() && owner_enter(p)) {
        *owning = true;
        return KB_PUSH_OWNER;
    }
    return enter_push_slow(p, owning);
}

static void leave_push(kb_pool *p, bool owning)
{
    if (owning)
        atomic_store_explicit(&p->owner_busy, 0, memory_order_release);
}

struct space_wait {
    kb_pool *p;
    struct kb_lane *lane;
    void *item;
};

/* 1: pushed, 2: pool closed, 0: still full. The owner's flag is held per
 * try, never across a wait: a producer turning the pool shared waits for it,
 * and may be the very executor this wait needs. */
static int try_push(void *arg)
{
    struct space_wait *w = arg;
    if (atomic_load_explicit(&w->p->closed, memory_order_acquire))
        return 2;
    bool owning;
    kb_push_mode mode = enter_push(w->p, &owning);
    int pushed = (int)kb__ring_push_n(&w->lane->ring, w->lane->buf, &w->item, 1, mode,
                                      &w->lane->seen);
    leave_push(w->p, owning);
    return pushed;
}

/* The lane was full: wait by the pool's strategy until an executor frees a
 * slot, the pool closes or the timeout passes. While the executor keeps
 * taking items the producer keeps spinning: parking it there would cost a
 * futex round trip per refill, and the wake-up tends to pull it onto the
 * executor's CPU. */
static int wait_for_space(struct space_wait *w, int timeout_ms)
{
    if (timeout_ms == 0)
        return KB_EFULL;
    int64_t deadline = kb__deadline_ns(timeout_ms), now = kb__now_ns();
    unsigned int taken = ck_pr_load_uint(&w->lane->ring.c_head);
    kb_idle_wait iw;
    kb__idle_wait_init(&iw, w->p->o.idle);
    for (;;) {
        int r = try_push(w);
        if (r != 0)
            return r == 1 ? KB_OK : KB_ECLOSED;
        if (kb__idle_wait_step(&iw, &now))
            break;
        if (now >= deadline)
            return KB_EFULL;
        unsigned int c = ck_pr_load_uint(&w->lane->ring.c_head);
        if (c != taken) {
            taken = c;
            kb__idle_wait_reset(&iw);
        }
    }
    int r = kb__signal_wait(&w->lane->space, try_push, w, deadline);
    return r == 1 ? KB_OK : r == 2 ? KB_ECLOSED : KB_EFULL;
}

/* Lanes a submit call pushed to; scheduled together when it ends. */
struct touched {
    kb_idle idle;
    unsigned n;
    struct kb_lane *lane[TOUCHED_MAX];
};

/* Dekker with the executor's unscheduling (executor.c, hold_for_recheck): our pushes
 * must be ordered before we read `scheduled`. The executor pays the expensive
 * side, once per batch of lanes it unschedules — except with `block`, whose
 * executors park per burst and could not afford it. */
static inline void fence_before_schedule(kb_idle idle)
{
    if (idle == KB_IDLE_BLOCK)
        kb__fence();
    else
        kb__fence_hot();
}

/* Put a lane we pushed to on its executor's ready queue if it was idle;
 * false when it already was scheduled (nothing to wake). */
static inline bool schedule_lane(struct kb_lane *lane)
{
    uint32_t idle = 0;
    if (atomic_load_explicit(&lane->scheduled, memory_order_relaxed) != 0 ||
        !atomic_compare_exchange_strong(&lane->scheduled, &idle, 1))
        return false;
    kb__lane_ready(lane);
    KB_PROBE2(lane_schedule, lane->index, lane->ex->index);
    return true;
}

/* Put the touched lanes that went idle on their executors' ready queues and
 * wake each of those executors once. */
static void schedule_touched(struct touched *t)
{
    struct kb_executor *woken[TOUCHED_MAX];
    unsigned n_woken = 0;
    fence_before_schedule(t->idle);
    for (unsigned i = 0; i < t->n; i++) {
        struct kb_lane *lane = t->lane[i];
        if (!schedule_lane(lane))
            continue;
        unsigned k = 0;
        while (k < n_woken && woken[k] != lane->ex)
            k++;
        if (k == n_woken)
            woken[n_woken++] = lane->ex;
    }
    if (n_woken > 0) {
        kb__fence();   /* the ready-queue entries before the parked check */
        for (unsigned k = 0; k < n_woken; k++)
            kb__signal_poke(&woken[k]->wake);
    }
    t->n = 0;
}

/* Only the last few entries are compared: a batch touching many distinct
 * lanes would otherwise scan the whole list per item (a third of a batched
 * publish's instructions, callgrind). A lane listed twice is harmless: its
 * second entry finds it scheduled. */
static void touch(struct touched *t, struct kb_lane *lane)
{
    for (unsigned i = t->n, seen = 0; i > 0 && seen < TOUCHED_RECENT; i--, seen++)
        if (t->lane[i - 1] == lane)
            return;
    if (t->n == TOUCHED_MAX)
        schedule_touched(t);
    t->lane[t->n++] = lane;
}

/* After a push to `lane`: list it for scheduling when the call ends, unless
 * it is scheduled already. That look is the read fence_before_schedule
 * orders after our pushes, affordable per push where that is a compiler
 * barrier; where it is a full fence (block, or no membarrier) every lane is
 * listed instead, for one fence per call. Under a steady stream the lanes
 * linger scheduled, and the list stays short. */
static inline void pushed_to(struct touched *t, struct kb_lane *lane)
{
    if (t->idle != KB_IDLE_BLOCK && atomic_load_explicit(&kb__asym_ok, memory_order_relaxed)) {
        kb__fence_hot();
        if (atomic_load_explicit(&lane->scheduled, memory_order_relaxed) != 0)
            return;
    }
    touch(t, lane);
}

/* Items a batch looks at, and may regroup, at once. */
#define WINDOW_MAX 64
/* Bits of the filter of lanes a window has seen (lanes beyond share them). */
#define SEEN_BITS 1024
/* The open-addressing table that finds each item's group when a window is
 * regrouped (more slots than items, a power of two). */
#define GROUP_SLOT_BITS 7
#define GROUP_NONE 0xff

/* Up to WINDOW_MAX items of a batch and their lanes. */
struct window {
    size_t n;              /* items up to the end or the first NULL one */
    bool null_item;        /* the window stopped at a NULL item */
    bool interleaved;      /* maybe some lane's items are split by another's */
    uint32_t idx[WINDOW_MAX];
};

/* Each item's lane, once, and whether regrouping may pay: a lane that comes
 * back after another one's run. A bit per lane tells (lanes past SEEN_BITS
 * share bits, so this may say yes wrongly, never no wrongly). */
static inline void window_scan(const kb_pool *p, const uint32_t *hashes, void *const *items,
                               size_t n, struct window *w)
{
    uint64_t seen[SEEN_BITS / 64] = {0};
    if (n > WINDOW_MAX)
        n = WINDOW_MAX;
    w->null_item = false;
    w->interleaved = false;
    size_t i = 0;
    for (; i < n; i++) {
        if (items[i] == NULL) {
            w->null_item = true;
            break;
        }
        uint32_t idx = w->idx[i] = lane_of(p, hashes[i]);
        if (i > 0 && idx == w->idx[i - 1])
            continue;
        uint64_t *word = &seen[(idx / 64) % (SEEN_BITS / 64)], bit = 1ull << (idx % 64);
        w->interleaved |= (*word & bit) != 0;
        *word |= bit;
    }
    w->n = i;
}

/* Regroup a window's items by lane so that each lane's items, in batch
 * order, move with one ring reservation, where runs of adjacent items would
 * have taken one per run (keys interleaved in the batch). Only where the
 * whole window is sure to be taken, so the batch still takes a prefix when
 * a lane is full: one producer (a lane's room then only grows) and room for
 * every group now. Returns the items taken: all of the window, or 0 with
 * nothing pushed (no certainty). */
static size_t push_grouped(kb_pool *p, const struct window *w, void *const *items,
                           kb_push_mode mode, struct touched *t)
{
    if (mode == KB_PUSH_MPSC)
        return 0;
    uint8_t slot[1u << GROUP_SLOT_BITS], group_of[WINDOW_MAX], count[WINDOW_MAX] = {0};
    uint32_t lane_idx[WINDOW_MAX];
    unsigned groups = 0;
    memset(slot, GROUP_NONE, sizeof slot);
    for (size_t i = 0; i < w->n; i++) {
        uint32_t idx = w->idx[i];
        unsigned h = (idx * 2654435761u) >> (32 - GROUP_SLOT_BITS);
        while (slot[h] != GROUP_NONE && lane_idx[slot[h]] != idx)
            h = (h + 1) & ((1u << GROUP_SLOT_BITS) - 1);
        if (slot[h] == GROUP_NONE) {
            slot[h] = (uint8_t)groups;
            lane_idx[groups++] = idx;
        }
        group_of[i] = slot[h];
        count[slot[h]]++;
    }
    struct kb_lane *lanes[WINDOW_MAX];
    unsigned first[WINDOW_MAX];
    for (unsigned g = 0, at = 0; g < groups; at += count[g], g++) {
        struct kb_lane *lane = lanes[g] = lane_get(p, lane_idx[g]);
        if (lane == NULL)
            return 0;
        unsigned int head =
            ck_pr_load_uint(mode == KB_PUSH_SPSC ? &lane->ring.p_tail : &lane->ring.p_head);
        if (head - kb__ring_consumed(&lane->ring, &lane->seen, head, count[g]) +
                count[g] > lane->ring.mask)
            return 0;
        first[g] = at;
    }
    void *sorted[WINDOW_MAX];
    unsigned fill[WINDOW_MAX];
    memcpy(fill, first, groups * sizeof *fill);
    for (size_t i = 0; i < w->n; i++)
        sorted[fill[group_of[i]]++] = items[i];
    for (unsigned g = 0; g < groups; g++) {
        /* takes all: checked above, and no other producer pushes meanwhile */
        kb__ring_push_n(&lanes[g]->ring, lanes[g]->buf, sorted + first[g], count[g], mode,
                        &lanes[g]->seen);
        pushed_to(t, lanes[g]);
    }
    return w->n;
}

int kb_pool_submit_batch(kb_pool *p, const uint32_t *hashes, void *const *items, size_t n,
                         int timeout_ms, size_t *accepted)
{
    size_t done = 0;
    int rc = KB_OK;
    if (p == NULL || (n > 0 && (hashes == NULL || items == NULL))) {
        rc = KB_EINVAL;
        goto out;
    }
    if (atomic_load_explicit(&p->closed, memory_order_acquire)) {
        rc = KB_ECLOSED;
        goto out;
    }
    bool owning;
    kb_push_mode mode = enter_push(p, &owning);
    struct touched t;
    t.n = 0;
    t.idle = p->o.idle;
    struct window w;
    while (rc == KB_OK && done < n) {
        size_t base = done;
        window_scan(p, hashes + base, items + base, n - base, &w);
        if (w.interleaved && w.n > 2)
            done += push_grouped(p, &w, items + base, mode, &t);
        /* runs of adjacent items of one lane, one reservation each */
        while (done < base + w.n) {
            uint32_t idx = w.idx[done - base];
            unsigned run = 1;
            while (done + run < base + w.n && w.idx[done + run - base] == idx)
                run++;
            struct kb_lane *lane = lane_get(p, idx);
            if (lane == NULL) {
                rc = KB_ENOMEM;
                break;
            }
            unsigned int k = kb__ring_push_n(&lane->ring, lane->buf, items + done, run, mode,
                                             &lane->seen);
            if (k == 0 && lane->ex == kb__on_executor) {
                /* A handler's own executor cannot drain the lane while it waits. */
                atomic_fetch_add_explicit(&p->rejected, 1, memory_order_relaxed);
                rc = KB_EFULL;
                break;
            }
            if (k == 0) {
                schedule_touched(&t);   /* what we pushed must drain while we wait */
                leave_push(p, owning);
                struct space_wait sw = {.p = p, .lane = lane, .item = items[done]};
                int waited = wait_for_space(&sw, timeout_ms);
                mode = enter_push(p, &owning);
                if (waited != KB_OK) {
                    if (waited == KB_EFULL)
                        atomic_fetch_add_explicit(&p->rejected, 1, memory_order_relaxed);
                    rc = waited;
                    break;
                }
                k = 1;
            }
            pushed_to(&t, lane);
            done += k;
        }
        if (rc == KB_OK && w.null_item)
            rc = KB_EINVAL;
    }
    leave_push(p, owning);
    schedule_touched(&t);
out:
    if (accepted != NULL)
        *accepted = done;
    return rc;
}

/* One item: the common case takes one ring slot and schedules one lane
 * without the batch's bookkeeping (a third of a publish's instructions,
 * callgrind); a full lane, a closed pool or an error go the batch's way,
 * which waits, counts and reports. */
int kb__pool_submit_one(kb_pool *p, uint32_t hash, void *item, int timeout_ms)
{
    if (atomic_load_explicit(&p->closed, memory_order_acquire))
        return KB_ECLOSED;
    struct kb_lane *lane = lane_get(p, lane_of(p, hash));
    unsigned int k = 0;
    if (lane != NULL) {
        bool owning;
        kb_push_mode mode = enter_push(p, &owning);
        k = kb__ring_push_n(&lane->ring, lane->buf, &item, 1, mode, &lane->seen);
        leave_push(p, owning);
    }
    if (k == 0)
        return kb_pool_submit_batch(p, &hash, &item, 1, timeout_ms, NULL);
    fence_before_schedule(p->o.idle);
    if (schedule_lane(lane)) {
        kb__fence();   /* the ready-queue entry before the parked check */
        kb__signal_poke(&lane->ex->wake);
    }
    return KB_OK;
}

int kb_pool_submit_hash(kb_pool *p, uint32_t hash, void *item, int timeout_ms)
{
    if (p == NULL || item == NULL)
        return KB_EINVAL;
    return kb__pool_submit_one(p, hash, item, timeout_ms);
}

int kb_pool_submit(kb_pool *p, const void *key, size_t key_len, void *item, int timeout_ms)
{
    if (key == NULL || key_len == 0)
        return KB_EINVAL;
    return kb_pool_submit_hash(p, kb__fnv1a32(key, key_len), item, timeout_ms);
}

uint32_t kb_pool_lane_of(const kb_pool *p, const void *key, size_t key_len)
{
    return lane_of(p, kb__fnv1a32(key, key_len));
}

uint32_t kb_pool_executor_of(const kb_pool *p, uint32_t lane)
{
    return (uint32_t)(kb_mix64(lane ^ p->o.salt) % p->sched->n);
}

uint32_t kb__pool_lane(const kb_pool *p, uint32_t hash)
{
    return lane_of(p, hash);
}

bool kb__pool_lane_is_ours(const kb_pool *p, uint32_t lane)
{
    return kb__on_executor != NULL &&
           kb__on_executor == &p->sched->ex[kb_pool_executor_of(p, lane)];
}

/* ---- waiting for work to finish ---- */

/* What one or more pools on one scheduler must have finished: per lane of
 * each pool in turn, what its ring had taken in when the wait began. */
struct flush_target {
    kb_pool *const *pools;
    size_t n;
    uint32_t *enqueued;     /* NULL: "everything", i.e. drain */
    int (*cut)(void *);     /* NULL: wait for the lanes or the deadline only */
    void *arg;
};

static int lanes_caught_up(const struct flush_target *t)
{
    const uint32_t *target = t->enqueued;
    for (size_t k = 0; k < t->n; k++) {
        const kb_pool *p = t->pools[k];
        for (uint32_t i = 0; i < p->o.lanes; i++, target += target != NULL) {
            struct kb_lane *lane = lane_peek(p, i);
            if (lane == NULL)
                continue;
            uint32_t want = target ? *target : kb__ring_enqueued(&lane->ring);
            uint32_t done = atomic_load_explicit(&lane->done, memory_order_acquire);
            if ((int32_t)(done - want) < 0)
                return 0;
        }
    }
    return 1;
}

static int caught_up_or_cut(void *arg)
{
    const struct flush_target *t = arg;
    return (t->cut != NULL && t->cut(t->arg)) || lanes_caught_up(t);
}

int kb__pools_flush(kb_pool *const *pools, size_t n, int64_t deadline_ns, int (*cut)(void *),
                    void *arg)
{
    if (n == 0)
        return KB_OK;
    size_t lanes = 0;
    for (size_t k = 0; k < n; k++)
        lanes += pools[k]->o.lanes;
    uint32_t *enqueued = malloc(sizeof(uint32_t) * lanes);
    if (enqueued == NULL)
        return KB_ENOMEM;
    uint32_t *e = enqueued;
    for (size_t k = 0; k < n; k++)
        for (uint32_t i = 0; i < pools[k]->o.lanes; i++) {
            struct kb_lane *lane = lane_peek(pools[k], i);
            *e++ = lane ? kb__ring_enqueued(&lane->ring) : 0;
        }
    struct flush_target t = {.pools = pools, .n = n, .enqueued = enqueued, .cut = cut, .arg = arg};
    int rc = KB_OK;
    if (!kb__signal_wait(&pools[0]->sched->progress, caught_up_or_cut, &t, deadline_ns))
        rc = KB_ETIMEDOUT;
    else if (!lanes_caught_up(&t))
        rc = KB_ECLOSED;   /* cut short */
    free(enqueued);
    return rc;
}

int kb_pool_flush(kb_pool *p, int timeout_ms)
{
    if (p == NULL)
        return KB_EINVAL;
    return kb__pools_flush(&p, 1, kb__deadline_ns(timeout_ms), NULL, NULL);
}

int kb__pool_drain(kb_pool *p, int64_t deadline_ns)
{
    struct flush_target t = {.pools = &p, .n = 1};
    return kb__signal_wait(&p->sched->progress, caught_up_or_cut, &t, deadline_ns) ? KB_OK
                                                                                  : KB_ETIMEDOUT;
}

void kb_pool_shutdown(kb_pool *p)
{
    if (p == NULL)
        return;
    atomic_store_explicit(&p->closed, 1, memory_order_seq_cst);
    kb__fence();
    for (uint32_t i = 0; i < p->o.lanes; i++) {
        struct kb_lane *lane = lane_peek(p, i);
        if (lane != NULL)
            kb__signal_poke(&lane->space);
    }
}

/* An item still set aside when the pool is freed: never finished. */
static void release_parked(void *item, bool first, uint32_t attempt, void *arg)
{
    kb_pool *p = arg;
    if (p->o.finish != NULL)
        p->o.finish(item, KB_ECLOSED, first ? attempt - 1 : 0, p->o.opaque);
}

void kb__pool_free(kb_pool *p)
{
    for (uint32_t i = 0; i < p->o.lanes; i++) {
        struct kb_lane *lane = lane_peek(p, i);
        if (lane == NULL)
            continue;
        void *item;
        for (uint8_t a = 0; a < lane->ahead_len && p->o.finish != NULL; a++)
            p->o.finish(lane->ahead[(lane->ahead_head + a) & (KB_LANE_LOOKAHEAD - 1)], KB_ECLOSED,
                        a == 0 ? lane->attempt - 1 : 0, p->o.opaque);
        while ((item = kb__ring_pop(&lane->ring, lane->buf)) != NULL)
            if (p->o.finish != NULL)
                p->o.finish(item, KB_ECLOSED, 0, p->o.opaque);
        kb__parked_free(lane->parked, release_parked, p);
        free(lane);
    }
    free(p->lanes);
    free(p);
}

int kb_pool_destroy(kb_pool *p, int timeout_ms)
{
    if (p == NULL)
        return KB_EINVAL;
    kb_pool_shutdown(p);
    int rc = kb__pool_drain(p, kb__deadline_ns(timeout_ms));
    kb__sched_destroy(p->own_sched ? p->sched : NULL);
    kb__pool_free(p);
    return rc;
}

/* ---- statistics ---- */

static void read_lane(const struct kb_lane *lane, kb_lane_stats *out)
{
    struct kb_lane *l = (struct kb_lane *)lane;
    uint32_t depth = ck_ring_size(&l->ring);
    /* held: the waiting aggregates' first items, and the ones set aside behind them */
    uint32_t held = atomic_load_explicit(&l->seen.held, memory_order_relaxed);
    out->handled = atomic_load_explicit(&l->handled, memory_order_relaxed);
    out->retried = atomic_load_explicit(&l->retried, memory_order_relaxed);
    out->dead = atomic_load_explicit(&l->dead, memory_order_relaxed);
    out->submitted = atomic_load_explicit(&l->taken, memory_order_relaxed) + depth;
    out->depth = depth;
    /* The executor notes the depth whenever it takes items, when it is
     * deepest since its last look; what queued since is deeper still. */
    out->max_depth = atomic_load_explicit(&l->max_depth, memory_order_relaxed);
    if (depth + held > out->max_depth)
        out->max_depth = depth + held;
    out->executor = l->ex->index;
    out->allocated = 1;
    out->aggregates_waiting = atomic_load_explicit(&l->waiting_seen, memory_order_relaxed);
    out->set_aside = held > out->aggregates_waiting ? held - out->aggregates_waiting : 0;
}

int kb_pool_lane_stats(const kb_pool *p, uint32_t lane, kb_lane_stats *out)
{
    if (p == NULL || out == NULL || lane >= p->o.lanes)
        return KB_EINVAL;
    memset(out, 0, sizeof *out);
    struct kb_lane *l = lane_peek(p, lane);
    if (l != NULL)
        read_lane(l, out);
    else
        out->executor = kb_pool_executor_of(p, lane);
    return KB_OK;
}

void kb_pool_stats_get(const kb_pool *p, kb_pool_stats *out)
{
    memset(out, 0, sizeof *out);
    out->lanes = p->o.lanes;
    out->threads = p->sched->n;
    out->capacity = p->ring_size - 1;
    out->rejected = atomic_load_explicit(&((kb_pool *)p)->rejected, memory_order_relaxed);
    for (uint32_t i = 0; i < p->o.lanes; i++) {
        struct kb_lane *l = lane_peek(p, i);
        if (l == NULL)
            continue;
        kb_lane_stats ls;
        read_lane(l, &ls);
        out->lanes_allocated++;
        out->submitted += ls.submitted;
        out->handled += ls.handled;
        out->retried += ls.retried;
        out->dead += ls.dead;
        out->depth += ls.depth;
        if (ls.max_depth > out->max_depth)
            out->max_depth = ls.max_depth;
        out->set_aside += ls.set_aside;
        out->aggregates_waiting += ls.aggregates_waiting;
    }
    out->memory_bytes = sizeof *p + p->o.lanes * sizeof *p->lanes +
                        (uint64_t)out->lanes_allocated * lane_bytes(p);
}
