/* The acker thread (kb-nats-ack). */
#ifndef KB_TRANSPORTS_NATS_ACKER_H
#define KB_TRANSPORTS_NATS_ACKER_H

#include "nats_types.h"

/* Start it; it runs until t->closing is set and t->acker_wake notified. */
int kb__nats_acker_start(kb_transport *t, char *errstr, size_t errlen);
/* One pass of frontier acks and progress records over every claim (the
 * acker; close after it with `last`: every changed record is written). */
void kb__nats_ack_pass(kb_transport *t, bool last);

#endif /* KB_TRANSPORTS_NATS_ACKER_H */
