/* The rules a value of one property must pass, by the property's type alone:
 * what kb_conf_set checks first and what a transport's table is checked
 * against when it registers. Knows no conf and no transport. */
#ifndef KB_CORE_CONF_VALUE_H
#define KB_CORE_CONF_VALUE_H

#include <stdint.h>

#include <keybus/transport.h>

/* `value` is valid for `p`: KB_OK (INT: the number in *number; BOOL: 1 or
 * 0), else
 * KB_EINVAL (KB_ENOMEM) with errstr naming the key, never quoting the value.
 * A URL's syntax only: whether its scheme names a transport is the conf's to
 * check. */
int kb__conf_value_check(const kb_conf_prop *p, const char *value, int64_t *number,
                         char *errstr, size_t errlen);

/* A property row is usable: type, default, range, choices, and the default
 * passes the row's own rule. KB_EINVAL with why. */
int kb__conf_prop_check(const kb_conf_prop *p, char *why, size_t whylen);

#endif /* KB_CORE_CONF_VALUE_H */
