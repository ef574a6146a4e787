/*
 * Writing a transport: the ops table a transport fills, and the calls the bus
 * offers it. A transport is picked by the scheme of the `transport` URL.
 *
 * Life of a bus, as a transport sees it:
 *   open -> (publish | subscribe | flush | stats)* -> stop -> (ack | dead_letter |
 *   release)* while the pools drain -> close.
 * ack, dead_letter and release run on executor threads, concurrently with each
 * other and with publish; everything else is called from application threads.
 */
#ifndef KEYBUS_TRANSPORT_H
#define KEYBUS_TRANSPORT_H

#include <stdarg.h>
#include <keybus/keybus.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KB_TRANSPORT_ABI 2

typedef struct kb_transport kb_transport;  /* the transport's own state */
typedef struct kb_sink kb_sink;            /* a topic subscribed in this process */

/* A message handed to a sink, and handed back in ack/dead_letter/release. */
typedef struct kb_delivery {
    const char *topic;
    const void *key;      size_t key_len;
    const void *payload;  size_t payload_len;
    uint32_t    partition;
    uint32_t    attempt;  /* deliveries so far, this one included (1 = first) */
    const char *id;       /* broker message ID ("" when none) */
    void       *cookie;   /* the transport's own; the bus only carries it */
    const kb_header *headers; size_t n_headers;   /* borrowed, like key and payload */
} kb_delivery;

enum {
    /* Exactly one thread per topic calls kb_sink_deliver, so lanes use the
     * single-producer ring operations. */
    KB_TRANSPORT_F_SINGLE_FEEDER = 1u << 0,
    /* In-process delivery (mem://): the bus enqueues published events into
     * this process's pools itself, without calling publish — the one fast
     * path the core keeps for a transport. publish and ack may be NULL. */
    KB_TRANSPORT_F_LOCAL = 1u << 1,
    /* publish carries kb_msg headers to the broker and deliveries bring them
     * back; without it the bus refuses events with headers (KB_EINVAL). */
    KB_TRANSPORT_F_HEADERS = 1u << 2,
};

typedef struct kb_transport_ops {
    int         abi_version;  /* KB_TRANSPORT_ABI */
    const char *scheme;       /* "mem", "redis", "nats" */
    unsigned    flags;        /* KB_TRANSPORT_F_* */

    int  (*open)(kb_transport **t, kb_bus *bus, const kb_conf *c, char *errstr, size_t errlen);
    /* Copy what it needs; must not wait for a broker round trip. m->hash is
     * set. kb_publish_batch calls it once per event, in order, and stops at
     * the first error. NULL only with KB_TRANSPORT_F_LOCAL. */
    int  (*publish)(kb_transport *t, const char *topic, const kb_msg *m);
    /* Start feeding `sink`; the sink lives until close. */
    int  (*subscribe)(kb_transport *t, const char *topic, kb_sink *sink);
    /* Settle a handled delivery. NULL: nothing to acknowledge. */
    int  (*ack)(kb_transport *t, const kb_delivery *d);
    int  (*dead_letter)(kb_transport *t, const kb_delivery *d, const char *reason);
    /* Optional: the bus gives up on an unhandled delivery at close; leave it
     * unacked so another consumer gets it, and free the cookie. */
    void (*release)(kb_transport *t, const kb_delivery *d);
    int  (*flush)(kb_transport *t, int timeout_ms);
    /* Optional (NULL: kb_drain waits for this process's pools, as on mem://):
     * send what is buffered, then wait until the consumer group has settled
     * (acked or dead-lettered) every event this process published before the
     * call; KB_ETIMEDOUT at the deadline (< 0: none). */
    int  (*drain)(kb_transport *t, int timeout_ms);
    /* Fill the publishing/broker fields of *out; KB_ENOTFOUND if unknown. */
    int  (*stats)(kb_transport *t, const char *topic, kb_topic_stats *out);
    /* Optional hooks (NULL: KB_ENOTFOUND). */
    int  (*partition_stats)(kb_transport *t, const char *topic, uint32_t partition,
                            kb_partition_stats *out);
    int  (*dead_letters)(kb_transport *t, const char *topic, const char *after_id, size_t max,
                         kb_dead_letter_fn fn, void *opaque);
    int  (*dead_letter_replay)(kb_transport *t, const char *topic, const char *id);
    /* Optional: called on the executor just before the handler; 0 means this
     * process no longer owns the delivery (lease lost), so it is released
     * unhandled instead. Must be cheap: it runs once per event. */
    int  (*still_owned)(kb_transport *t, const kb_delivery *d);
    /* Stop consuming: no kb_sink_deliver after it returns. Acks still flow. */
    void (*stop)(kb_transport *t);
    /* Send what is buffered (acks included), disconnect, free everything.
     * KB_OK, or an error (its text through kb_last_error) when events that
     * publish accepted could not be sent; kb_close then returns it. */
    int  (*close)(kb_transport *t);
} kb_transport_ops;

/* Make a transport available by its scheme (built-ins are registered already).
 * `ops` must outlive the process's use of keybus. KB_EINVAL on a bad table or a
 * scheme already taken. Thread: any. */
KB_EXPORT int kb_transport_register(const kb_transport_ops *ops);

/* Copy the delivery (key, payload, id; the cookie travels as is) into the
 * topic's pool. Waits while the lane is full: up to timeout_ms (< 0: until space
 * or close) — a broker loop passes -1 and so stops reading while lanes are full.
 * KB_EFULL, KB_ECLOSED (the delivery stays the transport's), KB_ENOMEM. */
KB_EXPORT int kb_sink_deliver(kb_sink *s, const kb_delivery *d, int timeout_ms);

/* Sink subscribed to `topic` in this bus, or NULL. Only valid while the caller
 * is inside kb_publish or holds the sink already (mem:// uses this). */
KB_EXPORT kb_sink *kb_bus_sink(kb_bus *b, const char *topic);

/* Report through the bus's log callback (printf format). Thread: any. */
KB_EXPORT void kb_log(kb_bus *b, kb_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Typed configuration reads for transports; the key must exist in a property
 * table (unknown keys read as 0 / ""). Thread: any (the conf is read-only). */
KB_EXPORT int64_t     kb_conf_int(const kb_conf *c, const char *key);
KB_EXPORT const char *kb_conf_str(const kb_conf *c, const char *key);

#ifdef __cplusplus
}
#endif

#endif /* KEYBUS_TRANSPORT_H */
