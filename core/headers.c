/* Event headers: checking them against the limits, and their packed form
 * inside a record or a transport's store. */
#include <string.h>
#include <strings.h>

#include <keybus/transport.h>

static int name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

int kb_headers_check(const kb_header *h, size_t n, size_t max_n, size_t max_bytes,
                      const char *what)
{
    if (n == 0)
        return KB_OK;
    if (h == NULL) {
        kb_errf(NULL, 0, "%s: headers is NULL but n_headers is %zu", what, n);
        return KB_EINVAL;
    }
    if (n > max_n) {
        kb_errf(NULL, 0, "%s: %zu headers exceed limits.max_headers (%zu)", what, n, max_n);
        return KB_ETOOBIG;
    }
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = h[i].name;
        size_t len = name != NULL ? strnlen(name, KB_MAX_HEADER_NAME + 1) : 0;
        if (len == 0 || len > KB_MAX_HEADER_NAME) {
            kb_errf(NULL, 0, "%s: header %zu: name %s", what, i,
                     name == NULL ? "is NULL" : len == 0 ? "is empty" : "is over 64 bytes");
            return KB_EINVAL;
        }
        for (size_t k = 0; k < len; k++)
            if (!name_char((unsigned char)name[k])) {
                kb_errf(NULL, 0, "%s: header %zu: name has 0x%02x at %zu; allowed: letters, "
                         "digits, '.', '_', '-'", what, i, (unsigned char)name[k], k);
                return KB_EINVAL;
            }
        if (strncasecmp(name, "kb-", 3) == 0 || strncasecmp(name, "nats-", 5) == 0) {
            kb_errf(NULL, 0, "%s: header \"%s\": names starting with Kb- or Nats- are reserved",
                     what, name);
            return KB_EINVAL;
        }
        if (h[i].value == NULL && h[i].value_len > 0) {
            kb_errf(NULL, 0, "%s: header \"%s\": value is NULL but value_len is %zu", what,
                     name, h[i].value_len);
            return KB_EINVAL;
        }
        const char *v = h[i].value;
        for (size_t k = 0; k < h[i].value_len; k++)
            if (v[k] == '\0' || v[k] == '\r' || v[k] == '\n') {
                kb_errf(NULL, 0, "%s: header \"%s\": value has %s at %zu (NUL, CR and LF "
                         "cannot cross every broker)", what, name,
                         v[k] == '\0' ? "NUL" : v[k] == '\r' ? "CR" : "LF", k);
                return KB_EINVAL;
            }
        bytes += len + h[i].value_len;
        if (bytes > max_bytes) {
            kb_errf(NULL, 0, "%s: headers exceed limits.max_header_bytes (%zu) at \"%s\"",
                     what, max_bytes, name);
            return KB_ETOOBIG;
        }
    }
    return KB_OK;
}

size_t kb_headers_packed_size(const kb_header *h, size_t n)
{
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += 1 + strlen(h[i].name) + 1 + 4 + h[i].value_len;
    return bytes;
}

void kb_headers_pack(char *dst, const kb_header *h, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(h[i].name);
        uint32_t vlen = (uint32_t)h[i].value_len;
        *dst++ = (char)len;
        memcpy(dst, h[i].name, len + 1);
        dst += len + 1;
        for (int b = 0; b < 4; b++)
            *dst++ = (char)(vlen >> (8 * b));
        if (vlen > 0)
            memcpy(dst, h[i].value, vlen);
        dst += vlen;
    }
}

void kb_headers_unpack(const char *src, size_t n, kb_header *out)
{
    for (size_t i = 0; i < n; i++) {
        size_t len = (unsigned char)*src++;
        out[i].name = src;
        src += len + 1;
        uint32_t vlen = 0;
        for (int b = 0; b < 4; b++)
            vlen |= (uint32_t)(unsigned char)*src++ << (8 * b);
        out[i].value = src;
        out[i].value_len = vlen;
        src += vlen;
    }
}
