/* Publishing: the publish and flush hooks. */
#ifndef KB_TRANSPORTS_NATS_PUBLISH_H
#define KB_TRANSPORTS_NATS_PUBLISH_H

#include "nats_types.h"

int kb__nats_publish(kb_transport *t, kb_nats_topic *tp, const kb_msg *m);
int kb__nats_flush(kb_transport *t, int timeout_ms);
/* The same up to a kb_now_ns deadline (INT64_MAX: none); close uses it. */
int kb__nats_flush_until(kb_transport *t, int64_t deadline);

#endif /* KB_TRANSPORTS_NATS_PUBLISH_H */
