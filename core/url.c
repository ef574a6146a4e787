/* Transport URLs (RFC 3986): scheme://[user[:password]@]host[:port][/path][?query],
 * where host[:port] may be a comma-separated list (Redis Sentinels, seed servers).
 * The one parser every transport uses, so every scheme follows the same rules:
 * userinfo percent-decoded, IPv6 in brackets, strictly decimal ports. Messages
 * name the part that is wrong and never quote the userinfo. */
#include <arpa/inet.h>
#include <ctype.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <keybus/transport.h>

#define URL_MAX 4096
#define HOST_MAX 255   /* a DNS name's limit */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* RFC 3986 character classes (ASCII only: other bytes must be encoded). */
static bool unreserved(unsigned char c)
{
    return isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

static bool sub_delim(unsigned char c)
{
    return c != '\0' && strchr("!$&'()*+,;=", c) != NULL;
}

/* Is [s, s+n) made of unreserved, sub-delims, `extra` and well-formed %XX? */
static bool all_of(const char *s, size_t n, const char *extra)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '%') {
            if (i + 2 >= n || hexval(s[i + 1]) < 0 || hexval(s[i + 2]) < 0)
                return false;
            i += 2;
        } else if (!unreserved(c) && !sub_delim(c) && (c == '\0' || strchr(extra, c) == NULL)) {
            return false;
        }
    }
    return true;
}

/* Percent-decode [s, s+n), which all_of() accepted, into a new string; NULL
 * when it decodes to a control character (out of memory sets *oom). */
static char *decode(const char *s, size_t n, int *oom)
{
    char *out = malloc(n + 1), *o = out;
    if (out == NULL) {
        *oom = 1;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '%') {
            c = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
            i += 2;
        }
        if ((unsigned char)c < 0x20 || c == 0x7f) {
            free(out);
            return NULL;
        }
        *o++ = c;
    }
    *o = '\0';
    return out;
}

static int scheme_char(unsigned char c, size_t i)
{
    return isalpha(c) || (i > 0 && (isdigit(c) || c == '+' || c == '-' || c == '.'));
}

static char *dup_n(const char *s, size_t n, int *oom)
{
    char *d = strndup(s, n);
    if (d == NULL)
        *oom = 1;
    return d;
}

void kb_url_free(kb_url *u)
{
    if (u == NULL)
        return;
    free(u->scheme);
    free(u->user);
    free(u->password);
    free(u->host);
    free(u->path);
    free(u->query);
    free(u);
}

static kb_url *fail(kb_url *u, int oom, char *errstr, size_t errlen, const char *why)
{
    kb_url_free(u);
    if (oom)
        kb_errf(errstr, errlen, "out of memory parsing a URL");
    else
        kb_errf(errstr, errlen, "%s", why);
    return NULL;
}

/* user[:password] in [a, at): checked, then decoded into u. */
static const char *parse_userinfo(kb_url *u, const char *a, const char *at, int *oom)
{
    const char *colon = memchr(a, ':', (size_t)(at - a));
    const char *uend = colon != NULL ? colon : at;
    if (!all_of(a, (size_t)(uend - a), ""))
        return "URL user name: '@', ':', '/', '?', '#', '%', blanks and non-ASCII bytes must be "
               "percent-encoded (%40 %3A %2F %3F %23 %25)";
    if (colon != NULL && !all_of(colon + 1, (size_t)(at - colon - 1), ":"))
        return "URL password: '@', '/', '?', '#', '%', blanks and non-ASCII bytes must be "
               "percent-encoded (%40 %2F %3F %23 %25)";
    if (uend > a && (u->user = decode(a, (size_t)(uend - a), oom)) == NULL)
        return "URL user name: decodes to a control character";
    if (colon != NULL && (u->password = decode(colon + 1, (size_t)(at - colon - 1), oom)) == NULL)
        return "URL password: decodes to a control character";
    return NULL;
}

