/* Error codes' names, the per-thread text of the last failure (kb_errf) and
 * the code of the last failed call that returns no code. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <keybus/transport.h>

#include "err.h"

static _Thread_local char last_error[1024];
static _Thread_local int last_code;

const char *kb_strerror(int code)
{
    switch (code) {
    case KB_OK: return "success";
    case KB_EINVAL: return "invalid argument";
    case KB_EFULL: return "lane full: enqueue timed out";
    case KB_ECLOSED: return "bus closing or closed";
    case KB_ETRANSPORT: return "transport error";
    case KB_ENOMEM: return "out of memory";
    case KB_ETOOBIG: return "key or payload too big";
    case KB_ENOTFOUND: return "not found";
    case KB_ETIMEDOUT: return "timed out";
    default: return "unknown error";
    }
}

const char *kb_last_error(void)
{
    return last_error;
}

int kb_last_error_code(void)
{
    return last_code;
}

void kb__err_set_code(int code)
{
    last_code = code;
}

void kb_err_clear(void)
{
    last_error[0] = '\0';
}

void kb_errf(char *errstr, size_t errlen, const char *fmt, ...)
{
    /* Format aside first: an argument may be kb_last_error() itself. */
    char text[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(last_error, text, sizeof text);
    if (errstr != NULL && errlen > 0 && errstr != last_error)
        snprintf(errstr, errlen, "%s", text);
}
