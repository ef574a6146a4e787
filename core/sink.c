/* Between transports and pools: deliveries become records on a lane, and a
 * handled record becomes an ack, a dead letter or a release. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bus_int.h"
#include "metrics.h"
#include "runs.h"

#define KB_MAX_ID_BYTES 255

/* The record of one delivery, in *out; KB_OK or the error (errstr set). */
static int record_of(struct kb_topic *topic, const kb_delivery *d, kb_rec **out)
{
    const char *id = d->id != NULL ? d->id : "";
    size_t id_len = strlen(id);
    if (id_len > KB_MAX_ID_BYTES) {
        kb_errf(NULL, 0, "delivery ID of %zu bytes is longer than %d", id_len, KB_MAX_ID_BYTES);
        return KB_EINVAL;
    }
    int rc = kb_headers_check(d->headers, d->n_headers, KB_MAX_HEADERS, 65536, "delivery");
    if (rc != KB_OK)
        return rc;
    kb_rec *r = kb__rec_new(topic, kb__metrics_stamp(topic), d->key, d->key_len, d->payload,
                            d->payload_len, id, id_len, d->headers, d->n_headers);
    if (r == NULL) {
        kb_errf(NULL, 0, "topic %s: out of memory for an event of %zu bytes", topic->name,
                d->key_len + d->payload_len);
        return KB_ENOMEM;
    }
    r->cookie = d->cookie;
    r->partition = d->partition;
    r->first_attempt = d->attempt ? d->attempt : 1;
    r->flags = (uint8_t)(d->flags & KB_DELIVERY_F_REDELIVERED);
    KB_PROBE4(receive, topic->name, d->key, d->key_len, r);
    *out = r;
    return KB_OK;
}

static kb_pool *pool_of(struct kb_topic *topic)
{
    kb_pool *pool = kb__topic_pool(topic);
    if (pool == NULL)
        kb_errf(NULL, 0, "topic %s: nobody subscribed here", topic->name);
    return pool;
}

__attribute__((cold)) void kb__submit_failed(const struct kb_topic *t, const char *who,
                                              kb_pool *pool, int rc, uint32_t hash,
                                              int timeout_ms)
{
    uint32_t lane = kb__pool_lane(pool, hash);
    if (rc == KB_EFULL && kb__pool_lane_is_ours(pool, lane))
        kb_errf(NULL, 0, "%s %s: lane %u full, and it belongs to this handler's own executor, "
                "which cannot drain it while the handler waits", who, t->name, lane);
    else if (rc == KB_EFULL)
        kb_errf(NULL, 0, "%s %s: lane %u full for %d ms", who, t->name, lane, timeout_ms);
    else if (rc == KB_ECLOSED)
        kb_errf(NULL, 0, "%s %s: bus is closing", who, t->name);
    else if (rc == KB_ENOMEM)
        kb_errf(NULL, 0, "%s %s: out of memory for lane %u", who, t->name, lane);
}

int kb__sink_put(struct kb_topic *topic, const kb_delivery *d, uint32_t hash, int timeout_ms)
{
    kb_pool *pool = pool_of(topic);
    if (pool == NULL)
        return KB_ENOTFOUND;
    kb_rec *r;
    int rc = record_of(topic, d, &r);
    if (rc != KB_OK)
        return rc;
    rc = kb__pool_submit_one(pool, hash, r, timeout_ms);
    if (rc != KB_OK) {
        kb__rec_free(r);
        kb__submit_failed(topic, "topic", pool, rc, hash, timeout_ms);
    }
    return rc;
}

/* What is wrong with a delivery, NULL when nothing. */
static const char *delivery_problem(const void *s, const kb_delivery *d)
{
    if (s != NULL && d != NULL && d->key != NULL && d->key_len > 0 &&
        (d->payload != NULL || d->payload_len == 0))
        return NULL;
    return s == NULL ? "sink is NULL"
           : d == NULL ? "delivery is NULL"
           : d->key == NULL || d->key_len == 0 ? "key is NULL or empty"
                                               : "payload is NULL with a length";
}

/* Debug builds hold transports to KB_TRANSPORT_F_SINGLE_FEEDER: its lanes use
 * the single-producer ring, which two feeders at once would corrupt. */
static inline bool feeding_begins(struct kb_topic *topic)
{
#ifndef NDEBUG
    bool single = topic->bus->ops->flags & KB_TRANSPORT_F_SINGLE_FEEDER;
    if (single && atomic_exchange(&topic->feeding, 1) != 0) {
        fprintf(stderr, "keybus: topic %s fed by two threads at once, though %s:// declares "
                "KB_TRANSPORT_F_SINGLE_FEEDER\n", topic->name, topic->bus->ops->scheme);
        abort();
    }
    return single;
#else
    (void)topic;
    return false;
#endif
}

