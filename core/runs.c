/* The crash journal: one small file per bus, mapped MAP_SHARED, one slot per
 * executor holding the delivery its handler is running. A process killed
 * inside a handler (kill -9, abort()) leaves the slot set in the page cache;
 * the next process of the same group on this host adopts the file and has
 * its transport record that run on the broker, so an event that crashes
 * every process running it still reaches the dead letters. An event that
 * only sat in a prefetched batch was in no slot, and costs no attempt. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bus_int.h"
#include "runs.h"

#define RUNS_MAGIC "kbruns1"
#define RUNS_HEADER_BYTES 4096
#define RUNS_TOPIC_MAX 200   /* KB_MAX_TOPIC_BYTES */
#define RUNS_ID_MAX 255      /* KB_MAX_ID_BYTES */
#define RUNS_SAME_NAME_MAX 64   /* live journals of one consumer name (several buses) */

typedef struct runs_header {
    char magic[8];
    uint32_t slots;
    uint32_t slot_bytes;
    char identity[1024];     /* scheme NUL broker NUL group NUL */
} runs_header;

typedef struct runs_slot {
    _Atomic uint32_t running;   /* 1 while the fields below describe a run */
    uint32_t attempt;
    uint32_t partition;
    uint16_t topic_len, id_len;
    char topic[RUNS_TOPIC_MAX + 1];
    char id[RUNS_ID_MAX + 1];
} runs_slot;

#define RUNS_SLOT_BYTES 512
_Static_assert(sizeof(runs_slot) <= RUNS_SLOT_BYTES, "a slot fits its stride");
_Static_assert(sizeof(runs_header) <= RUNS_HEADER_BYTES, "the header fits its page");

struct kb_runs {
    int fd;
    char *map;
    size_t map_bytes;
    uint32_t slots;
    char path[4352];
    const char **last_topic;   /* per slot: the topic its text holds (process memory) */
};

static runs_slot *slot_at(char *map, uint32_t i)
{
    return (runs_slot *)(map + RUNS_HEADER_BYTES + (size_t)i * RUNS_SLOT_BYTES);
}

void kb__runs_begin(kb_runs *j, uint32_t slot, const char *topic, uint32_t partition,
                    const char *id, uint32_t attempt)
{
    if (slot >= j->slots)
        return;
    runs_slot *s = slot_at(j->map, slot);
    /* A process killed between these stores leaves `running` 0: its handler
     * had not started, so no run is lost or invented. */
    atomic_store_explicit(&s->running, 0, memory_order_relaxed);
    if (j->last_topic[slot] != topic) {
        size_t n = strlen(topic);
        n = n > RUNS_TOPIC_MAX ? RUNS_TOPIC_MAX : n;
        memcpy(s->topic, topic, n);
        s->topic_len = (uint16_t)n;
        j->last_topic[slot] = topic;   /* topic names live as long as the bus */
    }
    size_t n = strlen(id);
    n = n > RUNS_ID_MAX ? RUNS_ID_MAX : n;
    memcpy(s->id, id, n);
    s->id_len = (uint16_t)n;
    s->partition = partition;
    s->attempt = attempt;
    atomic_store_explicit(&s->running, 1, memory_order_release);
}

void kb__runs_end(kb_runs *j, uint32_t slot)
{
    if (slot < j->slots)
        atomic_store_explicit(&slot_at(j->map, slot)->running, 0, memory_order_release);
}

static void runs_free(kb_runs *j)
{
    if (j->map != NULL)
        munmap(j->map, j->map_bytes);
    if (j->fd >= 0)
        close(j->fd);   /* drops the flock */
    free(j->last_topic);
    free(j);
}

void kb__runs_close(kb_runs *j)
{
    if (j == NULL)
        return;
    unlink(j->path);   /* still locked: nobody adopts it meanwhile */
    runs_free(j);
}

/* runs.dir, or the default: $XDG_RUNTIME_DIR/keybus-runs, else
 * /tmp/keybus-runs-<uid>. */
static void runs_dir(const char *dir, char *out, size_t len)
{
    const char *xdg = secure_getenv("XDG_RUNTIME_DIR");
    if (dir[0] != '\0')
        snprintf(out, len, "%s", dir);
    else if (xdg != NULL && xdg[0] == '/')
        snprintf(out, len, "%s/keybus-runs", xdg);
    else
        snprintf(out, len, "/tmp/keybus-runs-%ld", (long)getuid());
}

