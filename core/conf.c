/* kb_conf: values checked against the property tables on every set. */
#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keybus/transport.h>

#include "conf_int.h"
#include "conf_value.h"
#include "base/err.h"
#include "ini.h"
#include "registry.h"

/* Where a value came from; a later store from a lower source is ignored:
 * defaults < INI file < KEYBUS_* environment < code (kb_conf_set, -X). */
enum source { FROM_DEFAULT, FROM_FILE, FROM_ENV, FROM_CODE };

/* Unknown keys are quoted in messages only when they look like a key. */
#define KEY_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
#define KEY_SHOWN_MAX 128

struct conf_entry {
    const kb_conf_prop *prop;
    char *value;
    int64_t number;            /* parsed value of INT keys, 1 or 0 for BOOL keys */
    enum source source;
};

struct kb_conf {
    size_t n, cap;
    struct conf_entry *e;
    size_t transports_seen;    /* kb__transport_count() when their keys were added */
    _Atomic bool taken;        /* owned by an open bus */
    kb_log_fn log;
    void *log_opaque;
    kb_delivery_fn delivery;
    void *delivery_opaque;
    kb_state_fn state;
    void *state_opaque;
    kb_stats_fn stats_cb;
    void *stats_opaque;
};

static struct conf_entry *find(const kb_conf *c, const char *key)
{
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->e[i].prop->name, key) == 0)
            return &c->e[i];
    return NULL;
}

/* A URL value that passed kb__conf_value_check: its scheme names a transport
 * known now, whose own URL rules (check_url) it passes. */
static int check_scheme(const kb_conf_prop *p, const char *value, char *errstr, size_t errlen)
{
    char why[256];
    kb_url *u = kb_url_parse(value, why, sizeof why);
    if (u == NULL) {
        kb_errf(errstr, errlen, "%s: %s", p->name, why);
        return KB_ENOMEM;   /* the syntax was checked already */
    }
    const kb_transport_ops *ops = kb__transport_find(u->scheme, strlen(u->scheme));
    int rc = KB_OK;
    if (ops == NULL) {
        char known[128];
        kb__transport_schemes(known, sizeof known);
        kb_errf(errstr, errlen, "%s: unknown URL scheme \"%.31s\" (known: %s)", p->name,
                u->scheme, known);
        rc = KB_ENOTFOUND;
    } else if (ops->check_url != NULL && (rc = ops->check_url(u, why, sizeof why)) != KB_OK) {
        kb_errf(errstr, errlen, "%s", why);
    }
    kb_url_free(u);
    return rc;
}

/* Validate, then keep the value unless a higher source set the key already. */
static int store(struct conf_entry *e, const char *value, enum source source, char *errstr,
                 size_t errlen)
{
    int64_t number = 0;
    int rc = kb__conf_value_check(e->prop, value, &number, errstr, errlen);
    if (rc == KB_OK && e->prop->type == KB_CONF_URL)
        rc = check_scheme(e->prop, value, errstr, errlen);
    if (rc != KB_OK || source < e->source)
        return rc;
    char *copy = strdup(value);
    if (copy == NULL) {
        kb_errf(errstr, errlen, "%s: out of memory", e->prop->name);
        return KB_ENOMEM;
    }
    free(e->value);
    e->value = copy;
    e->number = number;
    e->source = source;
    return KB_OK;
}

static int sync_props(kb_conf *c, char *errstr, size_t errlen);

/* store() for entry i of c. `transport.plugins` loads its plugins at once
 * (their keys and schemes are then known to the keys set after it), and only
 * when this value wins over the stored one's source; a list that fails to
 * load is not kept. */
static int store_in(kb_conf *c, size_t i, const char *value, enum source source, char *errstr,
                    size_t errlen)
{
    struct conf_entry *e = &c->e[i];
    if (strcmp(e->prop->name, "transport.plugins") != 0 || source < e->source ||
        value[0] == '\0')
        return store(e, value, source, errstr, errlen);
    int64_t unused;
    int rc = kb__conf_value_check(e->prop, value, &unused, errstr, errlen);
    if (rc == KB_OK)
        rc = kb__transport_load_plugins(value, errstr, errlen);
    if (rc == KB_OK)
        rc = store(&c->e[i], value, source, errstr, errlen);
    if (rc == KB_OK)
        rc = sync_props(c, errstr, errlen);
    return rc;
}

