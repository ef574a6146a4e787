/* The committed offset on disk. Executors settle deliveries in the kit's
 * pending queue (kb_kit_settle: the committed offset follows the settled
 * prefix, in memory); the reader thread stores it here once per tick, not
 * once per ack, and a restart or the next owner resumes there. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "file_int.h"

/* Store the committed offset if it moved. Reader thread, or close. */
int kb__file_commit_write(struct kb__file_part *p)
{
    uint64_t c = kb_kit_queue_committed(p->queue);
    if (c == p->committed_written)
        return KB_OK;
    if (pwrite(p->offset_fd, &c, sizeof c, 0) != (ssize_t)sizeof c) {
        kb_errf(NULL, 0, "file: partition %u: storing the committed offset: %s", p->index,
                strerror(errno));
        return KB_ETRANSPORT;
    }
    p->committed_written = c;
    return KB_OK;
}

/* The group's committed offset: ours while we own the partition (the file
 * lags it by a tick), else what the owner last stored. Thread: any. */
uint64_t kb__file_committed(struct kb__file_part *p)
{
    if (atomic_load_explicit(&p->owned, memory_order_acquire))
        return kb_kit_queue_committed(p->queue);
    uint64_t c = 0;
    if (pread(p->offset_fd, &c, sizeof c, 0) != (ssize_t)sizeof c)
        c = 0;   /* no consumer has committed anything yet */
    return c;
}
