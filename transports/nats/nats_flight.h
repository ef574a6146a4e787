/* Publishes nats.c holds, found by their message. */
#ifndef KB_TRANSPORTS_NATS_FLIGHT_H
#define KB_TRANSPORTS_NATS_FLIGHT_H

#include <stddef.h>

typedef struct kb_nats_flight kb_nats_flight;

/* An empty table; NULL on out of memory. */
kb_nats_flight *kb__nats_flight_new(void);
void kb__nats_flight_free(kb_nats_flight *f);
/* Remember `pub` under `msg` (a message not in the table): KB_OK or
 * KB_ENOMEM. Thread: any. */
int kb__nats_flight_put(kb_nats_flight *f, const void *msg, void *pub);
/* What was put under `msg`, removed from the table; NULL: nothing. Thread: any. */
void *kb__nats_flight_take(kb_nats_flight *f, const void *msg);

#endif /* KB_TRANSPORTS_NATS_FLIGHT_H */
