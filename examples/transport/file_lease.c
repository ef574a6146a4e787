/* Who consumes which partition. Leases are flock(2) locks: a process owns
 * partition N of a topic while it holds the lock on <group>.p<N>.lock, and
 * the kernel drops the lock when the process closes it or dies, so a crashed
 * consumer never needs expiring. Consumers announce themselves with a locked
 * file in <group>.members/; each takes up to its fair share
 * (ceil(partitions / live members)) and hands over partitions beyond it once
 * everything it delivered from them is settled, so per-key order holds across
 * the hand-over. Runs on the reader thread (and in close, after it stopped). */
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
    tt->live_members = 1;
    return KB_OK;
}

void kb__file_member_leave(kb_transport_topic *tt)
{
    if (tt->member_fd < 0)
        return;
    unlink(tt->member_path);
    close(tt->member_fd);   /* drops the lock */
    tt->member_fd = -1;
}

/* Live members, ours included; `tidy` removes the files of dead ones
 * (unlocked). Thread: the reader with tidy, any without. */
uint32_t kb__file_members(kb_transport_topic *tt, int tidy)
{
    char *members = path_of(tt, "%s.members", tt->t->group, 0);
    DIR *d = members != NULL ? opendir(members) : NULL;
    if (d == NULL) {
        free(members);
        return 0;
    }
    uint32_t live = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;   /* ".", ".." and members still joining */
        int fd = openat(dirfd(d), e->d_name, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            continue;   /* left meanwhile */
        struct stat mine, other;
        if (tt->member_fd >= 0 && fstat(fd, &other) == 0 && fstat(tt->member_fd, &mine) == 0 &&
            mine.st_ino == other.st_ino) {
            live++;
        } else if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            if (tidy)
                unlinkat(dirfd(d), e->d_name, 0);   /* its process died without leaving */
        } else {
            live++;
        }
        close(fd);
    }
    closedir(d);
    free(members);
    return live;
}

static void take(kb_transport_topic *tt, struct kb__file_part *p)
{
    char *path = path_of(tt, "%s.p%u.lock", tt->t->group, p->index);
    int fd = path != NULL ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666) : -1;
    free(path);
    if (fd < 0)
        return;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);   /* another consumer holds it */
        return;
    }
    /* for kb_partition_stats_get: who holds it */
    const char *me = strrchr(tt->member_path, '/') + 1;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, me, strlen(me), 0) < 0)
        kb_log(tt->t->bus, KB_LOG_DEBUG, "file: topic %s: partition %u: owner not recorded",
               tt->name, p->index);
    p->lease_fd = fd;
    p->leaving = 0;
    uint64_t c = kb__file_committed(p);  /* not owned yet: where the previous owner stopped */
    p->committed_written = c;
    p->read_off = c;
    atomic_store_explicit(&p->committed, c, memory_order_relaxed);
    atomic_store_explicit(&p->owned, 1, memory_order_release);
    atomic_fetch_add(&tt->partitions_owned, 1);
    kb_log(tt->t->bus, KB_LOG_DEBUG, "file: topic %s: took partition %u at offset %llu",
           tt->name, p->index, (unsigned long long)c);
}

/* Store the committed offset, then unlock: the next owner starts there. */
void kb__file_lease_release(kb_transport_topic *tt, struct kb__file_part *p)
{
    if (p->lease_fd < 0)
        return;
    if (kb__file_commit_write(p) != KB_OK)
        kb_log(tt->t->bus, KB_LOG_WARNING, "topic %s: %s (the next owner repeats events)",
               tt->name, kb_last_error());
    atomic_store_explicit(&p->owned, 0, memory_order_release);
    if (ftruncate(p->lease_fd, 0) != 0)
        kb_log(tt->t->bus, KB_LOG_DEBUG, "file: partition %u: owner not cleared", p->index);
    close(p->lease_fd);
    p->lease_fd = -1;
    p->leaving = 0;
    atomic_fetch_sub(&tt->partitions_owned, 1);
}

void kb__file_lease_tick(kb_transport_topic *tt)
{
    uint32_t live = kb__file_members(tt, 1);
    tt->live_members = live > 0 ? live : 1;   /* we are one, even when the directory is gone */
    uint32_t n = tt->partitions;
    uint32_t fair = (n + tt->live_members - 1) / tt->live_members;
    uint32_t keeping = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct kb__file_part *p = &tt->parts[i];
        if (p->lease_fd < 0)
            continue;
        if (!p->leaving && keeping < fair)
            keeping++;
        else
            p->leaving = 1;   /* over the share: hand over once settled */
        pthread_mutex_lock(&p->lock);
        size_t in_flight = p->in_flight;
        pthread_mutex_unlock(&p->lock);
        if (p->leaving && in_flight == 0)
            kb__file_lease_release(tt, p);
    }
    /* start where our name hashes, so joiners do not all race for partition 0 */
    uint32_t start = (uint32_t)(kb_mix64(kb_fnv1a32(tt->member_path, strlen(tt->member_path))) % n);
    for (uint32_t k = 0; k < n && keeping < fair; k++) {
        struct kb__file_part *p = &tt->parts[(start + k) % n];
        if (p->lease_fd < 0) {
            take(tt, p);
            keeping += p->lease_fd >= 0;
        }
    }
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
