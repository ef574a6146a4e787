/* The INI grammar kb_conf_load reads (documented in kb_conf_write_reference):
 *   line     = blank | comment | section | pair      (one line each, never continued)
 *   comment  = ('#' | ';') any                        (only as the line's first non-blank)
 *   section  = '[' name ']'                           (nothing else on the line)
 *   pair     = key '=' value                          (blanks around both ignored)
 *   value    = bare | '"' (char | '\"' | '\\')* '"'
 * A bare value runs to the end of the line; a '#' or ';' after a blank in it
 * is an error (an inline comment would silently change the value).
 * A file shared with an application has `[keybus]` / `[keybus.NAME]`
 * sections: only their pairs are keybus's (see kb__ini_parse). */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <keybus/transport.h>

#include "ini.h"

#define KEY_MAX 256

static bool blank(char c)
{
    return c == ' ' || c == '\t';
}

static bool key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
}

static size_t key_span(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && key_char(s[i]))
        i++;
    return i;
}

/* `[name]`: the whole (trimmed) line. */
static int parse_section(const char *s, size_t n, char *section, char *why, size_t whylen)
{
    const char *close = memchr(s, ']', n);
    if (close == NULL) {
        kb_errf(why, whylen, "'[' without ']'");
        return KB_EINVAL;
    }
    if (close != s + n - 1) {
        kb_errf(why, whylen, "text after ']' (a key goes on its own line below the section)");
        return KB_EINVAL;
    }
    const char *a = s + 1, *b = close;
    while (a < b && blank(*a))
        a++;
    while (b > a && blank(b[-1]))
        b--;
    size_t len = (size_t)(b - a);
    if (len == 0 || key_span(a, len) != len || len >= KEY_MAX / 2) {
        kb_errf(why, whylen, "section name must be 1..%d letters, digits, '_', '.' or '-'",
                KEY_MAX / 2 - 1);
        return KB_EINVAL;
    }
    memcpy(section, a, len);
    section[len] = '\0';
    return KB_OK;
}

/* The value after '=' (trimmed) into out, which holds n + 1 bytes. */
static int parse_value(const char *s, size_t n, char *out, char *why, size_t whylen)
{
    if (n == 0 || s[0] != '"') {
        /* the blank before a leading '#' or ';' was trimmed as the separator */
        for (size_t i = 0; i < n; i++)
            if ((s[i] == '#' || s[i] == ';') && (i == 0 || blank(s[i - 1]))) {
                kb_errf(why, whylen, "inline comment after a value: comments go on their own "
                        "line (quote the value if it holds \" #\" or \" ;\")");
                return KB_EINVAL;
            }
        memcpy(out, s, n);
        out[n] = '\0';
        return KB_OK;
    }
    size_t o = 0, i = 1;
    for (; i < n && s[i] != '"'; i++) {
        if (s[i] == '\\') {
            if (i + 1 == n || (s[i + 1] != '"' && s[i + 1] != '\\')) {
                kb_errf(why, whylen, "bad escape in a quoted value (only \\\" and \\\\)");
                return KB_EINVAL;
            }
            i++;
        }
        out[o++] = s[i];
    }
    if (i == n) {
        kb_errf(why, whylen, "quoted value without its closing quote");
        return KB_EINVAL;
    }
    if (i != n - 1) {
        kb_errf(why, whylen, "text after the closing quote");
        return KB_EINVAL;
    }
    out[o] = '\0';
    return KB_OK;
}

struct reader {
    kb_ini_pair_fn *fn;   /* NULL: a first pass looking for keybus sections */
    void *arg;
    bool shared;          /* the file has keybus sections: the rest is the application's */
    bool ours;            /* the current section is keybus's */
    int bad_line;         /* the first pass's first bad line (0: none) and why */
    char bad_why[384];
    char section[KEY_MAX / 2];
    char value[KB_INI_LINE_MAX + 1];
};

/* `[keybus]` is the top level and `[keybus.pool]` the section `pool` of a
 * shared file; the name becomes the prefix its keys get. */
static bool keybus_section(char *section)
{
    static const char own[] = "keybus";
    size_t n = sizeof own - 1;
    if (strncmp(section, own, n) != 0 || (section[n] != '\0' && section[n] != '.'))
        return false;
    memmove(section, section + n + (section[n] == '.'), strlen(section + n) + 1);
    return true;
}

static int enter_section(struct reader *r, const char *s, size_t n, char *why, size_t whylen)
{
    int rc = parse_section(s, n, r->section, why, whylen);
    if (rc != KB_OK)
        return rc;
    /* [KeyBus.pool] would silently be the application's section */
    if (strncasecmp(r->section, "keybus", 6) == 0 && strncmp(r->section, "keybus", 6) != 0 &&
        (r->section[6] == '\0' || r->section[6] == '.')) {
        kb_errf(why, whylen, "section [%s]: keybus's sections are spelled in lower case "
                "([keybus], [keybus.NAME])", r->section);
        return KB_EINVAL;
    }
    bool own = keybus_section(r->section);
    if (r->fn == NULL)
        r->shared |= own;
    r->ours = own || !r->shared;
    return KB_OK;
}

