/* keybus itself, only through the public API, so any transport that kb_open
 * knows (mem://, redis://, nats://) runs the same scenario. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keybus/keybus.h>
#include <keybus/pool.h>

#include "bench.h"

struct bus_ctx {
    kb_bus *bus;
    kb_topic *topic;
    char name[64];
};

static int handle(const kb_event *ev, void *opaque)
{
    (void)opaque;
    if (ev->attempt == 1 && kb_collect_fails(ev->payload, ev->payload_len)) {
        kb_collect_retried(ev->payload, ev->payload_len);
        return KB_RETRY;
    }
    kb_collect_event(ev->payload, ev->payload_len);
    return KB_HANDLED;
}

static int publish(void *opaque, const void *key, size_t key_len, const void *payload, size_t len)
{
    struct bus_ctx *c = opaque;
    return kb_publish_to(c->topic, key, key_len, payload, len);
}

static int publish_batch(void *opaque, const kb_msg *msgs, size_t n, size_t *accepted)
{
    struct bus_ctx *c = opaque;
    return kb_publish_batch(c->topic, msgs, n, accepted);
}

/* What the bus burns while nothing happens: process CPU over a quiet second
 * (only the bus's threads run; this one sleeps). */
static double idle_cpu_pct(void)
{
    double before = kb_cpu_seconds();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    nanosleep(&(struct timespec){1, 0}, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    return 100.0 * (kb_cpu_seconds() - before) / wall;
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
    if (rc == KB_OK && o->idle)
        rc = kb_conf_set(c, "pool.idle", o->idle, err, sizeof err);
    if (rc == KB_OK && o->retry_scope)
        rc = kb_conf_set(c, "retry.scope", o->retry_scope, err, sizeof err);
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
    kb_conf_get(c, "pool.idle", r->idle, sizeof r->idle);
    if (r->fail_rate > 0)
        kb_conf_get(c, "retry.scope", r->retry_scope, sizeof r->retry_scope);
    kb_conf_get(c, "pool.threads", buf, sizeof buf);
    r->threads = (uint32_t)strtoul(buf, NULL, 10);
    if (r->threads == 0)   /* only `block` changes the automatic count */
        r->threads = kb_pool_default_threads(strcmp(r->idle, "block") == 0 ? KB_IDLE_BLOCK
                                                                           : KB_IDLE_ADAPTIVE);
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
    snprintf(c.name, sizeof c.name, "kbbench.%s.%ld.%u", kb_scenario_name(p->scenario),
             (long)getpid(), run_no++);
    int rc = kb_subscribe(c.bus, c.name, handle, NULL);
    if (rc == KB_OK && (c.topic = kb_topic_get(c.bus, c.name, err, sizeof err)) == NULL)
        rc = KB_ENOMEM;
    if (rc != KB_OK) {
        fprintf(stderr, "keybus-bench: kb_subscribe: %s (%s)\n", kb_strerror(rc), kb_last_error());
        r->error = rc;
    } else {
        wait_ready(c.bus, c.name);
        kb_drive(p, publish, publish_batch, &c, r);
        if (o->idle_cpu)
            r->idle_cpu_pct = idle_cpu_pct();
    }
    rc = kb_close(c.bus, 10000);
    if (rc != KB_OK)
        fprintf(stderr, "keybus-bench: kb_close: %s\n", kb_strerror(rc));
    kb_collect_end(p, r);
}
