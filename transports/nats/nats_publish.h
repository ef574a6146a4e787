/* Publishing: the publish and flush hooks. */
#ifndef KB_TRANSPORTS_NATS_PUBLISH_H
#define KB_TRANSPORTS_NATS_PUBLISH_H

#include "nats_types.h"

int kb__nats_publish(kb_transport *t, kb_nats_topic *tp, const kb_msg *m);
/* kb_flush's hook: flush_until, then the refusals so far count as told. */
int kb__nats_flush(kb_transport *t, int timeout_ms);
/* Events the server refused for good (reported failed) since the last
 * kb_flush or kb_drain took the count; kb_drain returns KB_ETRANSPORT for
 * them, as kb_flush does through the bus's count. */
uint64_t kb__nats_refused_take(kb_transport *t);
/* The same up to a kb_now_ns deadline (INT64_MAX: none); close uses it. */
int kb__nats_flush_until(kb_transport *t, int64_t deadline);

#endif /* KB_TRANSPORTS_NATS_PUBLISH_H */
