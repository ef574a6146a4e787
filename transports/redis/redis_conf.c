/* Configuration keys of the Redis transport (redis.*). */
#include "../../core/conf_int.h"

const kb_conf_prop kb__redis_props[] = {
    {"redis.connect_timeout_ms", KB_CONF_INT, "2000", 1, 600000,
     "Redis: TCP connect timeout, also for reconnects."},
    {"redis.read_timeout_ms", KB_CONF_INT, "5000", 1, 600000,
     "Redis: socket read/write timeout; must exceed `redis.block_ms`."},
    {"redis.block_ms", KB_CONF_INT, "100", 1, 60000,
     "Redis: `XREADGROUP BLOCK` time; bounds how fast a consumer notices new leases and close."},
    {"redis.batch", KB_CONF_INT, "256", 1, 100000,
     "Redis: starting `COUNT` per `XREADGROUP` (it grows up to 8x while reads come back "
     "full) and `COUNT` per recovery (`XPENDING`/`XAUTOCLAIM`) page."},
    {"redis.maxlen", KB_CONF_INT, "0", 0, INT64_MAX,
     "Redis: trim each partition stream with `MAXLEN ~ n` on publish; 0 = no trimming. "
     "Trimming may delete entries nobody acked yet."},
    {"redis.lease_ttl_ms", KB_CONF_INT, "10000", 100, 3600000,
     "Redis: partition lease and membership TTL; renewed 4 times per TTL. A dead "
     "process's partitions move after about this long."},
    {"redis.fenced_reads", KB_CONF_INT, "1", 0, 1,
     "Redis: 1 = each read is validated on the server before its entries are delivered "
     "(`GET` of the lease and `XPENDING` of each partition it returned entries of; entries "
     "read after the lease was lost are swept again), so a process "
     "paused past its lease cannot take entries the next owner should get; 0 = plain "
     "`XREADGROUP`, fenced only by the local lease deadline (a pause between that check and "
     "the read can strand entries and reorder their keys)."},
    {"redis.reconnect_min_ms", KB_CONF_INT, "50", 1, 60000,
     "Redis: first reconnect delay; doubles per failure, with jitter."},
    {"redis.reconnect_max_ms", KB_CONF_INT, "5000", 1, 600000,
     "Redis: cap on the reconnect delay."},
    {NULL, KB_CONF_INT, NULL, 0, 0, NULL},
};
