/* Error text helpers. */
#ifndef KB_CORE_ERR_H
#define KB_CORE_ERR_H

#include <stddef.h>

/* snprintf into a caller's errstr (NULL or zero length: nothing) and into this
 * thread's last-error text (kb_last_error). */
void kb__errf(char *errstr, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* KB_CORE_ERR_H */
