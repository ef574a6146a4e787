/* Broker figures: the stats and partition_stats hooks. */
#ifndef KB_TRANSPORTS_NATS_STATS_H
#define KB_TRANSPORTS_NATS_STATS_H

#include "nats_types.h"

int kb__nats_stats(kb_transport *t, kb_nats_topic *tp, kb_topic_stats *out);
int kb__nats_partition_stats(kb_transport *t, kb_nats_topic *tp, uint32_t partition,
                             kb_partition_stats *out);

#endif /* KB_TRANSPORTS_NATS_STATS_H */
