/* A strict INI reader for kb_conf_load (grammar in kb_conf_write_reference):
 * whole lines, one rule each for indentation, sections, quotes and comments,
 * and an error naming the line for anything else. */
#ifndef KB_CORE_INI_H
#define KB_CORE_INI_H

#include <stddef.h>

/* Longest line: the longest value a key allows (4096 bytes), quoted with
 * every byte escaped, after its key. */
#define KB_INI_LINE_MAX (2 * 4096 + 256)
/* Largest file read. */
#define KB_INI_FILE_MAX (1 << 20)

/* Called per `key = value` with the section prefix applied ("pool.workers").
 * A non-KB_OK return stops the parse; the callback writes its reason into
 * why (never the value of a secret). */
typedef int kb_ini_pair_fn(void *arg, const char *key, const char *value, char *why,
                           size_t whylen);

/* Parse text[0..len) and call fn per pair, stopping at the first error.
 * KB_OK, or the error with "<name>:<line>: <reason>" in errstr and
 * kb_last_error. */
int kb__ini_parse(const char *name, const char *text, size_t len, kb_ini_pair_fn *fn, void *arg,
                  char *errstr, size_t errlen);

/* kb__ini_parse of a regular file of at most KB_INI_FILE_MAX bytes. */
int kb__ini_parse_file(const char *path, kb_ini_pair_fn *fn, void *arg, char *errstr,
                       size_t errlen);

#endif /* KB_CORE_INI_H */