/* The journal directory, made if missing: KB_OK, or KB_ETRANSPORT naming it. */
static int usable_dir(const char *configured, char *dir, size_t len, char *errstr,
                      size_t errlen)
{
    runs_dir(configured, dir, len);
    struct stat st;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        kb_errf(errstr, errlen, "runs.dir: cannot create %s: %s", dir, strerror(errno));
        return KB_ETRANSPORT;
    }
    /* a directory another user made (in /tmp, say) could feed us journals */
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
        kb_errf(errstr, errlen, "runs.dir: %s is not a directory of this user", dir);
        return KB_ETRANSPORT;
    }
    return KB_OK;
}

int kb__runs_dir_check(const char *configured, char *errstr, size_t errlen)
{
    char dir[3840];
    return usable_dir(configured, dir, sizeof dir, errstr, errlen);
}

/* scheme NUL broker NUL group NUL, zero-padded; its length. */
static size_t identity_of(const kb_bus *b, const char *broker, char out[1024])
{
    memset(out, 0, 1024);
    int n = snprintf(out, 1024, "%s%c%s%c%s", b->ops->scheme, 0, broker, 0,
                     b->core.group);
    return n < 0 || n >= 1023 ? 1023 : (size_t)n + 1;
}

/* What a valid journal of `identity` holds: its slot count, or 0. */
static uint32_t journal_slots(const char *map, size_t bytes, const char identity[1024])
{
    const runs_header *h = (const runs_header *)map;
    if (bytes < RUNS_HEADER_BYTES || memcmp(h->magic, RUNS_MAGIC, 8) != 0 ||
        h->slot_bytes != RUNS_SLOT_BYTES || memcmp(h->identity, identity, 1024) != 0 ||
        (size_t)h->slots > (bytes - RUNS_HEADER_BYTES) / RUNS_SLOT_BYTES)
        return 0;
    return h->slots;
}

/* Adopt the journal at `path` if nobody holds it: record its runs, then
 * clear and delete it. KB_OK when it is gone or not ours to take. */
static int adopt_one(kb_bus *b, const char *path, const char identity[1024],
                     kb_run_record_fn *record, void *opaque)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return KB_OK;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);   /* a live process's */
        return KB_OK;
    }
    struct stat st;
    char *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= RUNS_HEADER_BYTES && st.st_nlink > 0)
        map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return KB_OK;   /* deleted by its last adopter meanwhile, or not a journal */
    }
    uint32_t slots = journal_slots(map, (size_t)st.st_size, identity);
    int rc = KB_OK;
    for (uint32_t i = 0; i < slots && rc == KB_OK; i++) {
        runs_slot *s = slot_at(map, i);
        if (atomic_load_explicit(&s->running, memory_order_acquire) != 1)
            continue;
        char topic[RUNS_TOPIC_MAX + 1], id[RUNS_ID_MAX + 1];
        snprintf(topic, sizeof topic, "%.*s", (int)(s->topic_len > RUNS_TOPIC_MAX ? RUNS_TOPIC_MAX
                                                                                 : s->topic_len), s->topic);
        snprintf(id, sizeof id, "%.*s", (int)(s->id_len > RUNS_ID_MAX ? RUNS_ID_MAX : s->id_len), s->id);
        kb_run run = {topic, s->partition, id, s->attempt};
        rc = record(opaque, &run);
        if (rc == KB_OK) {
            atomic_store_explicit(&s->running, 0, memory_order_relaxed);
            kb_log(b, KB_LOG_INFO, "runs: a process that died was running %s %s (partition %u, "
                   "attempt %u): recorded", topic, id, run.partition, run.attempt);
        }
    }
    if (rc == KB_OK && slots > 0)
        unlink(path);
    munmap(map, (size_t)st.st_size);
    close(fd);
    return rc;
}

/* Every journal of this scheme, broker and group nobody holds. */
static void adopt_all(kb_bus *b, const char *dir, const char *prefix, const char identity[1024],
                      kb_run_record_fn *record, void *opaque)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    size_t plen = strlen(prefix);
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n <= plen + 5 || strncmp(e->d_name, prefix, plen) != 0 ||
            strcmp(e->d_name + n - 5, ".runs") != 0)
            continue;
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int rc = adopt_one(b, path, identity, record, opaque);
        if (rc != KB_OK)
            kb_log(b, KB_LOG_WARNING, "runs: journal %s of a dead process kept for later: its runs "
                   "could not be recorded (%s)", path, kb_last_error()[0] ? kb_last_error()
                                                                          : kb_strerror(rc));
    }
    closedir(d);
}

