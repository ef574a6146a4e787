/* The `transport` URL: redis://[user[:password]@]host[:port][/db], parsed by
 * kb_url_parse (userinfo percent-decoded, IPv6 in brackets) and checked here
 * when it is set, so a typo stops kb_conf_set. Messages name the part, never
 * the user or the password. */
#include <stdio.h>
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

int kb__redis_check_url(const kb_url *u, char *errstr, size_t errlen)
{
    if (strcmp(u->scheme, "rediss") == 0) {
        kb_errf(errstr, errlen, "transport: rediss:// (TLS) is not supported: hiredis 0.14 has "
                "no TLS; use redis:// on a trusted network or a TLS tunnel");
        return KB_EINVAL;
    }
    if (u->host[0] == '\0') {
        kb_errf(errstr, errlen, "transport: redis URL has no host");
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
