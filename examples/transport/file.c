/* file://DIR — an example transport, built against the installed keybus
 * headers and library only and loaded as a plugin (`transport.plugins`).
 * Every partition of a topic is an append-only log file; consumers in
 * several processes share a topic through flock leases per partition and a
 * committed offset per partition and group (docs/transports.md walks through
 * it). This file: the ops table, its configuration keys, open/close and the
 * per-topic state. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_int.h"

/* The transport's own keys: kb_conf_set validates them and `keybus conf-doc`
 * documents them once the plugin is loaded. */
static const kb_conf_prop file_props[] = {
    {"file.poll_ms", KB_CONF_INT, "50", 1, 60000,
     "How often a file:// consumer looks for events other processes appended and "
     "re-balances partition leases; appends in this process wake it at once.", NULL},
    {"file.fsync", KB_CONF_ENUM, "flush", 0, 8,
     "`flush`: `kb_flush`, `kb_drain` and `kb_close` fsync the partition logs written "
     "since the last time, so flushed events survive a power loss; `never`: leave it to "
     "the kernel (events survive the process dying either way).", "flush|never"},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL, NULL},
};

/* file:///absolute/dir: no host (or localhost), user, port or query. */
static int file_check_url(const kb_url *u, char *errstr, size_t errlen)
{
    const char *why = NULL;
    if (u->user != NULL || u->password != NULL || u->port != 0)
        why = "takes no user, password or port";
    else if (u->host[0] != '\0' && strcmp(u->host, "localhost") != 0)
        why = "names a directory on this host: file:///path (three slashes)";
    else if (u->path[0] != '/' || u->path[1] == '\0')
        why = "needs a directory: file:///path";
    else if (u->query != NULL)
        why = "takes no options after '?'";
    if (why != NULL) {
        kb_errf(errstr, errlen, "transport: file:// %s", why);
        return KB_EINVAL;
    }
    return KB_OK;
}

static int mkdir_if_missing(const char *dir, char *errstr, size_t errlen)
{
    if (mkdir(dir, 0777) == 0 || errno == EEXIST)
        return KB_OK;
    kb_errf(errstr, errlen, "file: cannot create %s: %s", dir, strerror(errno));
    return KB_ETRANSPORT;
}

static void file_free(kb_transport *t)
{
    kb_signal_free(t->wake);
    kb_signal_free(t->settled);
    pthread_mutex_destroy(&t->topics_lock);
    free(t->dir);
    free(t->group);
    free(t->consumer);
    free(t);
}

static int file_open(kb_transport **out, kb_bus *bus, const kb_conf *c, char *errstr,
                     size_t errlen)
{
    kb_url *u = kb_url_parse(kb_conf_str(c, "transport"), errstr, errlen);
    if (u == NULL)
        return KB_EINVAL;
    kb_transport *t = calloc(1, sizeof *t);
    if (t != NULL) {
        t->bus = bus;
        t->dir = strdup(u->path);
        t->group = strdup(kb_conf_str(c, "group"));
        t->consumer = strdup(kb_conf_str(c, "consumer"));
        t->partitions = (uint32_t)kb_conf_int(c, "partitions");
        t->poll_ms = (int)kb_conf_int(c, "file.poll_ms");
        t->fsync_on_flush = strcmp(kb_conf_str(c, "file.fsync"), "flush") == 0;
        t->wake = kb_signal_new();
        t->settled = kb_signal_new();
        pthread_mutex_init(&t->topics_lock, NULL);
    }
    kb_url_free(u);
    if (t == NULL || t->dir == NULL || t->group == NULL || t->consumer == NULL ||
        t->wake == NULL || t->settled == NULL) {
        if (t != NULL)
            file_free(t);
        kb_errf(errstr, errlen, "file: out of memory");
        return KB_ENOMEM;
    }
    int rc = mkdir_if_missing(t->dir, errstr, errlen);
    if (rc != KB_OK) {
        file_free(t);
        return rc;
    }
    *out = t;
    return KB_OK;
}

