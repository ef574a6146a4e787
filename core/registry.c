/* Built-in transports (the build's list, registry.h), transports the
 * application registers at run time and plugins loaded by
 * `transport.plugins`. Each transport brings its own configuration keys
 * (kb_transport_ops.props). */
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf_value.h"
#include "registry.h"

#define MAX_REGISTERED 16
static const kb_transport_ops *registered[MAX_REGISTERED];   /* the bus's view */
static const kb_transport_ops *given[MAX_REGISTERED];        /* as registered */
/* Tables of an older ABI, copied up to their own end and zero-padded: the
 * bus reads the ops added since as NULL, never past the caller's table. */
static kb_transport_ops padded[MAX_REGISTERED];
static _Atomic size_t n_registered;     /* entries below it are immutable */
static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

/* How much of the table a version has: ABI 5 ended with close, whatever
 * ABI 6 added after it. */
static size_t table_size(int abi)
{
    return abi >= 6 ? sizeof(kb_transport_ops)
                    : offsetof(kb_transport_ops, close) + sizeof(((kb_transport_ops *)0)->close);
}

/* Schemes compare without case, as RFC 3986 says (kb_url_parse lowers them). */
static int scheme_is(const kb_transport_ops *ops, const char *scheme, size_t len)
{
    return strlen(ops->scheme) == len && strncasecmp(ops->scheme, scheme, len) == 0;
}

size_t kb__transport_count(void)
{
    return kb__builtin_transports_n + atomic_load_explicit(&n_registered, memory_order_acquire);
}

const kb_transport_ops *kb__transport_at(size_t i)
{
    size_t n = kb__builtin_transports_n;
    return i < n ? kb__builtin_transports[i] : registered[i - n];
}

const kb_transport_ops *kb__transport_find(const char *scheme, size_t len)
{
    size_t n = kb__transport_count();
    for (size_t i = 0; i < n; i++)
        if (scheme_is(kb__transport_at(i), scheme, len))
            return kb__transport_at(i);
    return NULL;
}

