/* Built-in transports and their configuration tables, plus transports the
 * application registers at run time. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "../core/conf_int.h"
#include "../core/registry.h"

extern const kb_transport_ops kb__mem_ops;
extern const kb_prop kb__mem_props[];
#ifdef KB_WITH_REDIS
extern const kb_transport_ops kb__redis_ops;
extern const kb_transport_ops kb__rediss_ops;   /* refuses: no TLS in hiredis 0.14 */
extern const kb_prop kb__redis_props[];
#endif
#ifdef KB_WITH_NATS
extern const kb_transport_ops kb__nats_ops;
extern const kb_prop kb__nats_props[];
#endif

const kb_prop *const kb__prop_tables[] = {
    kb__core_props,
    kb__mem_props,
#ifdef KB_WITH_REDIS
    kb__redis_props,
#endif
#ifdef KB_WITH_NATS
    kb__nats_props,
#endif
    NULL,
};

static const kb_transport_ops *const builtin[] = {
    &kb__mem_ops,
#ifdef KB_WITH_REDIS
    &kb__redis_ops,
    &kb__rediss_ops,
#endif
#ifdef KB_WITH_NATS
    &kb__nats_ops,
#endif
};
#define N_BUILTIN (sizeof builtin / sizeof builtin[0])

#define MAX_REGISTERED 16
static const kb_transport_ops *registered[MAX_REGISTERED];
static _Atomic size_t n_registered;     /* entries below it are immutable */
static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

static int scheme_is(const kb_transport_ops *ops, const char *scheme, size_t len)
{
    return strlen(ops->scheme) == len && memcmp(ops->scheme, scheme, len) == 0;
}

const kb_transport_ops *kb__transport_find(const char *scheme, size_t len)
{
    for (size_t i = 0; i < N_BUILTIN; i++)
        if (scheme_is(builtin[i], scheme, len))
            return builtin[i];
    size_t n = atomic_load_explicit(&n_registered, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (scheme_is(registered[i], scheme, len))
            return registered[i];
    return NULL;
}

void kb__transport_schemes(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    size_t n = atomic_load_explicit(&n_registered, memory_order_acquire);
    for (size_t i = 0; i < N_BUILTIN + n && o < len; i++) {
        const kb_transport_ops *ops = i < N_BUILTIN ? builtin[i] : registered[i - N_BUILTIN];
        int w = snprintf(buf + o, len - o, "%s%s", o ? ", " : "", ops->scheme);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

int kb_transport_register(const kb_transport_ops *ops)
{
    if (ops == NULL || ops->abi_version != KB_TRANSPORT_ABI || ops->scheme == NULL ||
        ops->scheme[0] == '\0' || ops->open == NULL ||
        (ops->publish == NULL && !(ops->flags & KB_TRANSPORT_F_LOCAL)) ||
        ops->subscribe == NULL || ops->dead_letter == NULL ||
        ops->close == NULL)
        return KB_EINVAL;
    pthread_mutex_lock(&register_lock);
    int rc = KB_OK;
    size_t n = atomic_load_explicit(&n_registered, memory_order_relaxed);
    if (kb__transport_find(ops->scheme, strlen(ops->scheme)) != NULL || n == MAX_REGISTERED)
        rc = KB_EINVAL;
    else {
        registered[n] = ops;
        atomic_store_explicit(&n_registered, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&register_lock);
    return rc;
}
