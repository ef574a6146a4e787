/* The configuration property tables: one row per key drives validation,
 * defaults, KEYBUS_* environment overrides and docs/CONFIGURATION.md. */
#ifndef KB_CORE_CONF_INT_H
#define KB_CORE_CONF_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <keybus/keybus.h>

#include <keybus/transport.h>

/* Tables end with a row whose name is NULL. */
extern const kb_conf_prop kb__core_props[];

/* Add the keys of transports registered since the conf was made (kb_open
 * calls it first, so a transport registered later still gets its defaults). */
int kb__conf_sync(kb_conf *c, char *errstr, size_t errlen);

/* A transport's property row is usable: type, default, range, choices, and
 * the default passes the row's own rule. KB_EINVAL with why. */
int kb__conf_prop_check(const kb_conf_prop *p, char *why, size_t whylen);

/* Write the Markdown reference of every key. */
void kb__conf_write_markdown(FILE *out);

/* A bus takes the conf in kb_open: false when another bus has it already.
 * While taken, kb_conf_set refuses changes and kb_conf_destroy leaves it to
 * kb_close, which calls kb__conf_free. */
bool kb__conf_take(kb_conf *c);
void kb__conf_give_back(kb_conf *c);   /* kb_open failed: the caller's again */
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

/* Call fn for every key with its value as kb_conf_get shows it (secrets
 * masked), in table order. */
void kb__conf_each(const kb_conf *c, void (*fn)(const char *key, const char *value, void *arg),
                   void *arg);

/* The log callback chosen for the bus. */
void kb__conf_log(const kb_conf *c, kb_log_fn *fn, void **opaque);
/* The stats feed callback (kb_conf_set_stats_cb). */
void kb__conf_stats_cb(const kb_conf *c, kb_stats_fn *fn, void **opaque);

#endif /* KB_CORE_CONF_INT_H */