static void default_consumer(char *buf, size_t len)
{
    char host[64] = "host";
    if (gethostname(host, sizeof host) != 0)
        strcpy(host, "host");
    host[sizeof host - 1] = '\0';
    for (char *h = host; *h; h++)
        if (isspace((unsigned char)*h))
            *h = '-';
    snprintf(buf, len, "%s-%ld", host, (long)getpid());
}

static int conf_store(kb_conf *c, const char *key, const char *value, enum source source,
                      char *errstr, size_t errlen);

/* Add the keys of `table` this conf lacks, holding their defaults (checked
 * when the transport was registered, kb__conf_prop_check). */
static int add_table(kb_conf *c, const kb_conf_prop *table, char *errstr, size_t errlen)
{
    for (const kb_conf_prop *p = table; p != NULL && p->name != NULL; p++) {
        if (find(c, p->name) != NULL)
            continue;   /* redis:// and rediss:// share a table */
        if (kb_vec_reserve((void **)&c->e, &c->cap, c->n + 1, sizeof *c->e) != KB_OK) {
            kb_errf(errstr, errlen, "%s: out of memory", p->name);
            return KB_ENOMEM;
        }
        struct conf_entry *e = &c->e[c->n];
        memset(e, 0, sizeof *e);
        char consumer[128];
        const char *def = p->def;
        if (def == NULL) {
            default_consumer(consumer, sizeof consumer);
            def = consumer;
        }
        e->prop = p;
        int rc = store(e, def, FROM_DEFAULT, errstr, errlen);
        if (rc != KB_OK)
            return rc;
        c->n++;
    }
    return KB_OK;
}

/* Bring in the keys of transports registered since the last call. */
static int sync_props(kb_conf *c, char *errstr, size_t errlen)
{
    size_t n = kb__transport_count();
    for (; c->transports_seen < n; c->transports_seen++) {
        int rc = add_table(c, kb__transport_at(c->transports_seen)->props, errstr, errlen);
        if (rc != KB_OK)
            return rc;
    }
    return KB_OK;
}

int kb__conf_sync(kb_conf *c, char *errstr, size_t errlen)
{
    return sync_props(c, errstr, errlen);
}

kb_conf *kb_conf_new(void)
{
    kb_conf *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    if (add_table(c, kb__core_props, NULL, 0) != KB_OK || sync_props(c, NULL, 0) != KB_OK) {
        kb__conf_free(c);
        return NULL;
    }
    return c;
}

int kb_conf_set(kb_conf *c, const char *key, const char *value, char *errstr, size_t errlen)
{
    return conf_store(c, key, value, FROM_CODE, errstr, errlen);
}

static int conf_store(kb_conf *c, const char *key, const char *value, enum source source,
                      char *errstr, size_t errlen)
{
    if (c == NULL || key == NULL || value == NULL) {
        kb_errf(errstr, errlen, "kb_conf_set: %s is NULL",
                 c == NULL ? "conf" : key == NULL ? "key" : "value");
        return KB_EINVAL;
    }
    if (atomic_load_explicit(&c->taken, memory_order_acquire) && source != FROM_ENV) {
        kb_errf(errstr, errlen, "%s: this kb_conf belongs to an open bus and cannot change",
                 key);
        return KB_EINVAL;
    }
    struct conf_entry *e = find(c, key);
    if (e == NULL && sync_props(c, NULL, 0) == KB_OK)
        e = find(c, key);   /* a transport registered since kb_conf_new */
    if (e == NULL) {
        size_t len = strnlen(key, KEY_SHOWN_MAX + 1);
        if (len <= KEY_SHOWN_MAX && strspn(key, KEY_CHARS) == len)
            kb_errf(errstr, errlen, "unknown configuration key \"%s\"", key);
        else   /* "nats.token:hunter2" (':' for '='): the key may hold a value */
            kb_errf(errstr, errlen, "unknown configuration key (not shown: it has characters "
                    "no key has, or is over %d bytes; a typo for '='?)", KEY_SHOWN_MAX);
        return KB_ENOTFOUND;
    }
    return store_in(c, (size_t)(e - c->e), value, source, errstr, errlen);
}

