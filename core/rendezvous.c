/* The one rendezvous ranking: both brokers assign partitions to members with
 * it, so every process agrees on the owner. */
#include <string.h>

#include <keybus/transport.h>

/* FNV-1a alone ranks badly (close names get close hashes); mixing the name's
 * hash with the partition spreads the winners evenly. */
static uint64_t score(const char *member, uint32_t partition)
{
    uint64_t h = kb_fnv1a32(member, strlen(member));
    return kb_mix64((h << 32) | partition);
}

long kb_rendezvous_owner(const char *const *members, size_t n, uint32_t partition)
{
    long best = -1;
    uint64_t best_score = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = score(members[i], partition);
        if (best < 0 || s > best_score ||
            (s == best_score && strcmp(members[i], members[best]) < 0)) {
            best = (long)i;
            best_score = s;
        }
    }
    return best;
}
