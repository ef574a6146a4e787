/* The record format, shared by partition logs and dead-letter files: a fixed
 * head, then the variable parts. A record goes to disk in one writev() on an
 * O_APPEND descriptor, so appends from several threads and processes never
 * interleave; a reader may still see the tail of a record being written, so
 * it checks the record is whole before handing it out. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "file_int.h"

uint64_t kb__file_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int kb__file_append(int fd, const struct kb__file_rec *head, const kb_msg *m,
                    const char *reason, uint64_t *end)
{
    struct kb__file_rec h = *head;
    h.magic = KB_FILE_MAGIC;
    h.key_len = (uint32_t)m->key_len;
    h.payload_len = (uint32_t)m->payload_len;
    h.n_headers = (uint32_t)m->n_headers;
    h.headers_len = (uint32_t)kb_headers_packed_size(m->headers, m->n_headers);
    h.reason_len = reason != NULL ? (uint32_t)strlen(reason) : 0;
    char small[512];
    char *packed = h.headers_len <= sizeof small ? small : malloc(h.headers_len);
    if (packed == NULL) {
        kb_errf(NULL, 0, "file: out of memory for %u bytes of headers", h.headers_len);
        return KB_ENOMEM;
    }
    kb_headers_pack(packed, m->headers, m->n_headers);
    struct iovec iov[] = {
        {&h, sizeof h},
        {(void *)m->key, m->key_len},
        {(void *)m->payload, m->payload_len},
        {packed, h.headers_len},
        {(void *)reason, h.reason_len},
    };
    size_t want = sizeof h + m->key_len + m->payload_len + h.headers_len + h.reason_len;
    ssize_t n = writev(fd, iov, 5);
    int err = errno;
    if (packed != small)
        free(packed);
    if (n != (ssize_t)want) {
        /* a short write leaves a torn record: readers stop before it */
        kb_errf(NULL, 0, "file: append of %zu bytes: %s", want,
                n < 0 ? strerror(err) : "short write (disk full?)");
        return KB_ETRANSPORT;
    }
    /* O_APPEND leaves this descriptor's offset past our record, or past a
     * later one another thread appended through it meanwhile: either is at
     * least our end, which is all kb_drain needs. */
    off_t at = lseek(fd, 0, SEEK_CUR);
    *end = at > 0 ? (uint64_t)at : 0;
    return KB_OK;
}

static int read_full(int fd, void *dst, size_t len, uint64_t offset)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, (char *)dst + got, len - got, (off_t)(offset + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return KB_ENOTFOUND;   /* the end, or a record not fully written yet */
        got += (size_t)n;
    }
    return KB_OK;
}

int kb__file_read_at(int fd, uint64_t offset, struct kb__file_buf *buf, struct kb__file_read *r)
{
    if (read_full(fd, &r->head, sizeof r->head, offset) != KB_OK)
        return KB_ENOTFOUND;
    const struct kb__file_rec *h = &r->head;
    if (h->magic != KB_FILE_MAGIC || h->n_headers > KB_MAX_HEADERS) {
        kb_errf(NULL, 0, "file: damaged record at offset %llu", (unsigned long long)offset);
        return KB_EINVAL;
    }
    size_t body = (size_t)h->key_len + h->payload_len + h->headers_len + h->reason_len;
    if (kb_vec_reserve((void **)&buf->data, &buf->cap, body + 1, 1) != KB_OK) {
        kb_errf(NULL, 0, "file: out of memory for a record of %zu bytes", body);
        return KB_ENOMEM;
    }
    if (read_full(fd, buf->data, body, offset + sizeof r->head) != KB_OK)
        return KB_ENOTFOUND;
    r->offset = offset;
    r->end = offset + sizeof r->head + body;
    r->key = buf->data;
    r->payload = r->key + h->key_len;
    const char *packed = r->payload + h->payload_len;
    kb_headers_unpack(packed, h->n_headers, r->headers);
    r->reason = packed + h->headers_len;
    buf->data[body] = '\0';   /* the reason is last: a C string */
    return KB_OK;
}