static inline void feeding_ends(struct kb_topic *topic, bool single)
{
    if (single)
        atomic_store(&topic->feeding, 0);
}

void kb_sink_dead_letters_lost(kb_sink *s, uint64_t n, const char *why)
{
    struct kb_topic *topic = (struct kb_topic *)s;
    if (topic == NULL || n == 0)
        return;
    atomic_fetch_add_explicit(&topic->dead_letter_failures, n, memory_order_relaxed);
    kb_log(topic->bus, KB_LOG_WARNING, "topic %s: %llu dead letters not stored: %s", topic->name,
           (unsigned long long)n, why != NULL ? why : "the transport failed to store them");
}

int kb_sink_deliver(kb_sink *s, const kb_delivery *d, int timeout_ms)
{
    const char *problem = delivery_problem(s, d);
    if (problem != NULL) {
        kb_errf(NULL, 0, "kb_sink_deliver: %s", problem);
        return KB_EINVAL;
    }
    struct kb_topic *topic = (struct kb_topic *)s;
    bool single = feeding_begins(topic);
    int rc = kb__sink_put(topic, d, kb_fnv1a32(d->key, d->key_len), timeout_ms);
    feeding_ends(topic, single);
    return rc;
}

/* Deliveries one submit takes at most: its arrays live on the stack. */
#define SINK_BATCH_MAX 64

/* What is left of a call's deadline for one more wait, in ms rounded up: 0
 * once it passed. */
static int ms_left(int64_t deadline_ns)
{
    int64_t left = deadline_ns - kb__now_ns();
    return left <= 0 ? 0 : (int)((left + 999999) / 1000000);
}

/* Delivery i of a batch is refused for `why`: the errstr names it. */
static void name_bad_delivery(size_t i, const char *why)
{
    char text[256];
    snprintf(text, sizeof text, "%s", why);   /* why may be the errstr itself */
    kb_errf(NULL, 0, "kb_sink_deliver_batch: delivery %zu: %s", i, text);
}

/* Records for d[0..n) (n <= SINK_BATCH_MAX; d[0] is delivery `first` of the
 * call) submitted together; *taken receives the accepted prefix, whose
 * records the pool now owns. With a deadline (timeout_ms > 0) the batch goes
 * without waiting and only the item at a full lane waits, for what is left:
 * the pool would wait up to a whole timeout at each full lane. */
static int put_batch(struct kb_topic *topic, kb_pool *pool, const kb_delivery *d, size_t n,
                     size_t first, int timeout_ms, int64_t deadline_ns, size_t *taken)
{
    uint32_t hashes[SINK_BATCH_MAX];
    void *items[SINK_BATCH_MAX];
    size_t made = 0;
    int rc = KB_OK;
    *taken = 0;
    while (made < n) {
        const char *problem = delivery_problem(topic, &d[made]);
        if (problem != NULL) {
            name_bad_delivery(first + made, problem);
            rc = KB_EINVAL;
            break;
        }
        kb_rec *r;
        if ((rc = record_of(topic, &d[made], &r)) != KB_OK) {
            name_bad_delivery(first + made, kb_last_error());
            break;
        }
        hashes[made] = kb_fnv1a32(d[made].key, d[made].key_len);
        items[made++] = r;
    }
    if (made == 0)
        return rc;
    size_t at = 0;
    int submitted, wait_ms;
    for (;;) {
        size_t got = 0;
        submitted = kb_pool_submit_batch(pool, hashes + at, items + at, made - at,
                                         timeout_ms > 0 ? 0 : timeout_ms, &got);
        at += got;
        if (submitted != KB_EFULL || timeout_ms <= 0 || (wait_ms = ms_left(deadline_ns)) == 0)
            break;
        got = 0;
        submitted = kb_pool_submit_batch(pool, hashes + at, items + at, 1, wait_ms, &got);
        at += got;
        if (submitted != KB_OK || at == made)
            break;
    }
    for (size_t i = at; i < made; i++)
        kb__rec_free(items[i]);
    if (submitted != KB_OK) {
        kb__submit_failed(topic, "topic", pool, submitted, hashes[at], timeout_ms);
        rc = submitted;
    }
    *taken = at;
    return rc;
}