/* Secret-bearing keys: declared KB_CONF_SECRET, or named like one (a
 * transport may declare its token as TEXT). */
static bool is_secret(const kb_conf_prop *p)
{
    if (p->type == KB_CONF_SECRET)
        return true;
    const char *dot = strrchr(p->name, '.');
    const char *last = dot != NULL ? dot + 1 : p->name;
    return strstr(last, "token") != NULL || strstr(last, "password") != NULL ||
           strstr(last, "secret") != NULL;
}

/* The value as kb_conf_get and the CLI show it: secrets as "***", URLs
 * without their userinfo. */
static const char *shown_value(const struct conf_entry *e, char *buf, size_t buflen)
{
    if (is_secret(e->prop))
        return e->value[0] != '\0' ? "***" : "";
    if (e->prop->type == KB_CONF_URL)
        return kb_url_redact(e->value, buf, buflen);
    return e->value;
}

int kb_conf_get(const kb_conf *c, const char *key, char *buf, size_t buflen)
{
    if (c == NULL || key == NULL || buf == NULL || buflen == 0)
        return KB_EINVAL;
    const struct conf_entry *e = find(c, key);
    if (e == NULL)
        return KB_ENOTFOUND;
    const char *v = shown_value(e, buf, buflen);
    if (v != buf)
        snprintf(buf, buflen, "%s", v);
    return KB_OK;
}

void kb_conf_each(const kb_conf *c, kb_conf_each_fn fn, void *arg)
{
    char buf[4200];
    for (size_t i = 0; i < c->n; i++)
        fn(c->e[i].prop->name, shown_value(&c->e[i], buf, sizeof buf), arg);
}

static const char *type_name(kb_conf_type t)
{
    switch (t) {
    case KB_CONF_INT: return "integer";
    case KB_CONF_URL: return "URL";
    case KB_CONF_TEXT: return "text";
    case KB_CONF_SECRET: return "secret";
    case KB_CONF_ENUM: return "one of";
    case KB_CONF_BOOL: return "boolean";
    case KB_CONF_STR: break;
    }
    return "name";
}

/* A read through the wrong function or of a key nobody declares: a bug in
 * the caller, which must not pass for a value of 0 or "". */
static void misread(const char *fn, const char *key, const struct conf_entry *e)
{
    char msg[300];
    if (e == NULL)
        snprintf(msg, sizeof msg, "%s(\"%.128s\"): no such configuration key", fn,
                 key != NULL ? key : "(null)");
    else
        snprintf(msg, sizeof msg, "%s(\"%s\"): the key is of type %s", fn, e->prop->name,
                 e->prop->type == KB_CONF_ENUM ? "enumeration" : type_name(e->prop->type));
#ifndef NDEBUG
    fprintf(stderr, "keybus: %s\n", msg);
    abort();
#else
    kb_log(NULL, KB_LOG_ERROR, "%s", msg);
    kb_errf(NULL, 0, "%s", msg);
    kb__err_set_code(KB_EINVAL);
#endif
}

/* The entry of `key` when its type is in `types` (a mask of 1 << type). */
static const struct conf_entry *typed(const kb_conf *c, const char *key, unsigned types,
                                      const char *fn)
{
    const struct conf_entry *e = c != NULL && key != NULL ? find(c, key) : NULL;
    if (e != NULL && (types >> e->prop->type & 1u))
        return e;
    misread(fn, key, e);
    return NULL;
}

#define TEXT_TYPES (1u << KB_CONF_STR | 1u << KB_CONF_URL | 1u << KB_CONF_TEXT | \
                    1u << KB_CONF_ENUM | 1u << KB_CONF_SECRET)

