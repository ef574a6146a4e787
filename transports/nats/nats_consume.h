/* Consuming: the subscribe and stop hooks and the feeder thread
 * (kb-nats-feed), one per bus for every subscribed topic. */
#ifndef KB_TRANSPORTS_NATS_CONSUME_H
#define KB_TRANSPORTS_NATS_CONSUME_H

#include "nats_types.h"

int kb__nats_subscribe(kb_transport *t, kb_nats_topic *tp, kb_sink *sink);
/* Stop feeding (no kb_sink_deliver after it returns) and join the feeder. */
void kb__nats_stop(kb_transport *t);

#endif /* KB_TRANSPORTS_NATS_CONSUME_H */