static int open_in(kb_transport_topic *tt, const char *name, int flags, int *fd,
                   char *errstr, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", tt->dir, name);
    *fd = open(path, flags | O_CREAT | O_CLOEXEC, 0666);
    if (*fd >= 0)
        return KB_OK;
    kb_errf(errstr, errlen, "file: topic %s: cannot open %s: %s", tt->name, path, strerror(errno));
    return KB_ETRANSPORT;
}

/* The partition count the topic was made with, in DIR/<topic>/partitions:
 * written by the first process to open the topic (to a file of its own,
 * then link()ed into place, so nobody reads it half written and only one
 * count wins), read by every other one. */
static int stored_count(kb_transport_topic *tt, char *errstr, size_t errlen)
{
    char path[4096], mine[4160], text[16];
    snprintf(path, sizeof path, "%s/partitions", tt->dir);
    snprintf(mine, sizeof mine, "%s.%ld.%p", path, (long)getpid(), (void *)tt);
    int fd = open(mine, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    int len = snprintf(text, sizeof text, "%u\n", tt->partitions);
    bool written = fd >= 0 && write(fd, text, (size_t)len) == len;
    if (fd >= 0)
        close(fd);
    bool linked = written && link(mine, path) == 0;
    int why = errno;
    unlink(mine);
    if (written && !linked && why != EEXIST) {
        kb_errf(errstr, errlen, "file: topic %s: cannot create %s: %s", tt->name, path,
                strerror(why));
        return KB_ETRANSPORT;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
    if (fd >= 0)
        close(fd);
    char *end = NULL;
    unsigned long n = 0;
    if (got > 0) {
        text[got] = '\0';
        n = strtoul(text, &end, 10);
    }
    if (n == 0 || n > UINT32_MAX || end == NULL || *end != '\n') {
        kb_errf(errstr, errlen, "file: topic %s: %s does not hold a partition count", tt->name,
                path);
        return KB_ETRANSPORT;
    }
    tt->stored_partitions = (uint32_t)n;
    return KB_OK;
}

/* The topic's directory, and its files (created when missing). */
static int open_files(kb_transport_topic *tt, char *errstr, size_t errlen)
{
    int rc = mkdir_if_missing(tt->dir, errstr, errlen);
    if (rc == KB_OK)
        rc = stored_count(tt, errstr, errlen);
    for (uint32_t i = 0; rc == KB_OK && i < tt->partitions; i++) {
        struct kb__file_part *p = &tt->parts[i];
        char name[300];
        snprintf(name, sizeof name, "p%u.log", i);
        rc = open_in(tt, name, O_RDWR | O_APPEND, &p->log_fd, errstr, errlen);
        snprintf(name, sizeof name, "%s.p%u.offset", tt->t->group, i);
        if (rc == KB_OK)
            rc = open_in(tt, name, O_RDWR, &p->offset_fd, errstr, errlen);
    }
    if (rc == KB_OK)
        rc = open_in(tt, "dlq.log", O_RDWR | O_APPEND, &tt->dlq_fd, errstr, errlen);
    if (rc == KB_OK)
        rc = open_in(tt, "dlq.log", O_RDWR, &tt->dlq_mark_fd, errstr, errlen);
    return rc;
}

static void topic_free(kb_transport_topic *tt)
{
    for (uint32_t i = 0; tt->parts != NULL && i < tt->partitions; i++) {
        struct kb__file_part *p = &tt->parts[i];
        kb_kit_queue_free(p->queue);   /* and the released deliveries still in it */
        if (p->log_fd >= 0)
            close(p->log_fd);
        if (p->offset_fd >= 0)
            close(p->offset_fd);
    }
    if (tt->dlq_fd >= 0)
        close(tt->dlq_fd);
    if (tt->dlq_mark_fd >= 0)
        close(tt->dlq_mark_fd);
    pthread_mutex_destroy(&tt->dlq_lock);
    free(tt->parts);
    free(tt->queues);
    free(tt->member_path);
    free(tt->dir);
    free(tt->name);
    free(tt);
}

/* Open (creating) the topic's directory and files. Called once per topic;
 * every per-topic hook gets the result, so nothing is looked up by name. */
static int file_topic_open(kb_transport *t, const char *topic, kb_transport_topic **out,
                           char *errstr, size_t errlen)
{
    kb_transport_topic *tt = calloc(1, sizeof *tt);
    if (tt == NULL) {
        kb_errf(errstr, errlen, "file: out of memory for topic %s", topic);
        return KB_ENOMEM;
    }
    tt->t = t;
    tt->partitions = t->partitions;
    tt->dlq_fd = tt->dlq_mark_fd = tt->member_fd = -1;
    pthread_mutex_init(&tt->dlq_lock, NULL);
    size_t dlen = strlen(t->dir) + 1 + strlen(topic) + 1;
    tt->name = strdup(topic);
    tt->dir = malloc(dlen);
    tt->parts = calloc(tt->partitions, sizeof *tt->parts);
    tt->queues = calloc(tt->partitions, sizeof *tt->queues);
    if (tt->name == NULL || tt->dir == NULL || tt->parts == NULL || tt->queues == NULL) {
        free(tt->parts);
        tt->parts = NULL;   /* topic_free: no partition to close */
        topic_free(tt);
        kb_errf(errstr, errlen, "file: out of memory for topic %s", topic);
        return KB_ENOMEM;
    }
    snprintf(tt->dir, dlen, "%s/%s", t->dir, topic);   /* keybus topic names hold no '/' */
    int rc = KB_OK;
    for (uint32_t i = 0; i < tt->partitions; i++) {
        struct kb__file_part *p = &tt->parts[i];
        p->index = i;
        p->log_fd = p->offset_fd = p->lease_fd = -1;
        /* settling notifies t->settled, which kb_drain waits on */
        p->queue = tt->queues[i] = kb_kit_queue_new(i, 0, t->settled);
        if (p->queue == NULL && rc == KB_OK) {
            kb_errf(errstr, errlen, "file: out of memory for topic %s", topic);
            rc = KB_ENOMEM;
        }
    }
    if (rc == KB_OK)
        rc = open_files(tt, errstr, errlen);
    if (rc != KB_OK) {
        topic_free(tt);
        return rc;
    }
    pthread_mutex_lock(&t->topics_lock);
    atomic_store(&tt->next, atomic_load(&t->topics));
    atomic_store(&t->topics, tt);   /* the reader walks the list without the lock */
    pthread_mutex_unlock(&t->topics_lock);
    *out = tt;
    return KB_OK;
}

/* Nothing here waits for anyone: the leases are local locks, so the deadline
 * is only checked around the fsyncs. */
static int file_close(kb_transport *t, int64_t deadline_ns)
{
    kb__file_stop(t);   /* kb_close stopped it already; harmless twice */
    int rc = kb__file_flush(t, kb_deadline_left_ms(deadline_ns));
    for (kb_transport_topic *tt = atomic_load(&t->topics), *next; tt != NULL; tt = next) {
        next = atomic_load(&tt->next);
        kb__file_member_leave(tt);   /* commit, unlock every lease, leave */
        topic_free(tt);
    }
    file_free(t);
    return rc;
}

static const kb_transport_ops file_ops = {
    .abi_version = KB_TRANSPORT_ABI,
    .scheme = "file",
    /* one reader thread feeds every sink; events keep their headers */
    .flags = KB_TRANSPORT_F_SINGLE_FEEDER | KB_TRANSPORT_F_HEADERS,
    .props = file_props,
    .check_url = file_check_url,
    .open = file_open,
    .topic_open = file_topic_open,
    .publish = kb__file_publish,
    .subscribe = kb__file_subscribe,
    .ack = kb__file_ack,
    .dead_letter = kb__file_dead_letter,
    .flush = kb__file_flush,
    .drain = kb__file_drain,
    .stats = kb__file_stats,
    .partition_stats = kb__file_partition_stats,
    .dead_letters = kb__file_dead_letters,
    .dead_letter_replay = kb__file_dead_letter_replay,
    .stop = kb__file_stop,
    .close = file_close,
};

/* The plugin's entry (KB_TRANSPORT_PLUGIN_ENTRY): the one exported symbol. */
__attribute__((visibility("default"))) const kb_transport_ops *kb_transport_plugin(void)
{
    return &file_ops;
}
