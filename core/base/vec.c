/* The one growable-array helper. */
#include <stdint.h>
#include <stdlib.h>

#include <keybus/transport.h>

int kb_vec_reserve(void **items, size_t *cap, size_t need, size_t elem_size)
{
    if (need <= *cap)
        return KB_OK;
    size_t n = *cap ? *cap : 8;
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return KB_ENOMEM;
        n *= 2;
    }
    if (elem_size != 0 && n > SIZE_MAX / elem_size)
        return KB_ENOMEM;
    void *grown = realloc(*items, n * elem_size);
    if (grown == NULL)
        return KB_ENOMEM;
    *items = grown;
    *cap = n;
    return KB_OK;
}
