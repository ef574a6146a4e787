#include "rec.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "sync.h"

/* Two size classes cover "a few hundred bytes" and small documents; anything
 * larger costs exactly one malloc. */
static const size_t class_bytes[] = {256, 2048};
#define N_CLASSES (sizeof class_bytes / sizeof class_bytes[0])

/* A thread keeps up to this many freed records per class before handing them
 * to the shared list. The shared list keeps up to 64 MiB per class: enough for
 * every record full lanes can hold in a busy process (recycling beats a
 * cross-thread malloc/free per event), while a larger burst does not pin its
 * peak memory forever. */
#define LOCAL_MAX 512
#define GLOBAL_BYTES (64u << 20)

struct local_cache {
    ck_stack_entry_t *head;
    uint32_t count;
};

/* Freed records migrate from executor threads to producer threads: executors
 * push onto the shared stack, producers take the whole stack at once. Both ck
 * operations are ABA-safe (push is a CAS on the head, batch pop an exchange). */
static ck_stack_t shared[N_CLASSES];
static _Atomic uint32_t shared_count[N_CLASSES];  /* approximate: bounds retention */

/* initial-exec: a plain %fs-relative access instead of a __tls_get_addr call
 * per event (the library is linked at start-up, not dlopen'ed mid-run). */
#define KB_TLS _Thread_local __attribute__((tls_model("initial-exec")))
static KB_TLS struct local_cache local[N_CLASSES];
static KB_TLS int local_registered;
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static void spill_local(unsigned cls)
{
    struct local_cache *lc = &local[cls];
    while (lc->head != NULL) {
        ck_stack_entry_t *e = lc->head;
        lc->head = e->next;
        if (atomic_load_explicit(&shared_count[cls], memory_order_relaxed) >=
            GLOBAL_BYTES / class_bytes[cls]) {
            free(e);   /* link is the first member: e is the record */
            continue;
        }
        KB_TSAN_RELEASE(&shared[cls]);
        ck_stack_push_upmc(&shared[cls], e);
        atomic_fetch_add_explicit(&shared_count[cls], 1, memory_order_relaxed);
    }
    lc->count = 0;
}

static void on_thread_exit(void *unused)
{
    (void)unused;
    for (unsigned cls = 0; cls < N_CLASSES; cls++)
        spill_local(cls);
}

static void make_exit_key(void)
{
    pthread_key_create(&exit_key, on_thread_exit);
}

static void register_thread(void)
{
    /* A thread that exits hands its cache back instead of leaking it. */
    pthread_once(&exit_once, make_exit_key);
    pthread_setspecific(exit_key, &local_registered);
    local_registered = 1;
}

kb_rec *kb__rec_alloc(size_t data_len)
{
    size_t need = sizeof(kb_rec) + data_len;
    for (unsigned cls = 0; cls < N_CLASSES; cls++) {
        if (need > class_bytes[cls])
            continue;
        struct local_cache *lc = &local[cls];
        if (lc->head == NULL) {
            if (!local_registered)
                register_thread();
            lc->head = ck_stack_batch_pop_upmc(&shared[cls]);
            KB_TSAN_ACQUIRE(&shared[cls]);
            /* Count unknown without walking the chain: treat it as taken. */
            if (lc->head != NULL)
                atomic_store_explicit(&shared_count[cls], 0, memory_order_relaxed);
        }
        kb_rec *r;
        if (lc->head != NULL) {
            r = (kb_rec *)lc->head;
            lc->head = lc->head->next;
            /* the next record was last written on another core: start loading it */
            __builtin_prefetch(lc->head, 1);
            if (lc->count > 0)
                lc->count--;
        } else {
            r = malloc(class_bytes[cls]);
            if (r == NULL)
                return NULL;
        }
        r->size_class = (uint8_t)cls;
        return r;
    }
    kb_rec *r = malloc(need);
    if (r != NULL)
        r->size_class = KB_REC_EXACT;
    return r;
}

void kb__rec_free(kb_rec *r)
{
    if (r == NULL)
        return;
    if (r->size_class == KB_REC_EXACT) {
        free(r);
        return;
    }
    unsigned cls = r->size_class;
    struct local_cache *lc = &local[cls];
    if (!local_registered)
        register_thread();
    r->link.next = lc->head;
    lc->head = &r->link;
    if (++lc->count >= LOCAL_MAX)
        spill_local(cls);
}
