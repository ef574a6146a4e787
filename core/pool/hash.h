/* FNV-1a inline, for the publish path: a key is hashed once per event there,
 * and a call plus a byte-at-a-time loop cost about as much as the rest of a
 * record's copy (callgrind). The exported kb_fnv1a32 is this function. */
#ifndef KB_CORE_HASH_H
#define KB_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

static inline uint32_t kb__fnv1a32(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint32_t h = 2166136261u;
    size_t i = 0;
    /* four bytes per turn: a quarter of the loop's compares and jumps */
    for (; i + 4 <= len; i += 4) {
        h = (h ^ p[i]) * 16777619u;
        h = (h ^ p[i + 1]) * 16777619u;
        h = (h ^ p[i + 2]) * 16777619u;
        h = (h ^ p[i + 3]) * 16777619u;
    }
    for (; i < len; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

#endif /* KB_CORE_HASH_H */
