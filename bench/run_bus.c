/* keybus itself, only through the public API, so any transport that kb_open
 * knows (mem://, redis://, nats://) runs the same scenario. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/keybus.h>

#include "bench.h"

struct bus_ctx {
    kb_bus *bus;
    char topic[64];
};

static int handle(const kb_event *ev, void *opaque)
{
    (void)opaque;
    kb_collect_event(ev->payload, ev->payload_len);
    return KB_HANDLED;
}

static int publish(void *opaque, const void *key, size_t key_len, const void *payload, size_t len)
{
    struct bus_ctx *c = opaque;
    return kb_publish(c->bus, c->topic, key, key_len, payload, len);
}

/* The origin's consumers were running before it published: wait (up to 10 s)
 * until this process owns every broker partition, so the clock measures the
 * bus, not lease acquisition at start-up. */
static void wait_ready(kb_bus *bus, const char *topic)
{
    kb_topic_stats st;
    for (int i = 0; i < 1000; i++) {
        if (kb_stats(bus, topic, &st) != KB_OK || st.partitions_owned >= st.partitions)
            return;
        usleep(10000);
    }
    fprintf(stderr, "keybus-bench: %s: %u of %u partitions owned after 10 s; starting anyway\n",
            topic, st.partitions_owned, st.partitions);
}

/* The URL for the report, with any password replaced. */
static void redact(const char *url, char *out, size_t outlen)
{
    const char *scheme = strstr(url, "://");
    const char *at = scheme ? strchr(scheme + 3, '@') : NULL;
    const char *colon = at ? memchr(scheme + 3, ':', (size_t)(at - scheme - 3)) : NULL;
    if (colon == NULL)
        snprintf(out, outlen, "%s", url);
    else
        snprintf(out, outlen, "%.*s:***%s", (int)(colon - url), url, at);
}

static kb_conf *make_conf(const kb_bus_opts *o, kb_result *r)
{
    char err[256] = "", buf[160];
    kb_conf *c = kb_conf_new();
    if (c == NULL) {
        r->error = KB_ENOMEM;
        return NULL;
    }
    int rc = KB_OK;
    if (o->config)
        rc = kb_conf_load(c, o->config, err, sizeof err);
    if (rc == KB_OK && o->transport)
        rc = kb_conf_set(c, "transport", o->transport, err, sizeof err);
    if (rc == KB_OK && o->threads) {
        snprintf(buf, sizeof buf, "%u", o->threads);
        rc = kb_conf_set(c, "pool.threads", buf, err, sizeof err);
    }
    if (rc == KB_OK)   /* kb_open applies it too; done here to report the effective values */
        rc = kb_conf_apply_env(c, err, sizeof err);
    if (rc != KB_OK) {
        fprintf(stderr, "keybus-bench: configuration: %s\n", err);
        snprintf(r->transport, sizeof r->transport, "(config error)");
        kb_conf_destroy(c);
        r->error = rc;
        return NULL;
    }
    kb_conf_get(c, "transport", buf, sizeof buf);
    redact(buf, r->transport, sizeof r->transport);
    kb_conf_get(c, "pool.threads", buf, sizeof buf);
    r->threads = (uint32_t)strtoul(buf, NULL, 10);
    if (r->threads == 0)
        r->threads = (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
    return c;
}

void kb_run_bus(const kb_plan *p, const kb_bus_opts *o, kb_result *r)
{
    static unsigned run_no;
    char err[256] = "";
    kb_result_plan(r, p);
    kb_conf *conf = make_conf(o, r);
    if (conf == NULL)
        return;
    if (kb_collect_begin(p) != 0) {
        kb_conf_destroy(conf);
        r->error = KB_ENOMEM;
        return;
    }
    struct bus_ctx c = {.bus = kb_open(conf, err, sizeof err)};
    if (c.bus == NULL) {
        fprintf(stderr, "keybus-bench: kb_open: %s\n", err);
        kb_conf_destroy(conf);
        r->error = KB_ETRANSPORT;
        kb_collect_end(p, r);
        return;
    }
    /* A fresh topic per run: broker streams keep what earlier runs left. */
    snprintf(c.topic, sizeof c.topic, "kbbench.%s.%ld.%u", kb_scenario_name(p->scenario),
             (long)getpid(), run_no++);
    int rc = kb_subscribe(c.bus, c.topic, handle, NULL);
    if (rc != KB_OK) {
        fprintf(stderr, "keybus-bench: kb_subscribe: %s (%s)\n", kb_strerror(rc), kb_last_error());
        r->error = rc;
    } else {
        wait_ready(c.bus, c.topic);
        kb_drive(p, publish, &c, r);
    }
    rc = kb_close(c.bus, 10000);
    if (rc != KB_OK)
        fprintf(stderr, "keybus-bench: kb_close: %s\n", kb_strerror(rc));
    kb_collect_end(p, r);
}
