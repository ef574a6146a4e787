/* Executor threads: each owns a set of lanes for life, runs the lanes that
 * producers marked ready, delays lanes whose head item asked for a retry, and
 * parks when there is nothing to do. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idle.h"
#include "parked.h"
#include "pool_int.h"
#include "ring.h"

/* Items handled per lane visit before the lane goes to the back of the ready
 * queue: bounds how long one hot key can hold its executor. */
#define LANE_BATCH 64
/* Empty visits before a lane leaves the ready queue. */
#define LANE_LINGER_VISITS 2
/* A round of the run list that handled fewer items than this per lane visit
 * means the executor outruns its producers: it then takes an item or two per
 * visit, and each item's ring slot, the producers' counter and the record move
 * between the cores once per event instead of once per batch, which slows the
 * producers (mixed, 3 lanes: 3.4M events/s against 5.0M paced). */
#define PACE_ITEMS_PER_VISIT 8
/* Pause instructions after such a round (~2.4 µs at 18.7 ns a pause here):
 * long enough for a few items per lane to arrive at millions of events/s,
 * short beside the median targets at fixed rates. */
#define PACE_PAUSES 128

/* A lane just unscheduled is re-checked for items after a barrier at the
 * latest this long after, when the executor stays busy (it re-checks at once
 * before parking). The cheap looks find a raced item long before; the barrier
 * is the guarantee, and it costs: a membarrier took 22 µs on average (147 at
 * most) in a VM, every lane of the executor waiting meanwhile. */
#define RECHECK_NS 10000000
/* Cheap looks a lane just unscheduled gets before only the fenced check
 * covers it: a push that raced the unscheduling is visible by then (the
 * producer's store buffer drains in well under a µs), while looking at every
 * lane unscheduled since the last barrier costs each visit ~8 more rings at
 * 1M events/s over 100 aggregates. */
#define RECHECK_LOOKS 4
/* An idle executor takes the barrier this long after it found nothing: long
 * enough that a short gap between bursts costs no membarrier. */
#define IDLE_RECHECK_NS 50000

/* Passes that find only a half-linked ready node before the executor yields. */
#define BLOCKED_SPINS 64

/* Lanes producers made ready arrive on the wait-free queue; the executor moves
 * them to its private run list, where re-queueing a lane costs no atomics. */
static void run_list_push(struct kb_executor *ex, struct kb_lane *lane)
{
    lane->run_next = NULL;
    if (ex->run_tail != NULL)
        ex->run_tail->run_next = lane;
    else
        ex->run_head = lane;
    ex->run_tail = lane;
    ex->run_len++;
}

/* A lane found holding an event after it was unscheduled: that event is older
 * than anything the lanes lingering on the list may hold. */
static void run_list_push_front(struct kb_executor *ex, struct kb_lane *lane)
{
    lane->run_next = ex->run_head;
    if (ex->run_head == NULL)
        ex->run_tail = lane;
    ex->run_head = lane;
    ex->run_len++;
}

static struct kb_lane *run_list_pop(struct kb_executor *ex)
{
    struct kb_lane *lane = ex->run_head;
    if (lane != NULL) {
        ex->run_head = lane->run_next;
        if (ex->run_head == NULL)
            ex->run_tail = NULL;
        ex->run_len--;
    }
    return lane;
}

/* Move the lanes producers made ready to the front of the run list, in the
 * order they came: their events are the oldest the executor knows of, while
 * the lanes lingering behind them mostly hold nothing yet. At the back they
 * waited a whole round of those, so the wait grew with the lanes lingering.
 * Never waits: a producer preempted between swapping the queue's tail and
 * linking its node leaves that node (and any behind it) unreachable for a
 * moment, and liburcu's blocking dequeue would then sleep 10 ms (WFCQ_WAIT);
 * the non-blocking one says so instead. Returns false when such a node was
 * left for the next pass. */
