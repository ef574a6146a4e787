/* kb_log: every part reports through the bus's log callback, so this sits
 * below all of them. Messages carry text from outside (broker keys and
 * errors, names from the environment): every control byte and every byte
 * that is not part of well-formed UTF-8 is written as \xHH, so no log line
 * can hold a terminal escape sequence or break a line-based collector. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "bus_int.h"

/* Length of the well-formed UTF-8 sequence at s (of n bytes) that is no C1
 * control, or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len = s[0] < 0xC2 ? 0 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : s[0] <= 0xF4 ? 4 : 0;
    if (len == 0 || len > n || (len == 2 && s[0] == 0xC2 && s[1] < 0xA0))
        return 0;   /* a lone continuation, C0/C1 overlongs, U+0080..U+009F */
    uint32_t cp = s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* `in` with control bytes and ill-formed UTF-8 as \xHH, into out (cut at
 * outlen, NUL-terminated). */
static void escape(const char *in, char *out, size_t outlen)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n && o + 5 < outlen;) {
        size_t len = s[i] >= 0x80 ? utf8_len(s + i, n - i) : s[i] >= 0x20 && s[i] != 0x7F;
        if (len == 0) {
            o += (size_t)snprintf(out + o, outlen - o, "\\x%02X", s[i]);
            i++;
            continue;
        }
        memcpy(out + o, s + i, len);
        o += len;
        i += len;
    }
    out[o] = '\0';
}

void kb_log(kb_bus *b, kb_log_level level, const char *fmt, ...)
{
    char msg[512], shown[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    escape(msg, shown, sizeof shown);
    if (b != NULL && b->log != NULL)
        b->log(level, shown, b->log_opaque);
    else if (level <= KB_LOG_WARNING)
        fprintf(stderr, "keybus: %s\n", shown);
}
