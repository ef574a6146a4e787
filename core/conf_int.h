/* The configuration property tables: one row per key drives validation,
 * defaults, KEYBUS_* environment overrides and docs/CONFIGURATION.md. */
#ifndef KB_CORE_CONF_INT_H
#define KB_CORE_CONF_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <keybus/keybus.h>

#include <keybus/transport.h>

/* Tables end with a row whose name is NULL. */
extern const kb_conf_prop kb__core_props[];

/* The core's keys as the bus uses them, resolved once at kb_open. Strings
 * point into the conf, which the bus owns. */
typedef struct kb_core_conf {
    bool conf_env;
    const char *transport;
    int64_t pool_workers, pool_threads, pool_queue_capacity, pool_enqueue_timeout_ms;
    const char *pool_idle;
    int64_t retry_max_attempts, retry_backoff_ms, retry_max_backoff_ms;
    const char *retry_scope;
    int64_t max_key_bytes, max_payload_bytes, max_headers, max_header_bytes;
    int64_t partitions;
    const char *group, *consumer, *runs_dir;
    bool metrics_enabled;
    const char *metrics_listen;
    int64_t metrics_max_connections;
    int64_t metrics_max_per_client;
    int64_t metrics_min_interval_ms;
    int64_t stats_interval_ms;
} kb_core_conf;

/* How a kb_core_conf member is read: from its C type. */
typedef enum { KB_FIELD_INT, KB_FIELD_BOOL, KB_FIELD_TEXT } kb_field_kind;
typedef struct kb_conf_field {
    const char *key;
    size_t offset;               /* in kb_core_conf */
    kb_field_kind kind;
} kb_conf_field;
#define KB_CONF_FIELD(key, member)                                                   \
    {key, offsetof(kb_core_conf, member),                                            \
     _Generic(((kb_core_conf *)0)->member, int64_t: KB_FIELD_INT, bool: KB_FIELD_BOOL, \
              const char *: KB_FIELD_TEXT)}
/* Which key fills which member (conf_props.c); ends with a NULL key. */
extern const kb_conf_field kb__core_fields[];

/* Fill *out from c through the checked reads (kb_conf_int, kb_conf_bool,
 * kb_conf_str), so a key bound to a member of the wrong type fails at the
 * first kb_open of a debug build. */
void kb__conf_core(const kb_conf *c, kb_core_conf *out);

/* Add the keys of transports registered since the conf was made (kb_open
 * calls it first, so a transport registered later still gets its defaults). */
int kb__conf_sync(kb_conf *c, char *errstr, size_t errlen);


/* A bus takes the conf in kb_open: false when another bus has it already.
 * While taken, kb_conf_set refuses changes and kb_conf_destroy leaves it to
 * kb_close, which calls kb__conf_free. */
bool kb__conf_take(kb_conf *c);
void kb__conf_give_back(kb_conf *c);   /* kb_open failed: the caller's again */
/* For each set `<key>_file` whose <key> is a secret: <key> from the file (at
 * kb_open, once). KB_EINVAL naming the file when it cannot be read, or when
 * <key> is set too. */
int kb__conf_secret_files(kb_conf *c, char *errstr, size_t errlen);

/* KB_EINVAL (errstr says why) when KEYBUS_TRANSPORT_PLUGINS is set: code is
 * never chosen by the environment, whatever conf.env says. */
int kb__conf_env_loads_no_code(char *errstr, size_t errlen);

/* kb_conf_apply_env for kb_open, on a conf it has taken. */
int kb__conf_env(kb_conf *c, char *errstr, size_t errlen);
void kb__conf_free(kb_conf *c);

/* Call report() for every KEYBUS_* environment variable that names no key,
 * with the nearest key's variable. */
void kb__conf_unknown_env(const kb_conf *c,
                          void (*report)(const char *name, const char *nearest, void *arg),
                          void *arg);

/* kb_conf_load of text in memory; `name` stands for the path in messages. */
int kb__conf_load_text(kb_conf *c, const char *name, const char *text, size_t len, char *errstr,
                       size_t errlen);

/* The delivery report and state callbacks (NULL: none). */
void kb__conf_delivery(const kb_conf *c, kb_delivery_fn *fn, void **opaque);
void kb__conf_state(const kb_conf *c, kb_state_fn *fn, void **opaque);

/* The log callback chosen for the bus. */
void kb__conf_log(const kb_conf *c, kb_log_fn *fn, void **opaque);
/* The stats feed callback (kb_conf_set_stats_cb). */
void kb__conf_stats_cb(const kb_conf *c, kb_stats_fn *fn, void **opaque);

#endif /* KB_CORE_CONF_INT_H */