static bool collect_ready(struct kb_executor *ex)
{
    struct cds_wfcq_node *node;
    if (cds_wfcq_empty(&ex->head, &ex->tail))
        return true;
    struct kb_lane *first = NULL, *last = NULL;
    uint32_t n = 0;
    bool linked = true;
    while ((node = __cds_wfcq_dequeue_nonblocking(&ex->head, &ex->tail)) != NULL) {
        if (node == CDS_WFCQ_WOULDBLOCK) {
            linked = false;
            break;
        }
        struct kb_lane *lane = caa_container_of(node, struct kb_lane, ready_node);
        KB_TSAN_ACQUIRE(lane);
        lane->run_next = NULL;
        if (last != NULL)
            last->run_next = lane;
        else
            first = lane;
        last = lane;
        n++;
    }
    if (first != NULL) {
        last->run_next = ex->run_head;
        if (ex->run_head == NULL)
            ex->run_tail = last;
        ex->run_head = first;
        ex->run_len += n;
    }
    return linked;
}

void kb__lane_ready(struct kb_lane *lane)
{
    KB_TSAN_RELEASE(lane);
    cds_wfcq_node_init(&lane->ready_node);
    cds_wfcq_enqueue(&lane->ex->head, &lane->ex->tail, &lane->ready_node);
}

/* ---- delayed lanes and waiting aggregates: a binary min-heap on due_ns,
 * private to the executor ---- */

static bool heap_push(struct kb_executor *ex, int64_t due_ns, struct kb_lane *lane,
                      struct kb_waiting *w)
{
    if (kb_vec_reserve((void **)&ex->heap, &ex->heap_cap, ex->heap_len + 1, sizeof *ex->heap) !=
        KB_OK)
        return false;
    size_t i = ex->heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (ex->heap[parent].due_ns <= due_ns)
            break;
        ex->heap[i] = ex->heap[parent];
        i = parent;
    }
    ex->heap[i] = (struct kb_timer){due_ns, lane, w};
    return true;
}

static struct kb_timer heap_pop(struct kb_executor *ex)
{
    struct kb_timer top = ex->heap[0];
    struct kb_timer last = ex->heap[--ex->heap_len];
    size_t i = 0, n = ex->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && ex->heap[c + 1].due_ns < ex->heap[c].due_ns)
            c++;
        if (last.due_ns <= ex->heap[c].due_ns)
            break;
        ex->heap[i] = ex->heap[c];
        i = c;
    }
    if (n > 0)
        ex->heap[i] = last;
    return top;
}