/* host[:port] in [h, hend) into u. */
static const char *parse_host(kb_url *u, const char *h, const char *hend, int *oom)
{
    const char *port;
    if (*h == '[') {
        const char *close = memchr(h, ']', (size_t)(hend - h));
        if (close == NULL)
            return "URL host: '[' without ']' (IPv6 literal)";
        unsigned char addr[16];
        char lit[64];
        size_t n = (size_t)(close - h - 1);
        if (n == 0 || n >= sizeof lit)
            return "URL host: not an IPv6 address in brackets";
        memcpy(lit, h + 1, n);
        lit[n] = '\0';
        if (inet_pton(AF_INET6, lit, addr) != 1)
            return "URL host: not an IPv6 address in brackets";
        if (close + 1 < hend && close[1] != ':')
            return "URL host: text after ']' (expected :port)";
        if ((u->host = dup_n(lit, n, oom)) == NULL)
            return "";
        port = close + 1 < hend ? close + 2 : NULL;
    } else {
        const char *colon = memchr(h, ':', (size_t)(hend - h));
        const char *h_end = colon ? colon : hend;
        for (const char *p = h; p < h_end; p++)
            if (!unreserved((unsigned char)*p))
                return "URL host: only letters, digits, '-', '.', '_' and '~' (IPv6 goes in "
                       "brackets)";
        if (h_end - h > HOST_MAX)
            return "URL host: longer than 255 bytes";
        if ((u->host = dup_n(h, (size_t)(h_end - h), oom)) == NULL)
            return "";
        port = colon ? colon + 1 : NULL;
    }
    if (port == NULL)
        return NULL;
    size_t n = (size_t)(hend - port);
    long v = 0;
    for (size_t i = 0; i < n && v <= 65535; i++)
        v = isdigit((unsigned char)port[i]) ? v * 10 + (port[i] - '0') : LONG_MAX;
    if (n == 0 || v < 1 || v > 65535)
        return "URL port: not a decimal number in 1..65535";
    u->port = (int)v;
    return NULL;
}

/* host[:port] or a list "h1:p1,h2:p2" in [h, hend): a list is checked entry
 * by entry and kept as written in u->host (port 0); the transport splits it. */
static const char *parse_hosts(kb_url *u, const char *h, const char *hend, int *oom)
{
    if (memchr(h, ',', (size_t)(hend - h)) == NULL)
        return parse_host(u, h, hend, oom);
    for (const char *e = h; e <= hend;) {
        const char *comma = memchr(e, ',', (size_t)(hend - e));
        const char *eend = comma != NULL ? comma : hend;
        if (eend == e)
            return "URL host list: an empty entry (hosts are separated by single commas)";
        kb_url one = {0};
        const char *why = parse_host(&one, e, eend, oom);
        free(one.host);
        if (why != NULL)
            return why;
        e = eend + 1;
    }
    u->host = dup_n(h, (size_t)(hend - h), oom);
    return u->host == NULL ? "" : NULL;
}

/* `url` with the scheme written again before later entries of a host list
 * dropped ("nats://h1:1,nats://h2:2" -> "nats://h1:1,h2:2", the form the
 * NATS tools use), into buf (at least strlen(url) + 1 bytes); the authority
 * ends at the first '/', '?' or '#' not part of such a prefix. url itself
 * when it has no "://" or nothing to drop. */
static const char *drop_repeated_schemes(const char *url, char *buf)
{
    const char *sep = strstr(url, "://");
    if (sep == NULL)
        return url;
    size_t slen = (size_t)(sep - url), o = (size_t)(sep + 3 - url);
    const char *p = sep + 3;
    memcpy(buf, url, o);
    bool dropped = false;
    for (; *p != '\0' && strchr("/?#", *p) == NULL; p++) {
        buf[o++] = *p;
        if (*p == ',' && strncasecmp(p + 1, url, slen) == 0 &&
            strncmp(p + 1 + slen, "://", 3) == 0) {
            p += slen + 3;
            dropped = true;
        }
    }
    strcpy(buf + o, p);
    return dropped ? buf : url;
}

