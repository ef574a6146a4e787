#include "rec.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Records are recycled in magazines (Bonwick's design): each thread holds one
 * magazine per size class, an array of free records, and trades whole
 * magazines with other threads through lock-free stacks. A record crosses
 * threads (producer writes it, executor frees it), so per-record handoff would
 * cost a shared-memory operation per event; a magazine costs one per 256, and
 * an array lets the producer prefetch the records it is about to fill. */

static const size_t class_bytes[KB_REC_CLASSES] = {128, 512, 2048};   /* kb__rec_class */
#define N_CLASSES KB_REC_CLASSES
#define MAG_SIZE KB_REC_MAG_SIZE
/* Full magazines kept in the shared stack, per class: up to 64 MiB of records,
 * enough for every record full lanes can hold in a busy process, while a larger
 * burst does not pin its peak memory forever. */
#define SHARED_BYTES (64u << 20)

struct class_state {
    /* Generation-counted stacks: magazines are reused, so pops must be ABA-safe.
     * Their double-width CAS needs 16-byte alignment. */
    _Alignas(16) ck_stack_t full;
    _Alignas(16) ck_stack_t empty;
    _Atomic uint32_t full_count;
};

static struct class_state shared[N_CLASSES];

/* The default TLS model, so the library can be dlopen'ed into any process
 * (initial-exec needs static TLS room a running process may have used up);
 * the build uses TLS descriptors (-mtls-dialect=gnu2) where the compiler has
 * them, which keeps a dynamic TLS access to a few instructions. */
_Thread_local struct kb_magazine *kb__rec_loaded[KB_REC_CLASSES];
static _Thread_local int registered;
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static struct kb_magazine *pop(ck_stack_t *s)
{
    ck_stack_entry_t *e = ck_stack_pop_mpmc(s);
    if (e != NULL)
        KB_TSAN_ACQUIRE(e);
    return (struct kb_magazine *)e;
}

static void push(ck_stack_t *s, struct kb_magazine *m)
{
    KB_TSAN_RELEASE(&m->link);
    ck_stack_push_mpmc(s, &m->link);
}

static void free_records(struct kb_magazine *m)
{
    while (m->n > 0)
        free(m->r[--m->n]);
}

/* Hand a full magazine to the other threads; an empty one back for reuse. */
static void give_back(unsigned cls, struct kb_magazine *m)
{
    struct class_state *cs = &shared[cls];
    if (m->n > 0) {
        uint32_t cap = (uint32_t)(SHARED_BYTES / (class_bytes[cls] * MAG_SIZE));
        if (atomic_fetch_add_explicit(&cs->full_count, 1, memory_order_relaxed) < cap) {
            push(&cs->full, m);
            return;
        }
        atomic_fetch_sub_explicit(&cs->full_count, 1, memory_order_relaxed);
        free_records(m);
    }
    push(&cs->empty, m);
}

static void on_thread_exit(void *unused)
{
    (void)unused;
    for (unsigned cls = 0; cls < N_CLASSES; cls++) {
        if (kb__rec_loaded[cls] != NULL)
            give_back(cls, kb__rec_loaded[cls]);
        kb__rec_loaded[cls] = NULL;
    }
}

static void make_exit_key(void)
{
    pthread_key_create(&exit_key, on_thread_exit);
}

/* Install `m` as this thread's magazine of class `cls`. */
static void load(unsigned cls, struct kb_magazine *m)
{
    if (!registered) {
        /* A thread that exits hands its magazines back instead of leaking them. */
        pthread_once(&exit_once, make_exit_key);
        pthread_setspecific(exit_key, &registered);
        registered = 1;
    }
    kb__rec_loaded[cls] = m;
}

static struct kb_magazine *empty_magazine(unsigned cls)
{
    struct kb_magazine *m = pop(&shared[cls].empty);
    if (m == NULL) {
        m = malloc(sizeof *m);
        if (m == NULL)
            return NULL;
    }
    m->n = 0;
    return m;
}

kb_rec *kb__rec_alloc_slow(size_t data_len)
{
    size_t need = sizeof(kb_rec) + data_len;
    unsigned cls = kb__rec_class(need);
    if (cls == N_CLASSES) {
        kb_rec *r = malloc(need);
        if (r != NULL)
            r->size_class = KB_REC_EXACT;
        return r;
    }

    struct kb_magazine *m = kb__rec_loaded[cls];
    if (m == NULL || m->n == 0) {
        struct kb_magazine *full = pop(&shared[cls].full);
        if (full != NULL) {
            atomic_fetch_sub_explicit(&shared[cls].full_count, 1, memory_order_relaxed);
            if (m != NULL)
                push(&shared[cls].empty, m);
            load(cls, m = full);
        } else if (m == NULL && (m = empty_magazine(cls)) != NULL) {
            load(cls, m);
        }
    }
    if (m != NULL && m->n > 0)
        return kb__rec_alloc(data_len);
    /* Cache-line aligned so a small event touches as few lines as possible. */
    kb_rec *r = aligned_alloc(KB_CACHELINE, class_bytes[cls]);
    if (r != NULL)
        r->size_class = (uint8_t)cls;
    return r;
}

void kb__rec_free_slow(kb_rec *r)
{
    if (r == NULL)
        return;
    if (r->size_class == KB_REC_EXACT) {
        free(r);
        return;
    }
    unsigned cls = r->size_class;
    struct kb_magazine *m = kb__rec_loaded[cls];
    if (m == NULL || m->n == MAG_SIZE) {
        struct kb_magazine *fresh = empty_magazine(cls);
        if (fresh == NULL) {
            free(r);
            return;
        }
        if (m != NULL)
            give_back(cls, m);
        load(cls, m = fresh);
    }
    m->r[m->n++] = r;
}
