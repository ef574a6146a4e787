/* Error text helpers. */
#ifndef KB_CORE_ERR_H
#define KB_CORE_ERR_H

#include <stddef.h>

/* snprintf into a caller's errstr (NULL or zero length: nothing) and into this
 * thread's last-error text (kb_last_error). */
void kb__errf(char *errstr, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Forget this thread's last error: before a call whose failure text is read
 * afterwards, so an older error is never taken for its reason. */
void kb__err_clear(void);

#endif /* KB_CORE_ERR_H */
