/* mem://, the embedded default: the bus enqueues publishes straight into the
 * topic's pool in this process (KB_TRANSPORT_F_LOCAL), so this transport only
 * keeps the dead letters: a bounded store per topic, listed and replayed
 * through kb_dead_letters / kb_dead_letter_replay as on the brokers. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <keybus/transport.h>

static const kb_conf_prop mem_props[] = {
    {"mem.dlq_capacity", KB_CONF_INT, "10000", 0, 1 << 24,
     "Dead letters mem:// keeps per topic for `kb_dead_letters` and "
     "`kb_dead_letter_replay`; when full the oldest is dropped, counted in "
     "`dead_letters_lost` and logged. 0 keeps none."},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL},
};

/* One dead letter. Walkers hold a reference while their callback runs, so an
 * entry replayed or dropped meanwhile is unlinked at once and freed by the
 * last reference. */
struct dead {
    struct dead *next;
    uint64_t id;
    unsigned refs;
    int unlinked, replaying;
    uint32_t attempts;
    int64_t time_ms;
    size_t key_len, payload_len, n_headers;
    char id_text[24];
    char *reason;
    char data[];                 /* key, payload, then the headers' block */
};

/* A topic's state: its dead letters, oldest first. */
struct kb_transport_topic {
    struct kb_transport_topic *next;
    char *topic;
    struct dead *head, *tail;
    size_t n;
    uint64_t last_id, dropped;
};

struct kb_transport {
    kb_bus *bus;
    size_t capacity;
    pthread_mutex_t lock;        /* the stores; dead letters are rare */
    kb_transport_topic *dlqs;
};

static int mem_check_url(const kb_url *u, char *errstr, size_t errlen)
{
    if (u->user != NULL || u->password != NULL || u->host[0] != '\0' || u->port != 0 ||
        u->path[0] != '\0' || u->query != NULL) {
        kb_errf(errstr, errlen, "transport: mem:// takes no host, user, path or options");
        return KB_EINVAL;
    }
    return KB_OK;
}

static int mem_open(kb_transport **out, kb_bus *bus, const kb_conf *c, char *errstr, size_t errlen)
{
    kb_transport *t = calloc(1, sizeof *t);
    if (t == NULL) {
        kb_errf(errstr, errlen, "mem: out of memory");
        return KB_ENOMEM;
    }
    t->bus = bus;
    t->capacity = (size_t)kb_conf_int(c, "mem.dlq_capacity");
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return KB_OK;
}

static int mem_topic_open(kb_transport *t, const char *topic, kb_transport_topic **out,
                          char *errstr, size_t errlen)
{
    kb_transport_topic *q = calloc(1, sizeof *q);
    if (q == NULL || (q->topic = strdup(topic)) == NULL) {
        free(q);
        kb_errf(errstr, errlen, "mem: out of memory for topic %s", topic);
        return KB_ENOMEM;
    }
    pthread_mutex_lock(&t->lock);
    q->next = t->dlqs;
    t->dlqs = q;
    pthread_mutex_unlock(&t->lock);
    *out = q;
    return KB_OK;
}

static int mem_subscribe(kb_transport *t, kb_transport_topic *q, kb_sink *sink)
{
    (void)t, (void)q, (void)sink;   /* the bus registry is the routing table */
    return KB_OK;
}

static void dead_free(struct dead *e)
{
    free(e->reason);
    free(e);
}