int kb_sink_deliver_batch(kb_sink *s, const kb_delivery *d, size_t n, int timeout_ms,
                          size_t *accepted)
{
    size_t done = 0;
    int rc = KB_OK;
    if (s == NULL || (d == NULL && n > 0)) {
        kb_errf(NULL, 0, "kb_sink_deliver_batch: %s", s == NULL ? "sink is NULL"
                                                                : "deliveries are NULL");
        rc = KB_EINVAL;
        goto out;
    }
    struct kb_topic *topic = (struct kb_topic *)s;
    kb_pool *pool = n > 0 ? pool_of(topic) : NULL;
    if (n > 0 && pool == NULL) {
        rc = KB_ENOTFOUND;
        goto out;
    }
    int64_t deadline_ns = timeout_ms > 0 ? kb__deadline_ns(timeout_ms) : 0;
    bool single = feeding_begins(topic);
    while (rc == KB_OK && done < n) {
        size_t chunk = n - done < SINK_BATCH_MAX ? n - done : SINK_BATCH_MAX;
        size_t taken;
        rc = put_batch(topic, pool, d + done, chunk, done, timeout_ms, deadline_ns, &taken);
        done += taken;
    }
    feeding_ends(topic, single);
out:
    if (accepted != NULL)
        *accepted = done;
    return rc;
}

/* The delivery a record came from; `headers` (KB_MAX_HEADERS entries) is
 * filled when not NULL, else the delivery carries none. */
static void delivery_of(const kb_rec *r, uint32_t attempt, kb_delivery *d, kb_header *headers)
{
    d->topic = r->topic->name;
    d->tt = r->topic->tt;
    d->key = kb__rec_key(r);
    d->key_len = r->key_len;
    d->payload = kb__rec_payload(r);
    d->payload_len = r->payload_len;
    d->partition = r->partition;
    d->attempt = attempt;
    d->id = kb__rec_id(r);
    d->cookie = r->cookie;
    d->headers = headers;
    d->n_headers = headers != NULL ? r->n_headers : 0;
    d->flags = r->flags;
    if (headers != NULL && r->n_headers > 0)
        kb_headers_unpack(kb__rec_headers(r), r->n_headers, headers);
}

/* The handler call running on this thread, for kb_event_set_reason. */
struct handler_call {
    const kb_event *ev;
    bool has_reason;
    char reason[256];
};
static _Thread_local struct handler_call current_call;

/* Before run `total` of r: the journal first (a crash from here on counts the
 * run on this host), then, for an event the broker handed out before or a
 * retry, the transport's synchronous record on the broker. */
static void run_begins(struct kb_topic *topic, const kb_rec *r, uint32_t total)
{
    kb_runs *runs = topic->bus->runs;
    if (runs != NULL)
        kb__runs_begin(runs, kb__executor_index(), topic->name, r->partition, kb__rec_id(r),
                       total);
    const kb_transport_ops *ops = topic->bus->ops;
    if (ops->run_begins != NULL && ((r->flags & KB_DELIVERY_F_REDELIVERED) || total > 1)) {
        kb_delivery d;
        delivery_of(r, total, &d, NULL);
        ops->run_begins(topic->bus->t, &d);
    }
}

/* A handler run: the handler, and around it what the topic asks for (`plain`
 * false: a broker's ownership check and records, histograms) and an event's
 * headers. Always inlined: kb__topic_handle's plain case, where a mem://
 * event's run is the handler call and little else, and handle_full. */
static inline __attribute__((always_inline)) int
run_handler(struct kb_topic *topic, kb_rec *r, uint32_t attempt, bool plain)
{
    uint32_t total = r->first_attempt + attempt - 1;
    const kb_transport_ops *ops = topic->bus->ops;
    if (!plain && ops->still_owned != NULL) {
        kb_delivery d;
        delivery_of(r, total, &d, NULL);
        if (!ops->still_owned(topic->bus->t, &d))
            return KB_POOL_SKIP;   /* released unacked: the new owner handles it */
    }
    kb_header headers[KB_MAX_HEADERS];
    if (!plain && r->n_headers > 0)
        kb_headers_unpack(kb__rec_headers(r), r->n_headers, headers);
    kb_event ev = {
        .topic = topic->name,
        .key = kb__rec_key(r),
        .key_len = r->key_len,
        .payload = kb__rec_payload(r),
        .payload_len = r->payload_len,
        .attempt = total,
        .id = kb__rec_id(r),
        .headers = !plain && r->n_headers > 0 ? headers : NULL,
        .n_headers = plain ? 0 : r->n_headers,
    };
    struct handler_call *call = &current_call;
    call->ev = &ev;
    call->has_reason = false;
    if (!plain)
        run_begins(topic, r, total);
    KB_PROBE5(handler_start, topic->name, ev.key, ev.key_len, r, total);
    int64_t start = plain ? 0 : kb__metrics_stamp(topic);
    int result = topic->fn(&ev, topic->opaque);
    if (!plain) {
        kb__metrics_ran(topic, kb__executor_index(), r->born_ns, start, attempt);
        if (topic->bus->runs != NULL)
            kb__runs_end(topic->bus->runs, kb__executor_index());
    }
    KB_PROBE3(handler_end, topic->name, r, result);
    call->ev = NULL;
    if (result == KB_HANDLED)
        return KB_HANDLED;
    if (result == KB_DECLINE)
        return KB_POOL_SKIP;   /* given back unacked, as at close */
    bool dead = result == KB_DEAD;
    if (!dead && total < topic->bus->max_attempts) {
        KB_PROBE3(retry, topic->name, r, total);
        return KB_RETRY;
    }
    /* kb__topic_finish runs next on this thread, while the text is still there */
    r->dead_reason = call->has_reason ? call->reason
                     : dead           ? "handler returned KB_DEAD"
                                      : "retry.max_attempts reached";
    return KB_DEAD;
}

