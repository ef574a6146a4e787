/* The key -> broker partition rule, public so tools show where an event lives. */
#include <keybus/keybus.h>
#include <keybus/pool.h>

uint32_t kb_partition_of(const void *key, size_t key_len, uint32_t partitions)
{
    return partitions == 0 ? 0 : kb_fnv1a32(key, key_len) % partitions;
}
