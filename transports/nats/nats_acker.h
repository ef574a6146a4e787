/* The acker thread (kb-nats-ack). */
#ifndef KB_TRANSPORTS_NATS_ACKER_H
#define KB_TRANSPORTS_NATS_ACKER_H

#include "nats_types.h"

/* Start it; it runs until t->closing is set and t->acker_wake notified. */
int kb__nats_acker_start(kb_transport *t, char *errstr, size_t errlen);
/* One pass of frontier acks over every claim (the acker, and close after it). */
void kb__nats_ack_pass(kb_transport *t);

#endif /* KB_TRANSPORTS_NATS_ACKER_H */