int64_t kb_conf_int(const kb_conf *c, const char *key)
{
    const struct conf_entry *e = typed(c, key, 1u << KB_CONF_INT, "kb_conf_int");
    return e != NULL ? e->number : 0;
}

bool kb_conf_bool(const kb_conf *c, const char *key)
{
    const struct conf_entry *e = typed(c, key, 1u << KB_CONF_BOOL, "kb_conf_bool");
    return e != NULL && e->number != 0;
}

const char *kb_conf_str(const kb_conf *c, const char *key)
{
    const struct conf_entry *e = typed(c, key, TEXT_TYPES, "kb_conf_str");
    return e != NULL ? e->value : "";
}

void kb__conf_core(const kb_conf *c, kb_core_conf *out)
{
    for (const kb_conf_field *f = kb__core_fields; f->key != NULL; f++) {
        char *at = (char *)out + f->offset;
        switch (f->kind) {
        case KB_FIELD_INT: *(int64_t *)(void *)at = kb_conf_int(c, f->key); break;
        case KB_FIELD_BOOL: *(bool *)(void *)at = kb_conf_bool(c, f->key); break;
        case KB_FIELD_TEXT: *(const char **)(void *)at = kb_conf_str(c, f->key); break;
        }
    }
}

static int on_ini_pair(void *arg, const char *key, const char *value, char *why, size_t whylen)
{
    return conf_store(arg, key, value, FROM_FILE, why, whylen);
}

int kb__conf_load_text(kb_conf *c, const char *name, const char *text, size_t len, char *errstr,
                       size_t errlen)
{
    return kb__ini_parse(name, text, len, on_ini_pair, c, errstr, errlen);
}

int kb_conf_load(kb_conf *c, const char *path, char *errstr, size_t errlen)
{
    if (c == NULL || path == NULL) {
        kb_errf(errstr, errlen, "kb_conf_load: %s is NULL", c == NULL ? "conf" : "path");
        return KB_EINVAL;
    }
    return kb__ini_parse_file(path, on_ini_pair, c, errstr, errlen);
}

static void env_name(const char *key, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "KEYBUS_");
    for (const char *k = key; *k && o + 1 < len; k++)
        buf[o++] = *k == '.' ? '_' : (char)toupper((unsigned char)*k);
    buf[o] = '\0';
}

/* The content of a secret's file: at most `max` bytes, one final newline
 * dropped. KB_OK, or KB_EINVAL with errstr naming the file. */
static int read_secret_file(const char *key, const char *path, int64_t max, char **out,
                            char *errstr, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        kb_errf(errstr, errlen, "%s: cannot read %s: %s", key, path, strerror(errno));
        return KB_EINVAL;
    }
    char *buf = calloc(1, (size_t)max + 3);
    size_t n = buf != NULL ? fread(buf, 1, (size_t)max + 2, f) : 0;
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (buf == NULL) {
        kb_errf(errstr, errlen, "%s: out of memory", key);
        return KB_ENOMEM;
    }
    if (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';
    if (n > 0 && buf[n - 1] == '\r')
        buf[--n] = '\0';
    const char *why = err != 0 ? strerror(err) : n == 0 ? "the file is empty"
                      : (int64_t)n > max ? "the file is over the key's limit"
                      : strlen(buf) != n ? "the file holds a NUL byte" : NULL;
    if (why != NULL) {
        kb_errf(errstr, errlen, "%s: cannot read %s: %s", key, path, why);
        explicit_bzero(buf, (size_t)max + 3);
        free(buf);
        return KB_EINVAL;
    }
    *out = buf;
    return KB_OK;
}