static int parse_line(struct reader *r, const char *s, size_t n, char *why, size_t whylen)
{
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] < 0x20 && s[i] != '\t') || (unsigned char)s[i] == 0x7f) {
            kb_errf(why, whylen, "control character (byte 0x%02X) at column %zu",
                    (unsigned)(unsigned char)s[i], i + 1);
            return KB_EINVAL;
        }
    while (n > 0 && blank(*s))   /* indentation is ignored: never a continuation */
        s++, n--;
    while (n > 0 && blank(s[n - 1]))
        n--;
    if (n == 0 || s[0] == '#' || s[0] == ';')
        return KB_OK;
    if (s[0] == '[')
        return enter_section(r, s, n, why, whylen);
    size_t klen = key_span(s, n), i = klen;
    while (i < n && blank(s[i]))
        i++;
    if (klen == 0 || i == n || s[i] != '=') {
        kb_errf(why, whylen, "expected `key = value`, `[section]` or a comment");
        return KB_EINVAL;
    }
    i++;
    while (i < n && blank(s[i]))
        i++;
    char key[KEY_MAX];
    if (klen >= KEY_MAX / 2) {
        kb_errf(why, whylen, "key longer than %d bytes", KEY_MAX / 2 - 1);
        return KB_EINVAL;
    }
    if (r->section[0] != '\0')
        snprintf(key, sizeof key, "%s.%.*s", r->section, (int)klen, s);
    else
        snprintf(key, sizeof key, "%.*s", (int)klen, s);
    int rc = parse_value(s + i, n - i, r->value, why, whylen);
    if (rc != KB_OK || r->fn == NULL || !r->ours)
        return rc;   /* the application's pairs are checked for syntax only */
    return r->fn(r->arg, key, r->value, why, whylen);
}

/* One pass over the lines; the first error names its line. The first pass
 * (no fn) only looks for keybus sections and reads on past errors, keeping
 * the first bad line; the second reports errors, with the pairs above them
 * set. */
static int parse_text(struct reader *r, const char *name, const char *text, size_t len,
                      char *errstr, size_t errlen)
{
    int rc = KB_OK;
    char why[384];
    size_t pos = 0;
    r->section[0] = '\0';
    r->ours = !r->shared;
    for (int line = 1; pos < len && (rc == KB_OK || r->fn == NULL); line++) {
        const char *s = text + pos, *nl = memchr(s, '\n', len - pos);
        size_t n = nl != NULL ? (size_t)(nl - s) : len - pos;
        pos += n + (nl != NULL);
        if (n > 0 && s[n - 1] == '\r')
            n--;   /* CRLF line ends */
        if (n > KB_INI_LINE_MAX) {
            kb_errf(why, sizeof why, "line longer than %d bytes", KB_INI_LINE_MAX);
            rc = KB_EINVAL;
        } else {
            rc = parse_line(r, s, n, why, sizeof why);
        }
        if (rc != KB_OK && r->fn != NULL && !r->shared && r->bad_line > line) {
            /* a pair refused above a bad line: that line (an unclosed
             * `[keybus`) may be why the pair was taken for keybus's */
            kb_errf(errstr, errlen, "%s:%d: %s", name, r->bad_line, r->bad_why);
            rc = KB_EINVAL;
        } else if (rc != KB_OK && r->fn != NULL) {
            kb_errf(errstr, errlen, "%s:%d: %s", name, line, why);
        } else if (rc != KB_OK && r->bad_line == 0) {
            r->bad_line = line;
            snprintf(r->bad_why, sizeof r->bad_why, "%s", why);
        }
    }
    return rc;
}

int kb__ini_parse(const char *name, const char *text, size_t len, kb_ini_pair_fn *fn, void *arg,
                  char *errstr, size_t errlen)
{
    struct reader *r = calloc(1, sizeof *r);
    if (r == NULL) {
        kb_errf(errstr, errlen, "%s: out of memory", name);
        return KB_ENOMEM;
    }
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)   /* a UTF-8 byte order mark */
        text += 3, len -= 3;
    /* first whether the file is shared: a [keybus] section may come last */
    parse_text(r, name, text, len, NULL, 0);
    r->fn = fn;
    r->arg = arg;
    int rc = parse_text(r, name, text, len, errstr, errlen);
    free(r);
    return rc;
}

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISCHR(m) || S_ISBLK(m) ? "a device"
           : S_ISFIFO(m) ? "a pipe" : S_ISSOCK(m) ? "a socket" : "not a file";
}

int kb__ini_parse_file(const char *path, kb_ini_pair_fn *fn, void *arg, char *errstr,
                       size_t errlen)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        kb_errf(errstr, errlen, "%s: cannot read: %s", path, strerror(errno));
        return KB_EINVAL;
    }
    struct stat st;
    int rc = KB_OK;
    if (fstat(fd, &st) != 0) {
        kb_errf(errstr, errlen, "%s: cannot read: %s", path, strerror(errno));
        rc = KB_EINVAL;
    } else if (!S_ISREG(st.st_mode)) {
        kb_errf(errstr, errlen, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
        rc = KB_EINVAL;
    }
    if (rc != KB_OK) {
        close(fd);
        return rc;
    }
    char *text = malloc(KB_INI_FILE_MAX + 1);
    if (text == NULL) {
        close(fd);
        kb_errf(errstr, errlen, "%s: out of memory", path);
        return KB_ENOMEM;
    }
    size_t len = 0;
    ssize_t got = 1;
    while (len <= KB_INI_FILE_MAX && got > 0) {
        got = read(fd, text + len, KB_INI_FILE_MAX + 1 - len);
        if (got > 0)
            len += (size_t)got;
        else if (got < 0 && errno == EINTR)
            got = 1;
    }
    int read_errno = errno;
    close(fd);
    if (got < 0) {
        kb_errf(errstr, errlen, "%s: cannot read: %s", path, strerror(read_errno));
        rc = KB_EINVAL;
    } else if (len > KB_INI_FILE_MAX) {
        kb_errf(errstr, errlen, "%s: larger than %d bytes", path, KB_INI_FILE_MAX);
        rc = KB_EINVAL;
    } else {
        rc = kb__ini_parse(path, text, len, fn, arg, errstr, errlen);
    }
    free(text);
    return rc;
}
