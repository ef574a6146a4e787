/* Renewals of the lease bucket that their round gave up waiting for
 * (nats_kv.c). An answer that comes later (a loaded server or machine) still
 * says the put was stored, after it was sent: without it a bucket that
 * always answers later than a round's wait lets every lease run out locally
 * although the server renews each one. Thread: the lease thread. */
#ifndef KB_TRANSPORTS_NATS_LATE_H
#define KB_TRANSPORTS_NATS_LATE_H

#include "nats_kv.h"

/* Remember the batch's unanswered renewals (sent as round `round`, reply
 * index = their index in ops), and forget those sent a TTL ago or more:
 * their answer could no longer extend anything. */
void kb__nats_late_keep(kb_transport *t, const kb_nats_kv_ops *ops, uint32_t round);
/* The answer to reply index `index` of an earlier round: a renewal stored
 * renews its lease from when it was sent, unless the lease ended meanwhile
 * or a later revision is already known. Anything else is dropped. */
void kb__nats_late_answered(kb_transport *t, uint32_t round, uint32_t index,
                            const kb_nats_kv_op *answer);

#endif /* KB_TRANSPORTS_NATS_LATE_H */
