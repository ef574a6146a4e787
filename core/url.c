/* Transport URLs (RFC 3986): scheme://[user[:password]@]host[:port][/path][?query].
 * The one parser every transport uses, so every scheme follows the same rules:
 * userinfo percent-decoded, IPv6 in brackets, strictly decimal ports. Messages
 * name the part that is wrong and never quote the userinfo. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/transport.h>

#define URL_MAX 4096

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Percent-decode [s, s+n) into a new string; NULL on a bad escape or a
 * decoded NUL (out of memory sets *oom). */
static char *decode(const char *s, size_t n, int *oom)
{
    char *out = malloc(n + 1), *o = out;
    if (out == NULL) {
        *oom = 1;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            *o++ = s[i];
            continue;
        }
        int hi = i + 1 < n ? hexval(s[i + 1]) : -1;
        int lo = i + 2 < n ? hexval(s[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            free(out);
            return NULL;
        }
        *o++ = (char)(hi * 16 + lo);
        i += 2;
    }
    *o = '\0';
    return out;
}

static int scheme_char(unsigned char c, size_t i)
{
    return isalpha(c) || (i > 0 && (isdigit(c) || c == '+' || c == '-' || c == '.'));
}

static int host_char(unsigned char c)
{
    return isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
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

static int parse_port(const char *s, size_t n, int *port)
{
    if (n == 0 || n > 5)
        return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v < 1 || v > 65535)
        return -1;
    *port = (int)v;
    return 0;
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
    size_t alen = strcspn(a, "/?");
    const char *at = NULL;
    for (const char *p = a; p < a + alen; p++)
        if (*p == '@')
            at = p;
    const char *host = a;
    if (at != NULL) {
        const char *colon = memchr(a, ':', (size_t)(at - a));
        size_t ulen = colon ? (size_t)(colon - a) : (size_t)(at - a);
        if (ulen > 0 && (u->user = decode(a, ulen, &oom)) == NULL)
            return fail(u, oom, errstr, errlen,
                        "URL user name has a bad percent-escape (write %XX, not %00)");
        if (colon != NULL &&
            (u->password = decode(colon + 1, (size_t)(at - colon - 1), &oom)) == NULL)
            return fail(u, oom, errstr, errlen,
                        "URL password has a bad percent-escape (write %XX, not %00)");
        host = at + 1;
    }
    const char *hend = a + alen, *port = NULL;
    if (*host == '[') {
        const char *close = memchr(host, ']', (size_t)(hend - host));
        if (close == NULL)
            return fail(u, 0, errstr, errlen, "URL host: '[' without ']' (IPv6 literal)");
        for (const char *p = host + 1; p < close; p++)
            if (!isxdigit((unsigned char)*p) && *p != ':' && *p != '.')
                return fail(u, 0, errstr, errlen,
                            "URL host: an IPv6 literal holds only hex digits, ':' and '.'");
        if (close == host + 1)
            return fail(u, 0, errstr, errlen, "URL host: empty IPv6 literal");
        if ((u->host = dup_n(host + 1, (size_t)(close - host - 1), &oom)) == NULL)
            return fail(u, oom, errstr, errlen, "");
        if (close + 1 < hend && close[1] != ':')
            return fail(u, 0, errstr, errlen, "URL host: text after ']' (expected :port)");
        port = close + 1 < hend ? close + 2 : NULL;
    } else {
        const char *colon = memchr(host, ':', (size_t)(hend - host));
        const char *h_end = colon ? colon : hend;
        for (const char *p = host; p < h_end; p++)
            if (!host_char((unsigned char)*p))
                return fail(u, 0, errstr, errlen,
                            *p == '@' || *p == ':'
                                ? "URL host: unexpected '@' or ':' (encode them in a password "
                                  "as %40 and %3A)"
                                : "URL host: only letters, digits, '-', '.', '_' and '~' "
                                  "(IPv6 goes in brackets)");
        if ((u->host = dup_n(host, (size_t)(h_end - host), &oom)) == NULL)
            return fail(u, oom, errstr, errlen, "");
        port = colon ? colon + 1 : NULL;
    }
    if (port != NULL && parse_port(port, (size_t)(hend - port), &u->port) != 0)
        return fail(u, 0, errstr, errlen, "URL port: not a decimal number in 1..65535");
    const char *q = strchr(hend, '?');
    size_t plen = q ? (size_t)(q - hend) : strlen(hend);
    if (memchr(hend, '@', plen) != NULL)
        return fail(u, 0, errstr, errlen,
                    "URL path has an '@': encode '/', '?' and '#' in a password as %2F, %3F, %23");
    if ((u->path = dup_n(hend, plen, &oom)) == NULL)
        return fail(u, oom, errstr, errlen, "");
    if (q != NULL && (u->query = dup_n(q + 1, strlen(q + 1), &oom)) == NULL)
        return fail(u, oom, errstr, errlen, "");
    return u;
}

const char *kb_url_redact(const char *url, char *out, size_t outlen)
{
    if (outlen == 0)
        return out;
    if (url == NULL) {
        snprintf(out, outlen, "(null)");
        return out;
    }
    const char *sep = strstr(url, "://");
    const char *rest = sep ? sep + 3 : url;
    /* Without "://" any '@' may end a password: mask up to the last one. */
    size_t span = sep ? strcspn(rest, "/?#") : strlen(rest);
    const char *at = NULL;
    for (const char *p = rest; p < rest + span; p++)
        if (*p == '@')
            at = p;
    if (at == NULL && !sep) {
        /* no "://" and no '@': a typo like "redis:/:secret" shows the scheme only */
        const char *colon = strchr(url, ':');
        if (colon != NULL && colon[1] != '\0') {
            snprintf(out, outlen, "%.*s:***", (int)(colon - url), url);
            return out;
        }
    }
    if (at == NULL)
        snprintf(out, outlen, "%s", url);
    else
        snprintf(out, outlen, "%.*s***%s", (int)(rest - url), url, at);
    return out;
}