static uint64_t next_random(struct kb_executor *ex)
{
    /* xorshift64*: jitter only needs to decorrelate retries */
    uint64_t x = ex->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    ex->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* retry.backoff_ms * 2^(attempt-1), capped, jittered so retries of many
 * lanes do not fire in lockstep. */
static int64_t retry_delay_ns(struct kb_executor *ex, const kb_pool_options *o, uint32_t attempt)
{
    return kb_backoff_ns(o->backoff_ms, o->max_backoff_ms, attempt > 1 ? attempt - 1 : 0,
                         next_random(ex)) + 1;
}

static void finish(kb_pool *p, struct kb_lane *lane, void *item, int outcome, uint32_t attempts)
{
    if (p->o.finish != NULL)
        p->o.finish(item, outcome, attempts, p->o.opaque);
    /* Single writer, so no locked add. Release: flush readers that see `done`
     * also see the finish side effects. */
    atomic_store_explicit(&lane->done, atomic_load_explicit(&lane->done, memory_order_relaxed) + 1,
                          memory_order_release);
}

/* Run the handler on an item of the lane and finish the item, unless it asks
 * for a retry: then false (the retry counted). Inlined into both callers: a
 * call per event cost the hot path about 20 instructions (callgrind). */
static inline __attribute__((always_inline)) bool run_item(struct kb_lane *lane, void *item, uint32_t attempt)
{
    kb_pool *p = lane->pool;
    int r = p->o.handle(item, attempt, p->o.opaque);
    if (r == KB_POOL_SKIP && p->skip_ok) {
        finish(p, lane, item, KB_ECLOSED, attempt);
        return true;
    }
    if (r == KB_HANDLED) {
        /* counted before the lane is marked done: a flush or drain that
         * returns then sees it in the stats */
        kb__counter_bump(&lane->handled);
        finish(p, lane, item, KB_HANDLED, attempt);
        return true;
    }
    if (r != KB_DEAD && (p->o.max_attempts == 0 || attempt < p->o.max_attempts)) {
        kb__counter_bump(&lane->retried);
        return false;
    }
    kb__counter_bump(&lane->dead);
    finish(p, lane, item, KB_DEAD, attempt);
    return true;
}

/* ---- retry.scope = key: an aggregate waits for its retry alone ---- */

/* Items taken off the ring and kept: producers count them as queued. */
static void held_add(struct kb_lane *lane, int delta)
{
    unsigned int held = atomic_load_explicit(&lane->seen.held, memory_order_relaxed);
    atomic_store_explicit(&lane->seen.held, held + (unsigned int)delta, memory_order_release);
}

static void waiting_add(struct kb_lane *lane, int delta)
{
    lane->waiting += (uint32_t)delta;
    atomic_store_explicit(&lane->waiting_seen, lane->waiting, memory_order_relaxed);
}

static const void *item_key(const kb_pool *p, const void *item, size_t *len)
{
    return p->o.key(item, len, p->o.opaque);
}

/* The lane's head item asked for a retry due at due_ns: it leaves the lane to
 * wait with the later items of its key, and the lane goes on. false when the
 * lane has to wait instead (scope lane, no key function, or no memory). */
static bool park(struct kb_executor *ex, struct kb_lane *lane, void *item, uint32_t attempt,
                 int64_t due_ns)
{
    kb_pool *p = lane->pool;
    if (p->o.retry_scope != KB_RETRY_SCOPE_KEY || p->o.key == NULL)
        return false;
    /* as many as the ring holds, and what the executor had popped ahead */
    if (lane->parked == NULL &&
        (lane->parked = kb__parked_new(lane->ring.mask + KB_LANE_LOOKAHEAD)) == NULL)
        return false;
    size_t len;
    const void *key = item_key(p, item, &len);
    struct kb_waiting *w =
        kb__parked_open(lane->parked, lane, item, key, len, kb_fnv1a32(key, len));
    if (w == NULL)
        return false;
    w->attempt = attempt;
    if (!heap_push(ex, due_ns, lane, w)) {
        kb__parked_pop(lane->parked, w);
        return false;
    }
    held_add(lane, 1);
    waiting_add(lane, 1);
    return true;
}

/* An item of the lane whose key waits for a retry joins it, in arrival
 * order. 1: set aside; 0: its key does not wait; -1: no room to set it
 * aside, the lane waits until an aggregate's items run. Out of line: only
 * lanes with a waiting key call it, and inlined its set-up leaked into the
 * loop every event takes. */
static __attribute__((noinline, cold)) int set_aside(struct kb_lane *lane, void *item)
{
    size_t len;
    const void *key = item_key(lane->pool, item, &len);
    struct kb_waiting *w = kb__parked_find(lane->parked, key, len, kb_fnv1a32(key, len));
    if (w == NULL)
        return 0;
    if (!kb__parked_append(lane->parked, w, item))
        return -1;
    held_add(lane, 1);
    return 1;
}

/* Wake producers waiting on a full lane once it is half empty, not per
 * freed slot: each wake costs a futex call on both sides, so let them refill
 * in bulk. Waiters are rare and pay the fence (kb__signal_wait). */
static void poke_space(struct kb_lane *lane)
{
    kb__fence_hot();
    unsigned int held = atomic_load_explicit(&lane->seen.held, memory_order_relaxed);
    if (ck_ring_size(&lane->ring) + held <= ck_ring_capacity(&lane->ring) / 2)
        kb__signal_poke(&lane->space);
}

/* A waiting aggregate's retry is due: run its items in order until one asks
 * for another retry (it waits again) or none is left (the key runs in the
 * lane again). A batch at most per turn, like a lane visit. */
static void run_waiting(struct kb_executor *ex, struct kb_waiting *w)
{
    struct kb_lane *lane = w->lane;
    kb_pool *p = lane->pool;
    unsigned n = 0;
    bool left = true;
    while (left && !atomic_load_explicit(&ex->sched->stop, memory_order_relaxed)) {
        if (n >= LANE_BATCH) {
            if (heap_push(ex, kb__now_ns(), lane, w))
                break;
        }
        void *item = kb__parked_head(lane->parked, w);
        uint32_t attempt = w->attempt;
        if (!run_item(lane, item, attempt)) {
            w->attempt = attempt + 1;
            if (heap_push(ex, kb__now_ns() + retry_delay_ns(ex, &p->o, attempt), lane, w))
                break;
            continue;   /* no memory to wait: retry at once rather than lose order */
        }
        n++;
        held_add(lane, -1);
        w->attempt = 1;
        left = kb__parked_pop(lane->parked, w);
        if (left)
            w->key = item_key(p, kb__parked_head(lane->parked, w), &w->key_len);
        else
            waiting_add(lane, -1);
    }
    if (n == 0)
        return;
    if (lane->held_up) {   /* there is room to set its next item aside now */
        lane->held_up = false;
        run_list_push(ex, lane);
    }
    poke_space(lane);
    kb__signal_poke(&ex->sched->progress);
}

/* Handle the lane's head item. false: it was delayed for a retry and stays at
 * the head. */
static bool handle_item(struct kb_executor *ex, struct kb_lane *lane, void *item)
{
    uint32_t attempt = lane->attempt;
    if (run_item(lane, item, attempt))
        return true;
    int64_t due_ns = kb__now_ns() + retry_delay_ns(ex, &lane->pool->o, attempt);
    if (park(ex, lane, item, attempt + 1, due_ns))
        return true;
    lane->attempt = attempt + 1;
    lane->due_ns = due_ns;
    if (heap_push(ex, due_ns, lane, NULL))
        return false;
    /* No memory to delay the lane: retry at once rather than lose order. */
    return handle_item(ex, lane, item);
}

/* Top the lane's look-ahead up to KB_LANE_LOOKAHEAD items and start loading
 * them: the records were written on another core, and the miss would
 * otherwise stall each handler. Topped up at half, not when empty, so the
 * records of the next few items load while the ones before them run. */
static void refill(struct kb_lane *lane)
{
    void *got[KB_LANE_LOOKAHEAD];
    unsigned int queued;
    unsigned n = kb__ring_pop_n(&lane->ring, lane->buf, got,
                                KB_LANE_LOOKAHEAD - lane->ahead_len, &queued);
    /* The depth only grows between two refills: this is its largest since
     * the last one. Noted here, by the one writer, not by every push, whose
     * view of the consumer's position is stale on purpose (ring.h). */
    queued += atomic_load_explicit(&lane->seen.held, memory_order_relaxed);
    if (queued > atomic_load_explicit(&lane->max_depth, memory_order_relaxed))
        atomic_store_explicit(&lane->max_depth, queued, memory_order_relaxed);
    for (unsigned i = 0; i < n; i++) {
        __builtin_prefetch(got[i]);
        __builtin_prefetch((char *)got[i] + KB_CACHELINE);
        lane->ahead[(lane->ahead_head + lane->ahead_len + i) & (KB_LANE_LOOKAHEAD - 1)] = got[i];
    }
    lane->ahead_len = (uint8_t)(lane->ahead_len + n);
    if (n > 0)
        atomic_store_explicit(&lane->taken,
                              atomic_load_explicit(&lane->taken, memory_order_relaxed) + n,
                              memory_order_relaxed);
}

/* Start loading what the visit of the lane after this one reads first, its
 * producers' ring counter and the slot at its head: both were written on the
 * publisher's core, and each visit otherwise began with those two misses in a
 * row. */
static inline void prefetch_lane(const struct kb_lane *lane)
{
    __builtin_prefetch(&lane->ring.p_tail);
    __builtin_prefetch(&lane->buf[lane->ring.c_head & lane->ring.mask]);
}

/* Dekker with kb_pool_submit, asymmetric: a producer pushes, orders with
 * kb__fence_hot() only, then reads `scheduled`; we clear `scheduled`, and
 * before the lane's ring is read for the verdict a kb__fence_rare() (one per
 * batch of lanes, at most RECHECK_NS after the first of them and before
 * parking) makes the producers' pushes visible. Either the producer saw 0 and
 * scheduled the lane, or we see its item. Meanwhile a few cheap looks catch
 * most such items early. */
static void hold_for_recheck(struct kb_executor *ex, struct kb_lane *lane)
{
    if (lane->rechecking && lane->recheck_looks < RECHECK_LOOKS) {
        lane->recheck_looks = 0;   /* unscheduled again: this time raced too */
        return;
    }
    if (lane->rechecking) {
        /* past its looks, then scheduled and unscheduled again: this
         * unscheduling raced its own producers, so it gets looks too */
        *lane->fenced_pprev = lane->recheck_next;
        if (lane->recheck_next != NULL)
            lane->recheck_next->fenced_pprev = lane->fenced_pprev;
    } else if (ex->rechecking == NULL && ex->fence_only == NULL) {
        ex->recheck_due_ns = kb__now_ns() + RECHECK_NS;
    }
    lane->rechecking = true;
    lane->recheck_looks = 0;
    lane->recheck_next = ex->rechecking;
    ex->rechecking = lane;
}

/* Schedule a lane just unscheduled again if it holds items. */
static bool reschedule_if_filled(struct kb_executor *ex, struct kb_lane *lane)
{
    uint32_t idle = 0;
    if (ck_ring_size(&lane->ring) == 0 ||
        !atomic_compare_exchange_strong(&lane->scheduled, &idle, 1))
        return false;
    run_list_push_front(ex, lane);
    return true;
}

/* Before a barrier: take off a re-check list the lanes a producer scheduled
 * again (that producer saw the lane idle, so its items are not stranded) and
 * schedule those a plain look finds holding items. Under a steady stream
 * every lane unscheduled is scheduled again within a round of its producer,
 * and the barrier, whose IPI round stalls every lane of the executor (4-50
 * µs on average on a 2-vCPU VM, milliseconds when a vCPU is preempted), is
 * skipped.
 * Returns whether a lane went back on the run list. */
static bool drop_scheduled_again(struct kb_executor *ex, struct kb_lane **list)
{
    bool found = false;
    struct kb_lane **pp = list;
    while (*pp != NULL) {
        struct kb_lane *lane = *pp;
        if (reschedule_if_filled(ex, lane)) {
            found = true;
        } else if (atomic_load_explicit(&lane->scheduled, memory_order_relaxed) == 0) {
            pp = &lane->recheck_next;
            continue;
        }
        lane->rechecking = false;
        *pp = lane->recheck_next;
        if (lane->recheck_next != NULL)
            lane->recheck_next->fenced_pprev = pp;
    }
    return found;
}

/* Re-check the lanes just unscheduled: schedule those holding items, forget
 * those scheduled again. A cheap look covers the lanes that had fewer than
 * RECHECK_LOOKS; the others wait for the fenced check alone. `fenced`: after a
 * kb__fence_rare(), the verdict on every empty one is final and both lists
 * empty. Returns whether a lane went back on the run list. */
static bool recheck_unscheduled(struct kb_executor *ex, bool fenced)
{
    if (ex->rechecking == NULL && ex->fence_only == NULL)
        return false;
    /* Where the fence is a plain mfence (pool.idle = block, or no
     * membarrier), deferring it saves nothing and only delays a raced item. */
    if (ex->sched->idle == KB_IDLE_BLOCK ||
        !atomic_load_explicit(&kb__asym_ok, memory_order_relaxed))
        fenced = true;
    bool found = false;
    if (fenced && ex->sched->idle == KB_IDLE_BLOCK) {
        kb__fence();        /* its producers fence fully: it parks per burst */
    } else if (fenced) {
        found = drop_scheduled_again(ex, &ex->rechecking);
        found |= drop_scheduled_again(ex, &ex->fence_only);
        if (ex->rechecking == NULL && ex->fence_only == NULL)
            return found;
        kb__fence_rare();
    }
    struct kb_lane **pp = &ex->rechecking;
    while (*pp != NULL) {
        struct kb_lane *lane = *pp;
        if (reschedule_if_filled(ex, lane)) {
            found = true;
        } else if (!fenced &&
                   atomic_load_explicit(&lane->scheduled, memory_order_relaxed) == 0) {
            if (++lane->recheck_looks < RECHECK_LOOKS) {
                pp = &lane->recheck_next;
                continue;
            }
            *pp = lane->recheck_next;        /* on to the fenced check alone */
            lane->recheck_next = ex->fence_only;
            if (ex->fence_only != NULL)
                ex->fence_only->fenced_pprev = &lane->recheck_next;
            lane->fenced_pprev = &ex->fence_only;
            ex->fence_only = lane;
            continue;
        }
        lane->rechecking = false;
        *pp = lane->recheck_next;
    }
    if (fenced) {
        for (struct kb_lane *lane = ex->fence_only; lane != NULL; lane = lane->recheck_next) {
            found |= reschedule_if_filled(ex, lane);
            lane->rechecking = false;
        }
        ex->fence_only = NULL;
    }
    return found;
}

/* Returns the number of items handled. */
static unsigned lane_visit(struct kb_executor *ex, struct kb_lane *lane)
{
    bool delayed = false;
    unsigned n = 0;

    for (;;) {
        /* `stop` is checked per item so a deadline in kb_close cuts a run of
         * slow handlers short after the one in hand. */
        if (atomic_load_explicit(&ex->sched->stop, memory_order_relaxed))
            break;
        if (lane->ahead_len <= KB_LANE_LOOKAHEAD / 2) {
            /* about a batch (LANE_BATCH) off the ring per visit at most */
            if (n + lane->ahead_len < LANE_BATCH)
                refill(lane);
            if (lane->ahead_len == 0)
                break;
        }
        void *item = lane->ahead[lane->ahead_head];
        int aside = lane->waiting > 0 ? set_aside(lane, item) : 0;
        if (aside < 0) {
            lane->held_up = true;   /* run_waiting schedules it again */
            delayed = true;
            break;
        }
        if (aside == 0 && !handle_item(ex, lane, item)) {
            delayed = true;
            break;
        }
        lane->ahead_head = (lane->ahead_head + 1) & (KB_LANE_LOOKAHEAD - 1);
        lane->ahead_len--;
        lane->attempt = 1;
        n++;
    }

    /* A lane that had work stays scheduled for one more round: under a steady
     * stream its next event is usually there by then, and the producer skips
     * the scheduling handshake (a CAS, a queue push and a fence) entirely. */
    lane->idle_visits = n > 0 ? 0 : lane->idle_visits + 1;
    bool unscheduled = false;
    if (!delayed) {
        if (lane->ahead_len > 0 || lane->idle_visits < LANE_LINGER_VISITS) {
            run_list_push(ex, lane);        /* back of the run list */
        } else {
            atomic_store_explicit(&lane->scheduled, 0, memory_order_release);
            hold_for_recheck(ex, lane);
            unscheduled = true;
        }
    }
    /* A visit that took nothing off the ring freed no space: an empty visit
     * of a lingering lane touches no line its producers write but the ring's. */
    if (n > 0 || delayed)
        poke_space(lane);
    /* Flushers wait for finished items and idle lanes: tell them whenever
     * there are some (a poke without waiters is one load). */
    if (n > 0 || delayed || unscheduled)
        kb__signal_poke(&ex->sched->progress);
    return n;
}

static void run_due_lanes(struct kb_executor *ex)
{
    int64_t now = kb__now_ns();
    /* Only the lanes due now: a lane re-delayed here waits for the next round. */
    for (size_t budget = ex->heap_len; budget > 0 && ex->heap_len > 0; budget--) {
        if (ex->heap[0].due_ns > now)
            break;
        struct kb_timer due = heap_pop(ex);
        if (due.w != NULL)
            run_waiting(ex, due.w);
        else
            lane_visit(ex, due.lane);
    }
}

static int has_work(void *arg)
{
    struct kb_executor *ex = arg;
    return !cds_wfcq_empty(&ex->head, &ex->tail) ||
           atomic_load_explicit(&ex->sched->stop, memory_order_acquire);
}

/* Nothing ready: wait by the bus's strategy for a producer to schedule a
 * lane, the next delayed lane to come due, or stop. */
static void idle(struct kb_executor *ex)
{
    kb_idle_wait iw;
    kb__idle_wait_init_executor(&iw, ex->sched->idle);
    int64_t now = kb__now_ns();
    /* Idle, the barrier delays no lane of ours: take it soon rather than
     * wait RECHECK_NS (spin and yield never reach the check before parking). */
    int64_t recheck_by = now + IDLE_RECHECK_NS;
    for (uint32_t step = 0;; step++) {
        if (has_work(ex) || (ex->heap_len > 0 && ex->heap[0].due_ns <= now))
            return;
        if ((step & 63) == 0 &&
            recheck_unscheduled(ex, now >= ex->recheck_due_ns || now >= recheck_by))
            return;
        if (kb__idle_wait_step(&iw, &now))
            break;
    }
    if (recheck_unscheduled(ex, true))   /* nothing may wait unseen while we sleep */
        return;
    int64_t deadline = ex->heap_len > 0 ? ex->heap[0].due_ns : INT64_MAX;
    kb__signal_wait(&ex->wake, has_work, ex, deadline);
}

_Thread_local struct kb_executor *kb__on_executor;
_Thread_local uint32_t kb__executor_number;

static void *executor_main(void *arg)
{
    struct kb_executor *ex = arg;
    kb__on_executor = ex;
    kb__executor_number = ex->index + 1;
    while (!atomic_load_explicit(&ex->sched->stop, memory_order_acquire)) {
        if (ex->heap_len > 0)
            run_due_lanes(ex);
        bool collected = collect_ready(ex);
        if (collected)
            ex->blocked_passes = 0;
        struct kb_lane *lane = run_list_pop(ex);
        if (lane != NULL) {
            if (ex->run_head != NULL)
                prefetch_lane(ex->run_head);
            /* A visit read the producers' ring counters; re-reading them at
             * once would pull the lines away from a producer between every two
             * of its writes. Once a whole round of the run list found little,
             * a short pause lets events accumulate; pausing per visit would
             * make a round, and so every event's wait, grow with the number of
             * lanes lingering on the list. */
            unsigned handled = lane_visit(ex, lane);
            ex->round_items += handled;
            if (++ex->round_visits >= ex->run_len) {
                if (ex->round_items < PACE_ITEMS_PER_VISIT * ex->round_visits)
                    for (int i = 0; i < PACE_PAUSES; i++)
                        ck_pr_stall();
                ex->round_visits = 0;
                ex->round_items = 0;
            }
            /* Lanes left unscheduled get a cheap look every few visits and
             * their final check once due. The clock (tens of ns in a VM) is
             * read after visits that ran handlers, which may have been slow,
             * and with the cheap look: read after every empty visit, it made
             * a round over lingering lanes cost a clock read per lane. */
            if (ex->rechecking != NULL || ex->fence_only != NULL) {
                bool look = (++ex->recheck_visits & 7) == 0;
                if ((look || handled > 0) && kb__now_ns() >= ex->recheck_due_ns)
                    recheck_unscheduled(ex, true);
                else if (look && ex->rechecking != NULL)
                    recheck_unscheduled(ex, false);
            }
            continue;
        }
        if (ex->heap_len > 0 && ex->heap[0].due_ns <= kb__now_ns()) {
            /* a key retrying back to back must not hold off the barrier */
            if (ex->rechecking != NULL || ex->fence_only != NULL)
                recheck_unscheduled(ex, kb__now_ns() >= ex->recheck_due_ns);
            continue;
        }
        if (!collected) {
            /* Only a half-linked ready node is left: its producer is between
             * two stores. Spin a little; if it stays half-linked the producer
             * was preempted, perhaps on this CPU, so let it run. */
            if (++ex->blocked_passes < BLOCKED_SPINS) {
                ck_pr_stall();
                continue;
            }
            sched_yield();
            /* lanes just unscheduled keep their deadline meanwhile */
            if (ex->rechecking != NULL || ex->fence_only != NULL)
                recheck_unscheduled(ex, kb__now_ns() >= ex->recheck_due_ns);
            continue;
        }
        idle(ex);
    }
    return NULL;
}

kb_sched *kb__sched_new(uint32_t threads, kb_idle idle, char *errstr, size_t errlen)
{
    kb__asym_init();   /* before any executor pokes with kb__fence_hot */
    kb_sched *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(errstr, errlen, "out of memory creating %u executors", threads);
        return NULL;
    }
    s->idle = idle;
    s->progress.hot_pokers = 1;   /* poked after lane visits */
    s->ex = aligned_alloc(KB_CACHELINE, sizeof(struct kb_executor) * threads);
    if (s->ex == NULL) {
        free(s);
        snprintf(errstr, errlen, "out of memory creating %u executors", threads);
        return NULL;
    }
    memset(s->ex, 0, sizeof(struct kb_executor) * threads);
    for (uint32_t i = 0; i < threads; i++) {
        struct kb_executor *ex = &s->ex[i];
        __cds_wfcq_init(&ex->head, &ex->tail);
        ex->sched = s;
        ex->index = i;
        ex->rng = 0x9E3779B97F4A7C15ULL * (i + 1) ^ (uint64_t)kb__now_ns();
        char name[24];
        snprintf(name, sizeof name, "kb-exec-%u", i);   /* visible in top, perf, gdb */
        if (kb_thread_start(&ex->thread, name, executor_main, ex) != KB_OK) {
            s->n = i;
            kb__sched_destroy(s);
            snprintf(errstr, errlen, "cannot start executor %u: %s", i, kb_last_error());
            return NULL;
        }
        s->n = i + 1;
    }
    return s;
}

void kb__sched_destroy(kb_sched *s)
{
    if (s == NULL)
        return;
    atomic_store_explicit(&s->stop, 1, memory_order_release);
    for (uint32_t i = 0; i < s->n; i++)
        kb__signal_notify(&s->ex[i].wake);
    for (uint32_t i = 0; i < s->n; i++) {
        kb_thread_join(s->ex[i].thread);
        free(s->ex[i].heap);
    }
    free(s->ex);
    free(s);
}

uint32_t kb__sched_threads(const kb_sched *s)
{
    return s->n;
}

void kb__sched_wake_waiters(kb_sched *s)
{
    kb__signal_notify(&s->progress);
}
