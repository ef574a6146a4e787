/* The administration hooks (keybus.h, "Administration"): groups, group
 * removal, topics and peek, read from the stream and consumer lists, the
 * lease bucket and direct gets. Called on application threads. */
#ifndef KB_TRANSPORTS_NATS_ADMIN_H
#define KB_TRANSPORTS_NATS_ADMIN_H

#include "nats_types.h"

int kb__nats_groups(kb_transport *t, kb_nats_topic *tp, kb_group_info **out, size_t *n);
int kb__nats_group_delete(kb_transport *t, kb_nats_topic *tp, const char *group, unsigned flags);
int kb__nats_topics(kb_transport *t, kb_topic_info **out, size_t *n);
int kb__nats_peek(kb_transport *t, kb_nats_topic *tp, const char *group, size_t max,
                  kb_peek_fn fn, void *opaque);

#endif /* KB_TRANSPORTS_NATS_ADMIN_H */
