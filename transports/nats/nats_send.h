/* Sending: a topic's publish backlog is the kit's; this is its broker side. */
#ifndef KB_TRANSPORTS_NATS_SEND_H
#define KB_TRANSPORTS_NATS_SEND_H

#include "nats_types.h"

/* A topic's backlog (topic_open hands it to kb__nats_topic_new); NULL on
 * out of memory, errstr saying so. */
kb_kit_backlog *kb__nats_backlog_new(kb_transport *t, char *errstr, size_t errlen);
/* Report every event of tp's backlog failed with `why`; the events given
 * up. Close only, with no callback of nats.c to come (the topic frees the
 * backlog). */
uint64_t kb__nats_send_close(kb_nats_topic *tp, const char *why);
/* A message for partition n of tp with a fresh Nats-Msg-Id, the key in its
 * header unless key is NULL, and the event's headers. */
int kb__nats_msg_event(kb_transport *t, kb_nats_topic *tp, uint32_t n, const void *key,
                       size_t key_len, const void *body, size_t body_len, const kb_header *h,
                       size_t nh, natsMsg **out);
/* Hand msg, carrying `events` events of partition n whose keys are keys[],
 * to tp's backlog (waiting for room up to pool.enqueue_timeout_ms) and send
 * what is due; takes msg in every case. */
int kb__nats_send(kb_transport *t, kb_nats_topic *tp, uint32_t n, natsMsg *msg,
                  const kb_kit_key *keys, uint32_t events);
/* Send what tp's backlog has due (resends included) while connected; a
 * thread that finds another one sending leaves it to that one. A connection
 * found not connected, or reconnected, since the last take-back has what it
 * held taken back first. `reporter`:
 * this thread may run delivery reports (the acker, close), so a publish
 * over the server's max_payload fails here; else it waits for the acker. */
void kb__nats_pump(kb_transport *t, kb_nats_topic *tp, bool reporter);
/* Pump every topic with something in its backlog. */
void kb__nats_pump_all(kb_transport *t, bool reporter);
/* Pump the topics a publish ack or a reconnect asked for (their
 * pump_wanted, cleared) and those with resends waiting. */
void kb__nats_pump_wanted(kb_transport *t, bool reporter);
/* The acker's tick: take back publishes a silent connection left unacked,
 * then pump every topic (as reporter). */
void kb__nats_send_tick(kb_transport *t);
/* How long a pumping thread may wait for t->pump_wanted before it pumps
 * anyway: `until`, or sooner when a resend's backoff ends before it (only
 * topics with resends waiting, while the connection is up). */
int64_t kb__nats_resend_due(kb_transport *t, int64_t until);
/* nats.c's reconnected callback: the resends go now (pump_wanted, the acker
 * and flushes woken). */
void kb__nats_send_reconnected(kb_transport *t);
/* nats.c's publish-ack handler (its own thread): the stored sequence for
 * kb_drain and the item's done, or its resend. */
void kb__nats_pub_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure);
/* nats.c's disconnected callback: take back every publish not yet acked;
 * they go again, in order, once connected. */
void kb__nats_disconnected(natsConnection *nc, void *closure);
/* Close, once natsConnection_Close returned and kb__nats_take_back_all
 * emptied nats.c's pending publishes: later publish-ack and connection
 * callbacks return at once, and this waits for the ones under way (past
 * `deadline` too: a delivery or state report callback runs in them, which
 * is logged), and up to `deadline` for the publish-ack calls nats.c has still
 * to make for acks it took before (pub_out counts them). false: one may
 * still come, so t must stay allocated. */
bool kb__nats_pub_cbs_end(kb_transport *t, int64_t deadline);
/* A publish-ack, disconnected or reconnected callback begins: false once
 * close is past natsConnection_Close (what is left is close's own; the
 * caller returns at once). Else it is counted until kb__nats_cb_end, and
 * close waits for it. */
bool kb__nats_cb_begin(kb_transport *t);
void kb__nats_cb_end(kb_transport *t);
/* Publishes nats.c still holds, taken back into their backlogs (close,
 * once the connection is closed, before kb__nats_pub_cbs_end). */
void kb__nats_take_back_all(kb_transport *t);

#endif /* KB_TRANSPORTS_NATS_SEND_H */