/* Take e out of q; it is freed now or by its last walker. Caller holds the lock. */
static void unlink_dead(kb_transport_topic *q, struct dead *e)
{
    struct dead **pp = &q->head, *prev = NULL;
    while (*pp != e) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = e->next;
    if (q->tail == e)
        q->tail = prev;
    q->n--;
    e->unlinked = 1;
    if (e->refs == 0)
        dead_free(e);
}

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int mem_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason)
{
    if (t->capacity == 0) {
        kb_errf(NULL, 0, "mem.dlq_capacity is 0");
        return KB_ENOTFOUND;
    }
    size_t headers_size = kb_headers_packed_size(d->headers, d->n_headers);
    struct dead *e = malloc(sizeof *e + d->key_len + d->payload_len + headers_size);
    if (e != NULL && (e->reason = strdup(reason)) == NULL) {
        free(e);
        e = NULL;
    }
    if (e == NULL) {
        kb_errf(NULL, 0, "out of memory for a dead letter of %zu bytes",
                 d->key_len + d->payload_len);
        return KB_ENOMEM;
    }
    e->next = NULL;
    e->refs = 0;
    e->unlinked = e->replaying = 0;
    e->attempts = d->attempt;
    e->time_ms = unix_ms();
    e->key_len = d->key_len;
    e->payload_len = d->payload_len;
    e->n_headers = d->n_headers;
    memcpy(e->data, d->key, d->key_len);
    if (d->payload_len > 0)
        memcpy(e->data + d->key_len, d->payload, d->payload_len);
    kb_headers_pack(e->data + d->key_len + d->payload_len, d->headers, d->n_headers);

    kb_transport_topic *q = d->tt;
    pthread_mutex_lock(&t->lock);
    e->id = ++q->last_id;
    snprintf(e->id_text, sizeof e->id_text, "%" PRIu64, e->id);
    uint64_t dropped_id = 0;
    if (q->n == t->capacity) {
        dropped_id = q->head->id;
        unlink_dead(q, q->head);
        q->dropped++;
    }
    if (q->tail != NULL)
        q->tail->next = e;
    else
        q->head = e;
    q->tail = e;
    q->n++;
    pthread_mutex_unlock(&t->lock);
    if (dropped_id != 0)
        kb_log(t->bus, KB_LOG_WARNING, "mem: topic %s: dead-letter store full (mem.dlq_capacity %zu): "
               "dropped the oldest, %" PRIu64, d->topic, t->capacity, dropped_id);
    return KB_OK;
}

/* "" or NULL: 0; otherwise a decimal dead-letter ID. */
static int parse_id(const char *s, uint64_t *out)
{
    if (s == NULL || *s == '\0') {
        *out = 0;
        return KB_OK;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] < '0' || s[0] > '9' || *end != '\0' || errno == ERANGE) {
        kb_errf(NULL, 0, "mem: dead-letter ID \"%.32s\" is not a decimal number", s);
        return KB_EINVAL;
    }
    *out = v;
    return KB_OK;
}

static int mem_dead_letters(kb_transport *t, kb_transport_topic *q, const char *after_id,
                            size_t max, kb_dead_letter_fn fn, void *opaque)
{
    uint64_t after;
    int rc = parse_id(after_id, &after);
    if (rc != KB_OK)
        return rc;
    pthread_mutex_lock(&t->lock);
    struct dead *e = q->head;
    for (size_t seen = 0; seen < max; seen++) {
        while (e != NULL && e->id <= after)
            e = e->next;
        if (e == NULL)
            break;
        e->refs++;
        pthread_mutex_unlock(&t->lock);
        kb_header headers[KB_MAX_HEADERS];
        kb_headers_unpack(e->data + e->key_len + e->payload_len, e->n_headers, headers);
        kb_dead_letter dl = {
            .id = e->id_text, .key = e->data, .key_len = e->key_len,
            .payload = e->data + e->key_len, .payload_len = e->payload_len,
            .partition = 0, .original_id = "", .attempts = e->attempts,
            .reason = e->reason, .time_ms = e->time_ms,
            .headers = headers, .n_headers = e->n_headers,
        };
        int stop = fn(&dl, opaque);   /* may replay this very entry */
        pthread_mutex_lock(&t->lock);
        after = e->id;
        struct dead *next = e->unlinked ? q->head : e->next;   /* rescan: IDs only grow */
        if (--e->refs == 0 && e->unlinked)
            dead_free(e);
        e = next;
        if (stop)
            break;
    }
    pthread_mutex_unlock(&t->lock);
    return KB_OK;
}