void kb__transport_schemes(char *buf, size_t len)
{
    size_t o = 0, n = kb__transport_count();
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < len; i++) {
        int w = snprintf(buf + o, len - o, "%s%s", o ? ", " : "", kb__transport_at(i)->scheme);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

/* NULL when the table is usable, else why not (into why[]). */
static const char *bad_table(const kb_transport_ops *ops, char *why, size_t whylen)
{
    if (ops == NULL)
        return "ops is NULL";
    if (ops->abi_version < KB_TRANSPORT_ABI_MIN || ops->abi_version > KB_TRANSPORT_ABI)
        return "abi_version is not between KB_TRANSPORT_ABI_MIN and KB_TRANSPORT_ABI";
    if (ops->scheme == NULL || ops->scheme[0] == '\0')
        return "no scheme";
    if (ops->open == NULL || ops->topic_open == NULL || ops->subscribe == NULL ||
        ops->dead_letter == NULL || ops->close == NULL)
        return "open, topic_open, subscribe, dead_letter and close are required";
    if (!(ops->flags & KB_TRANSPORT_F_LOCAL) &&
        (ops->publish == NULL || (ops->stop == NULL && ops->stop_by == NULL)))
        return "publish and stop (or stop_by) are required without KB_TRANSPORT_F_LOCAL";
    for (const kb_conf_prop *p = ops->props; p != NULL && p->name != NULL; p++) {
        size_t sl = strlen(ops->scheme);
        if (strncmp(p->name, ops->scheme, sl) != 0 || p->name[sl] != '.')
            return "a property is not named <scheme>.<key>";
        if (kb__conf_prop_check(p, why, whylen) != KB_OK)
            return why;
    }
    return NULL;
}

static int register_ops(const kb_transport_ops *ops, char *errstr, size_t errlen)
{
    char buf[512];
    kb_transport_ops view = {0};
    bool older = ops != NULL && ops->abi_version >= KB_TRANSPORT_ABI_MIN &&
                 ops->abi_version < KB_TRANSPORT_ABI;
    if (older)
        memcpy(&view, ops, table_size(ops->abi_version));
    const kb_transport_ops *full = older ? &view : ops;
    const char *why = bad_table(full, buf, sizeof buf);
    if (why != NULL) {
        kb_errf(errstr, errlen, "kb_transport_register: %s", why);
        return KB_EINVAL;
    }
    pthread_mutex_lock(&register_lock);
    int rc = KB_OK;
    size_t n = atomic_load_explicit(&n_registered, memory_order_relaxed);
    const kb_transport_ops *have = kb__transport_find(ops->scheme, strlen(ops->scheme));
    bool again = false;
    for (size_t i = 0; i < n && !again; i++)
        again = given[i] == ops;
    if (again) {
        /* the same plugin named again (another conf, or twice): already here */
    } else if (have != NULL) {
        kb_errf(errstr, errlen, "kb_transport_register: scheme \"%s\" is taken", ops->scheme);
        rc = KB_EINVAL;
    } else if (n == MAX_REGISTERED) {
        kb_errf(errstr, errlen, "kb_transport_register: more than %d transports",
                MAX_REGISTERED);
        rc = KB_EINVAL;
    } else {
        given[n] = ops;
        if (full == &view) {
            padded[n] = view;
            full = &padded[n];
        }
        registered[n] = full;
        atomic_store_explicit(&n_registered, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&register_lock);
    return rc;
}

int kb_transport_register(const kb_transport_ops *ops)
{
    return register_ops(ops, NULL, 0);
}

const kb_transport_ops *kb_transport_find(const char *scheme)
{
    return scheme != NULL ? kb__transport_find(scheme, strlen(scheme)) : NULL;
}

/* Why `st` (the file or directory `what`) may not be trusted with code,
 * or NULL: anyone else who can write it could replace what is loaded. */
static const char *untrusted(const struct stat *st, char *buf, size_t len)
{
    if (st->st_mode & S_IWOTH)
        return "is world-writable";
    if (st->st_mode & S_IWGRP)
        return "is group-writable";
    if (st->st_uid != 0 && st->st_uid != geteuid()) {
        snprintf(buf, len, "is owned by uid %u, neither root nor this process's user (%u)",
                 (unsigned)st->st_uid, (unsigned)geteuid());
        return buf;
    }
    return NULL;
}

/* The checks before dlopen runs any of the file's code: an absolute path to
 * a regular file which, like its directory, only root or this user can
 * write. The resolved path (symlinks followed) is the one checked and loaded. */
static int trusted_path(const char *path, char *real, char *errstr, size_t errlen)
{
    if (path[0] != '/') {
        kb_errf(errstr, errlen, "transport.plugins: \"%s\" is not an absolute path (a bare "
                "name would be searched for in LD_LIBRARY_PATH and the current directory)",
                path);
        return KB_EINVAL;
    }
    struct stat st;
    if (realpath(path, real) == NULL || stat(real, &st) != 0) {
        kb_errf(errstr, errlen, "transport.plugins: %s: %s", path, strerror(errno));
        return KB_EINVAL;
    }
    char why[128], dir[PATH_MAX];
    const char *bad = S_ISREG(st.st_mode) ? untrusted(&st, why, sizeof why)
                                           : "is not a regular file";
    if (bad != NULL) {
        kb_errf(errstr, errlen, "transport.plugins: %s %s; refused before loading it", real,
                bad);
        return KB_EINVAL;
    }
    snprintf(dir, sizeof dir, "%s", real);
    const char *d = dirname(dir);
    if (stat(d, &st) != 0) {
        kb_errf(errstr, errlen, "transport.plugins: %s: %s", d, strerror(errno));
        return KB_EINVAL;
    }
    if ((bad = untrusted(&st, why, sizeof why)) != NULL) {
        kb_errf(errstr, errlen, "transport.plugins: %s: its directory %s %s; refused before "
                "loading it", real, d, bad);
        return KB_EINVAL;
    }
    return KB_OK;
}

/* Load one plugin. The handle is never closed: the ops table and its code
 * must outlive every bus, as kb_transport_register requires. */
static int load_plugin(const char *named, char *errstr, size_t errlen)
{
    char path[PATH_MAX];
    int rc = trusted_path(named, path, errstr, errlen);
    if (rc != KB_OK)
        return rc;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        kb_errf(errstr, errlen, "transport.plugins: %s", dlerror());
        return KB_EINVAL;
    }
    kb_transport_plugin_fn *entry;
    *(void **)&entry = dlsym(h, KB_TRANSPORT_PLUGIN_ENTRY);
    if (entry == NULL) {
        kb_errf(errstr, errlen, "transport.plugins: %s exports no %s()", path,
                KB_TRANSPORT_PLUGIN_ENTRY);
        dlclose(h);
        return KB_EINVAL;
    }
    const kb_transport_ops *ops = entry();
    if (ops != NULL &&
        (ops->abi_version < KB_TRANSPORT_ABI_MIN || ops->abi_version > KB_TRANSPORT_ABI)) {
        kb_errf(errstr, errlen, "transport.plugins: %s was built for transport ABI %d, this "
                "keybus loads ABI %d to %d (rebuild it against these headers)", path,
                ops->abi_version, KB_TRANSPORT_ABI_MIN, KB_TRANSPORT_ABI);
        dlclose(h);
        return KB_EINVAL;
    }
    char why[768];
    if (register_ops(ops, why, sizeof why) != KB_OK) {
        kb_errf(errstr, errlen, "transport.plugins: %s: %s", path, why);
        dlclose(h);
        return KB_EINVAL;
    }
    return KB_OK;
}

int kb__transport_load_plugins(const char *list, char *errstr, size_t errlen)
{
    char path[4096];
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof path) {
            kb_errf(errstr, errlen, "transport.plugins: %s",
                    n == 0 ? "empty path in the list" : "path over 4095 bytes");
            return KB_EINVAL;
        }
        memcpy(path, p, n);
        path[n] = '\0';
        int rc = load_plugin(path, errstr, errlen);
        if (rc != KB_OK)
            return rc;
        p += n;
        if (*p == ',' && *++p == '\0') {
            kb_errf(errstr, errlen, "transport.plugins: empty path after the last ','");
            return KB_EINVAL;
        }
    }
    return KB_OK;
}