kb_url *kb_url_parse(const char *url, char *errstr, size_t errlen)
{
    int oom = 0;
    if (url == NULL)
        return fail(NULL, 0, errstr, errlen, "URL is NULL");
    size_t len = strnlen(url, URL_MAX + 1);
    if (len > URL_MAX)
        return fail(NULL, 0, errstr, errlen, "URL is over 4096 bytes");
    for (size_t i = 0; i < len; i++)
        if (isspace((unsigned char)url[i]) || iscntrl((unsigned char)url[i]))
            return fail(NULL, 0, errstr, errlen,
                        "URL has whitespace or a control character (percent-encode it)");
    char same[URL_MAX + 1];
    url = drop_repeated_schemes(url, same);
    const char *sep = strstr(url, "://");
    size_t slen = sep ? (size_t)(sep - url) : 0;
    for (size_t i = 0; i < slen; i++)
        if (!scheme_char((unsigned char)url[i], i))
            slen = 0;
    if (slen == 0)
        return fail(NULL, 0, errstr, errlen, "not a URL (expected scheme://...)");
    kb_url *u = calloc(1, sizeof *u);
    if (u == NULL)
        return fail(NULL, 1, errstr, errlen, "");
    if ((u->scheme = dup_n(url, slen, &oom)) == NULL)
        return fail(u, oom, errstr, errlen, "");
    for (char *c = u->scheme; *c; c++)
        *c = (char)tolower((unsigned char)*c);

    const char *a = sep + 3;
    if (strchr(a, '#') != NULL)
        return fail(u, 0, errstr, errlen,
                    "URL has a '#' (a fragment): encode '#' in a password as %23");
    /* The authority ends at the first '/' or '?'; its last '@' ends the userinfo. */
    const char *hend = a + strcspn(a, "/?"), *at = NULL;
    for (const char *p = a; p < hend; p++)
        if (*p == '@')
            at = p;
    const char *q = strchr(hend, '?');
    size_t plen = q ? (size_t)(q - hend) : strlen(hend);
    if (strchr(hend, '@') != NULL)   /* checked before the host, which it would mislead */
        return fail(u, 0, errstr, errlen,
                    "URL path or query has an '@': encode '/', '?' and '#' in a password as "
                    "%2F, %3F, %23");
    const char *why = at != NULL ? parse_userinfo(u, a, at, &oom) : NULL;
    if (why == NULL)
        why = parse_hosts(u, at != NULL ? at + 1 : a, hend, &oom);
    if (why != NULL)
        return fail(u, oom, errstr, errlen, why);
    if (!all_of(hend, plen, ":@/"))
        return fail(u, 0, errstr, errlen,
                    "URL path: a character that must be percent-encoded, or a bad %XX");
    if (q != NULL && !all_of(q + 1, strlen(q + 1), ":@/?"))
        return fail(u, 0, errstr, errlen,
                    "URL query: a character that must be percent-encoded, or a bad %XX");
    if ((u->path = dup_n(hend, plen, &oom)) == NULL)
        return fail(u, oom, errstr, errlen, "");
    if (q != NULL && (u->query = dup_n(q + 1, strlen(q + 1), &oom)) == NULL)
        return fail(u, oom, errstr, errlen, "");
    return u;
}

/* Whether an authority of len bytes is only "host[:port]" items separated by
 * ',' (several servers: "n1:4222,n2:4222"), each port all digits. */
static bool hosts_only(const char *a, size_t len)
{
    const char *end = a + len;
    while (a < end) {
        size_t item = strcspn(a, ",");
        if (a + item > end)
            item = (size_t)(end - a);
        const char *host_end = a + item;
        if (a[0] == '[') {
            const char *close = memchr(a, ']', item);
            if (close == NULL)
                return false;
            host_end = close + 1;
            if (host_end < a + item && *host_end != ':')
                return false;
        } else {
            const char *colon = memchr(a, ':', item);
            if (colon != NULL)
                host_end = colon;
        }
        if (host_end < a + item) {   /* ":port" */
            size_t digits = strspn(host_end + 1, "0123456789");
            if (digits == 0 || host_end + 1 + digits != a + item)
                return false;
        }
        a += item + 1;
    }
    return true;
}

const char *kb_url_redact(const char *url, char *out, size_t outlen)
{
    if (outlen == 0)
        return out;
    if (url == NULL) {
        snprintf(out, outlen, "(null)");
        return out;
    }
    char same[URL_MAX + 1];
    if (strnlen(url, URL_MAX + 1) <= URL_MAX)
        url = drop_repeated_schemes(url, same);
    const char *sep = strstr(url, "://");
    const char *rest = sep ? sep + 3 : url;
    /* Any '@' may end a password, also one typed unencoded in a path or after
     * a '#': mask up to the last one. */
    const char *at = strrchr(rest, '@');
    if (at == NULL && !sep) {
        /* no "://" and no '@': a typo like "redis:/:secret" shows the scheme only */
        const char *colon = strchr(url, ':');
        if (colon != NULL && colon[1] != '\0') {
            snprintf(out, outlen, "%.*s:***", (int)(colon - url), url);
            return out;
        }
    }
    if (at == NULL && sep) {
        /* "redis://user:secret" (no '@'): after the authority's first ':',
         * anything but a list of host[:port] may be a password */
        size_t alen = strcspn(rest, "/?#");
        const char *colon = memchr(rest, ':', alen);
        if (colon != NULL && !hosts_only(rest, alen)) {
            snprintf(out, outlen, "%.*s:***%s", (int)(colon - url), url, rest + alen);
            return out;
        }
    }
    if (at == NULL)
        snprintf(out, outlen, "%s", url);
    else
        snprintf(out, outlen, "%.*s***%s", (int)(rest - url), url, at);
    return out;
}
