#include "text.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

/* Length of the valid UTF-8 sequence of two to four bytes at s (at most n
 * bytes), its code point in *cp; 0 when invalid. */
static size_t utf8_sequence(const unsigned char *s, size_t n, uint32_t *cp)
{
    size_t len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : 2;
    if (s[0] < 0xC2 || s[0] > 0xF4 || len > n)
        return 0;
    *cp = s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        *cp = *cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (*cp < least[len] || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF))
        return 0;
    return len;
}

/* Length of the valid UTF-8 sequence at s (at most n bytes) that is no C1
 * control, or 0. */
static size_t utf8_printable(const unsigned char *s, size_t n)
{
    uint32_t cp = 0;
    size_t len = utf8_sequence(s, n, &cp);
    return cp >= 0x80 && cp <= 0x9F ? 0 : len;
}

void kb_cli_escape(FILE *out, const void *data, size_t len)
{
    const unsigned char *s = data;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        size_t run = c >= 0x80 ? utf8_printable(s + i, len - i) : 0;
        if (run > 0) {
            fwrite(s + i, 1, run, out);
            i += run - 1;
        } else if (c == '\\') {
            fputs("\\\\", out);
        } else if (c == '\n') {
            fputs("\\n", out);
        } else if (c == '\r') {
            fputs("\\r", out);
        } else if (c == '\t') {
            fputs("\\t", out);
        } else if (c < 0x20 || c >= 0x7F) {
            fprintf(out, "\\x%02X", c);
        } else {
            fputc(c, out);
        }
    }
}

void kb_cli_json_string(FILE *out, const void *data, size_t len)
{
    const unsigned char *s = data;
    fputc('"', out);
    uint32_t cp = 0;
    for (size_t i = 0, run; i < len; i++) {
        if (s[i] >= 0x80 && (run = utf8_sequence(s + i, len - i, &cp)) > 0) {
            fwrite(s + i, 1, run, out);
            i += run - 1;
        } else if (s[i] >= 0x80) {
            fputs("\\ufffd", out);   /* JSON is UTF-8: a broker's stray byte must not break it */
        } else if (s[i] == '"' || s[i] == '\\') {
            fprintf(out, "\\%c", s[i]);
        } else if (s[i] < 0x20) {
            fprintf(out, "\\u%04x", s[i]);
        } else {
            fputc(s[i], out);
        }
    }
    fputc('"', out);
}

/* Valid UTF-8 throughout (NUL and controls allowed: JSON escapes them). */
static int utf8_valid(const unsigned char *s, size_t len)
{
    uint32_t cp = 0;
    for (size_t i = 0, run; i < len; i += run)
        if ((run = s[i] < 0x80 ? 1 : utf8_sequence(s + i, len - i, &cp)) == 0)
            return 0;
    return 1;
}

static void base64(FILE *out, const unsigned char *s, size_t len)
{
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < len ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < len ? s[i + 2] : 0);
        fputc(digits[v >> 18 & 63], out);
        fputc(digits[v >> 12 & 63], out);
        fputc(i + 1 < len ? digits[v >> 6 & 63] : '=', out);
        fputc(i + 2 < len ? digits[v & 63] : '=', out);
    }
}

void kb_cli_json_bytes(FILE *out, const char *name, const void *data, size_t len)
{
    if (utf8_valid(data, len)) {
        fprintf(out, "\"%s\":", name);
        kb_cli_json_string(out, data, len);
    } else {
        fprintf(out, "\"%s_base64\":\"", name);
        base64(out, data, len);
        fputc('"', out);
    }
}

void kb_cli_json_headers(FILE *out, const kb_header *h, size_t n)
{
    fputs("\"headers\":[", out);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ",{\"name\":" : "{\"name\":", out);
        kb_cli_json_string(out, h[i].name, strlen(h[i].name));
        fputc(',', out);
        kb_cli_json_bytes(out, "value", h[i].value, h[i].value_len);
        fputc('}', out);
    }
    fputc(']', out);
}

void kb_cli_text_headers(FILE *out, const kb_header *h, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fputs("\theader.", out);
        kb_cli_escape(out, h[i].name, strlen(h[i].name));
        fputc('=', out);
        kb_cli_escape(out, h[i].value, h[i].value_len);
    }
}

static char cli_error[512];

void kb_cli_errf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cli_error, sizeof cli_error, fmt, ap);
    va_end(ap);
}

void kb_cli_report(const char *cmd, int rc)
{
    if (rc != KB_OK)
        fprintf(stderr, "keybus %s: %s: %s\n", cmd, kb_strerror(rc),
                cli_error[0] ? cli_error : kb_last_error());
    cli_error[0] = '\0';
}
