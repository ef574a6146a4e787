/* libFuzzer target: how broker bytes are printed. The CLI's text escaping
 * (kb_cli_escape, kb_cli_text_headers: exactly the documented escapes, so
 * the output holds no control byte, no C1 control and no invalid UTF-8,
 * and reads back to the input), its JSON (kb_cli_json_bytes,
 * kb_cli_json_string, kb_cli_json_headers: every line parses with cJSON
 * and is UTF-8; keys, payloads and header values read back byte for byte,
 * as a string or as base64; text fields with U+FFFD for a stray byte), and
 * kb_log's escaping of a message (through a mem:// bus's log callback:
 * control bytes and invalid UTF-8 as \xHH, nothing else changed). The
 * expected output is worked out here from Unicode's table of well-formed
 * UTF-8 (Table 3-7), not from the code under test.
 * Input: the bytes; as headers, split at NUL bytes into name, value, ... */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keybus/keybus.h>
#include <keybus/transport.h>

#include "../../cli/text.h"
#include "fuzz_buf.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FUZZ_HEADERS 16

/* Length of the well-formed UTF-8 sequence at s (n bytes left), 0 if none:
 * Table 3-7 of the Unicode Standard, range by range. */
static size_t wf_len(const unsigned char *s, size_t n)
{
    static const struct { unsigned char lo0, hi0, lo1, hi1; size_t len; } rows[] = {
        {0x00, 0x7F, 0, 0, 1},       {0xC2, 0xDF, 0x80, 0xBF, 2}, {0xE0, 0xE0, 0xA0, 0xBF, 3},
        {0xE1, 0xEC, 0x80, 0xBF, 3}, {0xED, 0xED, 0x80, 0x9F, 3}, {0xEE, 0xEF, 0x80, 0xBF, 3},
        {0xF0, 0xF0, 0x90, 0xBF, 4}, {0xF1, 0xF3, 0x80, 0xBF, 4}, {0xF4, 0xF4, 0x80, 0x8F, 4},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        if (s[0] < rows[r].lo0 || s[0] > rows[r].hi0)
            continue;
        size_t len = rows[r].len;
        if (len > n || (len > 1 && (s[1] < rows[r].lo1 || s[1] > rows[r].hi1)))
            return 0;
        for (size_t i = 2; i < len; i++)
            if (s[i] < 0x80 || s[i] > 0xBF)
                return 0;
        return len;
    }
    return 0;
}

/* Is the sequence of `len` bytes at s printable: no C0, DEL or C1 control? */
static bool printable(const unsigned char *s, size_t len)
{
    return len > 1 ? !(s[0] == 0xC2 && s[1] < 0xA0) : s[0] >= 0x20 && s[0] != 0x7F;
}

static bool all_wf(const unsigned char *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if ((k = wf_len(s + i, n - i)) == 0)
            return false;
    return true;
}

/* Text for a terminal or a line-based reader: well-formed and printable. */
static void check_clean(const unsigned char *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if ((k = wf_len(s + i, n - i)) == 0 || !printable(s + i, k))
            abort();
}

/* What docs/formats.md says kb_cli_escape prints for these bytes. */
static void want_escape(fuzz_buf *w, const unsigned char *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k) {
        k = wf_len(s + i, n - i);
        char hex[8];
        if (k > 0 && printable(s + i, k) && s[i] != '\\') {
            fuzz_put(w, s + i, k);
            continue;
        }
        k = 1;
        const char *e = s[i] == '\\' ? "\\\\" : s[i] == '\n' ? "\\n" : s[i] == '\r' ? "\\r"
                        : s[i] == '\t' ? "\\t" : NULL;
        if (e == NULL) {
            snprintf(hex, sizeof hex, "\\x%02X", s[i]);
            e = hex;
        }
        fuzz_put(w, e, strlen(e));
    }
}

/* The bytes an escaped text stands for (the escapes are unambiguous). */
static void unescape(fuzz_buf *w, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') {
            if (i + 1 >= n)
                abort();
            char e = s[++i];
            unsigned v = 0;
            if (e == 'x' && (i + 2 >= n || sscanf(s + i + 1, "%2X", &v) != 1))
                abort();
            c = e == '\\' ? '\\' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t'
                : e == 'x' ? (unsigned char)v : 0;
            if (e == 'x')
                i += 2;
            else if (c == 0)
                abort();
        }
        fuzz_put(w, &c, 1);
    }
}

/* What f printed into a memory stream, NUL-terminated. */
typedef struct out {
    char *p;
    size_t n;
    FILE *f;
} out;

static void out_open(out *o)
{
    if ((o->f = open_memstream(&o->p, &o->n)) == NULL)
        abort();
}

static void out_close(out *o)
{
    if (fclose(o->f) != 0)
        abort();
}

