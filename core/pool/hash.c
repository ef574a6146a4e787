/* The hashes every part shares: FNV-1a routes keys to lanes and partitions,
 * the mixer spreads close integers (lane -> executor, rendezvous scores,
 * kb_bus_random). */
#include <keybus/transport.h>

#include "hash.h"

uint32_t kb_fnv1a32(const void *data, size_t len)
{
    return kb__fnv1a32(data, len);
}

uint64_t kb_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

uint32_t kb_partition_of_hash(uint32_t hash, uint32_t partitions)
{
    return partitions > 1 ? hash % partitions : 0;
}

uint32_t kb_partition_of(const void *key, size_t key_len, uint32_t partitions)
{
    return kb_partition_of_hash(kb_fnv1a32(key, key_len), partitions);
}