/* Dead letter `id` of q in *out (NULL: none), t->lock held, on KB_OK. */
static int lock_dead(kb_transport *t, kb_transport_topic *q, const char *id, struct dead **out)
{
    uint64_t want;
    int rc = parse_id(id, &want);
    if (rc != KB_OK)
        return rc;
    pthread_mutex_lock(&t->lock);
    struct dead *e = q->head;
    while (e != NULL && e->id != want)
        e = e->next;
    *out = e;
    return KB_OK;
}

static int mem_dead_letter_replay(kb_transport *t, kb_transport_topic *q, const char *id)
{
    struct dead *e;
    int rc = lock_dead(t, q, id, &e);
    if (rc != KB_OK)
        return rc;
    if (e == NULL || e->replaying) {
        pthread_mutex_unlock(&t->lock);
        kb_errf(NULL, 0, "mem: topic %s has no dead letter %.32s%s", q->topic, id,
                 e != NULL ? " (a replay of it is under way)" : "");
        return KB_ENOTFOUND;
    }
    e->replaying = 1;
    e->refs++;
    pthread_mutex_unlock(&t->lock);
    /* back through the bus: the topic's lane, attempt 1, the same headers */
    kb_header headers[KB_MAX_HEADERS];
    kb_headers_unpack(e->data + e->key_len + e->payload_len, e->n_headers, headers);
    kb_msg m = {e->data, e->key_len, e->data + e->key_len, e->payload_len, 0, headers,
                e->n_headers};
    kb_topic *handle = kb_topic_get(t->bus, q->topic, NULL, 0);
    rc = handle != NULL ? kb_publish_ex(handle, &m) : KB_ENOMEM;
    pthread_mutex_lock(&t->lock);
    e->replaying = 0;
    e->refs--;
    if (rc == KB_OK && !e->unlinked)
        unlink_dead(q, e);
    else if (e->refs == 0 && e->unlinked)
        dead_free(e);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

static int mem_dead_letter_delete(kb_transport *t, kb_transport_topic *q, const char *id)
{
    struct dead *e;
    int rc = lock_dead(t, q, id, &e);
    if (rc != KB_OK)
        return rc;
    if (e != NULL)
        unlink_dead(q, e);   /* a walk or replay holding it frees it after */
    pthread_mutex_unlock(&t->lock);
    if (e == NULL)
        kb_errf(NULL, 0, "mem: topic %s has no dead letter %.32s", q->topic, id);
    return e != NULL ? KB_OK : KB_ENOTFOUND;
}

static int mem_stats(kb_transport *t, kb_transport_topic *q, kb_topic_stats *out)
{
    out->published = out->received;   /* a publish is an enqueue */
    pthread_mutex_lock(&t->lock);
    out->dlq_length = q->n;
    out->dead_letters_lost += q->dropped;
    pthread_mutex_unlock(&t->lock);
    return KB_OK;
}

static int mem_close(kb_transport *t, int64_t deadline_ns)
{
    (void)deadline_ns;   /* nothing to wait for */
    for (kb_transport_topic *q = t->dlqs, *next; q != NULL; q = next) {
        next = q->next;
        for (struct dead *e = q->head, *en; e != NULL; e = en) {
            en = e->next;
            dead_free(e);
        }
        free(q->topic);
        free(q);
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
    return KB_OK;
}

const kb_transport_ops kb__mem_ops = {
    .abi_version = KB_TRANSPORT_ABI,
    .scheme = "mem",
    .flags = KB_TRANSPORT_F_LOCAL,   /* the bus enqueues publishes itself */
    .props = mem_props,
    .check_url = mem_check_url,
    .open = mem_open,
    .topic_open = mem_topic_open,
    .subscribe = mem_subscribe,
    .dead_letter = mem_dead_letter,
    .stats = mem_stats,
    .dead_letters = mem_dead_letters,
    .dead_letter_replay = mem_dead_letter_replay,
    .dead_letter_delete = mem_dead_letter_delete,
    .close = mem_close,
};
