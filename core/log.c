/* kb_log: every part reports through the bus's log callback, so this sits
 * below all of them. */
#include <stdarg.h>
#include <stdio.h>

#include "bus_int.h"

void kb_log(kb_bus *b, kb_log_level level, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (b != NULL && b->log != NULL)
        b->log(level, msg, b->log_opaque);
    else if (level <= KB_LOG_WARNING)
        fprintf(stderr, "keybus: %s\n", msg);
}