static void text(const unsigned char *s, size_t n)
{
    out o;
    out_open(&o);
    kb_cli_escape(o.f, s, n);
    out_close(&o);
    fuzz_buf want = {0}, back = {0};
    want_escape(&want, s, n);
    unescape(&back, o.p, o.n);
    check_clean((const unsigned char *)o.p, o.n);
    if (o.n != want.n || (o.n > 0 && memcmp(o.p, want.p, o.n) != 0) || back.n != n ||
        (n > 0 && memcmp(back.p, s, n) != 0))
        abort();
    free(o.p), free(want.p), free(back.p);
}

/* A string as cJSON hands it back: its bytes up to the first NUL (cJSON
 * keeps a \u0000 as a NUL, and the length is not told). */
static void same_string(const cJSON *v, const void *want, size_t n)
{
    const char *nul = memchr(want, '\0', n);
    size_t k = nul != NULL ? (size_t)(nul - (const char *)want) : n;
    if (!cJSON_IsString(v) || strlen(v->valuestring) != k || memcmp(v->valuestring, want, k) != 0)
        abort();
}

static size_t b64_val(char c)
{
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *d = c != '\0' ? strchr(digits, c) : NULL;
    if (d == NULL)
        abort();
    return (size_t)(d - digits);
}

/* RFC 4648 base64 of exactly these bytes. */
static void same_base64(const cJSON *v, const unsigned char *want, size_t n)
{
    if (!cJSON_IsString(v))
        abort();
    const char *s = v->valuestring;
    size_t len = strlen(s), o = 0;
    if (len != 4 * ((n + 2) / 3))
        abort();
    for (size_t i = 0; i < len; i += 4) {
        size_t x = b64_val(s[i]) << 18 | b64_val(s[i + 1]) << 12 |
                   (s[i + 2] == '=' ? 0 : b64_val(s[i + 2]) << 6) |
                   (s[i + 3] == '=' ? 0 : b64_val(s[i + 3]));
        unsigned char got[3] = {(unsigned char)(x >> 16), (unsigned char)(x >> 8),
                                (unsigned char)x};
        for (size_t k = 0; k < 3 && o < n; k++)
            if (got[k] != want[o++])
                abort();
    }
}

/* kb_cli_json_bytes: a string where the bytes are UTF-8, base64 otherwise. */
static void same_bytes(const cJSON *obj, const char *name, const unsigned char *s, size_t n)
{
    char b64name[32];
    snprintf(b64name, sizeof b64name, "%s_base64", name);
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(obj, name);
    const cJSON *b64 = cJSON_GetObjectItemCaseSensitive(obj, b64name);
    if ((str != NULL) == (b64 != NULL) || (str != NULL) != all_wf(s, n))
        abort();   /* exactly one, the string for UTF-8 */
    if (str != NULL)
        same_string(str, s, n);
    else
        same_base64(b64, s, n);
}

/* kb_cli_json_string's text: a stray byte as U+FFFD. */
static void same_text(const cJSON *v, const unsigned char *s, size_t n)
{
    fuzz_buf want = {0};
    for (size_t i = 0, k; i < n; i += k)
        if ((k = wf_len(s + i, n - i)) > 0)
            fuzz_put(&want, s + i, k);
        else
            fuzz_put(&want, "\xEF\xBF\xBD", 3), k = 1;
    same_string(v, want.p != NULL ? want.p : "", want.n);
    free(want.p);
}

/* One JSON line: parses, whole, and is UTF-8. */
static cJSON *parse(const out *o)
{
    if (memchr(o->p, '\0', o->n) != NULL || !all_wf((const unsigned char *)o->p, o->n))
        abort();
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(o->p, o->n, &end, false);
    if (j == NULL || end != o->p + o->n)
        abort();
    return j;
}

static void json(const unsigned char *s, size_t n)
{
    out o;
    out_open(&o);
    fputc('{', o.f);
    kb_cli_json_bytes(o.f, "key", s, n);
    fputs(",\"text\":", o.f);
    kb_cli_json_string(o.f, s, n);
    fputc('}', o.f);
    out_close(&o);
    cJSON *j = parse(&o);
    same_bytes(j, "key", s, n);
    same_text(cJSON_GetObjectItemCaseSensitive(j, "text"), s, n);
    cJSON_Delete(j);
    free(o.p);
    /* what follows a NUL is compared too: again with 0x01 (also \u00XX) */
    unsigned char *no_nul = memchr(s, '\0', n) != NULL ? malloc(n) : NULL;
    if (no_nul != NULL) {
        for (size_t i = 0; i < n; i++)
            no_nul[i] = s[i] != '\0' ? s[i] : 1;
        json(no_nul, n);
        free(no_nul);
    }
}

