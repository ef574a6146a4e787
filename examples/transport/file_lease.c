/* Who consumes which partition: the broker side of the kit's lease manager
 * (kb_kit_members, which decides the fair share and hands over a partition
 * only once its queue is idle). Leases are flock(2) locks: a process owns
 * partition N of a topic while it holds the lock on <group>.p<N>.lock, and
 * the kernel drops the lock when the process closes it or dies, so a lease is
 * never lost while held and a crashed consumer never needs expiring.
 * Consumers announce themselves with a locked file in <group>.members/.
 * Runs on the reader thread (and in close, after it stopped). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_int.h"

static char *path_of(const kb_transport_topic *tt, const char *fmt, const char *a, uint32_t n)
{
    char name[512];
    snprintf(name, sizeof name, fmt, a, n);
    size_t len = strlen(tt->dir) + 1 + strlen(name) + 1;
    char *p = malloc(len);
    if (p != NULL)
        snprintf(p, len, "%s/%s", tt->dir, name);
    return p;
}

/* The names of the live members, ours included, into *out; with `tidy`,
 * remove the files of dead ones (unlocked). Thread: the reader with tidy,
 * any without. */
static int list_members(kb_transport_topic *tt, kb_names *out, int tidy)
{
    char *members = path_of(tt, "%s.members", tt->t->group, 0);
    DIR *d = members != NULL ? opendir(members) : NULL;
    free(members);
    if (d == NULL)
        return KB_OK;   /* nobody joined yet */
    int rc = KB_OK;
    for (struct dirent *e; rc == KB_OK && (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;   /* ".", ".." and members still joining */
        int fd = openat(dirfd(d), e->d_name, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            continue;   /* left meanwhile */
        struct stat mine, other;
        if ((tt->member_fd >= 0 && fstat(fd, &other) == 0 && fstat(tt->member_fd, &mine) == 0 &&
             mine.st_ino == other.st_ino) || flock(fd, LOCK_EX | LOCK_NB) != 0)
            rc = kb_names_add(out, e->d_name, strlen(e->d_name));   /* ours, or locked: live */
        else if (tidy)
            unlinkat(dirfd(d), e->d_name, 0);   /* its process died without leaving */
        close(fd);
    }
    closedir(d);
    return rc;
}

uint32_t kb__file_members(kb_transport_topic *tt)
{
    kb_names live = {0};
    list_members(tt, &live, 0);
    uint32_t n = (uint32_t)live.n;
    kb_names_free(&live);
    return n;
}

static int members_cb(void *opaque, kb_names *out)
{
    return list_members(opaque, out, 1);
}

static int take_cb(void *opaque, uint32_t i)
{
    kb_transport_topic *tt = opaque;
    struct kb__file_part *p = &tt->parts[i];
    char *path = path_of(tt, "%s.p%u.lock", tt->t->group, p->index);
    int fd = path != NULL ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666) : -1;
    free(path);
    if (fd < 0)
        return KB_ETRANSPORT;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);   /* another consumer holds it */
        return 0;
    }
    /* for kb_partition_stats_get: who holds it */
    const char *me = strrchr(tt->member_path, '/') + 1;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, me, strlen(me), 0) < 0)
        kb_log(tt->t->bus, KB_LOG_DEBUG, "file: topic %s: partition %u: owner not recorded",
               tt->name, p->index);
    uint64_t c = kb__file_committed(p);  /* not owned yet: where the previous owner stopped */
    kb_kit_queue_restart(p->queue, c);   /* idle: the kit takes nothing with deliveries out */
    p->lease_fd = fd;
    p->stalled = 0;
    p->committed_written = c;
    p->read_off = c;
    atomic_store_explicit(&p->owned, 1, memory_order_release);
    kb_log(tt->t->bus, KB_LOG_DEBUG, "file: topic %s: took partition %u at offset %llu",
           tt->name, p->index, (unsigned long long)c);
    return 1;
}

