/* The fair share: rendezvous ranking bounded by ceil(partitions / members).
 * Plain rendezvous (kb_rendezvous_owner) moves little when a member comes or
 * goes but can give one member 6 of 8 partitions; the bound keeps every
 * member within one partition of the others. Partitions are assigned in
 * order, each to the best-ranked member not yet full, so every process
 * computes the same answer from the same member set, in any listing order. */
#include <stdlib.h>
#include <string.h>

#include "kit_int.h"

/* The number partition p is ranked by. */
static uint32_t rank_key(uint32_t salt, uint32_t p)
{
    return salt == 0 ? p : (uint32_t)kb_mix64((uint64_t)salt << 32 | p);
}

void kb_kit_share(const char *const *members, size_t n, const char *me, uint32_t partitions,
                  uint32_t salt, unsigned char *mine)
{
    if (n == 0) {
        memset(mine, 1, partitions);   /* nobody listed yet (our heartbeat not seen): try */
        return;
    }
    size_t cap = (partitions + n - 1) / n;
    size_t *load = calloc(n, sizeof *load);
    const char **room = calloc(n, sizeof *room);
    size_t *index = calloc(n, sizeof *index);
    if (load == NULL || room == NULL || index == NULL) {
        /* out of memory: plain rendezvous, unbounded but still agreed on */
        for (uint32_t p = 0; p < partitions; p++) {
            long o = kb_rendezvous_owner(members, n, rank_key(salt, p));
            mine[p] = o >= 0 && strcmp(members[o], me) == 0;
        }
    } else {
        for (uint32_t p = 0; p < partitions; p++) {
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (load[i] < cap) {
                    room[k] = members[i];
                    index[k++] = i;
                }
            long o = kb_rendezvous_owner(room, k, rank_key(salt, p));   /* k > 0: cap * n >= partitions */
            load[index[o]]++;
            mine[p] = strcmp(room[o], me) == 0;
        }
    }
    free(load);
    free(room);
    free(index);
}
