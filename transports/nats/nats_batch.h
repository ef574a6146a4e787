/* Filling frames on the publish path. */
#ifndef KB_TRANSPORTS_NATS_BATCH_H
#define KB_TRANSPORTS_NATS_BATCH_H

#include "nats_types.h"

int kb__nats_batch_add(kb_transport *t, kb_nats_topic *tp, const kb_msg *m);
/* Send frames at least a linger old (all of them when `all`; with
 * nats.replicas > 1 each one whose partition has no publish unconfirmed).
 * KB_OK when nothing is left buffered. */
int kb__nats_batch_send_due(kb_transport *t, bool all);
/* Report every event still buffered failed with `why` (close: nothing
 * publishes any more; no lock held). */
void kb__nats_batch_give_up(kb_transport *t, const char *why);

#endif /* KB_TRANSPORTS_NATS_BATCH_H */