/* Store the committed offset, then unlock: the next owner starts there. */
static int give_back_cb(void *opaque, uint32_t i)
{
    kb_transport_topic *tt = opaque;
    struct kb__file_part *p = &tt->parts[i];
    if (kb__file_commit_write(p) != KB_OK)
        kb_log(tt->t->bus, KB_LOG_WARNING, "topic %s: %s (the next owner repeats events)",
               tt->name, kb_last_error());
    atomic_store_explicit(&p->owned, 0, memory_order_release);
    if (ftruncate(p->lease_fd, 0) != 0)
        kb_log(tt->t->bus, KB_LOG_DEBUG, "file: partition %u: owner not cleared", p->index);
    close(p->lease_fd);
    p->lease_fd = -1;
    return KB_OK;
}

/* The kit's lease manager over the flocks: no renew (a flock is never lost
 * while held), no lease_changed (nothing to trace: no lease expires). */
static int manager_new(kb_transport_topic *tt)
{
    kb_kit_members_conf c = {
        .size = sizeof c,
        .me = strrchr(tt->member_path, '/') + 1,
        .partitions = tt->partitions,
        .queues = tt->queues,
        .broker = {.opaque = tt, .try_take = take_cb, .give_back = give_back_cb,
                   .members = members_cb},
    };
    tt->members = kb_kit_members_new(&c);
    return tt->members != NULL ? KB_OK : KB_ENOMEM;
}

/* Create the member file under a dot name, lock it, then rename it into
 * place: another consumer never sees it unlocked and takes it for dead. */
int kb__file_member_join(kb_transport_topic *tt, char *errstr, size_t errlen)
{
    kb_transport *t = tt->t;
    char *members = path_of(tt, "%s.members", t->group, 0);
    char name[256];
    snprintf(name, sizeof name, "%s-%08x", t->consumer,
             (unsigned)kb_mix64((uint64_t)kb_now_ns() ^ (uintptr_t)tt));
    char *tmp = NULL, *final = NULL;
    if (members != NULL && (mkdir(members, 0777) == 0 || errno == EEXIST)) {
        size_t len = strlen(members) + strlen(name) + 3;
        tmp = malloc(len);
        final = malloc(len);
        if (tmp != NULL && final != NULL) {
            snprintf(tmp, len, "%s/.%s", members, name);
            snprintf(final, len, "%s/%s", members, name);
        }
    }
    int fd = tmp != NULL && final != NULL ? open(tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0666) : -1;
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0 || rename(tmp, final) != 0) {
        kb_errf(errstr, errlen, "file: topic %s: cannot join %s: %s", tt->name,
                members != NULL ? members : "(no memory)", strerror(errno));
        if (fd >= 0)
            close(fd);
        free(members), free(tmp), free(final);
        return KB_ETRANSPORT;
    }
    free(members), free(tmp);
    tt->member_fd = fd;
    tt->member_path = final;
    if (manager_new(tt) != KB_OK) {
        kb_errf(errstr, errlen, "file: topic %s: %s", tt->name, kb_last_error());
        kb__file_member_leave(tt);
        return KB_ENOMEM;
    }
    return KB_OK;
}

/* Give every lease back (committed offsets stored), then leave. */
void kb__file_member_leave(kb_transport_topic *tt)
{
    if (tt->member_fd < 0)
        return;
    if (tt->members != NULL)
        kb_kit_members_leave(tt->members);
    kb_kit_members_free(tt->members);
    tt->members = NULL;
    unlink(tt->member_path);
    close(tt->member_fd);   /* drops the lock */
    tt->member_fd = -1;
}

void kb__file_lease_owner(kb_transport_topic *tt, uint32_t p, char *out, size_t outlen)
{
    out[0] = '\0';
    char *path = path_of(tt, "%s.p%u.lock", tt->t->group, p);
    int fd = path != NULL ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    free(path);
    if (fd < 0)
        return;
    /* a name left by a consumer that died is no owner: its lock is gone */
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
        ssize_t n = pread(fd, out, outlen - 1, 0);
        out[n > 0 ? n : 0] = '\0';
    } else {
        flock(fd, LOCK_UN);
    }
    close(fd);
}