static void headers(const unsigned char *s, size_t n)
{
    kb_header h[MAX_FUZZ_HEADERS];
    char *copy = malloc(n + 2);
    if (copy == NULL)
        abort();
    memcpy(copy, s, n);
    copy[n] = copy[n + 1] = '\0';
    size_t nh = 0;
    for (char *p = copy; p < copy + n && nh < MAX_FUZZ_HEADERS;) {
        char *v = p + strlen(p) + 1;   /* the name's NUL, or copy[n] */
        h[nh].name = p;
        h[nh].value = v;
        h[nh].value_len = v <= copy + n ? strlen(v) : 0;
        if (v > copy + n)
            h[nh].value = "";
        nh++;
        p = v + h[nh - 1].value_len + 1;
    }
    out o;
    out_open(&o);
    fputc('{', o.f);
    kb_cli_json_headers(o.f, h, nh);
    fputc('}', o.f);
    out_close(&o);
    cJSON *j = parse(&o);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "headers");
    if (!cJSON_IsArray(a) || (size_t)cJSON_GetArraySize(a) != nh)
        abort();
    for (size_t i = 0; i < nh; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, (int)i);
        same_text(cJSON_GetObjectItemCaseSensitive(e, "name"), (const unsigned char *)h[i].name,
                  strlen(h[i].name));
        same_bytes(e, "value", (const unsigned char *)h[i].value, h[i].value_len);
    }
    cJSON_Delete(j);
    free(o.p);

    out_open(&o);
    kb_cli_text_headers(o.f, h, nh);
    out_close(&o);
    fuzz_buf want = {0};
    for (size_t i = 0; i < nh; i++) {
        fuzz_put(&want, "\theader.", 8);
        want_escape(&want, (const unsigned char *)h[i].name, strlen(h[i].name));
        fuzz_put(&want, "=", 1);
        want_escape(&want, (const unsigned char *)h[i].value, h[i].value_len);
    }
    if (o.n != want.n || (o.n > 0 && memcmp(o.p, want.p, o.n) != 0))
        abort();
    /* Names the library lets through hold no '=': each field splits back. */
    if (kb_headers_check(h, nh, KB_MAX_HEADERS, SIZE_MAX, "fuzz") == KB_OK) {
        char *f = o.p;
        for (size_t i = 0; i < nh; i++) {
            if (strncmp(f, "\theader.", 8) != 0)
                abort();
            char *eq = strchr(f + 8, '='), *next = strchr(f + 1, '\t');
            next = next != NULL ? next : o.p + o.n;
            fuzz_buf name = {0}, value = {0};
            if (eq == NULL || eq > next)
                abort();
            unescape(&name, f + 8, (size_t)(eq - f - 8));
            unescape(&value, eq + 1, (size_t)(next - eq - 1));
            if (name.n != strlen(h[i].name) || memcmp(name.p, h[i].name, name.n) != 0 ||
                value.n != h[i].value_len ||
                (value.n > 0 && memcmp(value.p, h[i].value, value.n) != 0))
                abort();
            free(name.p), free(value.p);
            f = next;
        }
    }
    free(want.p);
    free(o.p);
    free(copy);
}

/* kb_log through a bus's callback: what this thread logged last. */
static kb_bus *bus;
static _Thread_local fuzz_buf *logged;

static void on_log(int level, const char *msg, void *opaque)
{
    (void)level, (void)opaque;
    if (logged != NULL) {
        logged->n = 0;
        fuzz_put(logged, msg, strlen(msg));
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    kb_conf *c = kb_conf_new();
    char err[256];
    if (c == NULL || kb_conf_set(c, "transport", "mem://", err, sizeof err) != KB_OK)
        abort();
    kb_conf_set_log(c, on_log, NULL);
    if ((bus = kb_open(c, err, sizeof err)) == NULL)
        abort();
    return 0;
}

/* kb_log formats into 512 bytes: the message is the text up to its first
 * NUL, cut at 511 bytes. */
static void log_line(const unsigned char *s, size_t n)
{
    const unsigned char *nul = memchr(s, '\0', n);
    n = nul != NULL ? (size_t)(nul - s) : n;
    n = n > 511 ? 511 : n;
    char *msg = strndup((const char *)s, n);
    fuzz_buf got = {0}, want = {0};
    if (msg == NULL)
        abort();
    logged = &got;
    kb_log(bus, KB_LOG_ERROR, "%s", msg);
    logged = NULL;
    for (size_t i = 0, k; i < n; i += k) {
        char hex[8];
        if ((k = wf_len(s + i, n - i)) > 0 && printable(s + i, k)) {
            fuzz_put(&want, s + i, k);
            continue;
        }
        snprintf(hex, sizeof hex, "\\x%02X", s[i]);
        fuzz_put(&want, hex, 4);
        k = 1;
    }
    if (got.p == NULL || got.n != want.n || (got.n > 0 && memcmp(got.p, want.p, got.n) != 0))
        abort();
    check_clean((const unsigned char *)got.p, got.n);
    free(msg), free(got.p), free(want.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    text(data, size);
    json(data, size);
    headers(data, size);
    log_line(data, size);
    return 0;
}
