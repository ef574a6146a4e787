/* Property value rules (conf_value.h). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "conf_value.h"

/* Strictly decimal: an optional '-' then digits, nothing else (no blanks,
 * '+', hex or octal). Messages never quote the text, which may be a secret
 * typed into the wrong key. */
static int parse_int(const kb_conf_prop *p, const char *value, int64_t *out, char *errstr, size_t errlen)
{
    if (*value == '\0') {
        kb_errf(errstr, errlen, "%s: empty value, expected an integer in %" PRId64 "..%" PRId64,
                 p->name, p->min, p->max);
        return KB_EINVAL;
    }
    const char *d = value + (*value == '-');
    size_t digits = strspn(d, "0123456789");
    if (digits == 0 || d[digits] != '\0') {
        kb_errf(errstr, errlen, "%s: not an integer (decimal digits only, no blanks or sign '+')",
                p->name);
        return KB_EINVAL;
    }
    errno = 0;
    long long v = strtoll(value, NULL, 10);
    if (errno == ERANGE) {
        kb_errf(errstr, errlen, "%s: overflows; allowed %" PRId64 "..%" PRId64, p->name, p->min,
                p->max);
        return KB_EINVAL;
    }
    if (v < p->min || v > p->max) {
        const char *why = v < 0 ? "negative" : v == 0 ? "zero" : "out of range";
        kb_errf(errstr, errlen, "%s: %lld is %s; allowed %" PRId64 "..%" PRId64, p->name, v, why,
                 p->min, p->max);
        return KB_EINVAL;
    }
    *out = v;
    return KB_OK;
}

static int check_text(const kb_conf_prop *p, const char *value, char *errstr, size_t errlen)
{
    size_t len = strlen(value);
    if (p->type == KB_CONF_ENUM) {   /* the message lists the words, also for "" */
        for (const char *c = p->choices; *c;) {
            size_t n = strcspn(c, "|");
            if (n == len && strncmp(c, value, n) == 0)
                return KB_OK;
            c += n + (c[n] == '|');
        }
        kb_errf(errstr, errlen, "%s: not one of %s", p->name, p->choices);
        return KB_EINVAL;
    }
    if (p->type != KB_CONF_TEXT && p->type != KB_CONF_SECRET && len == 0) {
        kb_errf(errstr, errlen, "%s: empty value", p->name);
        return KB_EINVAL;
    }
    if ((int64_t)len > p->max) {
        kb_errf(errstr, errlen, "%s: value of %zu bytes is longer than %" PRId64, p->name, len,
                 p->max);
        return KB_EINVAL;
    }
    if (p->type == KB_CONF_TEXT || p->type == KB_CONF_SECRET)
        return KB_OK;
    for (size_t i = 0; i < len; i++) {
        if (isspace((unsigned char)value[i]) || iscntrl((unsigned char)value[i])) {
            kb_errf(errstr, errlen, "%s: whitespace or control character at offset %zu", p->name,
                     i);
            return KB_EINVAL;
        }
    }
    if (p->type == KB_CONF_URL) {
        char why[256];
        kb_url *u = kb_url_parse(value, why, sizeof why);
        if (u == NULL) {
            kb_errf(errstr, errlen, "%s: %s", p->name, why);
            return strstr(why, "out of memory") ? KB_ENOMEM : KB_EINVAL;
        }
        kb_url_free(u);
    }
    return KB_OK;
}

static int parse_bool(const kb_conf_prop *p, const char *value, int64_t *out, char *errstr,
                      size_t errlen)
{
    if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0) {
        *out = 1;
        return KB_OK;
    }
    if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0) {
        *out = 0;
        return KB_OK;
    }
    kb_errf(errstr, errlen, "%s: not a boolean (true, false, 1 or 0)", p->name);
    return KB_EINVAL;
}

int kb__conf_value_check(const kb_conf_prop *p, const char *value, int64_t *number,
                         char *errstr, size_t errlen)
{
    *number = 0;
    switch (p->type) {
    case KB_CONF_INT: return parse_int(p, value, number, errstr, errlen);
    case KB_CONF_BOOL: return parse_bool(p, value, number, errstr, errlen);
    default: return check_text(p, value, errstr, errlen);
    }
}

int kb__conf_prop_check(const kb_conf_prop *p, char *why, size_t whylen)
{
    if (p->type < KB_CONF_INT || p->type > KB_CONF_BOOL || p->def == NULL ||
        p->min > p->max || (p->type == KB_CONF_ENUM && p->choices == NULL)) {
        kb_errf(why, whylen, "property %s: needs a type, a default, min <= max%s", p->name,
                p->type == KB_CONF_ENUM ? " and choices" : "");
        return KB_EINVAL;
    }
    char rule[256];
    int64_t unused;
    int rc = kb__conf_value_check(p, p->def, &unused, rule, sizeof rule);
    if (rc != KB_OK)
        kb_errf(why, whylen, "property %s: its default breaks its own rule: %s", p->name, rule);
    return rc;
}