/* Our own journal, locked, empty, sized for `slots`; the first free name of
 * <prefix><consumer>[.<n>].runs (another bus of this process or a live
 * process may hold one; a journal kept for later is never reused). */
static int open_own(kb_runs *j, const char *dir, const char *prefix, const char *consumer,
                    const char identity[1024], char *errstr, size_t errlen)
{
    char name[160];
    size_t k = 0;
    for (const char *c = consumer; *c != '\0' && k < sizeof name - 1; c++)
        name[k++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                            (*c >= '0' && *c <= '9') || *c == '-' || *c == '_' || *c == '.'
                        ? *c : '_';
    name[k] = '\0';
    j->map_bytes = RUNS_HEADER_BYTES + (size_t)j->slots * RUNS_SLOT_BYTES;
    for (int n = 1; n <= RUNS_SAME_NAME_MAX; n++) {
        if (n == 1)
            snprintf(j->path, sizeof j->path, "%s/%s%s.runs", dir, prefix, name);
        else
            snprintf(j->path, sizeof j->path, "%s/%s%s.%d.runs", dir, prefix, name, n);
        int fd = open(j->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
            kb_errf(errstr, errlen, "runs.dir: cannot create %s: %s", j->path, strerror(errno));
            return KB_ETRANSPORT;
        }
        struct stat st;
        if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &st) != 0 || st.st_nlink == 0 ||
            st.st_size != 0) {
            close(fd);   /* held, deleted by an adopter meanwhile, or kept for later */
            continue;
        }
        if (ftruncate(fd, (off_t)j->map_bytes) != 0) {
            kb_errf(errstr, errlen, "runs.dir: cannot size %s: %s", j->path, strerror(errno));
            unlink(j->path);
            close(fd);
            return KB_ETRANSPORT;
        }
        j->map = mmap(NULL, j->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (j->map == MAP_FAILED) {
            j->map = NULL;
            kb_errf(errstr, errlen, "runs.dir: cannot map %s: %s", j->path, strerror(errno));
            unlink(j->path);
            close(fd);
            return KB_ETRANSPORT;
        }
        j->fd = fd;
        runs_header *h = (runs_header *)j->map;
        h->slots = j->slots;
        h->slot_bytes = RUNS_SLOT_BYTES;
        memcpy(h->identity, identity, sizeof h->identity);
        memcpy(h->magic, RUNS_MAGIC, 8);   /* last: a half-written header is no journal */
        return KB_OK;
    }
    kb_errf(errstr, errlen, "runs.dir: %s%s.*.runs: %d journals of this consumer name are in use",
             prefix, name, RUNS_SAME_NAME_MAX);
    return KB_ETRANSPORT;
}

int kb_bus_runs_journal(kb_bus *b, const char *broker, kb_run_record_fn *record, void *opaque,
                        char *errstr, size_t errlen)
{
    if (b == NULL || broker == NULL || record == NULL || b->runs != NULL) {
        kb_errf(errstr, errlen, "kb_bus_runs_journal: %s", b != NULL && b->runs != NULL
                 ? "the bus has its journal already" : "bus, broker or record is NULL");
        return KB_EINVAL;
    }
    char dir[3840], identity[1024], prefix[64];
    int rc = usable_dir(b->core.runs_dir, dir, sizeof dir, errstr, errlen);
    if (rc != KB_OK)
        return rc;
    size_t id_len = identity_of(b, broker, identity);
    snprintf(prefix, sizeof prefix, "%s-%08x-", b->ops->scheme, kb_fnv1a32(identity, id_len));
    adopt_all(b, dir, prefix, identity, record, opaque);

    kb_runs *j = calloc(1, sizeof *j);
    if (j != NULL) {
        j->fd = -1;
        j->slots = kb__sched_threads(b->sched);
        j->last_topic = calloc(j->slots, sizeof *j->last_topic);
    }
    if (j == NULL || j->last_topic == NULL) {
        if (j != NULL)
            free(j);
        kb_errf(errstr, errlen, "kb_bus_runs_journal: out of memory");
        return KB_ENOMEM;
    }
    rc = open_own(j, dir, prefix, b->core.consumer, identity, errstr, errlen);
    if (rc != KB_OK) {
        runs_free(j);
        return rc;
    }
    b->runs = j;
    return KB_OK;
}