int kb__conf_secret_files(kb_conf *c, char *errstr, size_t errlen)
{
    for (size_t i = 0; i < c->n; i++) {
        const char *name = c->e[i].prop->name, *path = c->e[i].value;
        size_t len = strlen(name);
        if (len <= 5 || len >= 160 || strcmp(name + len - 5, "_file") != 0 || path[0] == '\0')
            continue;
        char base[160];
        snprintf(base, sizeof base, "%.*s", (int)(len - 5), name);
        struct conf_entry *s = find(c, base);
        if (s == NULL || s->prop->type != KB_CONF_SECRET)
            continue;   /* nats.creds_file: a file, not a secret's */
        if (s->value[0] != '\0') {
            kb_errf(errstr, errlen, "%s and %s are both set: set one", base, name);
            return KB_EINVAL;
        }
        char *secret = NULL;
        int rc = read_secret_file(name, path, s->prop->max, &secret, errstr, errlen);
        if (rc == KB_OK) {
            char why[256];
            rc = store(s, secret, FROM_CODE, why, sizeof why);
            if (rc != KB_OK)
                kb_errf(errstr, errlen, "%s: %s holds no valid value: %s", name, path, why);
            explicit_bzero(secret, strlen(secret));
            free(secret);
        }
        if (rc != KB_OK)
            return rc;
    }
    return KB_OK;
}

int kb__conf_env_loads_no_code(char *errstr, size_t errlen)
{
    if (secure_getenv("KEYBUS_TRANSPORT_PLUGINS") == NULL)
        return KB_OK;
    kb_errf(errstr, errlen, "environment KEYBUS_TRANSPORT_PLUGINS: refused: transport.plugins "
            "is taken from code and configuration files only, never from the environment "
            "(whoever can set a variable must not choose code to run; unset it)");
    return KB_EINVAL;
}

int kb__conf_env(kb_conf *c, char *errstr, size_t errlen)
{
    if (c == NULL) {
        kb_errf(errstr, errlen, "kb_conf_apply_env: conf is NULL");
        return KB_EINVAL;
    }
    int rc = kb__conf_env_loads_no_code(errstr, errlen);
    if (rc != KB_OK)
        return rc;
    for (size_t i = 0; i < c->n; i++) {
        char name[160];
        env_name(c->e[i].prop->name, name, sizeof name);
        const char *value = secure_getenv(name);
        if (value == NULL)
            continue;
        char why[256];
        rc = store_in(c, i, value, FROM_ENV, why, sizeof why);
        if (rc != KB_OK) {
            kb_errf(errstr, errlen, "environment %s: %s", name, why);
            return rc;
        }
    }
    return KB_OK;
}

int kb_conf_apply_env(kb_conf *c, char *errstr, size_t errlen)
{
    if (c != NULL && atomic_load_explicit(&c->taken, memory_order_acquire)) {
        kb_errf(errstr, errlen, "kb_conf_apply_env: this kb_conf belongs to an open bus and "
                 "cannot change");
        return KB_EINVAL;
    }
    return kb__conf_env(c, errstr, errlen);
}

/* Edit distance, for "did you mean": names are short. */
static size_t distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[160];
    if (lb >= sizeof row / sizeof row[0])
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

void kb__conf_unknown_env(const kb_conf *c, void (*report)(const char *name, const char *nearest,
                                                            void *arg), void *arg)
{
    extern char **environ;
    for (char **ev = environ; ev != NULL && *ev != NULL; ev++) {
        const char *eq = strchr(*ev, '=');
        if (strncmp(*ev, "KEYBUS_", 7) != 0 || eq == NULL || (size_t)(eq - *ev) >= 160)
            continue;
        char name[160], known[160], nearest[160] = "";
        snprintf(name, sizeof name, "%.*s", (int)(eq - *ev), *ev);
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < c->n && best != 0; i++) {
            env_name(c->e[i].prop->name, known, sizeof known);
            size_t d = distance(name, known);
            if (d < best) {
                best = d;
                snprintf(nearest, sizeof nearest, "%s", known);
            }
        }
        if (best != 0)
            report(name, nearest, arg);
    }
}

/* A callback of a conf an open bus owns stays as it is: its threads read
 * the pair (fn, opaque) unlocked. True when c may not change (kb_last_error
 * says so). */
