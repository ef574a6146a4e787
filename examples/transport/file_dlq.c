/* Dead letters: appended to DIR/<topic>/dlq.log in the record format of the
 * logs, with the reason, attempts and time. A dead letter's ID is its offset
 * in that file; a replay publishes the event again and marks the entry
 * replayed in place (the file stays append-only for new entries). Replays
 * take the file's flock, so two processes never replay one entry twice.
 * The mark goes through a second descriptor: Linux's pwrite() on an O_APPEND
 * one appends, whatever the offset. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "file_int.h"

/* Executor threads. Storing the dead letter settles the delivery, as an ack. */
int kb__file_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason)
{
    (void)t;
    kb_transport_topic *tt = d->tt;
    kb_kit_pending *pe = d->cookie;
    struct kb__file_rec head = {
        .attempts = d->attempt, .partition = d->partition,
        .time_ms = (int64_t)kb__file_unix_ms(), .original = UINT64_MAX,
    };
    unsigned long long original;
    if (sscanf(d->id, "%*u-%llu", &original) == 1)
        head.original = original;
    kb_msg m = {d->key, d->key_len, d->payload, d->payload_len, 0, d->headers, d->n_headers};
    uint64_t end;
    int rc = kb__file_append(tt->dlq_fd, &head, &m, reason, &end);
    if (rc == KB_OK)
        kb_kit_settle(pe);
    else
        kb_kit_release(pe);   /* not stored: unsettled, so the next owner delivers it again */
    return rc;
}

/* "" or NULL: 0; else a decimal offset. */
static int parse_id(const char *s, uint64_t *out)
{
    *out = 0;
    if (s == NULL || *s == '\0')
        return KB_OK;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s < '0' || *s > '9' || *end != '\0' || errno == ERANGE) {
        kb_errf(NULL, 0, "file: dead-letter ID \"%.32s\" is not a decimal offset", s);
        return KB_EINVAL;
    }
    *out = v;
    return KB_OK;
}

int kb__file_dead_letters(kb_transport *t, kb_transport_topic *tt, const char *after_id,
                          size_t max, kb_dead_letter_fn fn, void *opaque)
{
    (void)t;
    uint64_t off;
    int rc = parse_id(after_id, &off);
    if (rc != KB_OK)
        return rc;
    struct kb__file_buf buf = {0};
    struct kb__file_read r;
    if (after_id != NULL && after_id[0] != '\0') {   /* start past that entry */
        rc = kb__file_read_at(tt->dlq_fd, off, &buf, &r);
        if (rc == KB_ENOTFOUND)
            kb_errf(NULL, 0, "file: topic %s has no dead letter %s", tt->name, after_id);
        off = r.end;
    }
    for (size_t seen = 0; rc == KB_OK && seen < max;) {
        rc = kb__file_read_at(tt->dlq_fd, off, &buf, &r);
        if (rc == KB_ENOTFOUND) {
            rc = KB_OK;   /* the end */
            break;
        }
        if (rc != KB_OK)
            break;
        off = r.end;
        if (r.head.replayed)
            continue;
        seen++;
        char id[24], original[48] = "";
        snprintf(id, sizeof id, "%" PRIu64, r.offset);
        if (r.head.original != UINT64_MAX)
            snprintf(original, sizeof original, "%u-%" PRIu64, r.head.partition,
                     r.head.original);
        kb_dead_letter dl = {
            .id = id, .key = r.key, .key_len = r.head.key_len,
            .payload = r.payload, .payload_len = r.head.payload_len,
            .partition = r.head.partition, .original_id = original,
            .attempts = r.head.attempts, .reason = r.reason, .time_ms = r.head.time_ms,
            .headers = r.headers, .n_headers = r.head.n_headers,
        };
        if (fn(&dl, opaque))   /* may replay this very entry: we hold no lock */
            break;
    }
    free(buf.data);
    return rc;
}

int kb__file_dead_letter_replay(kb_transport *t, kb_transport_topic *tt, const char *id)
{
    uint64_t off;
    int rc = parse_id(id, &off);
    if (rc != KB_OK)
        return rc;
    struct kb__file_buf buf = {0};
    struct kb__file_read r;
    /* threads of this process share dlq_fd, whose flock does not tell them apart */
    pthread_mutex_lock(&tt->dlq_lock);
    flock(tt->dlq_fd, LOCK_EX);
    rc = kb__file_read_at(tt->dlq_fd, off, &buf, &r);
    if (rc == KB_OK && r.head.replayed)
        rc = KB_ENOTFOUND;
    if (rc == KB_ENOTFOUND)
        kb_errf(NULL, 0, "file: topic %s has no dead letter %.32s", tt->name, id);
    if (rc == KB_OK) {
        kb_msg m = {r.key, r.head.key_len, r.payload, r.head.payload_len,
                    kb_fnv1a32(r.key, r.head.key_len), r.headers, r.head.n_headers};
        rc = kb__file_publish(t, tt, &m);
    }
    uint32_t replayed = 1;
    if (rc == KB_OK && pwrite(tt->dlq_mark_fd, &replayed, sizeof replayed,
                              (off_t)(off + offsetof(struct kb__file_rec, replayed))) !=
                           (ssize_t)sizeof replayed) {
        kb_errf(NULL, 0, "file: topic %s: marking dead letter %s replayed: %s", tt->name, id,
                strerror(errno));
        rc = KB_ETRANSPORT;
    }
    flock(tt->dlq_fd, LOCK_UN);
    pthread_mutex_unlock(&tt->dlq_lock);
    free(buf.data);
    return rc;
}
