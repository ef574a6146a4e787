/* The `transport` URL: redis://[user[:password]@]host[:port][/db] or
 * redis-sentinel://[user[:password]@]host[:port][,host[:port]...]/<master>,
 * parsed by kb_url_parse (userinfo percent-decoded, IPv6 in brackets, each
 * host of a list checked) and checked here when it is set, so a typo stops
 * kb_conf_set. Messages name the part, never the user or the password. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_int.h"

#define DB_MAX 100000   /* Redis's `databases` has no hard limit; this is plenty */

/* Strict decimal: digits only, no sign, no spaces; -1 when not. */
static long db_of(const char *path)
{
    if (path[0] == '\0' || strcmp(path, "/") == 0)
        return 0;
    long v = 0;
    size_t n = 1;
    for (; path[n] >= '0' && path[n] <= '9'; n++) {
        v = v * 10 + (path[n] - '0');
        if (v > DB_MAX)
            return -1;
    }
    return n > 1 && path[n] == '\0' ? v : -1;
}

#define SENTINEL_PORT 26379

/* One entry of a host list kb_url_parse checked: [v6]:port, host:port, host. */
static void addr_of(const char *e, size_t n, kb_redis_addr *out)
{
    const char *end = e + n, *colon;
    if (*e == '[') {
        const char *close = memchr(e, ']', n);
        snprintf(out->host, sizeof out->host, "%.*s", (int)(close - e - 1), e + 1);
        colon = close + 1 < end ? close + 1 : NULL;
    } else {
        colon = memchr(e, ':', n);
        snprintf(out->host, sizeof out->host, "%.*s", (int)((colon ? colon : end) - e), e);
    }
    out->port = colon != NULL ? (int)strtol(colon + 1, NULL, 10) : SENTINEL_PORT;
}

/* The Sentinels of u->host; -1 when there are more than `max`. */
static int sentinels_of(const kb_url *u, kb_redis_addr *out, size_t max)
{
    if (strchr(u->host, ',') == NULL) {
        snprintf(out[0].host, sizeof out[0].host, "%s", u->host);
        out[0].port = u->port != 0 ? u->port : SENTINEL_PORT;
        return 1;
    }
    size_t n = 0;
    for (const char *e = u->host; *e != '\0'; n++) {
        size_t len = strcspn(e, ",");
        if (n == max)
            return -1;
        addr_of(e, len, &out[n]);
        e += len + (e[len] == ',');
    }
    return (int)n;
}

/* "/<name>": letters, digits, '-', '.', '_'; the length, or 0 when not. */
static size_t master_of(const char *path)
{
    size_t n = strspn(path + (path[0] == '/'),
                      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._");
    return path[0] == '/' && n > 0 && n < KB_REDIS_MASTER_MAX && path[n + 1] == '\0' ? n : 0;
}

static int check_sentinel_url(const kb_url *u, char *errstr, size_t errlen)
{
    kb_redis_addr scratch[KB_REDIS_SENTINELS_MAX];
    if (u->host[0] == '\0') {
        kb_errf(errstr, errlen, "transport: redis-sentinel URL has no Sentinel host "
                "(redis-sentinel://host1:26379,host2:26379/<master-name>)");
        return KB_EINVAL;
    }
    if (sentinels_of(u, scratch, KB_REDIS_SENTINELS_MAX) < 0) {
        kb_errf(errstr, errlen, "transport: redis-sentinel URL lists more than %d Sentinels",
                KB_REDIS_SENTINELS_MAX);
        return KB_EINVAL;
    }
    if (u->query != NULL) {
        kb_errf(errstr, errlen, "transport: redis-sentinel URL takes no query ('?...'); encode "
                "'?' in a password as %%3F");
        return KB_EINVAL;
    }
    if (master_of(u->path) == 0) {
        kb_errf(errstr, errlen, "transport: redis-sentinel URL needs the master name as its "
                "path, 1..%d letters, digits, '-', '.' or '_' "
                "(redis-sentinel://host1:26379,host2:26379/<master-name>)", KB_REDIS_MASTER_MAX - 1);
        return KB_EINVAL;
    }
    return KB_OK;
}

void kb__redis_sentinel_url(const kb_url *u, kb_redis_addr *out, size_t *n, char *master)
{
    *n = (size_t)sentinels_of(u, out, KB_REDIS_SENTINELS_MAX);
    snprintf(master, KB_REDIS_MASTER_MAX, "%s", u->path + 1);
}

int kb__redis_check_url(const kb_url *u, char *errstr, size_t errlen)
{
    if (strcmp(u->scheme, "redis-sentinel") == 0)
        return check_sentinel_url(u, errstr, errlen);
    if (strcmp(u->scheme, "rediss") == 0) {
        kb_errf(errstr, errlen, "transport: rediss:// (TLS) is not supported: hiredis 0.14 has "
                "no TLS; use redis:// on a trusted network or a TLS tunnel");
        return KB_EINVAL;
    }
    if (u->host[0] == '\0') {
        kb_errf(errstr, errlen, "transport: redis URL has no host");
        return KB_EINVAL;
    }
    if (strchr(u->host, ',') != NULL) {
        kb_errf(errstr, errlen, "transport: redis:// takes one host; for a primary watched by "
                "Sentinels use redis-sentinel://host1:26379,host2:26379/<master-name>");
        return KB_EINVAL;
    }
    if (u->query != NULL) {
        kb_errf(errstr, errlen, "transport: redis URL takes no query ('?...'); encode '?' in a "
                "password as %%3F");
        return KB_EINVAL;
    }
    if (db_of(u->path) < 0) {
        kb_errf(errstr, errlen, "transport: redis URL path must be /N, a database number "
                "0..%d in decimal digits", DB_MAX);
        return KB_EINVAL;
    }
    return KB_OK;
}

int kb__redis_url_db(const kb_url *u)
{
    return (int)db_of(u->path);
}
