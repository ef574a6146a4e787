/* Sending publishes: asynchronous, with in-order resends after a reconnect. */
#ifndef KB_TRANSPORTS_NATS_SEND_H
#define KB_TRANSPORTS_NATS_SEND_H

#include "nats_types.h"

/* A message for partition n of tp with a fresh Nats-Msg-Id, the key in its
 * header unless key is NULL, and the event's headers. */
int kb__nats_msg_event(kb_transport *t, kb_nats_topic *tp, uint32_t n, const void *key,
                       size_t key_len, const void *body, size_t body_len, const kb_header *h,
                       size_t nh, natsMsg **out);
/* Publish asynchronously (or queue behind resends); takes msg in every case. */
int kb__nats_send(kb_transport *t, natsMsg *msg);
/* nats.c's publish-ack handler (its own thread): the stored sequence for
 * kb_drain, or the error (resent, or counted for kb_flush). */
void kb__nats_pub_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure);
/* nats.c's disconnected callback: take back every publish not yet acked and
 * queue new ones behind them. */
void kb__nats_disconnected(natsConnection *nc, void *closure);
/* Send the queued publishes again, in order, once connected. */
void kb__nats_resend(kb_transport *t);
/* Events never sent: queued for a resend, or published and not acked (taken
 * back from nats.c), each reported failed with `why`. Frees them; close
 * only, with no callback of nats.c to come. */
uint64_t kb__nats_resend_free(kb_transport *t, const char *why);

#endif /* KB_TRANSPORTS_NATS_SEND_H */