static __attribute__((noinline)) int handle_full(struct kb_topic *topic, kb_rec *r,
                                                 uint32_t attempt)
{
    return run_handler(topic, r, attempt, false);
}

int kb__topic_handle(void *item, uint32_t attempt, void *opaque)
{
    kb_rec *r = item;
    struct kb_topic *topic = opaque;
    if (topic->plain && r->n_headers == 0 && topic->bus->runs == NULL)
        return run_handler(topic, r, attempt, true);
    return handle_full(topic, r, attempt);
}

const void *kb__topic_key(const void *item, size_t *key_len, void *opaque)
{
    (void)opaque;
    const kb_rec *r = item;
    *key_len = r->key_len;
    return kb__rec_key(r);
}

int kb_event_set_reason(const kb_event *ev, const char *fmt, ...)
{
    struct handler_call *call = &current_call;
    if (ev == NULL || fmt == NULL || call->ev != ev) {
        kb_errf(NULL, 0, "kb_event_set_reason: %s", ev == NULL || fmt == NULL
                 ? "event or format is NULL" : "not the event this thread's handler is running for");
        return KB_EINVAL;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->reason, sizeof call->reason, fmt, ap);
    va_end(ap);
    call->has_reason = true;
    return KB_OK;
}

/* Settle a record with the transport (ack, dead letter, release), then free it. */
static __attribute__((noinline)) void settle(kb_rec *r, int outcome, uint32_t attempts,
                                             struct kb_topic *topic)
{
    kb_bus *b = topic->bus;
    if (kb__on_executor_thread() && !(b->ops->flags & KB_TRANSPORT_F_LOCAL))
        kb__executor_fed_by_transport();   /* mem:// settles its dead letters here too */
    kb_delivery d;
    kb_header headers[KB_MAX_HEADERS];   /* a dead letter keeps them */
    delivery_of(r, attempts ? r->first_attempt + attempts - 1 : r->first_attempt, &d,
                outcome == KB_DEAD ? headers : NULL);
    /* A failed ack or dead letter is logged (and a dead letter counted),
     * never retried: the transport owns what happens to the event next
     * (transport.h, ack). */
    if (outcome == KB_HANDLED) {
        kb_err_clear();
        int rc = b->ops->ack != NULL ? b->ops->ack(b->t, &d) : KB_OK;
        if (rc != KB_OK)
            kb_log(b, KB_LOG_WARNING, "topic %s: ack of %s failed: %s", topic->name, d.id,
                   kb_last_error()[0] ? kb_last_error() : kb_strerror(rc));
    } else if (outcome == KB_DEAD) {
        const char *reason = r->dead_reason ? r->dead_reason : "dead-lettered";
        KB_PROBE4(dead_letter, topic->name, r, d.attempt, reason);
        kb_err_clear();
        int rc = b->ops->dead_letter(b->t, &d, reason);
        if (rc != KB_OK) {
            atomic_fetch_add_explicit(&topic->dead_letter_failures, 1, memory_order_relaxed);
            kb_log(b, KB_LOG_WARNING, "topic %s: dead letter for key \"%.*s\" (%s, %u attempts) not stored: %s",
                   topic->name, (int)(d.key_len > 64 ? 64 : d.key_len), (const char *)d.key,
                   reason, d.attempt, kb_last_error()[0] ? kb_last_error() : kb_strerror(rc));
        }
    } else if (b->ops->release != NULL) {
        b->ops->release(b->t, &d);
    }
    kb__rec_free(r);
}

void kb__topic_finish(void *item, int outcome, uint32_t attempts, void *opaque)
{
    kb_rec *r = item;
    struct kb_topic *topic = opaque;
    if (outcome == KB_HANDLED)
        KB_PROBE3(ack, topic->name, r, kb__rec_id(r));
    if (outcome == KB_HANDLED && topic->bus->ops->ack == NULL)
        kb__rec_free(r);   /* nothing to settle (mem://) */
    else
        settle(r, outcome, attempts, topic);
}
