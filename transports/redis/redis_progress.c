/* Progress of frames: which events of a frame entry are settled (handled or
 * dead-lettered), so that a frame that comes again (a hand-over, a close that
 * released the rest, a crash) skips them. A bit per event, set by the
 * executor that settled it; the bitmap goes to the keeper, which records it
 * fenced with the acks in kb:{T}:done:<group>:N (field: entry ID, value: the bitmap,
 * bit j of byte j / 8 for event j), when the frame goes back unacked with
 * events settled, and when an event is settled KB_REDIS_PROGRESS_MS or more
 * after the first one not recorded yet (no timer: a crash replays at most
 * one such window of a frame, however old when nothing of the frame settled
 * since; most frames settle sooner and get no record). The
 * entry's ack deletes its record; the hash expires a week after its last
 * write, as the run records do. Per-key order makes this per-key progress:
 * an event settled means every earlier event of its key was. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redis_int.h"

#define WORD_BITS 64

kb_redis_fstate *kb__redis_fstate_new(const char *id, uint32_t epoch, uint32_t events)
{
    size_t words = (events + WORD_BITS - 1) / WORD_BITS;
    kb_redis_fstate *fs = calloc(1, sizeof *fs + words * sizeof fs->settled[0]);
    if (fs == NULL)
        return NULL;
    atomic_init(&fs->refs, 1);   /* the reader's, until every event is handed out */
    fs->epoch = epoch;
    fs->events = events;
    size_t n = strnlen(id, sizeof fs->id - 1);
    memcpy(fs->id, id, n);
    return fs;
}

/* The event's index in its frame: the ID's ".<index>" (read once per
 * event: no strtoul). */
static uint32_t index_of(const char *id)
{
    const char *dot = strrchr(id, '.');
    uint32_t j = 0;
    for (const char *c = dot != NULL ? dot + 1 : ""; *c >= '0' && *c <= '9' && j < 100000; c++)
        j = j * 10 + (uint32_t)(*c - '0');
    return j;
}

/* A clock of a few ms' resolution, for a 10 ms rule: reading it costs a
 * load, where the precise clock cost executors 8% of their time (perf). */
static int64_t coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void kb__redis_progress_queue(kb_transport *t, kb_redis_part *p, kb_redis_fstate *fs)
{
    size_t bytes = (fs->events + 7) / 8;
    char *done = malloc(bytes);
    if (done == NULL)
        return;   /* out of memory: more comes again, never less */
    for (size_t b = 0; b < bytes; b++)
        done[b] = (char)(atomic_load_explicit(&fs->settled[b / 8], memory_order_relaxed) >>
                         (8 * (b % 8)));
    kb__redis_job_progress(t, p, fs->id, fs->events, done);
}

void kb__redis_progress_note(kb_transport *t, kb_redis_part *p, kb_redis_fstate *fs,
                             const kb_delivery *d)
{
    uint32_t j = index_of(d->id);
    if (j >= fs->events)
        return;
    atomic_fetch_or_explicit(&fs->settled[j / WORD_BITS], (uint64_t)1 << (j % WORD_BITS),
                             memory_order_relaxed);
    /* A frame settled within KB_REDIS_PROGRESS_MS of its first unrecorded
     * event (the usual case) is acked with no record at all. */
    int64_t now = coarse_ns(), since = atomic_load_explicit(&fs->unrecorded_ns, memory_order_relaxed);
    if (since == 0) {
        atomic_compare_exchange_strong(&fs->unrecorded_ns, &since, now);
        return;
    }
    if (now - since < (int64_t)KB_REDIS_PROGRESS_MS * 1000000 ||
        !atomic_compare_exchange_strong(&fs->unrecorded_ns, &since, 0))
        return;
    kb__redis_progress_queue(t, p, fs);
}

bool kb__redis_progress_covers(const redisReply *runs, size_t i, uint32_t j)
{
    const redisReply *e = runs != NULL && i < runs->elements ? runs->element[i] : NULL;
    if (e == NULL || e->type != REDIS_REPLY_ARRAY || e->elements < 1)
        return false;
    const redisReply *done = e->element[e->elements - 1];
    return done->type == REDIS_REPLY_STRING && j / 8 < done->len &&
           ((unsigned char)done->str[j / 8] >> (j % 8) & 1) != 0;
}
