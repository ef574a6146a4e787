/* The connection to the server and its JetStream context. */
#ifndef KB_TRANSPORTS_NATS_CONNECT_H
#define KB_TRANSPORTS_NATS_CONNECT_H

#include "nats_types.h"

/* Connect (t->nc, t->js) as the configuration says, and make the options of
 * the consumer's connection (t->feed_opts; connected at the first
 * subscribe); errors carry nats.c's reason. */
int kb__nats_connect(kb_transport *t, const kb_conf *c, char *errstr, size_t errlen);
/* Connect the consumer's connection (t->feed_nc) from t->feed_opts, once;
 * the error (kb_last_error) names the URL and reason without secrets. */
int kb__nats_feed_connect(kb_transport *t);

#endif /* KB_TRANSPORTS_NATS_CONNECT_H */
