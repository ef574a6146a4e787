/* Events stored in frames, counted for broker_length. */
#ifndef KB_TRANSPORTS_NATS_TALLY_H
#define KB_TRANSPORTS_NATS_TALLY_H

#include "nats_types.h"

/* Events beyond one per message stored in partition `only` (all when < 0),
 * given the stream's first and last sequence now. */
int kb__nats_tally(kb_transport *t, kb_nats_topic *tp, uint64_t first, uint64_t last, long only,
                   uint64_t *extra);

#endif /* KB_TRANSPORTS_NATS_TALLY_H */
