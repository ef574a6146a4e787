/* A growing byte buffer of the fuzz targets, NUL-terminated; {0} is empty.
 * Out of memory aborts: a fuzzer's input is small. */
#ifndef KB_TESTS_FUZZ_BUF_H
#define KB_TESTS_FUZZ_BUF_H

#include <stdlib.h>
#include <string.h>

typedef struct fuzz_buf {
    char *p;
    size_t n, cap;
} fuzz_buf;

static void fuzz_put(fuzz_buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        if ((b->p = realloc(b->p, b->cap)) == NULL)
            abort();
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

#endif /* KB_TESTS_FUZZ_BUF_H */