static bool callback_refused(const kb_conf *c, const char *who)
{
    if (c == NULL)
        return true;
    if (!atomic_load_explicit(&c->taken, memory_order_acquire))
        return false;
    kb_errf(NULL, 0, "%s: this kb_conf belongs to an open bus and cannot change: ignored", who);
    return true;
}

void kb_conf_set_log(kb_conf *c, kb_log_fn fn, void *opaque)
{
    if (callback_refused(c, "kb_conf_set_log"))
        return;
    c->log = fn;
    c->log_opaque = opaque;
}

void kb__conf_log(const kb_conf *c, kb_log_fn *fn, void **opaque)
{
    *fn = c->log;
    *opaque = c->log_opaque;
}

void kb_conf_set_delivery_cb(kb_conf *c, kb_delivery_fn fn, void *opaque)
{
    if (callback_refused(c, "kb_conf_set_delivery_cb"))
        return;
    c->delivery = fn;
    c->delivery_opaque = opaque;
}

void kb_conf_set_state_cb(kb_conf *c, kb_state_fn fn, void *opaque)
{
    if (callback_refused(c, "kb_conf_set_state_cb"))
        return;
    c->state = fn;
    c->state_opaque = opaque;
}

void kb__conf_delivery(const kb_conf *c, kb_delivery_fn *fn, void **opaque)
{
    *fn = c->delivery;
    *opaque = c->delivery_opaque;
}

void kb__conf_state(const kb_conf *c, kb_state_fn *fn, void **opaque)
{
    *fn = c->state;
    *opaque = c->state_opaque;
}

void kb_conf_set_stats_cb(kb_conf *c, kb_stats_fn fn, void *opaque)
{
    if (callback_refused(c, "kb_conf_set_stats_cb"))
        return;
    c->stats_cb = fn;
    c->stats_opaque = opaque;
}

void kb__conf_stats_cb(const kb_conf *c, kb_stats_fn *fn, void **opaque)
{
    *fn = c->stats_cb;
    *opaque = c->stats_opaque;
}

kb_conf *kb_conf_dup(const kb_conf *c)
{
    if (c == NULL)
        return NULL;
    kb_conf *d = kb_conf_new();
    if (d == NULL)
        return NULL;
    for (size_t i = 0; i < c->n; i++) {
        struct conf_entry *e = find(d, c->e[i].prop->name);
        if (e == NULL || store(e, c->e[i].value, c->e[i].source, NULL, 0) != KB_OK) {
            kb_conf_destroy(d);
            return NULL;
        }
    }
    d->log = c->log;
    d->log_opaque = c->log_opaque;
    d->delivery = c->delivery;
    d->delivery_opaque = c->delivery_opaque;
    d->state = c->state;
    d->state_opaque = c->state_opaque;
    d->stats_cb = c->stats_cb;
    d->stats_opaque = c->stats_opaque;
    return d;
}

bool kb__conf_take(kb_conf *c)
{
    bool free_ = false;
    return atomic_compare_exchange_strong(&c->taken, &free_, true);
}

void kb__conf_give_back(kb_conf *c)
{
    atomic_store(&c->taken, false);
}

void kb_conf_destroy(kb_conf *c)
{
    if (c == NULL || atomic_load(&c->taken))
        return;   /* an open bus owns it: kb_close frees it */
    kb__conf_free(c);
}

void kb__conf_free(kb_conf *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->e[i].value);
    free(c->e);
    free(c);
}

