/* kb_drain's hook. */
#ifndef KB_TRANSPORTS_NATS_DRAIN_H
#define KB_TRANSPORTS_NATS_DRAIN_H

#include "nats_types.h"

int kb__nats_drain(kb_transport *t, int timeout_ms);

#endif /* KB_TRANSPORTS_NATS_DRAIN_H */
