/* mem://, the embedded default: the bus enqueues publishes straight into the
 * topic's pool in this process (KB_TRANSPORT_F_LOCAL), so this file only opens,
 * and sends dead letters to "<topic>.dlq" when something subscribed it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/bus_int.h"
#include "../../core/err.h"

struct kb_transport {
    kb_bus *bus;
    int enqueue_timeout_ms;
};

static int mem_open(kb_transport **out, kb_bus *bus, const kb_conf *c, char *errstr, size_t errlen)
{
    const char *url = kb_conf_str(c, "transport");
    if (strcmp(url, "mem://") != 0) {
        kb__errf(errstr, errlen, "transport: mem:// takes no host or options, got \"%s\"", url);
        return KB_EINVAL;
    }
    kb_transport *t = calloc(1, sizeof *t);
    if (t == NULL) {
        kb__errf(errstr, errlen, "mem: out of memory");
        return KB_ENOMEM;
    }
    t->bus = bus;
    t->enqueue_timeout_ms = (int)kb_conf_int(c, "pool.enqueue_timeout_ms");
    *out = t;
    return KB_OK;
}

static int mem_subscribe(kb_transport *t, const char *topic, kb_sink *sink)
{
    (void)t, (void)topic, (void)sink;   /* the bus registry is the routing table */
    return KB_OK;
}

static int mem_dead_letter(kb_transport *t, const kb_delivery *d, const char *reason)
{
    char dlq[256];
    snprintf(dlq, sizeof dlq, "%s.dlq", d->topic);
    struct kb_topic *sink = (struct kb_topic *)kb_bus_sink(t->bus, dlq);
    if (sink == NULL) {
        kb__errf(NULL, 0, "no subscriber for \"%s\"", dlq);
        return KB_ENOTFOUND;
    }
    (void)reason;
    kb_delivery copy = *d;
    copy.attempt = 1;
    copy.cookie = NULL;
    /* An executor must not wait on another lane (it may be its own): try once. */
    int rc = kb__sink_put(sink, &copy, kb_fnv1a32(d->key, d->key_len), 0);
    if (rc != KB_OK)
        kb__errf(NULL, 0, "\"%s\" refused it: %s", dlq, kb_strerror(rc));
    return rc;
}

static int mem_stats(kb_transport *t, const char *topic, kb_topic_stats *out)
{
    (void)t, (void)topic;
    out->published = out->received;   /* a publish is an enqueue */
    return out->lanes ? KB_OK : KB_ENOTFOUND;
}

static int mem_close(kb_transport *t)
{
    free(t);
    return KB_OK;
}

const kb_transport_ops kb__mem_ops = {
    .abi_version = KB_TRANSPORT_ABI,
    .scheme = "mem",
    .flags = KB_TRANSPORT_F_LOCAL,   /* the bus enqueues publishes itself */
    .open = mem_open,
    .subscribe = mem_subscribe,
    .dead_letter = mem_dead_letter,
    .stats = mem_stats,
    .close = mem_close,
};