void kb_conf_write_reference(FILE *out)
{
    fprintf(out, "# keybus configuration\n\n"
                 "Generated by `keybus conf-doc` from the property tables in `core/conf_props.c`\n"
                 "and each transport's `props` (`transports/*/`, plugins loaded with\n"
                 "`transport.plugins`); do not edit by hand (a test compares it).\n\n"
                 "Set keys with `kb_conf_set()`, in an INI file read by `kb_conf_load()`\n"
                 "(`[pool]` then `workers = 64` sets `pool.workers`), or with environment\n"
                 "variables `KEYBUS_<KEY>` (dots as underscores, upper case), which `kb_open()`\n"
                 "applies. When several set a key, the most specific wins, whatever the order of\n"
                 "the calls: defaults < INI file < `KEYBUS_*` environment < values set in code\n"
                 "(`kb_conf_set()`, the CLI's `-X`). `conf.env = false` turns the environment\n"
                 "off. Every `KEYBUS_*` value is validated even when code overrides it, and a\n"
                 "`KEYBUS_*` name that is no key is reported through the log callback with the\n"
                 "nearest key. Variables are read with `secure_getenv()`. The environment never\n"
                 "chooses code to load: `KEYBUS_TRANSPORT_PLUGINS` is refused (an error naming\n"
                 "the rule), even with `conf.env = false`.\n\n"
                 "Integers are strictly decimal: an optional `-` and digits, nothing else (no\n"
                 "blanks, `+`, hex or octal). Rules between keys (a minimum at most its\n"
                 "maximum, such as `retry.backoff_ms` <= `retry.max_backoff_ms`) are checked by\n"
                 "`kb_open()`, which names both keys. Booleans are `true` or `false` (`1` and\n"
                 "`0` are accepted too).\n\n"
                 "## INI files\n\n"
                 "`kb_conf_load()` (the CLI's `-c`) reads a regular file of at most 1 MiB (a\n"
                 "directory, device or pipe is an error) line by line, each line whole, up to\n"
                 "8448 bytes (the longest value, 4096 bytes, quoted and escaped, after its key;\n"
                 "a longer line is an error). `\\n` or `\\r\\n` ends a line; a UTF-8 byte order\n"
                 "mark at the start is skipped. Every line is one of:\n\n"
                 "- **blank**, or a **comment**: `#` or `;` as its first non-blank character.\n"
                 "  There are no inline comments: in an unquoted value, `#` or `;` after a blank\n"
                 "  is an error (`#` or `;` elsewhere in a value is part of it).\n"
                 "- a **section** `[name]`, alone on its line (`[pool] workers = 5` is an error);\n"
                 "  the keys below it get the prefix `name.`.\n"
                 "- a **pair** `key = value`. Keys are letters, digits, `_`, `.` and `-`; blanks\n"
                 "  around the key, the `=` and the value are ignored. A value starting with `\"`\n"
                 "  is quoted: it ends at the next unescaped `\"`, which must end the line; inside,\n"
                 "  `\\\"` is a quote and `\\\\` a backslash (any other `\\` is an error), and blanks\n"
                 "  are kept. Otherwise the value is the rest of the line, quotes included.\n\n"
                 "Indentation is ignored: an indented line is a line of its own, never the\n"
                 "continuation of the one before. Control characters other than tab are errors.\n"
                 "Anything else is an error naming the file and line (`path:3: ...`); loading\n"
                 "stops at the first error (keys on earlier lines stay set), and the message is\n"
                 "also in `kb_last_error()`. A key refused above a line that breaks the grammar\n"
                 "is reported as that line's error (an unclosed `[keybus` may be why the key\n"
                 "was taken for keybus's).\n\n"                 "### A file shared with the application\n\n"
                 "A service may keep its own settings in the same file. A file with at least\n"
                 "one `[keybus]` or `[keybus.NAME]` section is shared: keybus reads only those\n"
                 "sections — `[keybus]` holds the top-level keys (`transport`, `group`, ...),\n"
                 "`[keybus.pool]` the `pool.*` keys — and leaves every other section, and the\n"
                 "pairs above the first section, to the application (their lines must still\n"
                 "follow the grammar above). Inside keybus's sections every key is checked as\n"
                 "usual, so `[keybus.pool]` then `wrokers = 5` is still an unknown key. A file\n"
                 "without such a section is keybus's alone, every pair a keybus key. The\n"
                 "sections are spelled in lower case: `[KeyBus]` or `[KEYBUS.pool]` is an error\n"
                 "naming the section, never silently the application's. The CLI\n"
                 "reads a service's shared file the same way (`keybus -c service.ini stats T`).\n\n"
                 "```ini\n"
                 "[app]\n"
                 "events = 5\n"
                 "\n"
                 "[keybus]\n"
                 "transport = redis://127.0.0.1:6379\n"
                 "\n"
                 "[keybus.pool]\n"
                 "workers = 64\n"
                 "```\n\n"
                 "## Transport URLs\n\n"
                 "`scheme://[user[:password]@]host[:port][/path][?query]` per RFC 3986,\n"
                 "checked part by part by `kb_conf_set()` (messages name the part). The user\n"
                 "and password are percent-decoded: write `@` as `%%40`, `:` as `%%3A` (in the\n"
                 "user), `/` as `%%2F`, `#` as `%%23`, `?` as `%%3F` and `%%` as `%%25`. An IPv6\n"
                 "host goes in brackets (`redis://[::1]:6379`); host names are at most 255 bytes;\n"
                 "the port is decimal, 1..65535. Several servers (Redis Sentinels, NATS seed\n"
                 "servers) are a comma-separated list, `nats://h1:4222,h2:4222`, which may also\n"
                 "repeat the scheme before each server, as the NATS tools write it:\n"
                 "`nats://h1:4222,nats://h2:4222`.\n\n"
                 "## Secrets\n\n"
                 "Messages (errstr, `kb_last_error()`, the log callback, the CLI) never quote a\n"
                 "password, token or other secret: URLs are shown as `redis://***@host:6379`,\n"
                 "secret keys (type `secret`, or a name holding `token`, `password` or\n"
                 "`secret`) by name only, and a key that does not look like one (`-X\n"
                 "nats.token:x`, a typo for `=`) is not quoted. `kb_conf_get()` shows them the\n"
                 "same way (`***`, URLs without userinfo), as does `keybus conf`; transports\n"
                 "read the real values.\n\n"
                 "Each secret key `K` that holds the secret itself has a `K_file` twin\n"
                 "(`redis.password_file`, `nats.token_file`; `nats.creds_file` is a file\n"
                 "already): a file `kb_open()` reads once into `K` (at most `K`'s length; one\n"
                 "final newline dropped). An unreadable, empty or oversized file\n"
                 "fails `kb_open()` with `KB_EINVAL` naming the file and why, as does setting\n"
                 "both `K` and `K_file`. The log callback gets text from outside (broker keys\n"
                 "and errors) with every control byte and ill-formed UTF-8 byte as `\\xHH`.\n\n"
                 "## Keys\n\n"
                 "| key | type | default | range | environment | meaning |\n"
                 "|---|---|---|---|---|---|\n");
    size_t n = kb__transport_count();
    for (size_t i = 0; i <= n; i++) {
        const kb_conf_prop *t = i == 0 ? kb__core_props : kb__transport_at(i - 1)->props;
        if (i > 1 && t == kb__transport_at(i - 2)->props)
            continue;   /* redis:// and rediss:// share a table */
        for (const kb_conf_prop *p = t; p != NULL && p->name; p++) {
            char env[160], range[64];
            env_name(p->name, env + 1, sizeof env - 2);
            env[0] = '`';
            strcat(env, "`");
            if (strcmp(p->name, "transport.plugins") == 0)
                snprintf(env, sizeof env, "refused");
            if (p->type == KB_CONF_INT)
                snprintf(range, sizeof range, "%" PRId64 " .. %" PRId64, p->min, p->max);
            else if (p->type == KB_CONF_ENUM)
                snprintf(range, sizeof range, "%s", p->choices);
            else if (p->type == KB_CONF_BOOL)
                snprintf(range, sizeof range, "true, false (1, 0)");
            else
                snprintf(range, sizeof range, "up to %" PRId64 " bytes", p->max);
            fprintf(out, "| `%s` | %s | %s%s%s | %s | %s | %s |\n", p->name, type_name(p->type),
                    p->def ? "`" : "", p->def ? (p->def[0] ? p->def : "(empty)") : "computed",
                    p->def ? "`" : "", range, env, p->doc);
        }
    }
}
